"""How many requests a `megactx serve` configuration runs at once from one KV budget.

Starts one server per configuration (the same --kv-memory, a budget per rank), sends
`--requests` prompts of `--prompt-tokens` token ids at once (greedy, `ignore_eos`,
`--new-tokens` each), polls /metrics while they run and reports the KV pages, the peak of
running requests (megactx_num_running_reqs; with --enable-dp-attention also per rank), the
preemptions and the wall time of the batch. Configurations are separated by `;` in
`--configs`, each a list of serve arguments.

  python3 tools/bench/concurrency_serve_bench.py --megactx build/megactx --model models/default \
      --kv-memory 12MiB --configs "--tensor-parallel-size 2 --expert-parallel-size 2; \
      --tensor-parallel-size 2 --expert-parallel-size 2 --enable-dp-attention"

Stdlib only.
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "e2e"))
from megactx_server import MegactxServer  # noqa: E402


def get(url):
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read().decode()


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=3600) as response:
        return json.loads(response.read())


def running(metrics):
    """(running requests, {dp rank: running}) from a /metrics text."""
    total, ranks = 0, {}
    for line in metrics.splitlines():
        if line.startswith("megactx_num_running_reqs "):
            total = int(float(line.split()[1]))
        match = re.match(r'megactx_dp_rank_running_reqs\{dp_rank="(\d+)"\} (\S+)', line)
        if match:
            ranks[int(match.group(1))] = int(float(match.group(2)))
    return total, ranks


def measure(args, serve_args):
    rng = random.Random(1)
    prompts = [[rng.randrange(100, 8000) for _ in range(args.prompt_tokens)]
               for _ in range(args.requests)]
    with MegactxServer(args.megactx, args.model, *serve_args, kv_memory=args.kv_memory,
                       name="bench") as server:
        pages = next((int(m.group(1)) for line in server.log
                      for m in [re.search(r"KV cache: (\d+) pages", line)] if m), 0)
        peak, peak_ranks, done = 0, {}, threading.Event()

        def poll():
            nonlocal peak, peak_ranks
            while not done.is_set():
                total, ranks = running(get(server.url + "/metrics"))
                if total > peak:
                    peak, peak_ranks = total, ranks
                time.sleep(0.05)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            list(pool.map(lambda ids: post(server.url + "/generate", {
                "input_ids": ids, "sampling_params": {
                    "temperature": 0, "max_new_tokens": args.new_tokens, "ignore_eos": True}}),
                prompts))
        seconds = time.perf_counter() - start
        done.set()
        poller.join()
        stats = json.loads(get(server.url + "/ui/stats"))
    return pages, peak, peak_ranks, stats["engine"]["preemptions"], seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", default="models/default")
    parser.add_argument("--kv-memory", default="12MiB")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--configs", required=True, help="serve argument lists, ';'-separated")
    args = parser.parse_args()
    print(f"--kv-memory {args.kv_memory}; {args.requests} requests at once, {args.prompt_tokens} "
          f"prompt + {args.new_tokens} new tokens each")
    print("| serve arguments | KV pages | peak running requests (per rank) | preemptions | "
          "wall s |")
    print("|---|---|---|---|---|")
    for config in args.configs.split(";"):
        serve_args = config.split()
        pages, peak, ranks, preemptions, seconds = measure(args, serve_args)
        per_rank = f" ({', '.join(str(ranks[r]) for r in sorted(ranks))})" if ranks else ""
        print(f"| `{config.strip() or '(one process)'}` | {pages} | {peak}{per_rank} | "
              f"{preemptions} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
