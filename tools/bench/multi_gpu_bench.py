"""GLM-5.2 on several GPUs through `megactx serve`: time per output token, output tok/s per GPU
and the LayerSplit gain, beside the numbers others published for the same model.

The model: random weights in GLM-5.2-FP8's shapes (`--load-format dummy` with
bench/cuda/configs/glm52_fp8.json: 743B parameters and the 10B MTP layer, e4m3 in 128 x 128
blocks), each rank making only its own share; fp8 KV; token ids in and out. Parts (`--parts`):

  tpot        one request at a time: `--input-tokens` random ids in (8K), `--output-tokens` out
              (1K, ignore_eos), streamed; time per output token = (last token - first token) /
              (tokens - 1), the median of `--rounds`. Peer: SGLang's 3.03 ms on 8 H200s.
  throughput  `--concurrency` such requests at once (256): output tokens of the batch over its
              wall time, per GPU. Peer: SGLang's 236 tok/s per GPU on 8 H200s.
  layersplit  `--contexts` prompts (40K, 80K, 120K tokens), `--split-requests` (16) at once, 256
              new tokens each, through tensor parallelism with the experts split, with and
              without --enable-layer-split, from the same memory: the peak of running
              requests, decode tok/s (tokens after each request's first over the time after
              the last first token) and the gain. Peer: Z.ai's +10% to +132% at 40K-120K.

`--layout` picks the group of tpot and throughput: `dp` (the default: --tensor-parallel-size G
--expert-parallel-size G --enable-dp-attention, what SGLang recommends for GLM-5.2) or `tp`
(tensor parallel, experts split). Arguments after `--` go to every server (they replace the
script's own flags they repeat). Each part starts its own servers, so the parts can run in
separate calls of a machine that limits a command's time (`--parts tpot`, then ...).

  python3 tools/bench/multi_gpu_bench.py --megactx build/megactx --gpus 8 --json multi_gpu.json

On the CPU the same script checks its own logic on a small model (CTest `e2e_multi_gpu_bench`):

  python3 tools/bench/multi_gpu_bench.py --megactx build/megactx --device cpu --gpus 2 \\
      --config models/default/config.json --small

Stdlib only.
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# Imports tests/e2e's MegactxServer on the way (its sys.path setup).
import prefill_serve_bench as common  # noqa: E402
from prefill_serve_bench import MegactxServer  # noqa: E402

SGLANG_TPOT_MS = 3.03  # GLM-5.2-FP8, 8 H200s, concurrency 1, 8K in / 1K out
SGLANG_TOKS_PER_GPU = 236.0  # the same at concurrency 256
ZAI_LAYERSPLIT_GAIN = (0.10, 1.32)  # LayerSplit's throughput gain at 40K-120K contexts


def layout_args(layout, gpus):
    group = ["--tensor-parallel-size", str(gpus), "--expert-parallel-size", str(gpus)]
    return group + (["--enable-dp-attention"] if layout == "dp" else [])


def serve_args(args, context, running, extra=()):
    """The server's flags: the script's, then `extra`, then those after `--` (which win)."""
    ours = [("--device", args.device), ("--load-format", "dummy"), ("--skip-tokenizer-init", None),
            ("--context-length", str(context)), ("--max-running-requests", str(running)),
            ("--max-prefill-tokens", str(args.max_prefill_tokens))]
    if args.device == "cuda":
        ours += [("--kv-dtype", "fp8")]
    return common.merge_serve_args(ours, list(extra) + args.serve_args)


def model_folder(config):
    """A folder holding only `config` as config.json (what --load-format dummy reads)."""
    folder = tempfile.mkdtemp(prefix="megactx-dummy-")
    shutil.copy(config, os.path.join(folder, "config.json"))
    return folder


def random_ids(rng, length, vocab):
    return [rng.randrange(100, vocab) for _ in range(length)]


def started(server):
    """Seconds the server took to load (from its log's first and serving lines), or None."""
    stamps = [re.match(r"\[(\d+):(\d+):([\d.]+)\]", line) for line in server.log]
    stamps = [3600 * int(m.group(1)) + 60 * int(m.group(2)) + float(m.group(3))
              for m in stamps if m]
    return stamps[-1] - stamps[0] if len(stamps) >= 2 else None


def port_of(server):
    return int(server.url.rsplit(":", 1)[1])


def streamed(port, ids, new_tokens, timeout):
    result = common.stream_generate(port, common.generate_body(ids, new_tokens), timeout)
    events = result["events"]
    tokens = events[-1][1] if events else 0
    return tokens, result["first"] - result["start"], result["end"] - result["start"], result


def run_tpot(args, folder, vocab, record):
    rng = random.Random(1)
    context = args.input_tokens + args.output_tokens
    flags = serve_args(args, context, 1, layout_args(args.layout, args.gpus))
    with MegactxServer(args.megactx, folder, *flags, name="tpot", timeout=args.load_timeout,
                       kv_memory=args.kv_memory) as server:
        port = port_of(server)
        tpots, ttfts = [], []
        for _ in range(args.rounds):
            ids = random_ids(rng, args.input_tokens, vocab)
            tokens, first, _, result = streamed(port, ids, args.output_tokens, args.timeout)
            events = result["events"]
            if tokens < 2:
                raise RuntimeError(f"tpot: {tokens} tokens streamed")
            tpots.append((events[-1][0] - result["first"]) / (tokens - 1))
            ttfts.append(first)
        load = started(server)
    tpot = statistics.median(tpots)
    record["tpot"] = {"layout": args.layout, "gpus": args.gpus, "input": args.input_tokens,
                      "output": args.output_tokens, "tpot_s": tpots, "ttft_s": ttfts,
                      "load_s": load}
    print(f"| tpot | {' '.join(flags)} | {args.input_tokens} in / {args.output_tokens} out, "
          f"1 at a time | {tpot * 1e3:.2f} ms per output token (TTFT "
          f"{statistics.median(ttfts):.2f} s) | SGLang {SGLANG_TPOT_MS} ms "
          f"({tpot * 1e3 / SGLANG_TPOT_MS:.2f}x) |", flush=True)


def run_throughput(args, folder, vocab, record):
    rng = random.Random(2)
    context = args.input_tokens + args.output_tokens
    flags = serve_args(args, context, args.concurrency, layout_args(args.layout, args.gpus))
    prompts = [random_ids(rng, args.input_tokens, vocab) for _ in range(args.concurrency)]
    # Not streamed: one interpreter parses ~15-20K stream events a second (mtp_serve_bench.py),
    # below what 256 decoding requests make; the batch's output tokens over its wall time is
    # the output throughput SGLang's bench_serving reports.
    with MegactxServer(args.megactx, folder, *flags, name="throughput",
                       timeout=args.load_timeout, kv_memory=args.kv_memory) as server:
        port = port_of(server)
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            bodies = list(pool.map(lambda ids: json.loads(common.request(
                port, "POST", "/generate", json.dumps({
                    "input_ids": ids, "sampling_params": {
                        "temperature": 0, "max_new_tokens": args.output_tokens,
                        "ignore_eos": True}}), timeout=args.timeout)), prompts))
        wall = time.perf_counter() - start
        preemptions = json.loads(common.request(port, "GET", "/ui/stats"))["engine"]["preemptions"]
    tokens = sum(len(body["output_ids"]) for body in bodies)
    per_gpu = tokens / wall / args.gpus
    record["throughput"] = {"layout": args.layout, "gpus": args.gpus, "concurrency":
                            args.concurrency, "output_tokens": tokens, "wall_s": wall,
                            "tok_s_per_gpu": per_gpu, "preemptions": preemptions}
    print(f"| throughput | {' '.join(flags)} | {args.concurrency} at once, {args.input_tokens} in "
          f"/ {args.output_tokens} out | {per_gpu:.1f} output tok/s per GPU ({tokens} tokens in "
          f"{wall:.1f} s) | SGLang {SGLANG_TOKS_PER_GPU:.0f} ({per_gpu / SGLANG_TOKS_PER_GPU:.2f}x) "
          f"|", flush=True)


def running_peak(port, stop, out):
    while not stop.is_set():
        out[0] = max(out[0], common.metric(port, "megactx_num_running_reqs"))
        time.sleep(0.05)


def split_round(args, folder, vocab, context, layer_split):
    rng = random.Random(context)
    prompts = [random_ids(rng, context, vocab) for _ in range(args.split_requests)]
    extra = layout_args("tp", args.gpus) + (["--enable-layer-split"] if layer_split else [])
    flags = serve_args(args, context + args.split_new_tokens, args.split_requests, extra)
    with MegactxServer(args.megactx, folder, *flags, name="layersplit",
                       timeout=args.load_timeout, kv_memory=args.kv_memory) as server:
        port = port_of(server)
        pages = next((int(m.group(1)) for line in server.log
                      for m in [re.search(r"KV cache: (\d+) pages", line)] if m), 0)
        stop, peak = threading.Event(), [0.0]
        poller = threading.Thread(target=running_peak, args=(port, stop, peak), daemon=True)
        poller.start()
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(
                lambda ids: streamed(port, ids, args.split_new_tokens, args.timeout), prompts))
        stop.set()
        poller.join()
    last_first = max(r[1] for r in results)
    wall = max(r[2] for r in results)
    decode = sum(r[0] - 1 for r in results) / max(wall - last_first, 1e-9)
    return {"pages": pages, "peak_running": peak[0], "decode_tok_s": decode, "wall_s": wall,
            "output_tokens": sum(r[0] for r in results)}


def run_layersplit(args, folder, vocab, record):
    rows = []
    for context in args.contexts:
        plain = split_round(args, folder, vocab, context, False)
        split = split_round(args, folder, vocab, context, True)
        gain = split["decode_tok_s"] / max(plain["decode_tok_s"], 1e-9) - 1
        rows.append({"context": context, "plain": plain, "layer_split": split, "gain": gain})
        print(f"| layersplit | {' '.join(layout_args('tp', args.gpus))} [--enable-layer-split] | "
              f"{context} + {args.split_new_tokens} tokens, {args.split_requests} at once | "
              f"KV pages {plain['pages']} -> {split['pages']}, peak running "
              f"{plain['peak_running']:.0f} -> {split['peak_running']:.0f}, decode tok/s "
              f"{plain['decode_tok_s']:.0f} -> {split['decode_tok_s']:.0f} ({gain:+.0%}) | Z.ai "
              f"{ZAI_LAYERSPLIT_GAIN[0]:+.0%} to {ZAI_LAYERSPLIT_GAIN[1]:+.0%} |", flush=True)
    record["layersplit"] = rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--config", default=os.path.join(HERE, "..", "..", "bench", "cuda",
                                                         "configs", "glm52_fp8.json"))
    parser.add_argument("--gpus", type=int, default=8, help="ranks of the group")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--parts", default="tpot,throughput,layersplit")
    parser.add_argument("--layout", default="dp", choices=["dp", "tp"])
    parser.add_argument("--input-tokens", type=int, default=8192)
    parser.add_argument("--output-tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3, help="tpot: requests, one at a time")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--contexts", default="40960,81920,122880")
    # 16 at 120K tokens: more than a replicated cache holds at once on 8 H200s (about 6), within
    # what LayerSplit's holds, and a prefill that fits a 10-minute call.
    parser.add_argument("--split-requests", type=int, default=16)
    parser.add_argument("--split-new-tokens", type=int, default=256)
    parser.add_argument("--max-prefill-tokens", type=int, default=16384)
    parser.add_argument("--kv-memory", default=None,
                        help="per rank (default: what --gpu-memory-utilization leaves on GPUs)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per request")
    parser.add_argument("--load-timeout", type=float, default=1800,
                        help="seconds for a server to load")
    parser.add_argument("--small", action="store_true",
                        help="a CPU check of the script: tiny lengths and counts")
    parser.add_argument("--json")
    parser.add_argument("serve_args", nargs="*", help="after --: more serve arguments")
    args = parser.parse_args()
    if args.small:
        args.input_tokens, args.output_tokens, args.rounds = 48, 6, 2
        args.concurrency, args.split_requests, args.split_new_tokens = 4, 3, 4
        args.contexts = "96,160"
        args.max_prefill_tokens = 256
        args.kv_memory = args.kv_memory or "32MiB"
    args.contexts = [int(c) for c in args.contexts.split(",") if c]
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - {"tpot", "throughput", "layersplit"}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}")
    if args.kv_memory is None and args.device == "cpu":
        args.kv_memory = "1GiB"
    config = json.load(open(args.config))
    vocab = int(config["vocab_size"])
    folder = model_folder(args.config)
    record = {"config": os.path.basename(args.config), "gpus": args.gpus, "device": args.device}
    print(f"{os.path.basename(args.config)}: random weights (--load-format dummy), {args.gpus} "
          f"ranks on {args.device}{', fp8 KV' if args.device == 'cuda' else ''}")
    print("| part | serve arguments | workload | measured | peer |")
    print("|---|---|---|---|---|")
    try:
        if "tpot" in parts:
            run_tpot(args, folder, vocab, record)
        if "throughput" in parts:
            run_throughput(args, folder, vocab, record)
        if "layersplit" in parts:
            run_layersplit(args, folder, vocab, record)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if args.json:
            with open(args.json, "w") as out:
                json.dump(record, out, indent=1)


if __name__ == "__main__":
    main()
