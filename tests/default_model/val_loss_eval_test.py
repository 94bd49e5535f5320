#!/usr/bin/python3
"""tools/eval/val_loss_eval.py against PyTorch: a made-up validation file (paragraphs of the README)
is tokenized, packed and scored by `megactx serve` on the CPU; the same rows' mean next-token loss
from the training code's model (tools/train/model.py, fp32, dense) must agree within 1e-4 relative.
Rows of 100 tokens stay within the model's top-k of 128 keys, so the served sparse attention sees
every key and equals the dense one. Also checks the packing (data.pack with seed 2 on the server's
tokens: every row holds seq-len + 1 tokens), that --rows caps the rows, and that a bad --rows or a
folder without val.jsonl.xz is refused before any server starts.

    /usr/bin/python3 tests/default_model/val_loss_eval_test.py --megactx build-cpu/megactx

CTest `default_model_val_loss_eval`; without PyTorch or numpy it exits 77 (skipped). ~20 s."""
import argparse
import json
import lzma
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "train"))

try:
    import numpy as np  # noqa: E402
    import torch  # noqa: E402
    import torch.nn.functional as F  # noqa: E402
except ImportError as error:
    print("SKIPPED: {}".format(error))
    sys.exit(77)

import export  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    args = parser.parse_args()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        paragraphs = [p.strip() for p in f.read().split("\n\n") if len(p.strip()) > 40][:40]
    with tempfile.TemporaryDirectory() as tmp:
        with lzma.open(os.path.join(tmp, "val.jsonl.xz"), "wt", encoding="utf-8") as f:
            for text in paragraphs:
                f.write(json.dumps({"text": text, "kind": "text"}) + "\n")
        rows_path, out_path = os.path.join(tmp, "rows.npy"), os.path.join(tmp, "out.json")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "eval", "val_loss_eval.py"),
                        "--megactx", args.megactx, "--data", tmp, "--seq-len", "100", "--rows", "3",
                        "--save-rows", rows_path, "--json", out_path, args.model, "--", "--device", "cpu"],
                       check=True)
        for bad, words in ((["--rows", "0"], "--rows at least 1"), (["--data", ROOT], "no val.jsonl.xz")):
            refused = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "eval", "val_loss_eval.py"),
                                      "--megactx", args.megactx, "--data", tmp, *bad, args.model],
                                     capture_output=True, text=True)
            assert refused.returncode == 2 and words in refused.stderr, (bad, refused.stderr)
        rows = np.load(rows_path)
        with open(out_path) as f:
            served = json.load(f)[args.model]
    assert rows.shape == (3, 101), rows.shape
    assert served["tokens"] == 3 * 100, served
    torch.manual_seed(0)
    model = export.load_model_dir(args.model)
    model.eval()
    total = 0.0
    with torch.no_grad():
        for row in rows:
            full = torch.from_numpy(row[None].astype(np.int64))
            logits = model.logits(model(full[:, :-1], mode="dense"))
            total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), full[:, 1:].reshape(-1),
                                     reduction="sum").item()
    reference = total / (rows.shape[0] * (rows.shape[1] - 1))
    difference = abs(served["loss"] - reference) / reference
    print("val loss: megactx {:.6f}, PyTorch {:.6f}, relative difference {:.2e}".format(
        served["loss"], reference, difference))
    if not difference < 1e-4:
        print("FAILED: the served loss differs from PyTorch's")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
