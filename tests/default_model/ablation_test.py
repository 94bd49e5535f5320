"""The MTP ablation's bookkeeping (tools/train/ablation.py, ablation_table.py) on made-up results:
run lists parse or fail with a clear error, seeds of one variant are summarised by their mean and
spread, runs from several device calls merge into one table (a run in two files is an error), and
a row is "separated" only when its difference from the row above exceeds both rows' spreads at every
k. Stdlib only; < 1 s."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOLS = os.path.join(ROOT, "tools", "train")
sys.path.insert(0, TOOLS)

from ablation import ablation_runs, ablation_summary, split_run  # noqa: E402


def metrics(base):
    """Accepted lengths growing with k, `base` shifting a whole run."""
    out = {}
    for k in (1, 3, 7):
        out["T0_k{}".format(k)] = base + 0.3 * k
        out["T1_rejection_k{}".format(k)] = base + 0.35 * k
        out["T1_strict_k{}".format(k)] = base + 0.2 * k
    return out


def check_runs():
    assert ablation_runs("", 2) == [(v, s) for v in ("no_share_ce", "share_ce", "share_ce_tv") for s in (0, 1)]
    assert ablation_runs(" share_ce:3 ,no_share_ce:0", 1) == [("share_ce", 3), ("no_share_ce", 0)]
    for bad, words in (("share:0", "unknown"), ("share_ce", "VARIANT:SEED"), ("share_ce:x", "VARIANT:SEED"),
                       ("share_ce:0,share_ce:0", "twice")):
        try:
            ablation_runs(bad, 1)
        except ValueError as e:
            assert words in str(e), (bad, e)
        else:
            raise AssertionError("{!r} was accepted".format(bad))
    assert split_run("share_ce_tv_seed12") == ("share_ce_tv", 12)
    assert split_run("share_ce") is None and split_run("other_seed1") is None
    print("ablation_runs: lists parse, bad ones fail with a reason")


def check_summary():
    results = {"share_ce_seed0": metrics(1.0), "share_ce_seed1": metrics(1.2), "no_share_ce_seed0": metrics(0.5),
               "share_ce": {"T0_k1": {"mean": 0, "spread": 0}}}  # an old summary: not a run
    summary = ablation_summary(results)
    assert set(summary) == {"share_ce"}, summary  # one seed gives no spread
    assert abs(summary["share_ce"]["T0_k1"]["mean"] - 1.4) < 1e-9
    assert abs(summary["share_ce"]["T0_k1"]["spread"] - 0.2) < 1e-9
    assert summary["share_ce"]["seeds"] == [0, 1]
    print("ablation_summary: mean and spread over a variant's seeds")


def check_table():
    calls = [
        {"no_share_ce_seed0": metrics(1.0), "no_share_ce_seed1": metrics(1.02),
         "share_ce_seed0": metrics(1.5)},
        {"share_ce_seed1": metrics(1.55), "share_ce_tv_seed0": metrics(1.3), "share_ce_tv_seed1": metrics(1.9)},
    ]
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, runs in enumerate(calls):
            paths.append(os.path.join(tmp, "results{}.json".format(i)))
            with open(paths[-1], "w") as f:
                json.dump({"mtp_ablation": runs}, f)
        tool = os.path.join(TOOLS, "ablation_table.py")
        out = subprocess.run([sys.executable, tool] + paths, capture_output=True, text=True, check=True).stdout
        rows = [line for line in out.splitlines() if line.startswith("| ") and "configuration" not in line]
        assert len(rows) == 4, out
        cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
        assert cells[0][1] == "0,1" and cells[0][2] == "1.21 (0.02)", cells[0]  # strict, k=1
        assert cells[1][6] == "yes", cells[1]  # 1.5-1.55 against 1.0-1.02, spreads 0.05 and 0.02
        assert cells[2][6] == "yes" and cells[2][2] == "1.88 (0.05)", cells[2]  # rejection of the same runs
        assert cells[3][6] == "no", cells[3]  # share_ce_tv's spread 0.6 swallows the difference
        assert cells[3][7] == "5.47", cells[3]
        again = subprocess.run([sys.executable, tool, paths[0], paths[0]], capture_output=True, text=True)
        assert again.returncode != 0 and "also in an earlier file" in again.stderr, again
    print("ablation_table.py: two calls merged, separation judged against the spreads")


if __name__ == "__main__":
    check_runs()
    check_summary()
    check_table()
