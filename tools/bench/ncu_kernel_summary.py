#!/usr/bin/env python3
"""Where a GPU run spends its kernel time: an Nsight Compute CSV summed per kernel.

The GPU machine has no Nsight Systems; ncu with one metric per kernel is the
per-kernel timeline there. Profile only the region that matters (the benchmarks
bracket their timed steps with cudaProfilerStart/Stop) and summarise:

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw \\
        --clock-control none --log-file ncu.csv model_decode_bench --graphs off ...
    python3 tools/bench/ncu_kernel_summary.py ncu.csv --per 16 --title "glm_1b batch 1"

--per N divides the totals by N (the timed steps), so the table reads per step.
--timeline also lists the last step's launches in order (kernel, grid, us): how two
runs of the same model with different kernels compare linear by linear.
Kernels are grouped by their base name (template arguments and parameters cut);
ncu serialises the kernels, so the sum is the device time without overlap.
"""
import argparse
import collections
import csv
import re
import sys

UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}


def base_name(name: str) -> str:
    name = re.sub(r"\(.*$", "", name)  # parameters
    depth, out = 0, []
    for ch in name:  # template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    name = "".join(out).strip()
    name = re.sub(r"^(void|auto)\s+", "", name)
    return name.split("::")[-1] if "megactx" in name or "cub" in name else name


def read(path: str):
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own log lines start with ==
    rows = list(csv.reader(lines))
    if not rows:
        return []
    header, rest = rows[0], rows[1:]
    scale = 1e-3
    if rest and rest[0][header.index("Kernel Name")] == "":
        unit = rest[0][header.index("gpu__time_duration.sum")]
        scale = UNITS.get(unit, 1e-3)
        rest = rest[1:]
    name_col, time_col = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
    grid_col = header.index("Grid Size") if "Grid Size" in header else None
    out = []
    for row in rest:
        try:
            us = float(row[time_col].replace(",", "")) * scale
        except ValueError:
            continue
        out.append((base_name(row[name_col]), row[grid_col] if grid_col is not None else "", us))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--per", type=float, default=1.0, help="divide totals by this (steps)")
    parser.add_argument("--title", default="")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--timeline", action="store_true",
                        help="also list the last step's launches in order")
    args = parser.parse_args()
    launches = read(args.csv)
    if not launches:
        print(f"ncu_kernel_summary: no kernels in {args.csv}", file=sys.stderr)
        return 1
    total = sum(us for _, _, us in launches)
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for name, _, us in launches:
        by_name[name][0] += 1
        by_name[name][1] += us
    print(f"\n### {args.title or args.csv}: {len(launches) / args.per:.0f} launches, "
          f"{total / args.per:.1f} us of kernel time per step\n")
    print("| kernel | launches / step | us / step | mean us | share |")
    print("|---|---|---|---|---|")
    for name, (count, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"| `{name}` | {count / args.per:.1f} | {us / args.per:.1f} | {us / count:.2f} | "
              f"{100.0 * us / total:.1f}% |")
    if args.timeline:
        step = launches[-round(len(launches) / args.per):]
        print("\n| # | kernel | grid | us |")
        print("|---|---|---|---|")
        for i, (name, grid, us) in enumerate(step):
            print(f"| {i} | `{name}` | {grid} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
