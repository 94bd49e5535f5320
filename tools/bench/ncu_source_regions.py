#!/usr/bin/env python3
"""Where a kernel's stall samples go, by region of its SASS: a loop against the rare code around it.

An Nsight Compute source export lists every SASS instruction with its execution count and warp
stall samples. In a streaming kernel the hot loop's instructions share one execution count (once
per iteration and warp), and code that runs less often (a selection, a tile's setup) shows up as
runs of smaller counts. This script splits the listing into contiguous runs of "loop" and "rare"
instructions and prints each run's share of the samples, so that a question like "how much of a
short row's time is selection?" has a number:

    ncu --set full --import-source yes -k regex:fused_indexer_topk_kernel --launch-count 2 \\
        -o prof indexer_prefill_bench --fused-only --case '32K prompt'
    ncu -i prof.ncu-rep --page source --csv --print-source sass > prof.csv
    python3 tools/bench/ncu_source_regions.py prof.csv --reference QGMMA

An instruction belongs to the loop when it ran at least --loop-fraction (0.45) times the highest
execution count among the instructions matching --reference (a regex on the SASS text, e.g. the
loop's MMA). Each profiled launch in the export is reported on its own. The file may be xz
compressed. The numbers in docs/benchmarks.md ("The fused indexer prefill's selection, profiled")
came from it. --ranges 'name:first-last,...' then breaks named ranges down by stall reason
(--top N adds each range's hottest instructions): the fifty-first session's table of the fp8-ring
sparse MLA consumers came from

    python3 tools/bench/ncu_source_regions.py src.csv.xz --reference HGMMA --top 10 \\
        --ranges 'pre:0-971,scores:971-1809,softmax:2444-2685,output:2685-3411,producer:4435-4572'
"""
import argparse
import collections
import csv
import lzma
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def launches(path):
    """The export's launches, each a list of instruction rows (dicts)."""
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", newline="") as handle:
        lines = handle.read().splitlines()
    blocks, current = [], None
    for line in lines:
        if line.startswith('"Kernel Name"'):
            current = [line.split(",", 1)[1].strip().strip('"')]
            blocks.append(current)
        elif current is not None:
            current.append(line)
    # ncu writes each launch's listing twice in a row; keep one of each.
    unique = [block for i, block in enumerate(blocks) if i == 0 or block != blocks[i - 1]]
    return [(block[0], list(csv.DictReader(block[1:]))) for block in unique]


def number(text):
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return 0


def report(name, rows, reference, loop_fraction, min_share):
    total = sum(number(row[SAMPLES]) for row in rows)
    if total == 0:
        print(f"{name}: no samples\n")
        return
    counts = [number(row[EXECUTED]) for row in rows]
    matching = [c for row, c in zip(rows, counts) if reference.search(row["Source"])]
    if not matching:
        print(f"{name}: no instruction matches --reference\n")
        return
    threshold = loop_fraction * max(matching)
    stalls = [key for key in rows[0] if key.startswith("stall_") and "Not Issued" not in key]
    by_stall = collections.Counter()
    for row in rows:
        for key in stalls:
            by_stall[key] += number(row[key])
    in_loop = sum(number(row[SAMPLES]) for row, c in zip(rows, counts) if c >= threshold)
    print(f"{name}\n  samples {total}; loop (executed >= {threshold:.0f} times) "
          f"{100 * in_loop / total:.1f}%, rare code {100 * (total - in_loop) / total:.1f}%")
    print("  stalls: " + ", ".join(f"{key[6:]} {100 * value / total:.1f}%"
                                   for key, value in by_stall.most_common(8)))
    print("  | instructions | kind | executions per loop pass | samples | first instruction |")
    print("  |---|---|---|---|---|")
    start = 0
    while start < len(rows):
        hot = counts[start] >= threshold
        end = start
        while end < len(rows) and (counts[end] >= threshold) == hot:
            end += 1
        share = sum(number(row[SAMPLES]) for row in rows[start:end]) / total
        if share >= min_share:
            executed = sum(counts[start:end]) / max(matching)
            first = rows[start]["Source"].strip()[:48]
            print(f"  | {start}-{end} | {'loop' if hot else 'rare'} | {executed:.1f} | "
                  f"{100 * share:.1f}% | `{first}` |")
        start = end
    print()


def report_ranges(rows, ranges, top):
    """Named instruction ranges (from the table above or the SASS): each one's share of the
    samples, its instructions executed, its leading stall reasons and its hottest instructions."""
    total = sum(number(row[SAMPLES]) for row in rows)
    stalls = [key for key in rows[0] if key.startswith("stall_") and "Not Issued" not in key]
    print("  | range | instructions | samples | executed | leading stalls |")
    print("  |---|---|---|---|---|")
    for label, first, last in ranges:
        part = rows[first:last]
        samples = sum(number(row[SAMPLES]) for row in part)
        by_stall = collections.Counter()
        for row in part:
            for key in stalls:
                by_stall[key] += number(row[key])
        leading = ", ".join(f"{key[6:]} {100 * value / max(samples, 1):.0f}%"
                            for key, value in by_stall.most_common(5))
        executed = sum(number(row[EXECUTED]) for row in part)
        print(f"  | {label} | {first}-{last} | {100 * samples / max(total, 1):.1f}% | {executed} | "
              f"{leading} |")
    for label, first, last in ranges if top > 0 else []:
        print(f"\n  {label}: the {top} instructions with the most samples")
        hottest = sorted(range(first, min(last, len(rows))),
                         key=lambda i: -number(rows[i][SAMPLES]))[:top]
        for i in sorted(hottest):
            row = rows[i]
            reason = max(stalls, key=lambda key: number(row[key]))
            print(f"    {i:5d} {100 * number(row[SAMPLES]) / max(total, 1):5.2f}% "
                  f"x{number(row[EXECUTED])} {reason[6:]:>16}  {row['Source'].strip()[:72]}")
    print()


def parse_ranges(text):
    """'scores:971-1809,output:2685-3411' -> [(label, first, last)]."""
    ranges = []
    for item in filter(None, text.split(",")):
        label, span = item.rsplit(":", 1)
        first, last = (int(x) for x in span.split("-"))
        ranges.append((label, first, last))
    return ranges


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export", help="ncu --page source --csv --print-source sass output (.xz ok)")
    parser.add_argument("--reference", default="GMMA|HMMA",
                        help="regex for the loop's marker instructions (default: any MMA)")
    parser.add_argument("--loop-fraction", type=float, default=0.45)
    parser.add_argument("--min-share", type=float, default=0.01,
                        help="regions below this share of the samples are not listed")
    parser.add_argument("--ranges", default="",
                        help="named instruction ranges to break down, e.g. "
                             "'scores:971-1809,output:2685-3411' (indices as the table prints them)")
    parser.add_argument("--top", type=int, default=0,
                        help="with --ranges: list each range's N instructions with the most samples")
    args = parser.parse_args()
    reference = re.compile(args.reference)
    found = launches(args.export)
    if not found:
        sys.exit(f"{args.export}: no \"Kernel Name\" line; is it a --page source export?")
    for index, (name, rows) in enumerate(found):
        report(f"launch {index}: {name[:100]}", rows, reference, args.loop_fraction,
               args.min_share)
        if args.ranges:
            report_ranges(rows, parse_ranges(args.ranges), args.top)


if __name__ == "__main__":
    main()
