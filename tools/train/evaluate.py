"""Evaluation of the default model with the PyTorch implementation (model.py):
validation loss (sparse vs dense), passkey retrieval by context length, indexer recall against the
dense attention's own top-k, and MTP accepted lengths (chained drafts verified against the target)."""
import numpy as np
import torch
import torch.nn.functional as F

from model import IndexerLoss


def _autocast(device):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@torch.no_grad()
def val_loss(model, rows, mode, device, batch=2):
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(rows), batch):
        full = torch.from_numpy(rows[i:i + batch]).to(device).long()
        with _autocast(device):
            logits = model.logits(model(full[:, :-1], mode=mode))
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), full[:, 1:].reshape(-1), reduction="sum")
        total += ce.item()
        count += full[:, 1:].numel()
    return total / count


@torch.no_grad()
def passkey(model, tok, items, mode, device, eos_id, deadline=None, log=None):
    """items: {"tokens", "prompt", "answer", "key"}. A sample passes when greedy decoding reproduces the
    whole answer ("\\nThe pass key is K.") token by token after the prompt (teacher-forced argmax).
    Logits are computed only over the answer span (a 128K prompt would need 2 GB of logits). A length
    whose turn comes after `deadline` (time.time()) is recorded as skipped; an out-of-memory error is
    recorded for its length, the others still run."""
    import time

    model.eval()
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
                with _autocast(device):
                    h = model(ids, mode=mode)
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
        if log is not None:
            log("passkey {} {}: {}/{} ({:.0f} tokens, {:.1f}s)".format(mode, nominal, correct, done,
                                                                      np.mean(lengths[:done]), time.time() - t0))
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
