#!/usr/bin/python3
"""Looks at what the exported default model answers to the passkey test prompt, on the CPU machine
(Debian's python3-torch; no tokenizers library needed: a minimal byte-level BPE reads tokenizer.json).

    /usr/bin/python3 tools/train/cpu_check.py [--model models/default] [--drop-front 6600]

Feeds the prompt of tests/default_model/passkey_8k.json (its ids from passkey_8k_ids.txt) followed by
the expected answer and prints the model's argmax at each answer position, with dense and with
sparse (top-k) attention. --drop-front removes that many filler tokens from the start of the user
message, to look at shorter contexts (the needle sits at token 7062 of 7618)."""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import export  # noqa: E402


def byte_alphabet():
    """GPT-2 byte-level alphabet: byte -> printable character."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, [chr(c) for c in chars]))


class MiniBpe:
    def __init__(self, path):
        spec = json.load(open(path, encoding="utf-8"))
        self.vocab = dict(spec["model"]["vocab"])
        for added in spec["added_tokens"]:
            self.vocab[added["content"]] = added["id"]
        self.inverse = {v: k for k, v in self.vocab.items()}
        self.special = {a["id"] for a in spec["added_tokens"]}
        merges = spec["model"]["merges"]
        self.rank = {tuple(m.split(" ") if isinstance(m, str) else m): i for i, m in enumerate(merges)}
        self.to_char = byte_alphabet()
        self.to_byte = {c: b for b, c in self.to_char.items()}

    def encode_piece(self, piece):
        """BPE of one pre-tokenized piece (the caller splits like the Split regex would)."""
        word = [self.to_char[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            best = min((self.rank.get((word[i], word[i + 1]), float("inf")), i) for i in range(len(word) - 1))
            if best[0] == float("inf"):
                break
            i = best[1]
            word = word[:i] + [word[i] + word[i + 1]] + word[i + 2:]
        return [self.vocab[t] for t in word]

    def decode(self, ids):
        out = b""
        for i in ids:
            if i in self.special:
                out += self.inverse[i].encode()
            else:
                out += bytes(self.to_byte[c] for c in self.inverse[i])
        return out.decode("utf-8", "replace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO, "models", "default"))
    ap.add_argument("--drop-front", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fixture_dir = os.path.join(REPO, "tests", "default_model")
    key = json.load(open(os.path.join(fixture_dir, "passkey_8k.json")))["key"]
    ids = [int(x) for x in open(os.path.join(fixture_dir, "passkey_8k_ids.txt")).read().strip().split(",")]
    bpe = MiniBpe(os.path.join(args.model, "tokenizer.json"))
    # "\nThe pass key is 58213." as the Split regex cuts it: \n | The | " pass" | " key" | " is" | " " | digits by 3 | .
    digits = [key[i:i + 3] for i in range(0, len(key), 3)]
    answer = sum((bpe.encode_piece(p) for p in ["\n", "The", " pass", " key", " is", " "] + digits + ["."]), [])
    if args.drop_front:
        ids = ids[:4] + ids[4 + args.drop_front:]  # keep [gMASK]<sop><|user|>\n
    model = export.load_model_dir(args.model)
    model.eval()
    x = torch.tensor([ids + answer])
    print("context {} tokens; expected {!r}".format(len(ids), bpe.decode(answer)))
    for mode in ("sparse", "dense"):
        start = time.time()
        with torch.no_grad():
            logits = model.logits(model(x, mode=mode))
        pred = logits[0, len(ids) - 1:len(ids) - 1 + len(answer)].argmax(-1).tolist()
        print("{:6s} ({:.0f}s): {!r}  {}".format(mode, time.time() - start, bpe.decode(pred),
                                                  "PASS" if pred == answer else "FAIL"))


if __name__ == "__main__":
    main()
