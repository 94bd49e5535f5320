#!/usr/bin/python3
"""CPU check (Debian's python3-torch) that run 4's memory-saving paths compute what runs 1-3 computed:
the gather sparse attention (O(T x k)) against the [B,T,T] mask path, and the chunked LM/MTP head
losses against the whole-logits losses: forward, MTP drafts, indexer KL and every gradient, fp32.
The indexer's top-k selections of the mask run are replayed in the others: a near-tie in the index
scores can flip under fp32 rounding differences of the layers before (a different selected set, not
a different computation).

    /usr/bin/python3 tests/default_model/training_paths_test.py   # max relative differences; exit 1 above 1e-4

CTest `default_model_training_paths`; without PyTorch it exits 77 (skipped)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train"))

try:
    import torch  # noqa: E402
except ImportError as error:
    print("SKIPPED: needs PyTorch (Debian: apt-get install python3-torch):", error)
    sys.exit(77)

import model as M  # noqa: E402
import train as tr  # noqa: E402
from config import ModelConfig  # noqa: E402


def losses(m, full, w, rows, head_chunk):
    inp = full[:, :-1]
    il = M.IndexerLoss()
    h = m(inp, mode="sparse", index_loss=il, kl_rows=rows)
    if head_chunk:
        lm, mtp, _ = tr.head_losses(m, h, inp, full, w, 3, "sparse", True, 1.0, il, rows, chunk=head_chunk)
    else:
        logits = m.logits(h)
        lm = tr.weighted_ce(logits, full[:, 1:], w)
        mtp, _ = tr.mtp_losses(m, h, logits, inp, full, w, 3, "sparse", True, 1.0, il, rows)
    loss = lm + 0.3 * mtp + il.total()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad(set_to_none=True)
    return h.detach(), loss.item(), grads


class Replay:
    """Records Indexer.topk results in call order, then returns them in the same order."""

    def __init__(self):
        self.orig, self.saved, self.mode, self.i = M.Indexer.topk, [], "record", 0
        replay = self

        def topk(ix, *args, **kwargs):
            if replay.mode == "record":
                out = replay.orig(ix, *args, **kwargs)
                replay.saved.append(out)
                return out
            out = replay.saved[replay.i]
            replay.i += 1
            return out

        M.Indexer.topk = topk

    def replay(self):
        self.mode, self.i = "replay", 0


def main():
    torch.set_num_threads(2)
    worst = 0.0
    for B, T, k in [(2, 200, 16), (1, 300, 128)]:
        torch.manual_seed(0)
        m = M.GlmMoeDsa(ModelConfig(vocab_size=512, index_topk=k))
        full = torch.randint(0, 512, (B, T + 1))
        w = torch.rand(B, T) * 3
        rows = torch.tensor(sorted(set(torch.randint(0, T, (40,)).tolist())))
        results = {}
        rec = Replay()
        for impl, chunk in [("mask", 0), ("gather", 0), ("gather", 64)]:
            m.sparse_impl = impl
            results[(impl, chunk)] = losses(m, full, w, rows, chunk)
            rec.replay()
        M.Indexer.topk = rec.orig
        ref = results[("mask", 0)]
        for key, (h, loss, grads) in results.items():
            dh = ((h - ref[0]).abs().max() / ref[0].abs().max()).item()
            dg = max(((grads[n] - ref[2][n]).abs().max() / (ref[2][n].abs().max() + 1e-30)).item() for n in ref[2])
            same = sorted(grads) == sorted(ref[2])
            worst = max(worst, dh, dg, 0.0 if same else 1.0)
            print("B={} T={} k={} {} head_chunk={}: loss {:.6f} (mask {:.6f}), hidden {:.1e}, max grad {:.1e}, "
                  "same parameters {}".format(B, T, k, key[0], key[1], loss, ref[1], dh, dg, same))
    print("worst relative difference {:.1e}".format(worst))
    sys.exit(0 if worst < 1e-4 else 1)


if __name__ == "__main__":
    main()
