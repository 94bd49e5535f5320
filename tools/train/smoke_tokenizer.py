"""A stand-in for the `tokenizers` library on the CPU machine (which lacks it), for pipeline.py
--cpu-smoke only: special tokens as in models/default/tokenizer.json, every other byte as its
single-byte token of the same vocabulary (no merges, so ~1 token per character). It has the few
methods pipeline.py, data.py, curriculum.py and evaluate.py call."""
import json
import re

from cpu_check import byte_alphabet


class _Encoding:
    def __init__(self, ids):
        self.ids = ids


class ByteTokenizer:
    def __init__(self, path):
        spec = json.load(open(path, encoding="utf-8"))
        self.spec = spec
        self.vocab = dict(spec["model"]["vocab"])
        self.special = {a["content"]: a["id"] for a in spec["added_tokens"]}
        self.vocab.update(self.special)
        to_char = byte_alphabet()
        self.byte_id = [self.vocab[to_char[b]] for b in range(256)]
        self.split = re.compile("(" + "|".join(re.escape(s) for s in sorted(self.special, key=len, reverse=True)) + ")")

    def get_vocab_size(self):
        return max(self.vocab.values()) + 1

    def token_to_id(self, token):
        return self.vocab.get(token)

    def id_to_token(self, i):
        if not hasattr(self, "_inverse"):
            self._inverse = {v: k for k, v in self.vocab.items()}
        return self._inverse.get(i)

    def encode(self, text, add_special_tokens=False):
        ids = []
        for part in self.split.split(text):
            if part in self.special:
                ids.append(self.special[part])
            elif part:
                ids.extend(self.byte_id[b] for b in part.encode("utf-8"))
        return _Encoding(ids)

    def encode_batch(self, texts, add_special_tokens=False):
        return [self.encode(t) for t in texts]

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.spec, f, ensure_ascii=False)
