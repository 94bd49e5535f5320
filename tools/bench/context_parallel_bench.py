"""Time to first token of one long prompt through `megactx serve`, context parallel against
one process in the same run: one process with MEGACTX_THREADS threads and with one thread,
and `--context-parallel-size N` ranks with one thread each (N = the threads, so that both
use the same cores). Best of --repeat runs, the prefix cache flushed before each; the first
token of every configuration must be the same.

    python3 tools/bench/context_parallel_bench.py --megactx build/megactx \\
        --model models/default --length 4096 --threads 2
"""
import argparse
import os
import sys
import time

import requests

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "e2e"))
from megactx_server import MegactxServer  # noqa: E402

IDS_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "default_model",
                        "passkey_8k_ids.txt")


def first_token_seconds(args, prompt, extra, threads):
    """(best seconds to the first token, the first token id) of one server configuration."""
    os.environ["MEGACTX_THREADS"] = str(threads)
    common = ("--skip-tokenizer-init", "--kv-dtype", "f32", "--max-prefill-tokens",
              str(args.length), "--context-length", str(2 * args.length))
    best, token = None, None
    with MegactxServer(args.megactx, args.model, *common, *extra, name="cp") as server:
        for _ in range(args.repeat):
            requests.post(server.url + "/flush_cache", timeout=60)
            start = time.time()
            reply = requests.post(server.url + "/generate", json={
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0}}, timeout=1200).json()
            elapsed = time.time() - start
            best = elapsed if best is None else min(best, elapsed)
            token = reply["output_ids"]
    return best, token


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--length", type=int, default=4096, help="prompt tokens (at most 8192)")
    parser.add_argument("--threads", type=int, default=2, help="cores to use, = ranks")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    prompt = [int(t) for t in open(IDS_FILE).read().replace(",", " ").split()][:args.length]
    rows = [
        (f"one process, {args.threads} threads", (), args.threads),
        ("one process, 1 thread", (), 1),
        (f"--context-parallel-size {args.threads}, 1 thread each",
         ("--context-parallel-size", str(args.threads)), 1),
    ]
    results = [(name, *first_token_seconds(args, prompt, extra, threads))
               for name, extra, threads in rows]
    print(f"\n{len(prompt)}-token prompt, {os.path.basename(os.path.abspath(args.model))}, "
          f"best of {args.repeat}\n")
    print("| configuration | time to first token | vs the first row |")
    print("|---|---|---|")
    for name, seconds, _ in results:
        print(f"| {name} | {seconds:.2f} s | {results[0][1] / seconds:.2f}x |")
    same = all(token == results[0][2] for _, _, token in results)
    print(f"\nthe same first token in every configuration: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
