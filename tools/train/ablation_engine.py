#!/usr/bin/python3
"""The MTP ablation's accepted lengths measured in the C++ engine: each run's MTP layer (pipeline.py
--ablation-only writes RUN.safetensors into its ablation bundle) is put into a copy of the target's
folder (mtp_variant_model.variant_folder) and served by `megactx serve`, which drafts k = 1, 3, 7
tokens and verifies them (tools/bench/mtp_serve_bench.py: concurrent /generate requests on windows of
real text, the accepted length from /metrics). Each run is measured three ways, the pipeline's
PyTorch metrics' names kept so that ablation_table.py lays the result out like GLM-5.2's table:

  T0_k*             greedy (drafts accepted while they equal the target's argmax)
  T1_rejection_k*   temperature 1, rejection sampling (--spec-verify rejection)
  T1_strict_k*      temperature 1, a draft accepted only when it equals the target's own sample
                    (--spec-verify target-only)

Runs of the no-sharing variant are served with --speculative-no-share (every draft step its own KV
and top-k), the others with IndexShare / KVShare. The target's own MTP layer is measured as the row
"shipped".

    /usr/bin/python3 tools/train/ablation_engine.py --megactx build-cpu/megactx --target models/default \\
        --tensors OUT/ablation --json engine.json
    /usr/bin/python3 tools/train/ablation_table.py engine.json

Arguments after -- go to every `megactx serve` (e.g. --device cuda). Top-p is 1 unless --top-p says
otherwise: the full softmax, as the trainer's estimate uses.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from ablation import ABLATION_VARIANTS, split_run  # noqa: E402
from mtp_variant_model import variant_folder  # noqa: E402

BENCH = os.path.join(REPO, "tools", "bench", "mtp_serve_bench.py")
MODES = (("T0", 0.0, "rejection"), ("T1_rejection", 1.0, "rejection"), ("T1_strict", 1.0, "target-only"))


def measure(args, model_dir, share, serve_args):
    """{metric: accepted length} of one model folder, every mode and k."""
    out = {}
    ks = ",".join(str(k) for k in args.ks)
    for name, temperature, verify in MODES:
        with tempfile.TemporaryDirectory() as tmp:
            rows_path = os.path.join(tmp, "rows.json")
            command = [sys.executable, BENCH, "--megactx", args.megactx, "--model", model_dir, "--steps", ks,
                       "--concurrency", str(args.concurrency), "--prompt-tokens", str(args.prompt_tokens),
                       "--new-tokens", str(args.new_tokens), "--rounds", "1", "--temperature", str(temperature),
                       "--top-p", str(args.top_p), "--kv-memory", args.kv_memory, "--json", rows_path,
                       "--text", args.text, "--", "--spec-verify", verify,
                       *([] if share else ["--speculative-no-share"]), *serve_args]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError("{} failed:\n{}{}".format(" ".join(command), done.stdout[-2000:],
                                                               done.stderr[-2000:]))
            with open(rows_path) as f:
                for row in json.load(f):
                    out["{}_k{}".format(name, row["k"])] = row["accepted_length"]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--target", required=True, help="the frozen target's model folder")
    parser.add_argument("--tensors", required=True, help="a folder of RUN.safetensors (the ablation bundle)")
    parser.add_argument("--runs", default="", help="comma list of runs (default: every RUN.safetensors there)")
    parser.add_argument("--ks", default="1,3,7", help="draft lengths")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--kv-memory", default="2GiB")
    parser.add_argument("--text", default=os.path.join(REPO, "tests", "default_model", "passkey_8k_ids.txt"),
                        help="comma-separated token ids the prompts are cut from (default: the passkey fixture's)")
    parser.add_argument("--no-shipped", action="store_true", help="do not measure the target's own MTP layer")
    parser.add_argument("--json", required=True, help="results, as pipeline.py's mtp_ablation")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    serve_args = argv[split + 1:]
    try:
        args.ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        parser.error("--ks: a comma list of integers, got {!r}".format(args.ks))
    if not args.ks or any(not 1 <= k <= 7 for k in args.ks):
        parser.error("--ks: draft lengths from 1 to 7")
    if args.concurrency < 1 or args.prompt_tokens < 8 or args.new_tokens < 1:
        parser.error("--concurrency and --new-tokens must be at least 1, --prompt-tokens at least 8")
    if not os.path.isfile(os.path.join(args.target, "model.safetensors")):
        parser.error("{} is not a model folder".format(args.target))
    if not os.path.isfile(args.text):
        parser.error("no token-id file {}".format(args.text))
    if not os.path.isdir(args.tensors):
        parser.error("{} is not a folder".format(args.tensors))
    found = sorted(f[:-len(".safetensors")] for f in os.listdir(args.tensors) if f.endswith(".safetensors"))
    runs = [r.strip() for r in args.runs.split(",") if r.strip()] or found
    for run in runs:
        if split_run(run) is None:
            parser.error("{}: not a run's name (VARIANT_seedN, VARIANT one of {})".format(
                run, ", ".join(ABLATION_VARIANTS)))
        if run not in found:
            parser.error("{} holds no {}.safetensors".format(args.tensors, run))
    if not runs:
        parser.error("{} holds no run's tensors".format(args.tensors))

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            share = ABLATION_VARIANTS[split_run(run)[0]][0]
            folder = os.path.join(tmp, run)
            variant_folder(args.target, os.path.join(args.tensors, run + ".safetensors"), folder)
            results[run] = measure(args, folder, share, serve_args)
            print("{}: {}".format(run, json.dumps(results[run])), flush=True)
    if not args.no_shipped:
        results["shipped"] = measure(args, args.target, True, serve_args)
        print("shipped: {}".format(json.dumps(results["shipped"])), flush=True)
    with open(args.json, "w") as f:
        json.dump({"mtp_ablation": results, "engine": {
            "serve_args": serve_args, "concurrency": args.concurrency, "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens, "top_p": args.top_p}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
