"""Long-context prefill measured end to end: time to first token through `megactx serve`.

The model is GLM-5.2's exact attention and indexer in 8 dense layers
(bench/cuda/configs/glm52_attention.json, 1.74B parameters, glm_moe_dsa with
IndexShare), as a checkpoint Hugging Face transformers writes with its own
random initialisation (made once, on the GPU in bf16; `--checkpoint` keeps it
between runs). There is no tokenizer: the server runs with
--skip-tokenizer-init and every request sends `input_ids`.

In one run the script

  * measures the ceilings on this GPU before the server starts: bf16 GEMM
    (torch.matmul 8192^3) and fp8 e4m3 GEMM (torch._scaled_mm 8192^3,
    per-tensor scales), best of several CUDA-event-timed runs;
  * computes the FLOP floor of each prompt length from the config (the GEMMs
    and sparse MLA at the bf16 ceiling, the indexer at the fp8 one; see
    `flop_floor`);
  * starts one `megactx serve --device cuda --kv-dtype fp8 --cuda-bf16` with
    room for the longest prompt, warms it up with one 4K request, then sends
    one streamed /generate per length: L random ids (a fresh prompt each, so
    no prefix-cache hit), max_new_tokens 1, greedy. TTFT is the client's time
    from sending the request to the first streamed token (the request's
    upload and JSON parsing included); the server's own TTFT (from the
    request's submission to the engine) is the change of
    megactx_time_to_first_token_seconds_sum in /metrics;
  * after the server has stopped, times Hugging Face transformers' forward
    pass over the same lengths (up to --hf-max-length) as the peer, until it
    runs out of memory.

It prints a markdown table (length, TTFT, prefill tok/s, floor and its
parts, TTFT / floor, transformers), the ceilings and the server's device
memory plan (its "CUDA memory plan" log line), and the SM clock, power and
temperature nvidia-smi sampled while the ceilings were measured and during
each request (gpu_clocks.py): a long prefill may run at lower clocks than
the seconds-long GEMMs that set the floor. --sustained-seconds N also runs
each ceiling GEMM back to back for N seconds and prints the rate it holds,
and the floor at those rates under the table (the table keeps the burst
floor).

  python3 tools/bench/prefill_serve_bench.py --megactx build/megactx \\
      --checkpoint /tmp/glm52_attention_ckpt --json ttft.json --plot ttft.svg

--ab-env KEY=VALUE (repeatable) runs every length again through a second
server with that environment (an A/B in one run, e.g. a kernel switch), as a
last column.

Arguments after `--` go to `megactx serve` and replace the script's own value
of any flag they repeat. Needs torch and transformers (the GPU machine) for
everything but --help.
"""
import argparse
import glob
import http.client
import json
import os
import random
import re
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, HERE)
from megactx_server import MegactxServer  # noqa: E402
from gpu_clocks import ClockSampler, summary_text  # noqa: E402
from svg_plot import line_chart  # noqa: E402

DEFAULT_LENGTHS = "4096,16384,65536,131072,524288,1048576"


# ---------------------------------------------------------------------------
# The checkpoint


def has_checkpoint(directory):
    return bool(glob.glob(os.path.join(directory, "model*.safetensors*")))


def make_checkpoint(config_path, directory):
    """Writes a random glm_moe_dsa checkpoint of `config_path` to `directory` with transformers
    (its own initialisation), built on the GPU in bf16: on the CPU in fp32 the 1.74B
    parameters take minutes to initialise."""
    import torch
    import transformers

    # Written next to the target and renamed at the end, so a run killed mid-save never
    # leaves a directory that has_checkpoint() takes for a finished one.
    staging = directory.rstrip("/") + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    shutil.copy(config_path, os.path.join(staging, "config.json"))
    config = transformers.AutoConfig.from_pretrained(staging)
    start = time.perf_counter()
    with torch.device("cuda"):
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        except TypeError:  # transformers before `dtype` replaced `torch_dtype`
            model = transformers.AutoModelForCausalLM.from_config(config,
                                                                  torch_dtype=torch.bfloat16)
    model = model.to(torch.bfloat16)  # whichever keyword it took, the weights are bf16
    # config.json as transformers writes it replaces the copy above.
    try:
        model.save_pretrained(staging, safe_serialization=True)
    except TypeError:  # a version that dropped the switch: safetensors is its only format
        model.save_pretrained(staging)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    if not has_checkpoint(staging):
        raise RuntimeError(f"save_pretrained wrote no model*.safetensors in {staging}")
    shutil.rmtree(directory, ignore_errors=True)
    os.rename(staging, directory)
    print(f"checkpoint: {parameters / 1e9:.2f}B parameters written to {directory} "
          f"(transformers {transformers.__version__}, {time.perf_counter() - start:.0f} s)",
          flush=True)


# ---------------------------------------------------------------------------
# Ceilings and the floor


def event_seconds(fn, calls):
    """Seconds of `calls` back-to-back calls of `fn`, between two CUDA events."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3


def best_seconds(fn, repeats=10, inner=5, warmup=3):
    """Best of `repeats` CUDA-event timings of `inner` back-to-back calls, per call: several
    calls per timing keep the launch gaps out of a ~1.5 ms GEMM."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return min(event_seconds(fn, inner) / inner for _ in range(repeats))


def sustained_seconds(fn, seconds, batch=50):
    """Mean seconds per call of `fn` run back to back for about `seconds` (CUDA events around
    batches of `batch` calls): the rate a GPU holds under load, which may sit below the burst
    that best_seconds sees once power or temperature caps the clocks."""
    import torch

    fn()
    torch.cuda.synchronize()
    calls, elapsed = 0, 0.0
    while elapsed < seconds:
        elapsed += event_seconds(fn, batch)
        calls += batch
    return elapsed / calls


def measure_ceilings(size=8192, sustained=0.0):
    """bf16 and fp8 e4m3 dense GEMM TFLOP/s on this GPU (torch's cuBLAS / cuBLASLt), the best
    of short bursts; with `sustained` > 0 also each GEMM's mean rate over that many seconds of
    back-to-back calls (bf16_sustained_tflops, fp8_sustained_tflops) and the clocks meanwhile."""
    import torch

    out = gemm_rates(size, sustained)  # its operands are freed when it returns
    torch.cuda.empty_cache()
    return out


def gemm_rates(size, sustained):
    import torch

    flops = 2.0 * size ** 3
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    bf16_fn = lambda: torch.matmul(a, b)  # noqa: E731
    fp8_fn = None  # set once the fp8 GEMM ran
    fp8 = float("nan")
    fp8_error = ""
    with ClockSampler() as clocks:
        bf16 = flops / best_seconds(bf16_fn) / 1e12
        try:
            a8 = a.to(torch.float8_e4m3fn)
            # _scaled_mm wants b column-major: the transpose of a row-major [N, K] tensor.
            b8 = b.to(torch.float8_e4m3fn).t()
            one = torch.ones((), device="cuda", dtype=torch.float32)
            scaled = lambda: torch._scaled_mm(  # noqa: E731
                a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            fp8 = flops / best_seconds(scaled) / 1e12
            fp8_fn = scaled
        except Exception as error:  # noqa: BLE001 - the floor falls back to bf16 for the indexer
            fp8_error = str(error).splitlines()[0] if str(error) else type(error).__name__
    out = {"gpu": torch.cuda.get_device_name(), "bf16_tflops": bf16, "fp8_tflops": fp8,
           "fp8_error": fp8_error, "clocks": clocks.summary()}
    if sustained > 0:
        out["sustained_s"] = sustained
        with ClockSampler() as clocks:
            out["bf16_sustained_tflops"] = flops / sustained_seconds(bf16_fn, sustained) / 1e12
            if fp8_fn is not None:
                out["fp8_sustained_tflops"] = flops / sustained_seconds(fp8_fn, sustained) / 1e12
        out["sustained_clocks"] = clocks.summary()
    return out


def layer_kinds(config):
    """Per layer: (whether it owns an indexer, whether its MLP is dense)."""
    layers = config["num_hidden_layers"]
    # deepseek_v32 has no schedule: every layer runs its own indexer.
    indexer = config.get("indexer_types") or ["full"] * layers
    mlp = config.get("mlp_layer_types") or [
        "dense" if i < config.get("first_k_dense_replace", 0) else "sparse" for i in range(layers)]
    return [(indexer[i] == "full", mlp[i] == "dense") for i in range(layers)]


def flop_floor(config, length, bf16_tflops, fp8_tflops):
    """The FLOPs a prefill of `length` tokens cannot avoid, and the seconds they take at the
    measured ceilings. With L = length, H = hidden, h = heads, r = kv_lora_rank,
    d_n / d_r / d_v = qk_nope / qk_rope / v head dims, q = q_lora_rank, I = intermediate,
    h_i / d_i = index_n_heads / index_head_dim, k = index_topk:

      GEMMs    2 L x (multiply-accumulates per token of every linear layer), per layer
               q_a H q + q_b q h (d_n + d_r) + kv_a H (r + d_r) + absorbed W_UK h d_n r
               + absorbed W_UV h r d_v + o_proj h d_v H + dense MLP 3 H I (routed
               layers: (shared + top-k experts) 3 H I_moe + router H E), and in layers
               that own an indexer (indexer_types "full") wq_b q h_i d_i + wk H d_i
               + weights_proj H h_i; plus lm_head 2 H V for the last token only;
               at the bf16 ceiling;
      indexer  per "full" layer 2 h_i d_i x sum_{t=1..L} t keys (causal)
               = h_i d_i L (L + 1), at the fp8 ceiling;
      MLA      per layer, sum over tokens t of 2 h min(t, k) (r + d_r + r): QK over the
               576-wide latent + rope, PV over the 512-wide latent; at the bf16 ceiling.

    floor = GEMMs / bf16 + indexer / fp8 + MLA / bf16. Returns a dict of FLOPs and seconds."""
    H = config["hidden_size"]
    h = config["num_attention_heads"]
    r = config["kv_lora_rank"]
    d_n, d_r, d_v = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    q = config.get("q_lora_rank")
    h_i, d_i, k = config["index_n_heads"], config["index_head_dim"], config["index_topk"]
    L = length

    per_token = 0
    for own_indexer, dense in layer_kinds(config):
        if q:
            per_token += H * q + q * h * (d_n + d_r)
        else:  # no query LoRA: one projection from the hidden state
            per_token += H * h * (d_n + d_r)
        per_token += H * (r + d_r)               # kv_a: the latent and the shared rope key
        per_token += h * d_n * r + h * r * d_v   # W_UK and W_UV absorbed into the latent space
        per_token += h * d_v * H                 # o_proj
        if own_indexer:
            per_token += (q or H) * h_i * d_i + H * d_i + H * h_i  # wq_b, wk, weights_proj
        if dense:
            per_token += 3 * H * config["intermediate_size"]
        else:
            experts = config.get("n_shared_experts", 0) + config.get("num_experts_per_tok", 0)
            per_token += experts * 3 * H * config["moe_intermediate_size"]
            per_token += H * config.get("n_routed_experts", 0)
    gemm = 2.0 * L * per_token + 2.0 * H * config["vocab_size"]

    full_layers = sum(1 for own_indexer, _ in layer_kinds(config) if own_indexer)
    indexer = full_layers * float(h_i) * d_i * L * (L + 1)

    # sum_{t=1..L} min(t, k): every earlier key while t <= k, then k.
    selected = L * (L + 1) // 2 if L <= k else k * (k + 1) // 2 + (L - k) * k
    mla = config["num_hidden_layers"] * 2.0 * h * (r + d_r + r) * selected

    fp8 = fp8_tflops if fp8_tflops == fp8_tflops else bf16_tflops  # NaN: no fp8 measurement
    parts = {"gemm_s": gemm / (bf16_tflops * 1e12), "indexer_s": indexer / (fp8 * 1e12),
             "mla_s": mla / (bf16_tflops * 1e12)}
    return {"gemm_flops": gemm, "indexer_flops": indexer, "mla_flops": mla, **parts,
            "floor_s": sum(parts.values())}


# ---------------------------------------------------------------------------
# The server


def random_prompt(length, vocab, seed):
    # Ids from 2: 0 and 1 are the config's bos / eos.
    rng = random.Random(seed)
    return [rng.randrange(2, vocab) for _ in range(length)]


def request(port, method, path, body=None, timeout=60):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    connection.request(method, path, body, {"Content-Type": "application/json"} if body else {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    if response.status != 200:
        raise RuntimeError(f"{method} {path}: {response.status} {data[:300]!r}")
    return data.decode()


def metric(port, name):
    text = request(port, "GET", "/metrics")
    match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def generate_body(ids, new_tokens):
    """The JSON of one streamed greedy /generate of `ids` (ignore_eos: exactly `new_tokens`)."""
    return json.dumps({"input_ids": ids, "stream": True,
                       "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens,
                                           "ignore_eos": True}}, separators=(",", ":"))


def stream_generate(port, body, timeout):
    """Sends one streamed /generate `body` (encoded by the caller, before the clock starts) and
    reads it to the end: {"start", "first", "end"} in time.perf_counter() seconds (a system-wide
    clock, so the times of requests sent from several processes compare), "meta", the
    meta_info of the last event, and "events": (time, tokens so far) of every event with
    tokens."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    start = time.perf_counter()
    connection.request("POST", "/generate", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        detail = response.read()[:300]
        connection.close()
        raise RuntimeError(f"/generate: {response.status} {detail!r}")
    first = None
    meta = {}
    events = []
    # The stream: "data: {json}" events, output_ids cumulative, then "data: [DONE]".
    for line in response:
        line = line.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        event = json.loads(line[5:])
        if "error" in event:
            connection.close()
            raise RuntimeError(f"/generate stream: {event['error']}")
        if event.get("output_ids"):
            now = time.perf_counter()
            events.append((now, len(event["output_ids"])))
            if first is None:
                first = now
        meta = event.get("meta_info", meta)
    end = time.perf_counter()
    connection.close()
    if first is None:
        raise RuntimeError("/generate streamed no token")
    return {"start": start, "first": first, "end": end, "meta": meta, "events": events}


def first_token(port, ids, new_tokens, timeout):
    """One streamed /generate of `ids`: (seconds from sending to the first streamed token,
    meta_info of the last event). The body is encoded before the clock starts."""
    result = stream_generate(port, generate_body(ids, new_tokens), timeout)
    return result["first"] - result["start"], result["meta"]


def merge_serve_args(ours, given):
    """`ours` ([(flag, value or None)]) then `given` (the arguments after `--`), leaving out each
    of ours that `given` repeats: the CLI takes each option once."""
    repeated = set(a.split("=", 1)[0] for a in given if a.startswith("--"))
    out = []
    for flag, value in ours:
        if flag not in repeated:
            out += [flag] + ([value] if value is not None else [])
    return out + list(given)


def serve_args(args, context):
    """`megactx serve`'s arguments: the script's defaults unless the ones after `--` repeat a
    flag."""
    ours = [("--device", "cuda"), ("--kv-dtype", "fp8"), ("--cuda-bf16", None),
            ("--skip-tokenizer-init", None), ("--context-length", str(context)),
            ("--max-prefill-tokens", str(args.max_prefill_tokens))]
    return merge_serve_args(ours, args.serve_args)


def given_value(arguments, flag):
    for i, a in enumerate(arguments):
        if a == flag and i + 1 < len(arguments):
            return arguments[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def plan_lines(server):
    """The server's memory plan as it logged it ("CUDA memory plan", "KV cache:" lines)."""
    return [line.strip() for line in server.log
            if "CUDA memory plan" in line or "KV cache:" in line]


def run_server(args, lengths, vocab):
    """TTFT of each length through one server: {length: row}, and its memory plan lines."""
    context = max(lengths) + 1024
    extra = serve_args(args, context)
    context = int(given_value(extra, "--context-length") or context)
    rows = {}
    plan = []
    print(f"serve args: {' '.join(extra)} --kv-memory {args.kv_memory}", flush=True)
    with MegactxServer(args.megactx, args.checkpoint, *extra, kv_memory=args.kv_memory,
                       timeout=args.start_timeout) as server:
        port = int(server.url.rsplit(":", 1)[1])
        new_tokens = 1
        warmup = random_prompt(min(args.warmup_tokens, context - 2), vocab, args.seed)
        try:
            first_token(port, warmup, new_tokens, args.request_timeout)
        except RuntimeError as error:
            if "max_new_tokens" not in str(error):
                raise
            new_tokens = 2  # a server that wants more than one new token
            first_token(port, warmup, new_tokens, args.request_timeout)
        # The plan is logged before the server listens; by now stderr has been drained.
        plan = plan_lines(server)
        for line in plan:
            print(f"server log: {line}", flush=True)
        for i, length in enumerate(lengths):
            if length + new_tokens > context:
                print(f"{length}: skipped (context length {context})", flush=True)
                continue
            ids = random_prompt(length, vocab, args.seed + 1 + i)
            row = {"length": length}
            try:
                # An empty prefix cache: every page is free for the long prompts, and the
                # random prompt could not hit it anyway.
                request(port, "POST", "/flush_cache")
                sum0 = metric(port, "megactx_time_to_first_token_seconds_sum")
                count0 = metric(port, "megactx_time_to_first_token_seconds_count")
                with ClockSampler() as clocks:
                    ttft, meta = first_token(port, ids, new_tokens, args.request_timeout)
                row["clocks"] = clocks.summary()
                sum1 = metric(port, "megactx_time_to_first_token_seconds_sum")
                count1 = metric(port, "megactx_time_to_first_token_seconds_count")
                # One request at a time: the histogram's sum grew by this request's TTFT.
                server_ttft = sum1 - sum0 if count1 == count0 + 1 else None
                row.update(ttft_s=ttft, prefill_tok_s=length / ttft, server_ttft_s=server_ttft,
                           cached_tokens=meta.get("cached_tokens"))
                print(f"{length}: TTFT {ttft:.3f} s (server {seconds_text(server_ttft)} s), "
                      f"{length / ttft:,.0f} tok/s, cached {row['cached_tokens']}; "
                      f"{summary_text(row['clocks'])}", flush=True)
            except Exception as error:  # noqa: BLE001 - keep the lengths measured so far
                row["error"] = str(error)[:300]
                print(f"{length}: failed: {row['error']}", flush=True)
            rows[length] = row
            if "error" in row and server.process.poll() is not None:
                print("the server exited:\n" + "".join(server.log[-30:]), flush=True)
                break
    if args.server_log:
        # After the server stopped: what it logs at exit too (MEGACTX_CUDA_PHASE_TIMES=1 in
        # the environment adds the forward passes' time per phase).
        with open(args.server_log, "w") as log:
            log.write("".join(server.log))
    return rows, plan, extra


# ---------------------------------------------------------------------------
# The transformers peer


def run_transformers(checkpoint, lengths, vocab, seed, warmup_tokens):
    """Seconds of one forward pass of Hugging Face transformers per length (logits of the last
    token only), "OOM" where it ran out of memory; longer lengths are not tried after that."""
    import gc

    import torch
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    except TypeError:
        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint,
                                                                  torch_dtype=torch.bfloat16)
    model = model.to(torch.bfloat16).cuda().eval()
    keep_one = {"logits_to_keep": 1}

    def forward(length, prompt_seed):
        nonlocal keep_one
        ids = torch.tensor([random_prompt(length, vocab, prompt_seed)], device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            try:
                out = model(ids, **keep_one)
            except TypeError:  # a version without logits_to_keep: the whole logits
                keep_one = {}
                out = model(ids)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        del out, ids
        return seconds

    results = {}
    forward(warmup_tokens, seed)
    for i, length in enumerate(lengths):
        try:
            results[length] = forward(length, seed + 1 + i)
            print(f"{length}: transformers {results[length]:.3f} s", flush=True)
        except Exception as error:  # noqa: BLE001
            text = str(error)
            memory = isinstance(error, torch.cuda.OutOfMemoryError) or (
                isinstance(error, RuntimeError) and "memory" in text.lower())
            results[length] = "OOM" if memory else f"failed: {(text or repr(error))[:200]}"
            print(f"{length}: transformers {results[length]}", flush=True)
            break
        finally:
            gc.collect()
            torch.cuda.empty_cache()
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return results


# ---------------------------------------------------------------------------
# Output


def seconds_text(value):
    if value is None:
        return "-"
    if isinstance(value, str):  # "OOM", or why it failed: one table cell
        return value.replace("|", "/").replace("\n", " ")[:60]
    return f"{value:.3g}" if value < 10 else f"{value:.1f}"


def sustained_text(ceilings):
    """The sustained GEMM rates (measure_ceilings with sustained > 0) as one line."""
    fp8 = ceilings.get("fp8_sustained_tflops")
    return (f"sustained: bf16 GEMM {ceilings['bf16_sustained_tflops']:.0f} TFLOP/s"
            + (f", fp8 {fp8:.0f} TFLOP/s" if fp8 is not None else "")
            + f" over {ceilings.get('sustained_s', 0):.0f} s each; "
            + summary_text(ceilings.get("sustained_clocks")))


def print_table(rows, ceilings, plan):
    print()
    ab = rows[0].get("ab_env") if rows else None
    print("| length | TTFT s | server TTFT s | prefill tok/s | floor s (GEMM / indexer / MLA) | "
          "TTFT / floor | HF transformers s |" + (f" TTFT s with {ab} |" if ab else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if ab else ""))
    for row in rows:
        ttft = row.get("ttft_s")
        floor = (f"{seconds_text(row['floor_s'])} ({seconds_text(row['gemm_s'])} / "
                 f"{seconds_text(row['indexer_s'])} / {seconds_text(row['mla_s'])})")
        if ttft:
            cells = [seconds_text(ttft), f"{row['length'] / ttft:,.0f}",
                     f"{ttft / row['floor_s']:.2f}x"]
        else:  # not measured: why, in the TTFT column
            cells = [row.get("error", "skipped")[:60].replace("|", "/"), "-", "-"]
        print(f"| {row['length']} | {cells[0]} | {seconds_text(row.get('server_ttft_s'))} | "
              f"{cells[1]} | {floor} | {cells[2]} | {seconds_text(row.get('hf_s'))} |"
              + (f" {seconds_text(row.get('ab_ttft_s'))} |" if ab else ""))
    print()
    print(f"ceilings: {ceilings['gpu']}: bf16 GEMM {ceilings['bf16_tflops']:.0f} TFLOP/s, "
          f"fp8 e4m3 GEMM {ceilings['fp8_tflops']:.0f} TFLOP/s (8192^3, torch)"
          + (f"; fp8 failed ({ceilings['fp8_error']}), the indexer floor uses bf16"
             if ceilings["fp8_error"] else ""))
    print(f"clocks: ceilings {summary_text(ceilings.get('clocks'))}")
    if "bf16_sustained_tflops" in ceilings:
        print(sustained_text(ceilings))
    for row in rows:
        if "clocks" in row:
            print(f"clocks: {row['length']} {summary_text(row['clocks'])}"
                  + (f"; with {ab} {summary_text(row.get('ab_clocks'))}" if ab else ""))
    for row in rows:
        if "sustained_floor_s" in row and row.get("ttft_s"):
            print(f"floor at the sustained rates: {row['length']} "
                  f"{seconds_text(row['sustained_floor_s'])} s, TTFT / it "
                  f"{row['ttft_s'] / row['sustained_floor_s']:.2f}x")
    for line in plan:
        print(f"plan: {line}")


def plot(path, rows, gpu):
    def series(key):
        return [(row["length"], row[key]) for row in rows
                if isinstance(row.get(key), float) and row[key] > 0]

    curves = [("megactx TTFT", series("ttft_s")), ("FLOP floor (dashed)", series("floor_s")),
              ("HF transformers", series("hf_s"))]
    line_chart(path, [(name, points) for name, points in curves if points],
               title=f"Time to first token, GLM-5.2 attention in 8 dense layers, {gpu}",
               x_label="prompt (tokens)", y_label="seconds", log_x=True, log_y=True,
               x_ticks=[row["length"] for row in rows])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--config", default=os.path.join(ROOT, "bench", "cuda", "configs",
                                                         "glm52_attention.json"))
    parser.add_argument("--checkpoint", default="/tmp/glm52_attention_ckpt",
                        help="made here with transformers unless it holds model*.safetensors")
    parser.add_argument("--lengths", default=DEFAULT_LENGTHS, help="prompt lengths in tokens")
    parser.add_argument("--kv-memory", default="24GiB",
                        help="serve --kv-memory: the KV pools, not the whole GPU")
    parser.add_argument("--max-prefill-tokens", type=int, default=16384)
    parser.add_argument("--warmup-tokens", type=int, default=4096)
    parser.add_argument("--hf-max-length", type=int, default=65536)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers peer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=int, default=300, help="seconds for serve to start")
    parser.add_argument("--request-timeout", type=int, default=600)
    parser.add_argument("--json", default="", help="also write every number here")
    parser.add_argument("--server-log", default="", help="write the server's whole log here")
    parser.add_argument("--plot", default="", help="also write a log-log SVG chart here")
    parser.add_argument("--sustained-seconds", type=float, default=0.0,
                        help="also run each ceiling GEMM back to back for this long and print its "
                             "mean rate and clocks (the floor keeps the burst ceilings)")
    parser.add_argument("--ab-env", action="append", default=[], metavar="KEY=VALUE",
                        help="also run every length through a second server with this "
                             "environment variable set (an A/B in one run; repeatable)")
    parser.add_argument("serve_args", nargs="*", help="after --: passed to megactx serve")
    args = parser.parse_args()
    for item in args.ab_env:
        if "=" not in item or item.startswith("="):
            parser.error(f"--ab-env {item}: expected KEY=VALUE")

    with open(args.config) as f:
        config = json.load(f)
    lengths = sorted(int(n) for n in args.lengths.split(","))
    vocab = config["vocab_size"]

    if not has_checkpoint(args.checkpoint):
        make_checkpoint(args.config, args.checkpoint)
    ceilings = measure_ceilings(sustained=args.sustained_seconds)
    print(f"measured GEMM ceilings: bf16 {ceilings['bf16_tflops']:.0f} TFLOP/s, fp8 "
          f"{ceilings['fp8_tflops']:.0f} TFLOP/s {ceilings['fp8_error']}; "
          f"{summary_text(ceilings['clocks'])}", flush=True)
    if args.sustained_seconds > 0:
        print(sustained_text(ceilings), flush=True)

    rows = []
    for length in lengths:
        floor = flop_floor(config, length, ceilings["bf16_tflops"], ceilings["fp8_tflops"])
        rows.append({"length": length, **floor})
        if "bf16_sustained_tflops" in ceilings:
            # The floor again at the rates the GEMMs hold for --sustained-seconds (a lower
            # clock under the power cap): printed beside the burst floor, which the table keeps.
            rows[-1]["sustained_floor_s"] = flop_floor(
                config, length, ceilings["bf16_sustained_tflops"],
                ceilings.get("fp8_sustained_tflops", ceilings["fp8_tflops"]))["floor_s"]
        print(f"{length}: floor {floor['floor_s']:.3f} s = GEMMs {floor['gemm_flops'] / 1e15:.3f} "
              f"PFLOP {floor['gemm_s']:.3f} s + indexer {floor['indexer_flops'] / 1e15:.3f} PFLOP "
              f"{floor['indexer_s']:.3f} s + sparse MLA {floor['mla_flops'] / 1e15:.3f} PFLOP "
              f"{floor['mla_s']:.3f} s", flush=True)

    def write_json(serve, plan):
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"config": os.path.basename(args.config), "ceilings": ceilings,
                           "serve_args": serve, "kv_memory": args.kv_memory, "plan": plan,
                           "rows": rows}, f, indent=1)

    measured, plan, serve = run_server(args, lengths, vocab)
    for row in rows:
        row.update(measured.get(row["length"], {}))
    write_json(serve, plan)  # now, in case the peer below runs past the caller's timeout
    if args.ab_env:
        variant = dict(item.split("=", 1) for item in args.ab_env)
        print(f"A/B: the same lengths with {' '.join(args.ab_env)}", flush=True)
        saved = dict(os.environ)
        os.environ.update(variant)  # the server inherits it
        server_log = args.server_log
        if server_log:
            args.server_log = server_log + ".ab"
        try:
            measured_b, _, _ = run_server(args, lengths, vocab)
        finally:
            os.environ.clear()
            os.environ.update(saved)
            args.server_log = server_log
        for row in rows:
            row["ab_env"] = " ".join(args.ab_env)
            row["ab_ttft_s"] = measured_b.get(row["length"], {}).get("ttft_s")
            row["ab_clocks"] = measured_b.get(row["length"], {}).get("clocks")
        write_json(serve, plan)

    if not args.no_hf:
        try:
            hf = run_transformers(args.checkpoint,
                                  [n for n in lengths if n <= args.hf_max_length], vocab,
                                  args.seed, args.warmup_tokens)
        except Exception as error:  # noqa: BLE001 - the table of megactx still prints
            print(f"transformers peer failed: {error}", flush=True)
            hf = {}
        for row in rows:
            if row["length"] in hf:
                row["hf_s"] = hf[row["length"]]
    write_json(serve, plan)
    print_table(rows, ceilings, plan)
    if args.plot:
        plot(args.plot, rows, ceilings["gpu"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
