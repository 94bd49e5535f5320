#!/usr/bin/python3
"""tools/eval/val_loss_eval.py against PyTorch: a made-up validation file (paragraphs of the README)
is tokenized, packed and scored by `megactx serve` on the CPU; the same rows' mean next-token loss
from the training code's model (tools/train/model.py, fp32, dense) must agree within 1e-4 relative,
padding targets excluded in both (data.real_targets, also checked on made-up rows).
Rows of 100 tokens stay within the model's top-k of 128 keys, so the served sparse attention sees
every key and equals the dense one; the server keeps its KV in f32 (the default bf16 KV moved run 9's
loss by 1.2e-4 relative). Also checks the packing (data.pack with seed 2 on the server's
tokens: every row holds seq-len + 1 tokens), that --rows caps the rows, that --by-kind scores the same
documents alike from the validation and the training file, and that a bad --rows, a folder without
val.jsonl.xz or a --train-file without --by-kind or not in the folder is refused before any server
starts.

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

import data  # noqa: E402
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
        with lzma.open(os.path.join(tmp, "train.jsonl.xz"), "wt", encoding="utf-8") as f:
            for text in paragraphs[:2] + paragraphs[-3:]:
                f.write(json.dumps({"text": text, "kind": "text"}) + "\n")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "eval", "val_loss_eval.py"),
                        "--megactx", args.megactx, "--data", tmp, "--seq-len", "100", "--rows", "3",
                        "--by-kind", "2", "--train-file", "train.jsonl.xz",
                        "--save-rows", rows_path, "--json", out_path, args.model, "--", "--device", "cpu",
                        "--kv-dtype", "f32"],
                       check=True)
        for bad, words in ((["--rows", "0"], "--rows at least 1"), (["--data", ROOT], "no val.jsonl.xz"),
                           (["--train-file", "train.jsonl.xz"], "needs --by-kind"),
                           (["--by-kind", "2", "--train-file", "none.jsonl.xz"], "holds no none.jsonl.xz")):
            refused = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "eval", "val_loss_eval.py"),
                                      "--megactx", args.megactx, "--data", tmp, *bad, args.model],
                                     capture_output=True, text=True)
            assert refused.returncode == 2 and words in refused.stderr, (bad, refused.stderr)
        rows = np.load(rows_path)
        with open(out_path) as f:
            served = json.load(f)[args.model]
    assert rows.shape == (3, 101), rows.shape
    # Padding: every eos after an eos; the first eos after a document is text (the document's end).
    with open(os.path.join(args.model, "tokenizer.json"), encoding="utf-8") as f:
        eos = {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}["<|endoftext|>"]
    assert data.real_targets(np.array([[5, 7, eos, eos, eos], [eos, 4, eos, 9, eos]]), eos).tolist() == [
        [True, True, False, False], [True, True, True, True]]
    real = data.real_targets(rows, eos)
    assert served["tokens"] == real.sum() and served["padding_tokens"] == (~real).sum(), served
    assert served["tokens"] + served["padding_tokens"] == 3 * 100, served
    # --by-kind: the first 2 documents of each kind, one by one; the training file starts with the same
    # two documents, so both splits score exactly the same tokens.
    val_kind, train_kind = served["by_kind"]["val"]["text"], served["by_kind"]["train"]["text"]
    assert val_kind == train_kind and val_kind["tokens"] > 0, served["by_kind"]
    torch.manual_seed(0)
    model = export.load_model_dir(args.model)
    model.eval()
    total = 0.0
    with torch.no_grad():
        for row in rows:
            full = torch.from_numpy(row[None].astype(np.int64))
            logits = model.logits(model(full[:, :-1], mode="dense"))
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), full[:, 1:].reshape(-1),
                                 reduction="none")
            total += ce[torch.from_numpy(data.real_targets(row[None], eos).reshape(-1))].sum().item()
    reference = total / real.sum()
    difference = abs(served["loss"] - reference) / reference
    print("val loss: megactx {:.6f}, PyTorch {:.6f}, relative difference {:.2e}".format(
        served["loss"], reference, difference))
    if not difference < 1e-4:
        print("FAILED: the served loss differs from PyTorch's")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
