"""A desk check of src/kernels/cuda/topk/cluster_topk.cu on the CPU, written
before the kernel first ran on a GPU: one row's cluster emulated where the
kernel's index maps live (key j of thread t in CTA r is position
(j * C + r) * T + t; CTA r owns the bins [r * B / C, (r + 1) * B / C) of a
digit and scans them from the top; the digit is decided where the running
count from the top reaches the keys still needed; a bin that holds exactly
those settles the row), against numpy's ordering of the scores. It does not
model the barriers, the distributed shared memory or the warp claims; a GPU
failure of indexer_topk_test's cluster cases that this script does not
reproduce points there.

    python3 tools/kernel_emulation/cluster_topk.py     # numpy; under a second

When written it agreed on normal and heavy-tie rows of 2K to 384K keys (the
GPU tests then passed on the H200 on their first run)."""
import numpy as np

C, T = 8, 1024  # kTopkClusterCtas, kTopkClusterThreads
K = 2048


def ordered(scores):
    """float_to_ordered: the uint32 image whose order is the floats' order."""
    bits = scores.astype(np.float32).view(np.uint32)
    return np.where(bits & 0x80000000, ~bits, bits | 0x80000000).astype(np.uint32)


def cluster_select(scores, k=K):
    visible = len(scores)
    if visible <= k:
        return np.arange(visible)
    per_thread = (visible + C * T - 1) // (C * T)
    j, r, t = np.meshgrid(np.arange(per_thread), np.arange(C), np.arange(T), indexing="ij")
    position = ((j * C + r) * T + t).ravel()
    rank = r.ravel()
    valid = position < visible
    position, rank = position[valid], rank[valid]
    keys = ordered(scores)[position].astype(np.int64)

    prefix, need, settled_shift = 0, k, 0
    for level, (shift, bits) in enumerate(((20, 12), (8, 12), (0, 8))):
        bins = 1 << bits
        owned = bins // C
        match = np.ones(len(keys), bool) if level == 0 else (keys >> (shift + bits)) == prefix
        histogram = np.zeros((C, bins), np.int64)  # each CTA's own
        np.add.at(histogram, (rank[match], (keys[match] >> shift) & (bins - 1)), 1)
        decisions = []
        segment_total = [histogram[:, c * owned:(c + 1) * owned].sum() for c in range(C)]
        for c in range(C):
            bin_of_thread = (c + 1) * owned - 1 - np.arange(owned)  # descending
            own = histogram[:, bin_of_thread].sum(0)
            above = sum(segment_total[c + 1:]) + np.concatenate([[0], np.cumsum(own)[:-1]])
            for i in np.nonzero((above < need) & (above + own >= need))[0]:
                left = need - above[i]
                decisions.append((bin_of_thread[i], left, own[i] == left))
        assert len(decisions) == 1, decisions  # exactly one thread of the cluster decides
        digit, need, whole = decisions[0]
        prefix = (prefix << bits) | int(digit)
        if whole:
            settled_shift = shift
            break
    shifted = keys >> settled_shift
    above = position[shifted > prefix]
    ties = position[shifted == prefix]
    assert len(above) == k - need and len(ties) >= need
    return np.concatenate([above, ties[:need]])


def main():
    rng = np.random.default_rng(1)
    cases = [(2049, "normal"), (10000, "normal"), (4097, "ties"), (30000, "ties"),
             (65536, "four values"), (200001, "normal"), (48 * C * T, "normal"),
             (48 * C * T - 5, "four values")]
    for visible, kind in cases:
        if kind == "normal":
            scores = rng.normal(size=visible).astype(np.float32)
        elif kind == "ties":
            scores = rng.choice(np.array([-3, -0.5, 0, 1, 1, 2.5, 7], np.float32), visible)
        else:
            scores = rng.choice(np.array([-1, 0, 0, 2], np.float32), visible)
        chosen = cluster_select(scores)
        assert len(np.unique(chosen)) == K and chosen.max() < visible
        kth = np.sort(scores)[::-1][K - 1]
        assert (scores[chosen] >= kth).all()
        assert (scores[chosen] > kth).sum() == (scores > kth).sum()
        print(f"{visible} keys, {kind}: a valid top-{K}")


if __name__ == "__main__":
    main()
