"""A desk check of the ping-pong consumers' running max in
src/kernels/cuda/sparse_mla/sparse_mla_prefill_fp8ring.cu
(fp8ring_pingpong_consumer), written before the variant first ran on a GPU.

Per bunch each consumer votes alone whether its block's scores pass the shared
running max by the slack; the one that does not pass writes P relative to the
old max and may already have put its own block into its O; the one that passes
puts a non-passing partner's block into its O before rescaling. This script
replays those orders (every combination of who passes, in random and adversarial
score orders) with P rounded to f16 as the kernel does, and checks each consumer's
O and the row sums against a float64 softmax, and that no P exceeds 2^slack.
It does not model the mbarriers, the fragments or the PTX.

    python3 tools/kernel_emulation/sparse_mla_pingpong_max.py   # numpy, ~1 s
"""
import numpy as np

SLACK = 8.0
NO_MAX = -1e30
BLOCK = 64


def run(scores, values):
    """scores [keys] (log2 units, -inf for missing), values [keys, dims]."""
    keys = len(scores)
    bunches = (keys + 2 * BLOCK - 1) // (2 * BLOCK)
    ref = NO_MAX
    o = [np.zeros(values.shape[1]), np.zeros(values.shape[1])]  # consumer c: its own copy of O
    sums = [0.0, 0.0]
    largest_p = 0.0

    def block(b, c):
        lo = (2 * b + c) * BLOCK
        s = np.full(BLOCK, -np.inf)
        v = np.zeros((BLOCK, values.shape[1]))
        n = max(0, min(BLOCK, keys - lo))
        s[:n], v[:n] = scores[lo:lo + n], values[lo:lo + n]
        return s, v

    def tile(s, m):
        p = np.exp2(s - m).astype(np.float16).astype(np.float64)
        return p

    for b in range(bunches):
        blocks = [block(b, 0), block(b, 1)]
        passed = [bool(np.any(blocks[c][0] > ref + SLACK)) for c in range(2)]
        maxima = [np.max(blocks[c][0]) for c in range(2)]
        new = ref
        for c in range(2):
            if passed[c]:
                new = max(new, maxima[c])
        factor = np.exp2(ref - new)
        tiles = [None, None]
        # Non-passing consumers write their tile relative to the old max first.
        for c in range(2):
            if not passed[c]:
                tiles[c] = tile(blocks[c][0], ref)
                sums[c] += tiles[c].sum()
        for c in range(2):
            x = 1 - c
            if not passed[c]:
                o[c] += tiles[c] @ blocks[c][1]  # its own block, old max
                if passed[x]:
                    o[c] *= factor
                    sums[c] *= factor
                    while tiles[x] is None:  # the other writes its tile (new max)
                        tiles[x] = tile(blocks[x][0], new)
                        sums[x] += tiles[x].sum()
                o[c] += tiles[x] @ blocks[x][1]
            else:
                sums[c] *= factor
                if not passed[x]:
                    o[c] += tiles[x] @ blocks[x][1]  # the partner's tile, old max
                if tiles[c] is None:
                    tiles[c] = tile(blocks[c][0], new)
                    sums[c] += tiles[c].sum()
                o[c] *= factor
                o[c] += tiles[c] @ blocks[c][1]
                if passed[x]:
                    if tiles[x] is None:
                        tiles[x] = tile(blocks[x][0], new)
                        sums[x] += tiles[x].sum()
                    o[c] += tiles[x] @ blocks[x][1]
        largest_p = max(largest_p, max(t.max() for t in tiles))
        ref = new
    total = sums[0] + sums[1]
    valid = np.isfinite(scores)
    w = np.exp2(scores[valid] - scores[valid].max())
    want = (w @ values[valid]) / w.sum()
    lse_want = scores[valid].max() + np.log2(w.sum())
    errors = [np.max(np.abs(o[c] / total - want)) / np.max(np.abs(want)) for c in range(2)]
    return max(errors), abs(ref + np.log2(total) - lse_want), largest_p


def main():
    rng = np.random.default_rng(3)
    worst = (0.0, 0.0, 0.0)
    cases = 0
    for keys in (7, 64, 100, 128, 300, 2048):
        for order in ("random", "rising", "falling", "one_side"):
            scores = rng.normal(0, 4, keys)
            if order == "rising":
                scores = np.sort(scores) * 3  # every bunch raises the max
            elif order == "falling":
                scores = -np.sort(-scores)
            elif order == "one_side":  # only consumer 1's blocks rise
                scores = rng.normal(0, 1, keys)
                for k in range(keys):
                    if (k // BLOCK) % 2 == 1:
                        scores[k] += 10 * (k // (2 * BLOCK))
            scores[rng.random(keys) < 0.1] = -np.inf
            scores[0] = rng.normal()
            values = rng.normal(0, 1, (keys, 16))
            result = run(scores, values)
            worst = tuple(max(a, b) for a, b in zip(worst, result))
            cases += 1
    print(f"{cases} cases: O relative error {worst[0]:.2e}, lse error (log2) {worst[1]:.2e}, "
          f"largest P {worst[2]:.1f}")
    assert worst[0] < 2e-3 and worst[1] < 1e-3 and worst[2] <= 2 ** SLACK


if __name__ == "__main__":
    main()
