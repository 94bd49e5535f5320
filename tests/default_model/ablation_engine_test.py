#!/usr/bin/python3
"""tools/train/ablation_engine.py (the MTP ablation's accepted lengths through `megactx serve`) on the
CPU, with two "runs" whose MTP tensors are the shipped layer's own: both runs and the shipped model
must measure exactly alike in every mode (greedy, rejection sampling, strict matching; requests are
seeded and the servers batch-invariant, --deterministic, so that which requests share a step cannot
move a sample; the engine publishes a step's counters before it delivers the step's tokens, so
/metrics read after a round holds the round's last verification). Every accepted length lies in
[1, k + 1], ablation_table.py lays the file out, and bad arguments (an unknown run, a draft length
past 7, tensors of the wrong shape) are refused.

    /usr/bin/python3 tests/default_model/ablation_engine_test.py --megactx build-cpu/megactx

CTest `default_model_ablation_engine`; without PyTorch it exits 77 (skipped). ~1 minute."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOLS = os.path.join(ROOT, "tools", "train")
sys.path.insert(0, TOOLS)

try:
    import torch  # noqa: E402
except ImportError as error:
    print("SKIPPED: {}".format(error))
    sys.exit(77)

import export  # noqa: E402
from mtp_variant_model import variant_folder  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    args = parser.parse_args()
    with open(os.path.join(args.model, "config.json")) as f:
        prefix = "model.layers.{}.".format(json.load(f)["num_hidden_layers"])
    tensors = export.read_safetensors(os.path.join(args.model, "model.safetensors"))
    mtp = {k: v for k, v in tensors.items() if k.startswith(prefix)}
    assert mtp, prefix
    tool = os.path.join(TOOLS, "ablation_engine.py")
    with tempfile.TemporaryDirectory() as tmp:
        bundle = os.path.join(tmp, "ablation")
        os.makedirs(bundle)
        for run in ("share_ce_seed0", "share_ce_seed1"):
            export.write_safetensors(os.path.join(bundle, run + ".safetensors"), mtp)
        out = os.path.join(tmp, "engine.json")
        base = [sys.executable, tool, "--megactx", args.megactx, "--target", args.model, "--tensors", bundle]
        subprocess.run(base + ["--ks", "1,3", "--concurrency", "2", "--prompt-tokens", "64", "--new-tokens", "24",
                               "--kv-memory", "256MiB", "--json", out, "--", "--deterministic"], check=True)
        with open(out) as f:
            results = json.load(f)["mtp_ablation"]
        table = subprocess.run([sys.executable, os.path.join(TOOLS, "ablation_table.py"), out], check=True,
                               capture_output=True, text=True).stdout
        for bad, words in ((["--runs", "share_ce_seed2"], "holds no share_ce_seed2"),
                           (["--runs", "other_seed0"], "not a run's name"), (["--ks", "1,9"], "from 1 to 7")):
            refused = subprocess.run(base + bad + ["--json", out], capture_output=True, text=True)
            assert refused.returncode == 2 and words in refused.stderr, (bad, refused.stderr)
        wrong = dict(mtp)
        name = sorted(wrong)[0]
        wrong[name] = torch.zeros(3, 3, dtype=wrong[name].dtype)
        export.write_safetensors(os.path.join(tmp, "wrong.safetensors"), wrong)
        try:
            variant_folder(args.model, os.path.join(tmp, "wrong.safetensors"), os.path.join(tmp, "wrong"))
        except ValueError as error:
            assert "the target's" in str(error), error
        else:
            raise AssertionError("a tensor of the wrong shape was taken")
    print(json.dumps(results, indent=1))
    print(table)
    keys = {"{}_k{}".format(m, k) for m in ("T0", "T1_rejection", "T1_strict") for k in (1, 3)}
    assert set(results) == {"share_ce_seed0", "share_ce_seed1", "shipped"}, results
    for run, metrics in results.items():
        assert set(metrics) == keys, (run, metrics)
        for key, value in metrics.items():
            k = int(key.rsplit("k", 1)[1])
            assert 1.0 <= value <= k + 1, (run, key, value)
    if not results["share_ce_seed0"] == results["share_ce_seed1"] == results["shipped"]:
        print("FAILED: the same MTP tensors measured differently")
        return 1
    assert "| + IndexShare / KVShare | 0,1 | " in table, table
    print("ablation_engine.py: the shipped layer's tensors as two runs measure as the shipped model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
