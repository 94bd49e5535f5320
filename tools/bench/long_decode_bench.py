"""Decode speed at long contexts through `megactx serve`, beside its memory-read floor.

The model is the one of tools/bench/prefill_serve_bench.py: GLM-5.2's exact
attention and indexer in 8 dense layers (bench/cuda/configs/glm52_attention.json)
as a random transformers checkpoint (made once at --checkpoint when it holds
none, exactly as that script makes it), or with `--model DIR` an existing
model folder (models/default). The server runs with --skip-tokenizer-init
and every request sends `input_ids`.

In one run the script

  * measures the GPU's read bandwidth before the server starts: a read-only
    reduction (torch.sum over an 8 GiB tensor viewed as int64), best of several
    CUDA-event-timed runs (`--read-gbps` gives it instead, e.g. without torch);
  * starts one `megactx serve --device cuda --kv-dtype fp8 --cuda-bf16` with room
    for the longest context (context length = longest + new tokens + 1024,
    max running requests = the largest concurrency), warms it up;
  * per context length L: one prompt of L random ids, sent once alone with
    max_new_tokens 1 (the prefill, its time to first token reported; it leaves
    the prompt in the prefix cache), then per concurrency C: one warm-up round
    (the decode graphs of this batch and context bucket are captured there, not
    in the timed round) and `--rounds` timed rounds of C streamed /generate
    requests at once, all with the SAME prompt, so that they hit the prefix
    cache instead of prefilling again (meta_info cached_tokens, reported,
    shows it), greedy, ignore_eos, `--new-tokens` new tokens each; the best
    round is reported;
  * decode tok/s is the sum over the C requests of each one's decode rate (its
    tokens after the first over the time from its first token to its end: first
    tokens that come at different times do not inflate it); TPOT is the median
    over the requests of (end - first token) / (tokens - 1);
  * the read floor of one decode step of C requests at context L, from the
    checkpoint and its config:
      weights  2 bytes (bf16) per parameter of every tensor in the checkpoint's
               safetensors headers that a step reads: all of them but the MTP
               layers, the embedding table counted as the C rows it gathers and,
               in MoE layers, the routed experts as the E (1 - (1 - k/E)^C)
               distinct ones C requests are expected to reach under uniform
               routing (the benchmark config is dense: every weight is read);
      KV       per request, in the fp8 cache layout: in every layer whose
               indexer_types entry is "full", all L indexer keys of
               (index_head_dim + 4) bytes (e4m3 + an fp32 scale: 132); in every
               layer, min(L, index_topk) latent entries of (kv_lora_rank + 4
               kv_lora_rank / 128 + 2 qk_rope_head_dim) bytes (e4m3 latent,
               fp32 scales per 128, bf16 rope key: 656);
    step floor = (weights + C x KV) / read bandwidth, floor tok/s =
    C / step floor, and the achieved share of it.

Prints a markdown table (context, concurrency, prefill TTFT, cached tokens,
decode tok/s, TPOT, step floor, floor tok/s, % of floor), the read bandwidth
and the server's memory plan lines.

  python3 tools/bench/long_decode_bench.py --megactx build/megactx \\
      --checkpoint /tmp/glm52_attention_ckpt --json long_decode.json --plot long_decode.svg

A request that fails (a context the KV pools cannot hold, say) leaves its
error in its row and the run goes on; a server that exited ends it.
Arguments after `--` go to `megactx serve` and replace the script's own value
of any flag they repeat. The script's own `--device cpu` leaves out the CUDA
flags, for a smoke test on the CPU (give --read-gbps; the floor keeps the fp8
KV layout whatever --kv-dtype the server runs with):

  python3 tools/bench/long_decode_bench.py --megactx build/megactx --model models/default \
      --contexts 256,1024 --concurrency 1,2 --new-tokens 8 --device cpu --read-gbps 20 \
      -- --kv-dtype f32

Needs torch for the bandwidth unless --read-gbps is given, and transformers
only to make the checkpoint.
"""
import argparse
import concurrent.futures
import glob
import http.client
import json
import os
import re
import signal
import statistics
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# Imports tests/e2e's MegactxServer and svg_plot's line_chart on the way (its sys.path setup).
import prefill_serve_bench as common  # noqa: E402

DEFAULT_CONTEXTS = "1024,8192,131072,1048576"


# ---------------------------------------------------------------------------
# The floor


def measure_read_bandwidth(gib=8):
    """GB/s of a read-only reduction over `gib` GiB on the GPU: what one decode step's weight and
    KV reads can reach at best. int64 elements: 1 Gi of them for 8 GiB, within 32-bit indexing,
    so torch runs one reduction kernel."""
    import torch

    data = torch.zeros(gib << 30, dtype=torch.uint8, device="cuda").view(torch.int64)
    seconds = common.best_seconds(lambda: data.sum(), repeats=10, inner=3, warmup=2)
    nbytes = data.numel() * data.element_size()
    gpu = torch.cuda.get_device_name()
    del data
    torch.cuda.empty_cache()
    return nbytes / seconds / 1e9, gpu


def safetensors_tensors(directory):
    """{name: (dtype, shape)} from the headers of every *.safetensors file in `directory` (the
    8-byte little-endian header length, then the JSON header; no tensor data is read)."""
    tensors = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        tensors.update({name: (entry["dtype"], entry["shape"]) for name, entry in header.items()})
    if not tensors:
        raise RuntimeError(f"no *.safetensors in {directory}")
    return tensors


def weight_parameters(tensors, config):
    """The parameters a decode step reads, split into what every step reads in full
    ("always"), the embedding table ("embedding", rows per token) and the routed experts
    ({layer: [parameters of each expert]})."""
    layers = config["num_hidden_layers"]
    always = 0
    experts = {}
    embedding_row = 0
    tied = "lm_head.weight" not in tensors
    for name, (_, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        layer = re.search(r"\.layers\.(\d+)\.", name)
        if layer and int(layer.group(1)) >= layers:
            continue  # an MTP layer: plain decoding never runs it
        if name.endswith("scale_inv"):
            continue  # fp8 block scales: --cuda-bf16 folds them into bf16 weights at load
        if name.endswith("embed_tokens.weight") and not tied:
            embedding_row = shape[-1]  # a step gathers one row per token, not the table
            continue
        expert = re.search(r"\.mlp\.experts\.(\d+)\.", name)
        if layer and expert:
            per_layer = experts.setdefault(int(layer.group(1)), {})
            index = int(expert.group(1))
            per_layer[index] = per_layer.get(index, 0) + count
            continue
        always += count
    return always, embedding_row, {layer: list(e.values()) for layer, e in experts.items()}


def kv_bytes_per_request(config, context):
    """Bytes of KV cache one request's decode step reads at `context` tokens, fp8 layout."""
    layers = config["num_hidden_layers"]
    # deepseek_v32 has no schedule: every layer runs its own indexer.
    indexer = config.get("indexer_types") or ["full"] * layers
    full = sum(1 for kind in indexer[:layers] if kind == "full")
    key = config["index_head_dim"] + 4
    rank = config["kv_lora_rank"]
    latent = rank + 4 * ((rank + 127) // 128) + 2 * config["qk_rope_head_dim"]
    return full * context * key + layers * min(context, config["index_topk"]) * latent


def step_floor(config, weights, context, concurrency, read_gbps):
    """The bytes one decode step of `concurrency` requests at `context` tokens must read, and the
    seconds they take at `read_gbps`."""
    always, embedding_row, experts = weights
    parameters = always + concurrency * embedding_row
    k = config.get("num_experts_per_tok", 1)
    for sizes in experts.values():
        count = len(sizes)
        # Distinct experts C requests reach when each picks k of E uniformly: random ids route
        # roughly so, and a step reads each reached expert once.
        reached = count * (1 - (1 - min(k, count) / count) ** concurrency)
        parameters += reached * (sum(sizes) / count)
    weight_bytes = 2 * parameters
    kv = concurrency * kv_bytes_per_request(config, context)
    seconds = (weight_bytes + kv) / (read_gbps * 1e9)
    return {"weight_bytes": weight_bytes, "kv_bytes": kv, "step_floor_s": seconds,
            "floor_tok_s": concurrency / seconds}


# ---------------------------------------------------------------------------
# The server


# The request bodies of a pool's processes, {"warmup": ..., "timed": ...}: handed over once per
# process by the pool's initializer, not pickled again for every request (a 1M-token prompt is
# ~5 MB of JSON).
_BODIES = {}


def _set_bodies(bodies):
    _BODIES.update(bodies)


def _started(_):
    return os.getpid()


def _stream(job):
    """One streamed request of the round, in a pool process: a process per stream, as in
    mtp_serve_bench.py, so that parsing the events of C streams does not share one interpreter
    (and the timestamps are not delayed by it)."""
    port, which, timeout = job
    result = common.stream_generate(port, _BODIES[which], timeout)
    return {"start": result["start"], "first": result["first"], "end": result["end"],
            "tokens": result["meta"].get("completion_tokens", 0),
            "cached": result["meta"].get("cached_tokens")}


def timed_round(pool, port, which, concurrency, timeout):
    """One round of `concurrency` streams of the pool's body `which`: decode tok/s, median TPOT,
    the cached tokens of each request."""
    results = list(pool.map(_stream, [(port, which, timeout)] * concurrency))
    # Decode tok/s: the sum of each request's own decode rate (its tokens after the first over
    # the time from its first token to its end), so first tokens that come at different times
    # (a request's prefix-cache match, the last page re-prefilled) do not inflate it, as a
    # window from the last first token would.
    rates = [(r["tokens"] - 1) / max(r["end"] - r["first"], 1e-9) for r in results if r["tokens"] > 1]
    tpot = [(r["end"] - r["first"]) / (r["tokens"] - 1) for r in results if r["tokens"] > 1]
    start = min(r["start"] for r in results)
    return {"decode_tok_s": sum(rates),
            "tpot_s": statistics.median(tpot) if tpot else None,
            "cached_tokens": [r["cached"] for r in results],
            "completion_tokens": [r["tokens"] for r in results],
            # Per request, seconds from the round's first send: when its first token and its
            # end came (first tokens far apart make decode tok/s count tokens outside its window).
            "requests": [[round(r["first"] - start, 6), round(r["end"] - start, 6)]
                         for r in results]}


def our_serve_args(args, context, concurrency):
    if args.device == "cpu":  # the CPU smoke test: no CUDA-only flags
        ours = [("--device", "cpu")]
    else:
        ours = [("--device", "cuda"), ("--kv-dtype", "fp8"), ("--cuda-bf16", None)]
    ours += [("--skip-tokenizer-init", None), ("--context-length", str(context)),
             ("--max-running-requests", str(concurrency)),
             ("--max-prefill-tokens", str(args.max_prefill_tokens))]
    extra = common.merge_serve_args(ours, args.serve_args)
    # MegactxServer passes --kv-memory itself: one given after `--` replaces ours.
    kv_memory = common.given_value(extra, "--kv-memory") or args.kv_memory
    cleaned = []
    skip = False
    for a in extra:
        if skip:
            skip = False
            continue
        if a == "--kv-memory":
            skip = True
            continue
        if not a.startswith("--kv-memory="):
            cleaned.append(a)
    return cleaned, kv_memory


def error_text(error):
    """An error for a table cell: the server's own message when the body carries one."""
    text = str(error)
    match = re.search(r'"message":"((?:[^"\\]|\\.)*)"', text)
    if not match:
        return text[:300]
    # The body came through repr() of bytes: an apostrophe arrives escaped.
    return f"{text.split(':', 1)[0]}: {match.group(1)}".replace("\\'", "'")[:300]


def server_alive(server, port):
    """Whether the server still answers: a process that is shutting down (SIGTERM, a crash
    handler) has not exited yet when its connections break, so poll() alone misses it."""
    if server.process.poll() is not None:
        return False
    try:
        common.request(port, "GET", "/health", timeout=10)
        return True
    except RuntimeError:  # it answered, with an error status
        return True
    except (OSError, http.client.HTTPException):  # refused or reset: gone, exited or not
        return False


def measure_context(args, server, port, context, ids, levels, record):
    """Prefill of one context, then its concurrency levels; record(row) each row. False when the
    server exited."""
    bodies = {"timed": common.generate_body(ids, args.new_tokens),
              "warmup": common.generate_body(ids, args.warmup_new_tokens)}
    ttft = None
    try:
        # An empty prefix cache: every page free for this context's prompt (the earlier
        # contexts' prompts are not used again).
        common.request(port, "POST", "/flush_cache")
        ttft, meta = common.first_token(port, ids, 1, args.request_timeout)
        print(f"{context}: prefill TTFT {ttft:.3f} s (cached {meta.get('cached_tokens')})",
              flush=True)
    except Exception as error:  # noqa: BLE001 - the decode rows say why they are missing
        message = error_text(error)
        print(f"{context}: prefill failed: {message}", flush=True)
        for c in levels:
            record({"context": context, "concurrency": c, "error": f"prefill: {message}"})
        return server_alive(server, port)
    first_row = True
    for c in levels:
        row = {"context": context, "concurrency": c}
        if first_row:
            row["prefill_ttft_s"] = ttft
            first_row = False
        try:
            with concurrent.futures.ProcessPoolExecutor(
                    c, initializer=_set_bodies, initargs=(bodies,)) as pool:
                list(pool.map(_started, range(c)))  # every process started before any round
                # Untimed: the decode graphs of this batch and context bucket are captured here.
                timed_round(pool, port, "warmup", c, args.request_timeout)
                best = None
                for _ in range(args.rounds):
                    result = timed_round(pool, port, "timed", c, args.request_timeout)
                    if best is None or result["decode_tok_s"] > best["decode_tok_s"]:
                        best = result
            row.update(best)
            print(f"{context} x {c}: decode {best['decode_tok_s']:,.1f} tok/s, TPOT "
                  f"{ms_text(best['tpot_s'])} ms, cached {cached_text(best['cached_tokens'])}",
                  flush=True)
        except Exception as error:  # noqa: BLE001 - keep the cases measured so far
            row["error"] = error_text(error)
            print(f"{context} x {c}: failed: {row['error']}", flush=True)
        record(row)
        if "error" in row and not server_alive(server, port):
            return False
    return True


def run_server(args, model, contexts, levels, vocab, record, state):
    """Every case through one server; its arguments and memory plan lines go into `state` as soon
    as they are known."""
    context_length = max(contexts) + args.new_tokens + 1024
    extra, kv_memory = our_serve_args(args, context_length, max(levels))
    state.update(serve_args=extra, kv_memory=kv_memory)
    context_length = int(common.given_value(extra, "--context-length") or context_length)
    print(f"serve args: {' '.join(extra)} --kv-memory {kv_memory}", flush=True)
    with common.MegactxServer(args.megactx, model, *extra, kv_memory=kv_memory,
                              timeout=args.start_timeout) as server:
        port = int(server.url.rsplit(":", 1)[1])
        # First allocations and graphs outside the measured cases; no longer than the shortest
        # context, which the KV pools must hold anyway (the server caps its context at them).
        warmup = common.random_prompt(min(1024, min(contexts)), vocab, args.seed)
        try:
            common.first_token(port, warmup, 8, args.request_timeout)
        except RuntimeError as error:  # the cases will say what fails
            print(f"warm-up failed: {str(error)[:300]}", flush=True)
        # The plan is logged before the server listens; by now stderr has been drained.
        state["plan"] = common.plan_lines(server)
        for line in state["plan"]:
            print(f"server log: {line}", flush=True)
        for i, context in enumerate(contexts):
            if context + args.new_tokens > context_length:
                print(f"{context}: skipped (context length {context_length})", flush=True)
                for c in levels:
                    record({"context": context, "concurrency": c,
                            "error": f"skipped (context length {context_length})"})
                continue
            ids = common.random_prompt(context, vocab, args.seed + 1 + i)
            if not measure_context(args, server, port, context, ids, levels, record):
                state["server_exited"] = True
                print("the server exited:\n" + "".join(server.log[-30:]), flush=True)
                break
    if args.server_log:
        with open(args.server_log, "w") as log:
            log.write("".join(server.log))


# ---------------------------------------------------------------------------
# Output


def ms_text(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.3g}"


def cached_text(cached):
    values = [v for v in cached if v is not None]
    if not values:
        return "-"
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def print_table(rows, read_gbps, read_source, plan):
    print()
    print("| context | concurrency | prefill TTFT s | cached tokens | decode tok/s | TPOT ms | "
          "step floor ms | floor tok/s | % of floor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        ttft = row.get("prefill_ttft_s")
        floor = [ms_text(row.get("step_floor_s")), f"{row['floor_tok_s']:,.0f}"
                 if row.get("floor_tok_s") else "-"]
        if "decode_tok_s" in row:
            share = 100 * row["decode_tok_s"] / row["floor_tok_s"]
            cells = [cached_text(row["cached_tokens"]), f"{row['decode_tok_s']:,.1f}",
                     ms_text(row["tpot_s"]), f"{share:.1f}%"]
        else:  # not measured: why, in the cached tokens column
            cells = [row.get("error", "not run")[:120].replace("|", "/").replace("\n", " "),
                     "-", "-", "-"]
        print(f"| {row['context']} | {row['concurrency']} | "
              f"{common.seconds_text(ttft) if ttft else '-'} | {cells[0]} | {cells[1]} | "
              f"{cells[2]} | {floor[0]} | {floor[1]} | {cells[3]} |")
    print()
    print(f"read bandwidth: {read_gbps:,.0f} GB/s ({read_source})")
    for line in plan:
        print(f"plan: {line}")


def plot(path, rows, levels, title):
    curves = []
    for c in levels:
        mine = [r for r in rows if r["concurrency"] == c]
        curves.append((f"megactx, {c} req", [(r["context"], r["decode_tok_s"]) for r in mine
                                             if r.get("decode_tok_s")]))
        curves.append((f"floor, {c} req (dashed)", [(r["context"], r["floor_tok_s"])
                                                    for r in mine if r.get("floor_tok_s")]))
    curves = [(name, points) for name, points in curves if points]
    if not curves:
        print("no points to plot", flush=True)
        return
    common.line_chart(path, curves, title=title, x_label="context (tokens)",
                      y_label="decode tok/s", log_x=True, log_y=True,
                      x_ticks=sorted(set(r["context"] for r in rows)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--config", default=os.path.join(common.ROOT, "bench", "cuda", "configs",
                                                         "glm52_attention.json"),
                        help="the config of the checkpoint made at --checkpoint")
    parser.add_argument("--checkpoint", default="/tmp/glm52_attention_ckpt",
                        help="made here with transformers unless it holds model*.safetensors")
    parser.add_argument("--model", default="",
                        help="an existing model folder instead of --checkpoint (token ids only)")
    parser.add_argument("--contexts", default=DEFAULT_CONTEXTS, help="context lengths in tokens")
    parser.add_argument("--concurrency", default="1,4,16", help="requests at once")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--warmup-new-tokens", type=int, default=4,
                        help="new tokens of the untimed round before each concurrency")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds, the best reported")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a smoke test without the CUDA flags (give --read-gbps)")
    parser.add_argument("--kv-memory", default=None,
                        help="serve --kv-memory (default 48GiB, 2GiB with --device cpu)")
    parser.add_argument("--max-prefill-tokens", type=int, default=16384)
    parser.add_argument("--read-gbps", type=float, default=None,
                        help="the read bandwidth in GB/s instead of measuring it with torch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=int, default=300, help="seconds for serve to start")
    parser.add_argument("--request-timeout", type=int, default=600)
    parser.add_argument("--json", default="", help="also write every number here")
    parser.add_argument("--server-log", default="", help="write the server's whole log here")
    parser.add_argument("--plot", default="", help="also write an SVG chart here")
    parser.add_argument("serve_args", nargs="*", help="after --: passed to megactx serve")
    args = parser.parse_args()
    if args.kv_memory is None:
        args.kv_memory = "2GiB" if args.device == "cpu" else "48GiB"
    contexts = sorted(int(n) for n in args.contexts.split(","))
    levels = sorted(int(c) for c in args.concurrency.split(","))

    if args.model:
        model = args.model
    else:
        model = args.checkpoint
        if not common.has_checkpoint(model):
            common.make_checkpoint(args.config, model)
    # The config the server reads, not --config: with --model they differ.
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    weights = weight_parameters(safetensors_tensors(model), config)
    print(f"weights read per step: {2 * weights[0] / 1e9:.3f} GB every step, embedding rows "
          f"of {2 * weights[1]} bytes, routed experts in {len(weights[2])} layers", flush=True)

    if args.read_gbps:
        read_gbps, read_source = args.read_gbps, "given by --read-gbps"
    else:
        read_gbps, gpu = measure_read_bandwidth()
        read_source = f"{gpu}, torch.sum over 8 GiB, best of 10"
    print(f"read bandwidth: {read_gbps:,.0f} GB/s ({read_source})", flush=True)

    rows = []
    state = {"serve_args": [], "kv_memory": args.kv_memory, "plan": []}

    def write_json():
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": model, "config": config.get("model_type"),
                           "read_gbps": read_gbps, "read_source": read_source,
                           "new_tokens": args.new_tokens, "rounds": args.rounds, **state,
                           "rows": rows}, f, indent=1)

    def record(row):
        row.update(step_floor(config, weights, row["context"], row["concurrency"], read_gbps))
        rows.append(row)
        write_json()  # after every case, in case the caller's timeout ends the run

    # timeout(1)'s SIGTERM (gpu-check.sh) leaves through the finally below: the table of the
    # cases measured so far still prints, and the server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        run_server(args, model, contexts, levels, config["vocab_size"], record, state)
    finally:  # what was measured before a failure still prints
        write_json()
        print_table(rows, read_gbps, read_source, state["plan"])
        if args.plot:
            name = os.path.basename(os.path.normpath(model))
            plot(args.plot, rows, levels, f"Decode at long contexts, {name}")
    return 1 if state.get("server_exited") else 0


if __name__ == "__main__":
    sys.exit(main())
