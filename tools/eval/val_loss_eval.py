#!/usr/bin/python3
"""Validation loss of exported default-model folders through `megactx serve` itself, on exactly the
rows the training pipeline evaluates (tools/train/pipeline.py: DATA/val.jsonl.xz packed into rows of
8,192 tokens with seed 2, the first --rows of them), so that weights from any run, including ones in
git history, compare on one set.

The documents are tokenized by the server's /tokenize (the CPU machine has no `tokenizers` library;
megactx's tokenizer equals HF tokenizers on the project's fixtures) and packed by the pipeline's own
data.pack; each row is scored by the native /generate (prefill only, `return_logprob` from position
0): the loss is the mean of -log p over every token but each row's first and the padding at rows'
ends (data.real_targets; "loss_with_padding" counts it too), with the model's sparse attention as
served (the pipeline's "sparse" number, up to bf16 autocast against the engine's f32).

    /usr/bin/python3 tools/eval/val_loss_eval.py --megactx build-cpu/megactx --data .train-data-r7 \\
        models/default /tmp/run2-model

--by-kind N also scores the first N documents of each kind (the "kind" field) one by one, each cut
to --seq-len tokens, from val.jsonl.xz and, with --train-file, from a training file of the same
folder (e.g. other.jsonl.xz): the gap between a kind's training and validation loss is how much of
that kind the weights have memorized rather than learned.

Why: the validation set was rebuilt after runs 1-3 (Debian's package descriptions changed), so run 2's
2.62 and today's numbers come from different sets; this measures old and new weights on one.
"""
import argparse
import json
import math
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tools", "train"))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))

import numpy as np  # noqa: E402
import requests  # noqa: E402

import data  # noqa: E402  (tools/train/data.py: its reader and packing; tokenizers only when training one)
from megactx_server import MegactxServer  # noqa: E402


def tokenize(url, text):
    """The server's token ids of a document, as int32."""
    response = requests.post(url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=120)
    response.raise_for_status()
    return np.asarray(response.json()["tokens"], dtype=np.int32)


def val_rows(url, eos_id, val_docs, seq_len, count):
    """The pipeline's val_rows[:count] (data.build_rows(tok, texts, seq_len, seed=2))."""
    encoded = [tokenize(url, doc["text"]) for doc in val_docs]
    return data.pack(encoded, seq_len, eos_id, random.Random(2))[:count]


def kind_documents(url, docs, per_kind, seq_len):
    """{kind: [token arrays]}: the first per_kind documents of each kind, each cut to seq_len + 1
    tokens (documents of fewer than 2 tokens are skipped)."""
    out = {}
    for doc in docs:
        kept = out.setdefault(doc.get("kind", "?"), [])
        if len(kept) < per_kind:
            tokens = tokenize(url, doc["text"])[:seq_len + 1]
            if len(tokens) >= 2:
                kept.append(tokens)
    return out


def kind_losses(url, documents):
    """{kind: (mean nats/token, tokens)} over each kind's documents, each scored by row_losses."""
    out = {}
    for kind, docs in sorted(documents.items()):
        total, count = 0.0, 0
        for doc in docs:
            losses = row_losses(url, doc)
            total, count = total + losses.sum(), count + len(losses)
        if count:
            out[kind] = (total / count, count)
    return out


def row_losses(url, row):
    """-log p of each of row[1:] (numpy [len(row) - 1]), from one cold prefill of the row."""
    requests.post(url + "/flush_cache", json={}, timeout=60).raise_for_status()
    response = requests.post(url + "/generate", json={
        "input_ids": [int(t) for t in row], "return_logprob": True, "logprob_start_len": 0,
        "sampling_params": {"max_new_tokens": 0, "temperature": 1.0}}, timeout=3600)
    response.raise_for_status()
    entries = response.json()["meta_info"]["input_token_logprobs"][1:]
    if len(entries) != len(row) - 1 or any(e[0] is None or not math.isfinite(e[0]) for e in entries):
        raise RuntimeError("the server scored {} of {} positions".format(len(entries), len(row) - 1))
    return -np.asarray([e[0] for e in entries], dtype=np.float64)


def print_kinds(model_dir, by_kind):
    """A markdown table: kind, validation loss, training loss and their gap (nats/token)."""
    print("\n{} by kind (nats/token; documents cut to --seq-len tokens)\n".format(model_dir))
    train = by_kind.get("train", {})
    print("| kind | validation | training | gap |\n|---|---|---|---|")
    for kind in sorted(set(by_kind["val"]) | set(train)):
        val = by_kind["val"].get(kind, {}).get("loss")
        tr = train.get(kind, {}).get("loss")
        cell = lambda x: "{:.3f}".format(x) if x is not None else "-"  # noqa: E731
        gap = "{:.3f}".format(val - tr) if val is not None and tr is not None else "-"
        print("| {} | {} | {} | {} |".format(kind, cell(val), cell(tr), gap))
    print(flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="exported model folders (one tokenizer among them)")
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--data", required=True, help="a training data folder (its val.jsonl.xz)")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--rows", type=int, default=8, help="the pipeline evaluates 8")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--by-kind", type=int, default=0, metavar="N",
                        help="also score the first N documents of each kind one by one (see above)")
    parser.add_argument("--train-file", default="",
                        help="with --by-kind: a file of the --data folder to compare with (e.g. other.jsonl.xz)")
    parser.add_argument("--save-rows", help="also save the scored rows here (numpy .npy, int32 [rows, seq-len + 1])")
    parser.epilog = "Arguments after -- go to megactx serve (e.g. --device cuda --kv-dtype fp8)."
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    serve_args = argv[split + 1:]
    if args.seq_len < 2 or args.rows < 1 or args.by_kind < 0:
        parser.error("--seq-len must be at least 2, --rows at least 1 and --by-kind at least 0")
    if args.train_file and not args.by_kind:
        parser.error("--train-file needs --by-kind")
    train_path = os.path.join(args.data, args.train_file) if args.train_file else ""
    if train_path and not os.path.isfile(train_path):
        parser.error("{} holds no {}".format(args.data, args.train_file))
    if not os.path.isfile(os.path.join(args.data, "val.jsonl.xz")):
        parser.error("{} holds no val.jsonl.xz".format(args.data))
    for model_dir in args.models:
        if not os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
            parser.error("{} is not a model folder (no tokenizer.json)".format(model_dir))
    tokenizers = set()
    for model_dir in args.models:
        with open(os.path.join(model_dir, "tokenizer.json"), "rb") as f:
            tokenizers.add(f.read())
    if len(tokenizers) != 1:
        parser.error("the folders' tokenizers differ: their losses would not compare")
    with open(os.path.join(args.models[0], "tokenizer.json"), encoding="utf-8") as f:
        eos_id = {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}["<|endoftext|>"]
    val_docs = data.read_jsonl(os.path.join(args.data, "val.jsonl.xz"))
    rows, by_kind, results = None, None, {}
    for model_dir in args.models:
        # The rows must fit whatever context the folder's config.json allows.
        with MegactxServer(args.megactx, model_dir, "--context-length", str(args.seq_len + 16), *serve_args,
                           kv_memory="1GiB", name="val") as server:
            if rows is None:
                start = time.time()
                rows = val_rows(server.url, eos_id, val_docs, args.seq_len, args.rows)
                print("{} rows of {} tokens ({:.0f} s to tokenize and pack)".format(
                    len(rows), rows.shape[1] - 1, time.time() - start), flush=True)
            if args.by_kind and by_kind is None:
                by_kind = {"val": kind_documents(server.url, val_docs, args.by_kind, args.seq_len)}
                if train_path:
                    by_kind["train"] = kind_documents(server.url, data.read_jsonl(train_path), args.by_kind,
                                                      args.seq_len)
            start = time.time()
            losses = np.stack([row_losses(server.url, row) for row in rows])
            real = data.real_targets(rows, eos_id)
            results[model_dir] = {"loss": float(losses[real].mean()), "tokens": int(real.sum()),
                                  "loss_with_padding": float(losses.mean()), "padding_tokens": int((~real).sum())}
            print("{}: {:.4f} nats/token over {} tokens; {:.4f} counting the rows' {} padding targets "
                  "({:.0f} s)".format(model_dir, losses[real].mean(), real.sum(), losses.mean(), (~real).sum(),
                                      time.time() - start), flush=True)
            if by_kind:
                results[model_dir]["by_kind"] = {split: {kind: {"loss": loss, "tokens": n} for kind, (loss, n)
                                                         in kind_losses(server.url, docs).items()}
                                                 for split, docs in by_kind.items()}
                print_kinds(model_dir, results[model_dir]["by_kind"])
    if args.save_rows:
        np.save(args.save_rows, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
