"""The DSA indexer under tensor parallelism, replicated on every rank against split over the
ranks' heads (`--split-indexer`: each rank scores the context with its share of the indexer's
heads, an all_reduce of [rows, context] floats per indexer layer adds them), through
`megactx serve --tensor-parallel-size N` in the same run: time to the first token of one long
prompt and decode tokens/s after it, best of --repeat runs with the prefix cache flushed before
each. Both must produce the same tokens.

    python3 tools/bench/indexer_split_bench.py --megactx build/megactx --model models/default \\
        --length 4096 --ranks 2
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


def measure(args, prompt, extra):
    """(best seconds to the first token, best decode tokens/s, output ids) of one configuration."""
    common = ("--skip-tokenizer-init", "--kv-dtype", "f32", "--max-prefill-tokens",
              str(args.length), "--context-length", str(args.length + args.new_tokens + 64),
              "--tensor-parallel-size", str(args.ranks))
    best_first, best_decode, ids = None, None, None
    with MegactxServer(args.megactx, args.model, *common, *extra, name="indexer") as server:
        for _ in range(args.repeat):
            requests.post(server.url + "/flush_cache", timeout=60)
            start = time.time()
            requests.post(server.url + "/generate", json={
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0}}, timeout=1200)
            first = time.time() - start
            # The same prompt again, now cached: what is left is its decode.
            start = time.time()
            reply = requests.post(server.url + "/generate", json={
                "input_ids": prompt, "sampling_params": {
                    "max_new_tokens": args.new_tokens, "temperature": 0, "ignore_eos": True}},
                timeout=1200).json()
            decode = (args.new_tokens - 1) / (time.time() - start)
            best_first = first if best_first is None else min(best_first, first)
            best_decode = decode if best_decode is None else max(best_decode, decode)
            ids = reply["output_ids"]
    return best_first, best_decode, ids


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--length", type=int, default=4096, help="prompt tokens (at most 8192)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    text = [int(t) for t in open(IDS_FILE).read().replace(",", " ").split()]
    prompt = text[:args.length]
    print(f"prompt {len(prompt)} tokens, {args.new_tokens} new, --tensor-parallel-size "
          f"{args.ranks}, MEGACTX_THREADS={os.environ.get('MEGACTX_THREADS', 'unset')}, "
          f"best of {args.repeat}\n")
    print("| indexer | time to first token s | decode tok/s |\n|---|---|---|")
    outputs = []
    for name, extra in (("replicated", ()), ("split (--split-indexer)", ("--split-indexer",))):
        first, decode, ids = measure(args, prompt, extra)
        outputs.append(ids)
        print(f"| {name} | {first:.3f} | {decode:.1f} |")
    same = outputs[0] == outputs[1]
    print(f"\nthe same output ids: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
