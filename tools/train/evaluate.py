"""Evaluation of the default model with the PyTorch implementation (model.py):
validation loss (sparse vs dense; padding excluded), passkey retrieval by context length (with the needle recall of each
indexer, from the same forward pass), indexer recall against the dense attention's own top-k, and MTP
accepted lengths (chained drafts verified against the target)."""
import numpy as np
import torch
import torch.nn.functional as F

from data import real_targets
from model import IndexerLoss


def _autocast(device):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@torch.no_grad()
def val_loss(model, rows, mode, device, eos_id, batch=2):
    """Mean next-token loss over rows [N, T+1] (numpy), padding targets excluded (data.real_targets)."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(rows), batch):
        full = torch.from_numpy(rows[i:i + batch]).to(device).long()
        real = torch.from_numpy(real_targets(rows[i:i + batch], eos_id)).to(device).reshape(-1)
        with _autocast(device):
            logits = model.logits(model(full[:, :-1], mode=mode))
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), full[:, 1:].reshape(-1), reduction="none")
        total += ce[real].sum().item()
        count += int(real.sum().item())
    return total / count


class NeedleProbe(IndexerLoss):
    """Needle recall inside a passkey forward pass. targets: (batch index, index into the query rows,
    needle column) for each key token of each prompt: the row that predicts the answer's key token i and
    the prompt position of the needle's key token i (what that row has to copy). For each indexer group
    (the target's full layers in order) it records whether that column is among the row's top-k index
    scores (what the sparse layers attend to) and among the top-k of the dense attention the group's
    layers would compute (head-summed, as the KL's target: what a perfectly fitted indexer would pick)."""

    def __init__(self, k, targets):
        super().__init__(dense_target=True)
        self.k, self.targets, self.groups = k, targets, []

    def add(self, p, logits, support):
        lg = logits.masked_fill(~support, float("-inf"))
        pm = p.masked_fill(~support, -1.0)
        out = []
        for b, r, col in self.targets:
            out.append((int((lg[b, r] > lg[b, r, col]).sum().item() < self.k),
                        int((pm[b, r] > pm[b, r, col]).sum().item() < self.k)))
        self.groups.append(out)


def needle_targets(tok, ids, p0, p1):
    """Rows predicting the key tokens of the answer ids[p0:p1] and the needle's key-token columns: the
    last occurrence in the prompt ids[:p0] of the answer's key tokens (tokens holding a digit). Returns
    [(row, column)] or [] when the needle's tokens differ from the answer's."""
    key_pos = [j for j in range(p0, p1) if any(ch.isdigit() for ch in (tok.id_to_token(ids[j]) or ""))]
    if not key_pos:
        return []
    key_ids = [ids[j] for j in key_pos]
    n = len(key_ids)
    arr = np.asarray(ids[:p0])
    cand = np.nonzero(arr[:p0 - n + 1] == key_ids[0])[0] if p0 >= n else []
    for start in cand[::-1]:
        if list(arr[start:start + n]) == key_ids:
            return [(j - 1, int(start) + i) for i, j in enumerate(key_pos)]
    return []


def _full_layers(model):
    return [i for i, t in enumerate(model.cfg.indexer_types) if t == "full"]


@torch.no_grad()
def passkey(model, tok, items, mode, device, eos_id, deadline=None, log=None, needle=False):
    """items: {"tokens", "prompt", "answer", "key"}. A sample passes when greedy decoding reproduces the
    whole answer ("\\nThe pass key is K.") token by token after the prompt (teacher-forced argmax).
    Logits are computed only over the answer span (a 128K prompt would need 2 GB of logits). A length
    whose turn comes after `deadline` (time.time()) is recorded as skipped; an out-of-memory error is
    recorded for its length, the others still run.
    needle=True: also the needle recall of each indexer (NeedleProbe) from the same forward pass, by
    length: "index" the share of key tokens whose needle token is in the top-k of the row predicting
    it, "dense" the same for the dense attention's top-k, "first" the index share for the first key
    token alone (no earlier key digit to follow)."""
    import time

    model.eval()
    full_layers = _full_layers(model)
    by_len = {}
    for it in items:
        by_len.setdefault(it["tokens"], []).append(it)
    results = {}
    for nominal, group in sorted(by_len.items()):
        if deadline is not None and time.time() > deadline:
            results[nominal] = {"skipped": "time", "n": len(group)}
            continue
        t0 = time.time()
        batch = max(1, 16384 // nominal)
        correct, lengths, done = 0, [], 0
        hits = [[] for _ in full_layers]  # per indexer: (index hit, dense hit, first key token) per target
        no_needle = 0
        try:
            for i in range(0, len(group), batch):
                if deadline is not None and time.time() > deadline:
                    break  # partial: the accuracy of the prompts evaluated so far
                chunk = group[i:i + batch]
                seqs, spans = [], []
                for it in chunk:
                    p = tok.encode(it["prompt"], add_special_tokens=False).ids
                    a = tok.encode(it["prompt"] + it["answer"], add_special_tokens=False).ids
                    assert a[:len(p)] == p, "prompt tokens change when the answer is appended"
                    seqs.append(a)
                    spans.append((len(p), len(a)))
                    lengths.append(len(a))
                T = max(len(s) for s in seqs)
                ids = torch.full((len(seqs), T), eos_id, dtype=torch.long)
                for b, s in enumerate(seqs):
                    ids[b, :len(s)] = torch.tensor(s)
                ids = ids.to(device)
                probe, rows = None, None
                if needle:
                    per_b = [needle_targets(tok, s, p0, p1) for s, (p0, p1) in zip(seqs, spans)]
                    no_needle += sum(1 for t in per_b if not t)
                    all_rows = sorted({r for t in per_b for r, _ in t})
                    if all_rows:
                        where = {r: i for i, r in enumerate(all_rows)}
                        targets = [(b, where[r], c) for b, t in enumerate(per_b) for r, c in t]
                        firsts = [i == 0 for t in per_b for i in range(len(t))]
                        probe = NeedleProbe(model.cfg.index_topk, targets)
                        rows = torch.tensor(all_rows, device=device)
                with _autocast(device):
                    h = model(ids, mode=mode, index_loss=probe, kl_rows=rows)
                if probe is not None:
                    for g, out in enumerate(probe.groups[:len(full_layers)]):
                        hits[g] += [(a, d, first) for (a, d), first in zip(out, firsts)]
                for b, (p0, p1) in enumerate(spans):
                    with _autocast(device):
                        pred = model.logits(h[b, p0 - 1:p1 - 1]).argmax(-1)
                    correct += int(torch.equal(pred, ids[b, p0:p1]))
                done += len(chunk)
                del h
        except torch.cuda.OutOfMemoryError as e:
            results[nominal] = {"error": "out of memory: " + str(e).split("\n")[0][:160], "n": len(group)}
            torch.cuda.empty_cache()
            continue
        if done == 0:
            results[nominal] = {"skipped": "time", "n": len(group)}
            continue
        results[nominal] = {"accuracy": correct / max(1, done), "n": done, "mean_tokens": float(np.mean(lengths[:done])),
                            "seconds": round(time.time() - t0, 1)}
        if done < len(group):
            results[nominal]["partial"] = "{} of {} prompts (time)".format(done, len(group))
        recall_txt = ""
        if needle and any(hits):
            rec = {}
            for layer, hs in zip(full_layers, hits):
                if hs:
                    rec["L{}".format(layer)] = {"index": float(np.mean([a for a, _, _ in hs])),
                                                "dense": float(np.mean([d for _, d, _ in hs])),
                                                "first": float(np.mean([a for a, _, f in hs if f]))}
            rec["key_tokens"] = len(hits[0])
            if no_needle:
                rec["needle_not_found"] = no_needle
            results[nominal]["needle_recall"] = rec
            recall_txt = "; needle in top-{} index/dense/first: ".format(model.cfg.index_topk) + " ".join(
                "{} {:.2f}/{:.2f}/{:.2f}".format(n, v["index"], v["dense"], v["first"])
                for n, v in rec.items() if isinstance(v, dict))
        if log is not None:
            log("passkey {} {}: {}/{} ({:.0f} tokens, {:.1f}s){}".format(mode, nominal, correct, done,
                                                                        np.mean(lengths[:done]), time.time() - t0,
                                                                        recall_txt))
    return results


class RecallProbe(IndexerLoss):
    """Receives (p, index logits, support) per indexer group instead of building a loss."""

    def __init__(self, k):
        super().__init__()
        self.k, self.recall, self.mass = k, [], []

    def add(self, p, logits, support):
        k = self.k
        visible = support.sum(-1)  # [B, R]
        keep = visible > k
        if not keep.any():
            return
        top_attn = p.masked_fill(~support, -1.0).topk(k, dim=-1).indices
        top_index = logits.masked_fill(~support, float("-inf")).topk(k, dim=-1).indices
        hit = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, top_attn, True).gather(-1, top_index)
        recall = hit.float().mean(-1)  # [B, R]
        mass = p.gather(-1, top_index).sum(-1)  # attention mass the indexer's set captures
        self.recall.append(recall[keep].mean().item())
        self.mass.append(mass[keep].mean().item())


@torch.no_grad()
def indexer_recall(model, rows, device, k):
    """Dense forward; for each indexer (the target's full layers, then the MTP layer) the recall of
    its top-k against the top-k of the attention it serves (head-summed, averaged over the layers
    sharing its selection), on query rows with more than k visible tokens."""
    model.eval()
    per_group = None
    for i in range(len(rows)):
        full = torch.from_numpy(rows[i:i + 1]).to(device).long()
        inp = full[:, :-1]
        T = inp.shape[1]
        q_rows = torch.arange(k + 1, T, max(1, (T - k) // 256), device=device)
        probe = RecallProbe(k)
        with _autocast(device):
            h = model(inp, mode="dense", index_loss=probe, kl_rows=q_rows)
            model.mtp_forward(h, inp, 1, mode="dense", index_loss=probe, kl_rows=q_rows)
        if per_group is None:
            per_group = [[[], []] for _ in probe.recall]
        for g, (r, m) in enumerate(zip(probe.recall, probe.mass)):
            per_group[g][0].append(r)
            per_group[g][1].append(m)
    return [{"recall": float(np.mean(r)), "attention_mass": float(np.mean(m))} for r, m in per_group]


@torch.no_grad()
def generate(model, prompts, new_tokens, temperature, device, generator):
    """prompts [B, P] (same length); plain recomputation per token (the model has no KV cache)."""
    ids = prompts.to(device)
    for _ in range(new_tokens):
        with _autocast(device):
            logits = model.logits(model(ids, mode="sparse")[:, -1:]).float()[:, 0]
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(device)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return ids


def assistant_prompts(rows, assistant_id, length, count, seed):
    """Windows of validation rows ending right after an <|assistant|> token: [count, length]."""
    rng = np.random.default_rng(seed)
    spots = [(r, c) for r in range(len(rows)) for c in np.nonzero(rows[r] == assistant_id)[0] if c + 1 >= length
             and c + 200 < rows.shape[1]]
    pick = rng.choice(len(spots), size=min(count, len(spots)), replace=False)
    return torch.from_numpy(np.stack([rows[spots[i][0], spots[i][1] + 1 - length:spots[i][1] + 1] for i in pick])).long()


def text_prompts(rows, eos_id, length, count, seed, room=200):
    """Windows of validation rows anywhere in their packed short documents: [count, length]. What the
    engine's MTP measurement serves (tools/bench/mtp_serve_bench.py: windows of a document stream),
    where assistant_prompts' chat turns follow a few templates. A window starts after its row's first
    eos (so a row's opening long retrieval document is left out), and it and the `room` tokens after it
    hold no padding (an eos after an eos). Fewer than `count` when the rows have too few spots."""
    rng = np.random.default_rng(seed)
    spots = []
    for r in range(len(rows)):
        row = np.asarray(rows[r])
        eos = np.nonzero(row == eos_id)[0]
        if len(eos) == 0:
            continue
        pad = np.nonzero((row[1:] == eos_id) & (row[:-1] == eos_id))[0] + 1  # padding positions
        end = int(pad[0]) if len(pad) else len(row)  # the first padding token, or the row's end
        for start in range(int(eos[0]) + 1, end - length - room + 1, length // 2):
            spots.append((r, start))
    pick = rng.choice(len(spots), size=min(count, len(spots)), replace=False) if spots else []
    windows = [np.asarray(rows[spots[i][0]])[spots[i][1]:spots[i][1] + length] for i in pick]
    return torch.from_numpy(np.stack(windows) if windows else np.zeros((0, length), np.int64)).long()


@torch.no_grad()
def mtp_acceptance(model, prompts, device, ks=(1, 3, 7), new_tokens=96, share=True, seed=0):
    """Accepted length (tokens emitted per target verification, the bonus token included).
    T=0: exact walk over the target's greedy continuation (drafts are used as inputs only while they
    match, so feeding the continuation is exact). T=1: expected value 1 + sum_i prod_{m<=i} alpha_m
    along a target sample, alpha = sum_x min(p, q) with rejection sampling, sum_x p q for strict
    verification (accept when the draft equals the target's own sample)."""
    model.eval()
    out = {}
    kmax = max(ks)
    P = prompts.shape[1]
    for temperature in (0, 1):
        gen = torch.Generator().manual_seed(seed + temperature)
        seq = generate(model, prompts, new_tokens, temperature, device, gen)
        with _autocast(device):
            h = model(seq, mode="sparse")
            logits = model.logits(h).float()
            drafts = [model.logits(x).float() for x in model.mtp_forward(h, seq, kmax, mode="sparse", share=share)]
        T = seq.shape[1]
        lo, hi = P - 1, T - 1 - kmax - 1  # rows t whose target token y_{t+1} is generated and whose drafts can be verified
        if temperature == 0:
            target = logits.argmax(-1).cpu().numpy()  # target[t] = y_{t+1}
            draft = torch.stack([d.argmax(-1) for d in drafts]).cpu().numpy()  # draft[j, b, t] guesses y_{t+2+j}
            for k in ks:
                emitted, steps = 0, 0
                for b in range(seq.shape[0]):
                    t = lo
                    while t <= hi:
                        a = 0
                        while a < k and draft[a, b, t] == target[b, t + 1 + a]:
                            a += 1
                        emitted += a + 1
                        steps += 1
                        t += a + 1
                out["T0_k{}".format(k)] = emitted / steps
        else:
            p = torch.softmax(logits, dim=-1)
            for name, fn in (("rejection", lambda pp, qq: torch.minimum(pp, qq).sum(-1)),
                             ("strict", lambda pp, qq: (pp * qq).sum(-1))):
                alphas = []
                for j in range(kmax):
                    q = torch.softmax(drafts[j][:, lo:hi + 1], dim=-1)
                    alphas.append(fn(p[:, lo + 1 + j:hi + 2 + j], q))  # [B, rows]
                alphas = torch.stack(alphas)  # [kmax, B, rows]
                for k in ks:
                    expected = 1 + torch.cumprod(alphas[:k], dim=0).sum(0)
                    out["T1_{}_k{}".format(name, k)] = expected.mean().item()
    return out
