#!/usr/bin/env python3
"""Peer baseline for tokenizer_bench: HF `tokenizers` encoding the same inputs.

    build/tokenizer_bench --dump /tmp/tokbench          # writes en.txt, zh.txt, ...
    python3 bench/tokenizer/hf_baseline.py --model tests/fixtures/tokenizer/glm \
        --inputs /tmp/tokbench

Prints the same columns as tokenizer_bench (single thread, add_special_tokens
off; "cold" = first encode of a freshly loaded tokenizer, "warm" = best of 3).
Needs tokenizers (the GPU machine has 0.23).
"""
import argparse
import os
import time

from tokenizers import Tokenizer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--inputs", required=True)
    args = parser.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    print(f"{'input':<10} {'MB':>8} {'tokens':>10} {'B/token':>8} {'cold MB/s':>10} "
          f"{'warm MB/s':>10}")
    for name in ("en", "zh", "zh-unique"):
        path = os.path.join(args.inputs, name + ".txt")
        if not os.path.exists(path):
            continue
        text = open(path, encoding="utf-8").read()
        size = len(text.encode("utf-8")) / 1e6
        tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
        start = time.perf_counter()
        tokens = len(tok.encode(text, add_special_tokens=False).ids)
        cold = time.perf_counter() - start
        warm = min(timed(tok, text) for _ in range(3))
        print(f"{name:<10} {size:8.2f} {tokens:10d} {size * 1e6 / tokens:8.2f} "
              f"{size / cold:10.1f} {size / warm:10.1f}")


def timed(tok, text):
    start = time.perf_counter()
    tok.encode(text, add_special_tokens=False)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
