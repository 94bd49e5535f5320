"""Run 3: a length curriculum (e.g. 1K -> 2K -> 4K -> 8K rows, same tokens per batch) with retrieval
documents synthesized per phase so that every one fits its phase's rows, and per-token loss weights
that put the retrieval answers above the other assistant tokens.

Per phase of row length L (tokens):
- retrieval documents (tools/data/retrieval.py: passkey, multi-turn multi-key, key-value lists) are
  rendered through the chat template with filler lengths up to what L holds; one that still
  tokenizes longer than a row is dropped, never cut (cutting could lose its needle);
- the other chat tasks (chat, tools, arithmetic, copy, letters) come from the carried documents,
  cycling through them; a chat document longer than a row keeps its end;
- documents are never split across rows; plain text (package descriptions, dictionary, fortunes)
  fills the space left at the end of each row, so its share stays small; what is still empty is
  padding with weight 0.
Weights of target token t (input token t-1): retrieval_weight inside an assistant turn of a
retrieval document, assistant_weight inside another assistant turn, 1 elsewhere, 0 on padding."""
import os
import random
import re
import sys
import time
from multiprocessing import get_context

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "data"))

import data  # noqa: E402

RETRIEVAL, OTHER, TEXT, PAD = 2, 1, 3, 0
# Token shares of each phase's atomic documents (the plain text only fills gaps). Run 4 passes --mix
# with a "text" share: plain-text documents packed whole like the others (cut to a row when longer).
MIX = {"passkey": 0.26, "multikey_turns": 0.30, "kv_list": 0.10, "other": 0.34}
MIX_KINDS = ("passkey", "multikey_turns", "kv_list", "other", "text")


def parse_mix(spec):
    """"passkey:0.12,multikey_turns:0.13,kv_list:0.05,other:0.3,text:0.4" -> dict normalized to 1
    (kinds left out get 0); "" -> MIX."""
    if not spec:
        return dict(MIX)
    mix = {}
    for part in spec.split(","):
        kind, share = part.split(":")
        if kind not in MIX_KINDS or float(share) < 0:
            raise ValueError("bad --mix entry {!r} (kinds {})".format(part, MIX_KINDS))
        mix[kind] = float(share)
    total = sum(mix.values())
    if total <= 0:
        raise ValueError("bad --mix {!r}".format(spec))
    return {k: v / total for k, v in mix.items()}
CHARS_PER_TOKEN = 4.0  # filler text under the shipped tokenizer is ~4.15; aiming low keeps docs in rows


def parse_curriculum(spec, default_len):
    """"1024:0.15,2048:0.15,4096:0.25,8192:0.45" -> [(1024, 0.15), ...], fractions normalized."""
    if not spec:
        return [(default_len, 1.0)]
    phases = []
    for part in spec.split(","):
        length, frac = part.split(":")
        phases.append((int(length), float(frac)))
    total = sum(f for _, f in phases)
    if total <= 0 or any(f <= 0 or n < 256 for n, f in phases):
        raise ValueError("bad --curriculum {!r}".format(spec))
    return [(n, f / total) for n, f in phases]


# ---------------------------------------------------------------- synthesis (worker processes)

_W = {}


def _init_worker(template_text, filler, words):
    from render import ChatRenderer

    _W["renderer"] = ChatRenderer(template_text)
    _W["filler"] = filler
    _W["words"] = words


def _render_many(job):
    """job = (seed, kind, count, max_chars) -> [rendered text]."""
    import retrieval

    seed, kind, count, max_chars = job
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        # Half log-uniform from 300 characters (many cheap short examples), half in the upper half
        # of the phase's range (retrieval at the full distance of the phase).
        if rng.random() < 0.5:
            chars = retrieval.log_uniform_chars(rng, 300, max_chars)
        else:
            chars = rng.randint(max_chars // 2, max_chars)
        if kind == "passkey":
            request = retrieval.passkey(rng, _W["filler"], chars)
        elif kind == "multikey_turns":
            request = retrieval.multikey_turns(rng, _W["filler"], chars)
        else:
            request = retrieval.kv_list(rng, _W["words"])
        out.append(_W["renderer"].render(request["messages"], **request.get("kwargs", {})))
    return out


def words_of(filler, limit=20000):
    seen = {}
    for p in filler:
        for w in re.findall(r"\b[a-z]{4,10}\b", p):
            seen[w] = True
            if len(seen) >= limit:
                return sorted(seen)
    return sorted(seen)


def synthesize(kind, n_docs, max_chars, seed, pool, chunk=64):
    jobs = [(seed * 1000003 + i, kind, min(chunk, n_docs - i), max_chars) for i in range(0, n_docs, chunk)]
    out = []
    for texts in pool.map(_render_many, jobs):
        out.extend(texts)
    return out


# ---------------------------------------------------------------- packing


def pack_phase(atomic, kinds, text_stream, row_len, eos_id, rng):
    """atomic: token arrays (each already ends with eos), never split; kinds: their kind codes.
    text_stream: int32 tokens of plain text, cut freely to fill row ends.
    Returns rows int32 [N, row_len] and kind codes int8 [N, row_len]."""
    order = list(range(len(atomic)))
    rng.shuffle(order)
    rows, codes = [], []
    cur, cur_codes, used, tpos = [], [], 0, 0

    def close():
        nonlocal cur, cur_codes, used, tpos
        gap = row_len - used
        take = min(gap, len(text_stream) - tpos)
        if take > 0:
            cur.append(text_stream[tpos:tpos + take])
            cur_codes.append(np.full(take, TEXT, np.int8))
            tpos += take
            gap -= take
        if gap > 0:
            cur.append(np.full(gap, eos_id, np.int32))
            cur_codes.append(np.full(gap, PAD, np.int8))
        rows.append(np.concatenate(cur))
        codes.append(np.concatenate(cur_codes))
        cur, cur_codes, used = [], [], 0

    for i in order:
        d = atomic[i]
        if used + len(d) > row_len:
            close()
        cur.append(d)
        cur_codes.append(np.full(len(d), kinds[i], np.int8))
        used += len(d)
    if cur:
        close()
    return np.stack(rows).astype(np.int32), np.stack(codes)


def phase_weights(rows, codes, ids, assistant_weight, retrieval_weight):
    """rows [N, L+1], codes [N, L+1] -> weights [N, L] of the targets rows[:, 1:]."""
    inside = data.assistant_weights(rows, ids, 2.0) > 1.5  # input token inside an assistant turn
    src = codes[:, :-1]
    w = np.where(inside, np.where(src == RETRIEVAL, retrieval_weight, assistant_weight), 1.0)
    w = np.where(codes[:, 1:] == PAD, 0.0, w)
    return w.astype(np.float32)


def build_phase(tok, ids, seq_len, target_tokens, other_docs, text_docs, seed, pool, log, assistant_weight,
                retrieval_weight, mix=None):
    mix = mix or MIX
    t0 = time.time()
    rng = random.Random(seed)
    row_len = seq_len + 1
    eos = ids["<|endoftext|>"]
    max_chars = int((seq_len - 80) * CHARS_PER_TOKEN * 0.93)
    texts, kinds = [], []
    counts = {}
    for kind in ("passkey", "multikey_turns", "kv_list"):
        # Mean characters of one document: the half log-uniform part plus the upper-half part.
        if kind == "kv_list":
            mean_chars = 700
        else:
            lo, hi = 300, max(max_chars, 301)
            mean_chars = 0.5 * (hi - lo) / np.log(hi / lo) + 0.5 * 0.75 * hi
        if mix.get(kind, 0) <= 0:
            continue
        n = max(8, int(mix[kind] * target_tokens * CHARS_PER_TOKEN / mean_chars))
        got = synthesize(kind, n, max_chars, seed * 7 + len(counts), pool)
        counts[kind] = len(got)
        texts += got
        kinds += [RETRIEVAL] * len(got)
    def cycle(docs, share, kind):
        """Documents from a phase-dependent offset, whole, until `share` of the phase's characters."""
        wanted = share * target_tokens * CHARS_PER_TOKEN
        start = rng.randrange(len(docs)) if docs else 0
        taken, i = 0.0, 0
        while taken < wanted and docs and i < 10 * len(docs):
            t = docs[(start + i) % len(docs)]
            texts.append(t)
            kinds.append(kind)
            taken += len(t)
            i += 1
        return i

    # Other chat tasks, then plain-text documents packed whole (--mix text:...).
    counts["other"] = cycle(other_docs, mix.get("other", 0), OTHER)
    text_count = cycle(text_docs, mix.get("text", 0), TEXT)
    if text_count:
        counts["text"] = text_count
    enc = data.encode_all(tok, texts)
    atomic, atomic_kinds, dropped = [], [], 0
    for e, k in zip(enc, kinds):
        d = np.concatenate([e, [eos]]).astype(np.int32)
        if len(d) > row_len:
            if k == RETRIEVAL:
                dropped += 1  # never cut a retrieval document: its needle could be lost
                continue
            d = d[:row_len] if k == TEXT else d[-row_len:]
        atomic.append(d)
        atomic_kinds.append(k)
    # Plain text to fill row ends: more than the gaps need (1K rows leave ~10% gaps), so no padding.
    shuffled = text_docs[:]
    rng.shuffle(shuffled)
    picked, chars = [], 0
    for t in shuffled:
        picked.append(t)
        chars += len(t)
        if chars > 0.35 * target_tokens * CHARS_PER_TOKEN:
            break
    text_enc = data.encode_all(tok, picked)
    stream = np.concatenate([np.concatenate([e, [eos]]) for e in text_enc]).astype(np.int32) if text_enc else \
        np.zeros(0, np.int32)
    rows, codes = pack_phase(atomic, atomic_kinds, stream, row_len, eos, rng)
    weights = phase_weights(rows, codes, ids, assistant_weight, retrieval_weight)
    n = codes.size
    share = {name: float((codes == c).sum()) / n for name, c in
             [("retrieval", RETRIEVAL), ("other", OTHER), ("text", TEXT), ("pad", PAD)]}
    n_answers = int(((weights == retrieval_weight) & (codes[:, :-1] == RETRIEVAL)).sum())
    log("phase {}: {} rows, docs {}, dropped {} too-long retrieval docs, token shares {}, retrieval answer "
        "tokens {}, {:.0f}s".format(seq_len, len(rows), counts, dropped,
                                    {k: round(v, 3) for k, v in share.items()}, n_answers, time.time() - t0))
    return rows, weights, {"rows": int(len(rows)), "docs": counts, "dropped": dropped, "shares": share}


class CurriculumBatches:
    """Phase i covers training-time fractions [ends[i-1], ends[i]); its batch holds tokens_per_batch
    tokens (batch = tokens_per_batch // seq_len rows). next(f) picks the phase; next() with no f
    (the MTP ablation) uses the last phase."""

    def __init__(self, phases, tokens_per_batch, seed=3):
        self.phases = []
        end = 0.0
        for i, (seq_len, frac, rows, weights) in enumerate(phases):
            end += frac
            batch = max(1, tokens_per_batch // seq_len)
            self.phases.append((end, data.Batches(rows, weights, batch, seed=seed + i), seq_len))
        self.current = len(self.phases) - 1
        self.dropped = set()

    @property
    def epoch(self):
        return self.phases[self.current][1].epoch

    @property
    def seq_len(self):
        return self.phases[self.current][2]

    def next(self, f=None):
        if f is None:
            self.current = len(self.phases) - 1
        else:
            self.current = next((i for i, (end, _, _) in enumerate(self.phases) if f < end), len(self.phases) - 1)
        while self.current in self.dropped and self.current > 0:
            self.current -= 1  # a phase whose step ran out of memory: the previous phase takes its time
        return self.phases[self.current][1].next()

    def drop_current(self):
        """After an out-of-memory step: give the current phase's time to the one before it. Returns
        False when there is no earlier phase left."""
        remaining = [i for i in range(self.current) if i not in self.dropped]
        if not remaining:
            return False
        self.dropped.add(self.current)
        return True


def make_pool(template_text, filler, words, workers):
    return get_context("fork").Pool(workers, initializer=_init_worker, initargs=(template_text, filler, words))
