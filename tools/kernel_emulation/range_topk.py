"""A desk check of src/kernels/cuda/topk/range_topk.cu on the CPU, written
before the kernel first ran on a GPU: one row emulated where the kernel's
arithmetic lives (key j of thread t is position j * T + t; each level bins
the keys of [lo, hi] at (key - lo) >> shift with the smallest shift that
leaves at most B bins; thread t owns bins B-1-2t and B-2-2t and an exclusive
scan over threads of their sums counts the keys in higher bins; the bin where
that count reaches the keys still needed becomes [lo, hi]; a bin holding
exactly those settles the row; the collect takes every key above hi and the
first `need` keys of [lo, hi] in (thread, key slot) order, at offsets from one
scan of the packed counts above << 16 | ties), against numpy's ordering of the
scores. It does not model the barriers or the shared-memory atomics.

    python3 tools/kernel_emulation/range_topk.py     # numpy; a few seconds

It checks that the selection is a top-k (every key above the k-th taken, the
rest ties of it), that the levels end within three, and that the packed scan
never carries (counts below 2^16)."""
import numpy as np

T, BIN_BITS = 1024, 11  # kThreads, kRangeBinBits
B = 1 << BIN_BITS
K = 2048
MAX_VISIBLE = 16384  # kTopkRangeMaxVisible


def ordered(scores):
    """float_to_ordered: the uint32 image whose order is the floats' order."""
    bits = scores.astype(np.float32).view(np.uint32)
    return np.where(bits & 0x80000000, ~bits, bits | 0x80000000).astype(np.uint32)


def clz32(x):
    return 32 - int(x).bit_length()


def range_select(scores, k=K):
    """The positions the kernel writes, in its output order, and its level count."""
    visible = len(scores)
    if visible <= k:
        return np.arange(visible), 0
    per_thread = (visible + T - 1) // T
    assert per_thread <= 16
    j, t = np.meshgrid(np.arange(per_thread), np.arange(T), indexing="ij")
    position = (j * T + t)  # [per_thread, T]
    valid = position < visible
    keys = np.zeros(position.shape, dtype=np.int64)
    keys[valid] = ordered(scores)[position[valid]]

    lo, hi = int(keys[valid].min()), int(keys[valid].max())
    need, levels = k, 0
    while hi != lo:
        levels += 1
        span = hi - lo
        shift = max(0, 32 - clz32(span) - BIN_BITS)
        assert (span >> shift) < B
        in_range = valid & (keys >= lo) & (keys <= hi)
        histogram = np.bincount(((keys[in_range] - lo) >> shift).astype(np.int64), minlength=B)
        assert len(histogram) == B
        # Thread t: upper bin B-1-2t, lower bin B-2-2t; exclusive scan over t.
        upper_bins = B - 1 - 2 * np.arange(T)
        upper, lower = histogram[upper_bins], histogram[upper_bins - 1]
        own = upper + lower
        above = np.concatenate(([0], np.cumsum(own)[:-1]))
        finders = np.nonzero((above < need) & (above + own >= need))[0]
        assert len(finders) == 1, finders
        f = finders[0]
        in_upper = above[f] + upper[f] >= need
        bin_ = upper_bins[f] if in_upper else upper_bins[f] - 1
        before = above[f] if in_upper else above[f] + upper[f]
        here = upper[f] if in_upper else lower[f]
        bin_low = lo + (int(bin_) << shift)
        bin_high = min(bin_low + (1 << shift) - 1, hi)
        lo, hi, need = bin_low, bin_high, int(need - before)
        assert 1 <= need <= here
        if here == need:
            break
        assert levels <= 3

    # Collect: counts per thread over its key slots, one exclusive scan of the packed word.
    above_count = (valid & (keys > hi)).sum(axis=0)
    tie_count = (valid & (keys >= lo) & (keys <= hi)).sum(axis=0)
    assert above_count.sum() < (1 << 16) and tie_count.sum() < (1 << 16)
    packed = (above_count << 16) | tie_count
    offsets = np.concatenate(([0], np.cumsum(packed)[:-1]))
    taken = min(k, visible)
    above_total = taken - need
    assert above_count.sum() == above_total
    out = np.full(k, -1, dtype=np.int64)
    for thread in range(T):
        above_at, tie_at = int(offsets[thread]) >> 16, int(offsets[thread]) & 0xFFFF
        for slot in range(per_thread):
            if not valid[slot, thread]:
                continue
            key = keys[slot, thread]
            if key > hi:
                out[above_at] = position[slot, thread]
                above_at += 1
            elif key >= lo:
                if tie_at < need:
                    out[above_total + tie_at] = position[slot, thread]
                tie_at += 1
    return out[:taken], levels


def check(scores, k=K, what=""):
    chosen, levels = range_select(scores, k)
    visible = len(scores)
    taken = min(k, visible)
    assert len(chosen) == taken and len(set(chosen.tolist())) == taken, what
    assert chosen.min() >= 0 and chosen.max() < visible, what
    if taken < visible:
        keys = ordered(scores).astype(np.int64)
        kth = np.sort(keys)[::-1][taken - 1]
        assert (keys[chosen] >= kth).all(), what
        assert (keys[chosen] > kth).sum() == (keys > kth).sum(), what
    return levels


def main():
    rng = np.random.default_rng(5)
    worst = 0
    extremes = np.array([np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3e38, -3e38, 1e-30],
                        dtype=np.float32)
    for visible in [2049, 3000, 4097, 8192, 9001, MAX_VISIBLE - 1, MAX_VISIBLE]:
        for k in [K, 1, 100]:
            rows = {
                "normal": rng.standard_normal(visible),
                "one octave": 5 + 1e-3 * rng.standard_normal(visible),
                "a few ulps": np.float32(1.0) + rng.integers(0, 40, visible) * np.float32(2**-23),
                "all equal but one": np.where(np.arange(visible) == 1234 % visible, 4.5, 4.0),
                "ties": rng.choice([-3.0, -0.5, 0.0, 1.0, 1.0, 2.5, 7.0], visible),
                "extremes": np.where(rng.random(visible) < 0.25,
                                     extremes[rng.integers(0, 9, visible)],
                                     rng.standard_normal(visible)),
                "indexer-like": np.maximum(rng.standard_normal((visible, 8)), 0) @ rng.random(8),
            }
            for name, scores in rows.items():
                worst = max(worst, check(np.asarray(scores, dtype=np.float32), k,
                                         f"{name}, {visible} keys, k {k}"))
    print(f"range_topk desk check: every row selected a top-k; at most {worst} levels")


if __name__ == "__main__":
    main()
