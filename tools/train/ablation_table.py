#!/usr/bin/python3
"""The MTP ablation's table from one or more pipeline results.json files (pipeline.py --ablation-only,
possibly one device call per group of runs with --ablation-runs), laid out like GLM-5.2's table.

    /usr/bin/python3 tools/train/ablation_table.py OUT1/results.json [OUT2/results.json ...]

Rows, as GLM-5.2 lists them: (1) no sharing, CE loss, strict matching at T=1 (accept a draft only
when it equals the target's own sample); (2) + IndexShare / KVShare; (3) + rejection sampling; (4) +
the TV loss. Each cell is the mean over the variant's seeds and, in brackets, their spread (max -
min). A row's "separated" column says whether its difference from the row above exceeds the larger
of the two rows' spreads at every k (what issue 23 asks of the training budget). The last column is
GLM-5.2's published accepted length for the row. A run found in two files is an error: each run must
come from one call.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ablation import ablation_summary, split_run  # noqa: E402

GLM52 = [4.56, 5.10, 5.29, 5.47]
ROWS = [  # (label, variant, metric prefix)
    ("no sharing, CE, strict match", "no_share_ce", "T1_strict"),
    ("+ IndexShare / KVShare", "share_ce", "T1_strict"),
    ("+ rejection sampling", "share_ce", "T1_rejection"),
    ("+ TV loss", "share_ce_tv", "T1_rejection"),
]
KS = (1, 3, 7)


def merge(paths):
    runs = {}
    for path in paths:
        with open(path) as f:
            ablation = json.load(f).get("mtp_ablation", {})
        for key, metrics in ablation.items():
            if split_run(key) is None:
                continue  # a summary written by the pipeline: recomputed over every file's runs
            if key in runs:
                raise SystemExit("{}: run {} is also in an earlier file".format(path, key))
            runs[key] = metrics
    return runs


def cell(summary, runs, variant, metric):
    """(mean, spread) over the variant's seeds; (value, None) for one seed; (None, None) when no run
    has the metric (e.g. a measurement without k = 7)."""
    if variant in summary and metric in summary[variant]:
        value = summary[variant][metric]
        return value["mean"], value["spread"]
    single = [m[metric] for k, m in runs.items() if split_run(k)[0] == variant and metric in m]
    return (single[0], None) if single else (None, None)


def table(runs):
    summary = ablation_summary(runs)
    lines = ["| configuration | seeds | " + " | ".join("T=1, k={}".format(k) for k in KS) +
             " | T=0, k=7 | separated from the row above | GLM-5.2 |",
             "|---|---|" + "---|" * len(KS) + "---|---|---|"]
    previous = None
    for (label, variant, prefix), glm in zip(ROWS, GLM52):
        cells = [cell(summary, runs, variant, "{}_k{}".format(prefix, k)) for k in KS]
        greedy = cell(summary, runs, variant, "T0_k7")
        seeds = summary.get(variant, {}).get("seeds") or sorted(
            split_run(k)[1] for k in runs if split_run(k)[0] == variant)

        def show(value):
            mean, spread = value
            if mean is None:
                return "-"
            return "{:.2f}".format(mean) + ("" if spread is None else " ({:.2f})".format(spread))

        separated = "-"
        if previous is not None and all(c[0] is not None and p[0] is not None for c, p in zip(cells, previous)):
            if all(c[1] is not None and p[1] is not None for c, p in zip(cells, previous)):
                separated = "yes" if all(abs(c[0] - p[0]) > max(c[1], p[1]) for c, p in zip(cells, previous)) \
                    else "no"
            else:
                separated = "one seed: unknown"
        lines.append("| {} | {} | {} | {} | {} | {} |".format(
            label, ",".join(map(str, seeds)) or "-", " | ".join(show(c) for c in cells), show(greedy), separated,
            "{:.2f}".format(glm)))
        previous = cells
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="pipeline results.json files")
    args = parser.parse_args()
    runs = merge(args.results)
    if not runs:
        raise SystemExit("no MTP ablation runs in {}".format(", ".join(args.results)))
    print(table(runs))


if __name__ == "__main__":
    main()
