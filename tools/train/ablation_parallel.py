#!/usr/bin/env python3
"""The MTP ablation's runs side by side on one device: one pipeline.py --ablation-only process per
run, all started at once, so a device call trains every run for most of its time instead of its
share of it.

Why: the default model is small (17M parameters), so one run's training steps leave the GPU mostly
idle (host-bound: ~5 steps of 8K tokens per second on an H100 in the thirty-third session); runs in
separate processes fill each other's gaps. Every run trains the same --steps (pipeline.py
--ablation-steps: the schedule runs over steps), so runs that get different shares of the device
still train alike; the time a run may take is capped at what the call leaves.

    python3 tools/train/ablation_parallel.py --out $OUT --runs no_share_ce:0,share_ce:0,share_ce_tv:0 \\
        --steps 1500 --total-s 560 -- --data .train-data-r4 --init-from models/default \\
        --curriculum 8192:1 --mix other:0.6,text:0.4 --passkey-n 0 --tokens-per-s 8192:85000 \
        --sparse-impl gather

Memory: runs side by side need the gather form of sparse attention (`--sparse-impl gather` after --,
O(T x k) scores; the default mask form holds [B, T, T] per layer, tens of GB per run at 4 x 8K rows);
--parallel N runs them in waves of N that share the time instead.

Each run writes OUT/<run>/ (its log.txt and results.json) and its MTP tensors; at the end the
launcher prints the merged table (ablation_table.py) and bundles everything a device call must
return into OUT/ablation_runs.tar.part* (`cat OUT/ablation_runs.tar.part* | tar -x -C DIR`: DIR/<run>/
results.json, log.txt and ablation/<run>.safetensors), since a call returns only a few files.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from ablation import ablation_runs  # noqa: E402


def worker_command(run, out, work, total_s, steps, pipeline_args, runs):
    name, seed = run
    # The data synthesis's processes: the machine's cores shared among the runs.
    workers = [] if "--workers" in pipeline_args else ["--workers", str(max(1, (os.cpu_count() or 1) // runs))]
    # Each worker's own clock: its training may take what is left after its set-up (data, baseline
    # evaluations: ~30 s alone, longer beside the others) and before its evaluation (~10 s alone).
    return [sys.executable, os.path.join(HERE, "pipeline.py"), *pipeline_args, "--ablation-only",
            "--ablation-runs", "{}:{}".format(name, seed), "--ablation-steps", str(steps),
            "--out", out, "--work", work, "--total-s", str(total_s),
            "--ablation-s", str(total_s), "--reserve-s", "30", *workers]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", required=True, help="VARIANT:SEED,... (tools/train/ablation.py)")
    ap.add_argument("--steps", type=int, required=True, help="training steps of every run")
    ap.add_argument("--total-s", type=float, required=True, help="wall-clock budget of the whole launcher")
    ap.add_argument("--work", default="/tmp/megactx-ablation", help="the workers' scratch folders")
    ap.add_argument("--parallel", type=int, default=0,
                    help="runs at once (0: all); more runs go in waves that share --total-s, for when all "
                         "of them would not fit in the device's memory together")
    ap.add_argument("--dry-run", action="store_true", help="print the workers' commands and stop")
    ap.add_argument("pipeline_args", nargs=argparse.REMAINDER, help="after --: passed to every pipeline.py")
    args = ap.parse_args()
    try:
        runs = ablation_runs(args.runs, 1)
    except ValueError as e:
        ap.error(str(e))
    if args.steps <= 0:
        ap.error("--steps must be > 0")
    pipeline_args = args.pipeline_args[1:] if args.pipeline_args[:1] == ["--"] else args.pipeline_args
    for flag in ("--out", "--work", "--ablation-runs", "--ablation-steps", "--ablation-only", "--total-s",
                 "--ablation-s", "--reserve-s"):
        if flag in pipeline_args:
            ap.error("{} is set by the launcher; do not pass it after --".format(flag))
    if args.parallel < 0:
        ap.error("--parallel must be >= 0")
    width = args.parallel or len(runs)
    waves = [runs[i:i + width] for i in range(0, len(runs), width)]
    start = time.time()
    worker_s = (args.total_s - 25.0) / len(waves)  # the bundle and the table after the workers
    if worker_s < 120:
        ap.error("--total-s {} leaves no time to train ({:.0f} s per wave)".format(args.total_s, worker_s))

    os.makedirs(args.out, exist_ok=True)
    jobs, failed = [], []
    for number, wave in enumerate(waves):
        wave_start = time.time()
        started = []
        for run in wave:
            key = "{}_seed{}".format(*run)
            out, work = os.path.join(args.out, key), os.path.join(args.work, key)
            shutil.rmtree(work, ignore_errors=True)
            command = worker_command(run, out, work, worker_s, args.steps, pipeline_args, len(wave))
            print("wave {} run {}: {}".format(number, key, " ".join(command)), flush=True)
            jobs.append(key)
            if args.dry_run:
                continue
            os.makedirs(out, exist_ok=True)
            stdout = open(os.path.join(out, "stdout.txt"), "w")
            started.append((key, out, work, subprocess.Popen(command, stdout=stdout, stderr=subprocess.STDOUT),
                            stdout))
        for key, out, work, process, stdout in started:
            try:
                code = process.wait(timeout=max(1.0, worker_s + 10.0 - (time.time() - wave_start)))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                code = "killed at the budget"
            stdout.close()
            print("run {} ended: {} ({:.0f}s)".format(key, code, time.time() - start), flush=True)
            if code != 0:
                failed.append(key)
            # The run's MTP tensors beside its results (the worker's own bundle is dropped: one bundle).
            tensors = os.path.join(work, "ablation")
            if os.path.isdir(tensors):
                shutil.copytree(tensors, os.path.join(out, "ablation"), dirs_exist_ok=True)
            for entry in os.listdir(out):
                if entry.startswith("ablation.tar.part"):
                    os.remove(os.path.join(out, entry))
    if args.dry_run:
        return 0

    results = [os.path.join(args.out, key, "results.json") for key in jobs]
    present = [path for path in results if os.path.isfile(path)]
    if present:
        subprocess.run([sys.executable, os.path.join(HERE, "ablation_table.py"), *present])
    tar = os.path.join(args.work, "ablation_runs.tar")
    subprocess.run(["tar", "cf", tar, "-C", args.out, *[key for key in jobs if os.path.isdir(os.path.join(args.out, key))]],
                   check=True)
    subprocess.run(["split", "-b", "15m", "-d", tar, os.path.join(args.out, "ablation_runs.tar.part")],
                   check=True)
    for key in jobs:  # only the bundle comes back
        shutil.rmtree(os.path.join(args.out, key), ignore_errors=True)
    print("bundled {} runs into {}/ablation_runs.tar.part* ({:.0f}s in all){}".format(
        len(jobs), args.out, time.time() - start, "; failed: " + ", ".join(failed) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
