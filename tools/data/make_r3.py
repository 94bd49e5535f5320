#!/usr/bin/python3
"""Builds the run-3 data folder from the data of prepare.py (run 2's .train-data), small enough to
carry (<= 12 MB); the retrieval documents themselves are synthesized on the GPU machine at training
time (tools/train/curriculum.py) from the filler paragraphs written here.

    /usr/bin/python3 tools/data/make_r3.py --src .train-data --out .train-data-r3

Writes:
  filler.jsonl.xz   {"text"}: training-split package-description paragraphs (80-1500 characters,
                    one line), taken from the "packages" documents of train.jsonl.xz; the held-out
                    validation/evaluation filler never occurs in train.jsonl.xz, so it stays held out
  other.jsonl.xz    every non-retrieval training document (chat, tools, arithmetic, copy, letters,
                    plain text), unchanged; the old passkey/multikey documents are dropped
  val.jsonl.xz, passkey_eval.jsonl.xz, gen_prompts.jsonl.xz   copied unchanged"""
import argparse
import json
import lzma
import os
import shutil

RETRIEVAL_KINDS = {"passkey", "multikey"}


def read_jsonl(path):
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_jsonl(path, rows):
    with lzma.open(path, "wt", encoding="utf-8", preset=6) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print("wrote {} ({} rows, {:.2f} MB)".format(path, len(rows), os.path.getsize(path) / 1e6))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=".train-data")
    ap.add_argument("--out", default=".train-data-r3")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    docs = read_jsonl(os.path.join(args.src, "train.jsonl.xz"))
    paragraphs = set()
    for d in docs:
        if d["kind"] != "packages":
            continue
        for p in d["text"].split("\n\n"):
            if 80 <= len(p) <= 1500 and "\n" not in p:
                paragraphs.add(p)
    write_jsonl(os.path.join(args.out, "filler.jsonl.xz"), [{"text": p} for p in sorted(paragraphs)])
    write_jsonl(os.path.join(args.out, "other.jsonl.xz"), [d for d in docs if d["kind"] not in RETRIEVAL_KINDS])
    for name in ["val.jsonl.xz", "passkey_eval.jsonl.xz", "gen_prompts.jsonl.xz"]:
        shutil.copyfile(os.path.join(args.src, name), os.path.join(args.out, name))


if __name__ == "__main__":
    main()
