#!/usr/bin/python3
"""Validation loss of exported default-model folders through `megactx serve` itself, on exactly the
rows the training pipeline evaluates (tools/train/pipeline.py: DATA/val.jsonl.xz packed into rows of
8,192 tokens with seed 2, the first --rows of them), so that weights from any run, including ones in
git history, compare on one set.

The documents are tokenized by the server's /tokenize (the CPU machine has no `tokenizers` library;
megactx's tokenizer equals HF tokenizers on the project's fixtures) and packed by the pipeline's own
data.pack; each row is scored by the native /generate (prefill only, `return_logprob` from position
0): the loss is the mean of -log p over every token but each row's first, with the model's sparse
attention as served (the pipeline's "sparse" number, up to bf16 autocast against the engine's f32).

    /usr/bin/python3 tools/eval/val_loss_eval.py --megactx build-cpu/megactx --data .train-data-r7 \\
        models/default /tmp/run2-model

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


def val_rows(url, eos_id, data_dir, seq_len, count):
    """The pipeline's val_rows[:count] (data.build_rows(tok, texts, seq_len, seed=2))."""
    encoded = []
    for doc in data.read_jsonl(os.path.join(data_dir, "val.jsonl.xz")):
        response = requests.post(url + "/tokenize", json={"prompt": doc["text"], "add_special_tokens": False},
                                 timeout=120)
        response.raise_for_status()
        encoded.append(np.asarray(response.json()["tokens"], dtype=np.int32))
    return data.pack(encoded, seq_len, eos_id, random.Random(2))[:count]


def row_loss(url, row):
    """Sum of -log p over row[1:] and its count, from one cold prefill of the row."""
    requests.post(url + "/flush_cache", json={}, timeout=60).raise_for_status()
    response = requests.post(url + "/generate", json={
        "input_ids": [int(t) for t in row], "return_logprob": True, "logprob_start_len": 0,
        "sampling_params": {"max_new_tokens": 0, "temperature": 1.0}}, timeout=3600)
    response.raise_for_status()
    entries = response.json()["meta_info"]["input_token_logprobs"][1:]
    if len(entries) != len(row) - 1 or any(e[0] is None or not math.isfinite(e[0]) for e in entries):
        raise RuntimeError("the server scored {} of {} positions".format(len(entries), len(row) - 1))
    return -sum(e[0] for e in entries), len(entries)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="exported model folders (one tokenizer among them)")
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--data", required=True, help="a training data folder (its val.jsonl.xz)")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--rows", type=int, default=8, help="the pipeline evaluates 8")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--save-rows", help="also save the scored rows here (numpy .npy, int32 [rows, seq-len + 1])")
    parser.epilog = "Arguments after -- go to megactx serve (e.g. --device cuda --kv-dtype fp8)."
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    serve_args = argv[split + 1:]
    if args.seq_len < 2 or args.rows < 1:
        parser.error("--seq-len must be at least 2 and --rows at least 1")
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
    rows, results = None, {}
    for model_dir in args.models:
        # The rows must fit whatever context the folder's config.json allows.
        with MegactxServer(args.megactx, model_dir, "--context-length", str(args.seq_len + 16), *serve_args,
                           kv_memory="1GiB", name="val") as server:
            if rows is None:
                start = time.time()
                rows = val_rows(server.url, eos_id, args.data, args.seq_len, args.rows)
                print("{} rows of {} tokens ({:.0f} s to tokenize and pack)".format(
                    len(rows), rows.shape[1] - 1, time.time() - start), flush=True)
            start = time.time()
            total, count = 0.0, 0
            for row in rows:
                loss, n = row_loss(server.url, row)
                total, count = total + loss, count + n
        results[model_dir] = {"loss": total / count, "tokens": count}
        print("{}: {:.4f} nats/token over {} tokens ({:.0f} s)".format(model_dir, total / count, count,
                                                                       time.time() - start), flush=True)
    if args.save_rows:
        np.save(args.save_rows, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
