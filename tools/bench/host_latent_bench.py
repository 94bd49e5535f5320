"""The live host tier through `megactx serve`: concurrent long requests with and without it.

The model is GLM-5.2's exact attention and indexer in 8 dense layers
(bench/cuda/configs/glm52_attention.json) as a random transformers checkpoint, made once at
--checkpoint exactly as tools/bench/prefill_serve_bench.py makes it. Two servers run one after
the other with the same `--kv-memory` (a budget that holds only a few of the long contexts):
the plain one, and one with `--host-latent-memory` (decoding requests' full pages move to
offload pages whose latents live in pinned host memory; their indexer keys stay in the budget).

Per server and per concurrency C: the prefix cache is flushed, C requests with DIFFERENT random
prompts of `--context` tokens are sent at once (streamed /generate, greedy, ignore_eos,
`--new-tokens` each), and the script reports

  * how many ran at once: the most `megactx_num_running_reqs` seen while polling /metrics;
  * output tok/s: all generated tokens over the round's wall time (first send to last end);
  * decode tok/s while all C decode together: the tokens the C streams produced in the window
    from the last first token to the first end, over its length (empty when the requests never
    decoded together: the plain server runs them a few at a time);
  * TPOT: the median over requests of (end - first token) / (tokens - 1);
  * the hot cache's hit rate (megactx_host_latent_hot_hits_total over _selected_entries_total)
    and the bytes copied host -> GPU per decode step (_copied_bytes_total over
    _read_steps_total) in the round;
  * the bytes the tier moved (megactx_host_latent_moved_bytes_total) and the top-k latent bytes
    a decode step of one request reads from host memory (min(context, top-k) entries of 656 B in
    every layer), against the bus rate: --bus-gbps (default: measured, a pinned host -> device
    copy of 1 GiB with torch).

  python3 tools/bench/host_latent_bench.py --megactx build/megactx \\
      --checkpoint /tmp/glm52_attention_ckpt --context 131072 --concurrency 1,2,4,8 \\
      --kv-memory 3GiB --host-latent-memory 24GiB --json host_latent.json --plot host_latent.svg

A smoke test on the CPU (no CUDA flags; give --bus-gbps):

  python3 tools/bench/host_latent_bench.py --megactx build/megactx --model models/default \\
      --device cpu --context 600 --concurrency 1,3 --new-tokens 16 --kv-memory 40MiB \\
      --host-latent-memory 64MiB --bus-gbps 10 -- --kv-dtype f32

--variants runs one tier server per variant, each LABEL:ENV=VALUE+ENV=VALUE, for A/B runs of
the hot cache's switches (kernels/cuda/kv_copy/stage_offload.h, model/cuda/dsa_fast_attention.cpp):

  --variants "live host tier:,modulo lines:MEGACTX_OFFLOAD_LINE_MAP=modulo,one stream:MEGACTX_OFFLOAD_SIDE_STREAM=0"

A prompt longer than the device KV (the tier prefills it, its full pages moving after every
chunk): give the plain server a budget that holds it, the tier a smaller one, and compare the
time to the first token and the TPOT:

  --context 131072 --concurrency 1 --kv-memory 256MiB --plain-kv-memory 2GiB

Arguments after `--` go to every server.
"""
import argparse
import concurrent.futures
import json
import os
import statistics
import time
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import prefill_serve_bench as common  # noqa: E402


READ_COUNTERS = ("selected_entries", "hot_hits", "copied_bytes", "read_steps")


def measure_bus_gbps(gib=1):
    """GB/s of one pinned host -> device copy (what reads of pinned host memory can reach)."""
    import torch

    host = torch.zeros(gib << 30, dtype=torch.uint8).pin_memory()
    device = torch.empty_like(host, device="cuda")
    seconds = common.best_seconds(lambda: device.copy_(host, non_blocking=True), repeats=5,
                                  inner=1, warmup=1)
    return host.numel() / seconds / 1e9


def stream_tokens(job):
    """One streamed /generate in a pool process (common.stream_generate: its send, end and the
    time and token count of every event)."""
    port, body, timeout = job
    return common.stream_generate(port, body, timeout)


def tokens_by(events, moment):
    """Tokens a stream had produced by `moment` (its cumulative count at the last event before)."""
    count = 0
    for when, total in events:
        if when > moment:
            break
        count = total
    return count


def poll_running(port, stop, seen):
    while not stop.is_set():
        try:
            value = common.metric(port, "megactx_num_running_reqs")
            if value == value:  # not NaN
                seen.append(value)
        except Exception:  # noqa: BLE001 - a poll may race the server's shutdown
            pass
        stop.wait(0.2)


def run_round(port, prompts, new_tokens, timeout):
    bodies = [common.generate_body(ids, new_tokens) for ids in prompts]
    seen = []
    stop = threading.Event()
    poller = threading.Thread(target=poll_running, args=(port, stop, seen), daemon=True)
    moved_before = common.metric(port, "megactx_host_latent_moved_bytes_total")
    reads_before = {name: common.metric(port, f"megactx_host_latent_{name}_total")
                    for name in READ_COUNTERS}
    poller.start()
    with concurrent.futures.ProcessPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(stream_tokens, [(port, body, timeout) for body in bodies]))
    stop.set()
    poller.join()
    moved = common.metric(port, "megactx_host_latent_moved_bytes_total") - moved_before
    reads = {name: common.metric(port, f"megactx_host_latent_{name}_total") - reads_before[name]
             for name in READ_COUNTERS}
    start = min(r["start"] for r in results)
    end = max(r["end"] for r in results)
    total = sum(r["events"][-1][1] for r in results if r["events"])
    firsts = [r["events"][0][0] for r in results]
    ends = [r["events"][-1][0] for r in results]
    window = (max(firsts), min(ends))
    together = None
    if window[1] - window[0] > 0.05:
        produced = sum(tokens_by(r["events"], window[1]) - tokens_by(r["events"], window[0])
                       for r in results)
        together = produced / (window[1] - window[0])
    tpot = [(r["events"][-1][0] - r["events"][0][0]) / (r["events"][-1][1] - 1)
            for r in results if r["events"] and r["events"][-1][1] > 1]
    ttft = [r["events"][0][0] - r["start"] for r in results]
    return {"max_running": max(seen) if seen else None,
            "output_tok_s": total / (end - start),
            "together_tok_s": together,
            "tpot_s": statistics.median(tpot) if tpot else None,
            "ttft_max_s": max(ttft),
            "wall_s": end - start,
            "moved_bytes": moved if moved == moved else 0.0,
            "hit_rate": (reads["hot_hits"] / reads["selected_entries"]
                         if reads["selected_entries"] > 0 else None),
            "copied_bytes_per_step": (reads["copied_bytes"] / reads["read_steps"]
                                      if reads["read_steps"] > 0 else None)}


def run_server(args, label, extra, vocab, rows, kv_memory):
    context_length = args.context + args.new_tokens + 1024
    ours = ([("--device", "cuda"), ("--kv-dtype", "fp8"), ("--cuda-bf16", None)]
            if args.device == "cuda" else [("--device", "cpu")])
    ours += [("--skip-tokenizer-init", None), ("--context-length", str(context_length)),
            ("--max-running-requests", str(max(args.levels))),
            ("--max-prefill-tokens", str(args.max_prefill_tokens))]
    serve = common.merge_serve_args(ours, extra + args.serve_args)
    print(f"{label}: serve {' '.join(serve)} --kv-memory {kv_memory}", flush=True)
    if args.phase_times:
        # Printed by the server as it exits (the CUDA model's and the engine's phases).
        os.environ["MEGACTX_CUDA_PHASE_TIMES"] = "1"
        os.environ["MEGACTX_ENGINE_TIMES"] = "1"
    server = common.MegactxServer(args.megactx, args.model or args.checkpoint, *serve,
                                  kv_memory=kv_memory, timeout=args.start_timeout)
    plan = measure_server(args, label, server, vocab, rows, kv_memory)
    if args.phase_times:
        time.sleep(1)  # the drain thread reads the last lines
        report = "".join(server.log)
        start = min((i for i in (report.find("CUDA phase times"), report.find("engine phase"))
                     if i >= 0), default=-1)
        print(report[start:] if start >= 0 else "(no phase times in the server log)", flush=True)
    return plan


def measure_server(args, label, server, vocab, rows, kv_memory):
    with server:
        port = int(server.url.rsplit(":", 1)[1])
        plan = [line.strip() for line in server.log
                if "KV cache:" in line or "live host tier" in line or "CUDA memory plan" in line]
        for line in plan:
            print(f"  {line}", flush=True)
        # Warm-up: graphs and first allocations outside the measured rounds.
        common.first_token(port, common.random_prompt(min(4096, args.context), vocab, 1), 32,
                           args.request_timeout)
        seed = 100
        for c in args.levels:
            common.request(port, "POST", "/flush_cache")
            prompts = [common.random_prompt(args.context, vocab, seed + i) for i in range(c)]
            seed += c
            row = {"server": label, "concurrency": c, "context": args.context,
                   "kv_memory": kv_memory}
            try:
                row.update(run_round(port, prompts, args.new_tokens, args.request_timeout))
            except Exception as error:  # noqa: BLE001 - keep the rows measured so far
                row["error"] = str(error)[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
        return plan


def print_table(rows, read_bytes, bus_gbps):
    print("\n| server | requests | ran at once | output tok/s | decode tok/s, all together | "
          "TPOT (ms) | slowest TTFT (s) | moved to the tier (GB) | hot hit rate | "
          "copied per step (MB; ms at the bus rate) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['server']}, KV {r.get('kv_memory', '-')} | {r['concurrency']} | "
                  f"error: {r['error']} | | | | | | | |")
            continue
        together = f"{r['together_tok_s']:,.0f}" if r["together_tok_s"] else "-"
        tpot = f"{r['tpot_s'] * 1e3:.2f}" if r["tpot_s"] else "-"
        hits = f"{r['hit_rate'] * 100:.1f}%" if r.get("hit_rate") is not None else "-"
        copied = r.get("copied_bytes_per_step")
        copied = (f"{copied / 1e6:.2f}; {copied / bus_gbps / 1e6:.3f}" if copied is not None
                  else "-")
        print(f"| {r['server']}, KV {r.get('kv_memory', '-')} | {r['concurrency']} | "
              f"{r['max_running']:.0f} | "
              f"{r['output_tok_s']:,.0f} | {together} | {tpot} | {r['ttft_max_s']:.2f} | "
              f"{r['moved_bytes'] / 1e9:.2f} | {hits} | {copied} |")
    print(f"\nTop-k latents a decode step of one offloaded request reads from host memory: "
          f"{read_bytes / 1e6:.1f} MB; at the bus rate of {bus_gbps:.1f} GB/s (pinned host -> "
          f"device copy, same machine) that is {read_bytes / bus_gbps / 1e6:.3f} ms per request "
          f"and step.")


def plot(path, rows, levels, title):
    """Decode tok/s while all the round's requests decode together, against the requests sent
    (a server that never ran them all at once has no point there)."""
    series = []
    for label in dict.fromkeys(r["server"] for r in rows):
        points = [(r["concurrency"], r["together_tok_s"]) for r in rows
                  if r["server"] == label and "error" not in r and r.get("together_tok_s")]
        if points:
            series.append((label, points))
    if series:
        common.line_chart(path, series, title=title, x_label="concurrent requests",
                          y_label="decode tok/s, all decoding together", x_ticks=levels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plot-from", help="only redraw the chart of an earlier --json")
    parser.add_argument("--megactx")
    parser.add_argument("--checkpoint", help="the benchmark config's checkpoint (made if absent)")
    parser.add_argument("--model", help="an existing model folder instead (models/default)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test without CUDA flags")
    parser.add_argument("--config", default=os.path.join(
        HERE, "..", "..", "bench", "cuda", "configs", "glm52_attention.json"))
    parser.add_argument("--context", type=int, default=131072)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--kv-memory", default="3GiB")
    parser.add_argument("--plain-kv-memory", help="the plain server's budget (default: --kv-memory)")
    parser.add_argument("--host-latent-memory", default="24GiB")
    parser.add_argument("--max-prefill-tokens", type=int, default=16384)
    parser.add_argument("--bus-gbps", type=float, default=None)
    parser.add_argument("--skip-plain", action="store_true",
                        help="only the tier servers (A/B runs of the variants)")
    parser.add_argument("--variants", default="live host tier:",
                        help="tier servers, each LABEL:ENV=VALUE+ENV=VALUE (see above)")
    parser.add_argument("--request-timeout", type=float, default=600)
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--json")
    parser.add_argument("--phase-times", action="store_true",
                        help="print each server's CUDA and engine phase times as it exits")
    parser.add_argument("--plot")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    args.serve_args = [a for a in args.serve_args if a != "--"]
    if not args.plot_from and not args.megactx:
        parser.error("--megactx is required (unless --plot-from)")
    if args.plot_from:
        with open(args.plot_from) as f:
            data = json.load(f)
        rows = data["rows"]
        levels = sorted({r["concurrency"] for r in rows})
        plot(args.plot, rows, levels, f"{rows[0]['context'] // 1024}K-token requests, "
             f"--kv-memory {data['kv_memory']}")
        return
    args.levels = [int(c) for c in args.concurrency.split(",")]
    if not args.model and not common.has_checkpoint(args.checkpoint):
        common.make_checkpoint(args.config, args.checkpoint)
    with open(os.path.join(args.model or args.checkpoint, "config.json")) as f:
        config = json.load(f)
    vocab = config["vocab_size"]
    bus = args.bus_gbps if args.bus_gbps else measure_bus_gbps()
    entry = config["kv_lora_rank"] + 4 * (config["kv_lora_rank"] // 128) + \
        2 * config["qk_rope_head_dim"]
    read_bytes = config["num_hidden_layers"] * min(args.context, config["index_topk"]) * entry
    rows = []
    plans = {}
    if not args.skip_plain:
        plans["plain"] = run_server(args, "plain", [], vocab, rows,
                                    args.plain_kv_memory or args.kv_memory)
    for variant in args.variants.split(","):
        label, _, settings = variant.partition(":")
        env = dict(item.split("=", 1) for item in settings.split("+") if item)
        saved = dict(os.environ)
        os.environ.update(env)
        try:
            plans[label] = run_server(
                args, label, ["--host-latent-memory", args.host_latent_memory], vocab, rows,
                args.kv_memory)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    print_table(rows, read_bytes, bus)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "bus_gbps": bus, "read_bytes_per_step": read_bytes,
                       "plans": plans, "kv_memory": args.kv_memory,
                       "host_latent_memory": args.host_latent_memory}, f, indent=1)
    if args.plot:
        plot(args.plot, rows, args.levels,
             f"{args.context // 1024}K-token requests, --kv-memory {args.kv_memory}")


if __name__ == "__main__":
    main()
