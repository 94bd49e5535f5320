#!/usr/bin/env python3
"""Two Nsight Compute profiles of one kernel side by side: what changed between two builds.

For a kernel that got slower (or faster) between builds, profile the same launch with each
build's binary in one call and list every metric whose value moved, largest change first:

    ncu --set full -k regex:fused_indexer_topk_kernel --launch-skip 2 --launch-count 1 \\
        --csv --page details --log-file old.csv old/indexer_prefill_bench --fused-only
    ncu ... --log-file new.csv new/indexer_prefill_bench --fused-only
    python3 tools/bench/ncu_compare.py old.csv new.csv --kernel fused_indexer --min-change 5

Each profile's values are averaged over the launches whose kernel name contains --kernel
(all launches without it); non-numeric metrics are compared as text. Stall reasons
(smsp__pcsamp_warps_issue_stalled_*, "Warp State" section), local memory traffic (spills)
and registers per thread are the usual suspects.
"""
import argparse
import collections
import csv
import sys


def number(text: str):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read(path: str, kernel: str):
    """{(section, metric, unit): [values]} over the matching launches of one details CSV."""
    values = collections.defaultdict(list)
    launches = set()
    with open(path, newline="") as handle:
        lines = [line for line in handle if line.startswith('"')]  # ncu's own log lines dropped
    for row in csv.DictReader(lines):
        name = row.get("Kernel Name", "")
        if kernel and kernel not in name:
            continue
        launches.add(row.get("ID", ""))
        key = (row.get("Section Name", ""), row.get("Metric Name", ""), row.get("Metric Unit", ""))
        values[key].append(row.get("Metric Value", ""))
    return values, len(launches)


def summary(values):
    """The mean of numeric values, else the text when every launch agrees."""
    numbers = [number(v) for v in values]
    if all(n is not None for n in numbers) and numbers:
        return sum(numbers) / len(numbers)
    return values[0] if len(set(values)) == 1 else " | ".join(sorted(set(values)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--kernel", default="", help="substring of the kernel name to keep")
    parser.add_argument("--min-change", type=float, default=2.0,
                        help="list numeric metrics that moved by at least this many percent")
    args = parser.parse_args()
    old, old_launches = read(args.old, args.kernel)
    new, new_launches = read(args.new, args.kernel)
    if not old_launches or not new_launches:
        print(f"no launch matches '{args.kernel}' ({old_launches} old, {new_launches} new)",
              file=sys.stderr)
        return 1
    print(f"{old_launches} old and {new_launches} new launches; metrics that moved by "
          f"{args.min_change:g}% or more, largest first\n")
    print("| section | metric | unit | old | new | change |")
    print("|---|---|---|---|---|---|")
    rows = []
    for key in sorted(set(old) | set(new)):
        a = summary(old[key]) if key in old else "-"
        b = summary(new[key]) if key in new else "-"
        if isinstance(a, float) and isinstance(b, float):
            base = max(abs(a), 1e-12)
            change = 100.0 * (b - a) / base
            if abs(change) >= args.min_change and a != b:
                rows.append((abs(change), key, f"{a:.4g}", f"{b:.4g}", f"{change:+.1f}%"))
        elif a != b:
            rows.append((float("inf"), key, str(a), str(b), "differs"))
    for _, (section, metric, unit), a, b, change in sorted(rows, key=lambda r: -r[0]):
        print(f"| {section} | {metric} | {unit} | {a} | {b} | {change} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
