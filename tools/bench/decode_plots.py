#!/usr/bin/env python3
"""Charts of a decode sweep through `megactx serve` (the --json rows of
mtp_serve_bench.py, one file per prompt length): decode tok/s against the
number of concurrent requests, one curve per MTP step count k, one SVG per
prompt length, and the speed-up of each k over k = 0.

  python3 tools/bench/decode_plots.py OUT_DIR decode_1024.json decode_8192.json

A file's prompt length is the number in its name. Stdlib only.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from svg_plot import line_chart  # noqa: E402


def curves(rows, value):
    by_k = {}
    for row in rows:
        if row.get(value) is not None and row[value] > 0:
            by_k.setdefault(row["k"], []).append((row["concurrency"], row[value]))
    return [(f"k = {k}" + (" (plain)" if k == 0 else ""), sorted(points))
            for k, points in sorted(by_k.items())]


def speedups(rows):
    plain = {row["concurrency"]: row["decode_tok_s"] for row in rows if row["k"] == 0}
    by_k = {}
    for row in rows:
        if row["k"] > 0 and plain.get(row["concurrency"], 0) > 0:
            by_k.setdefault(row["k"], []).append(
                (row["concurrency"], row["decode_tok_s"] / plain[row["concurrency"]]))
    return [(f"k = {k}", sorted(points)) for k, points in sorted(by_k.items())]


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = sys.argv[1]
    for path in sys.argv[2:]:
        rows = json.load(open(path))
        match = re.search(r"(\d+)", os.path.basename(path))
        prompt = match.group(1) if match else "?"
        concurrency = sorted({row["concurrency"] for row in rows})
        line_chart(os.path.join(out_dir, f"decode_{prompt}.svg"), curves(rows, "decode_tok_s"),
                   title=f"Decode through serve, prompts of {prompt} tokens",
                   x_label="concurrent requests", y_label="decode tok/s", log_x=True, log_y=True,
                   x_ticks=concurrency)
        gains = speedups(rows)
        if gains:
            line_chart(os.path.join(out_dir, f"mtp_speedup_{prompt}.svg"), gains,
                       title=f"MTP decode tok/s over plain decoding, prompts of {prompt} tokens",
                       x_label="concurrent requests", y_label="x plain decoding", log_x=True,
                       x_ticks=concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
