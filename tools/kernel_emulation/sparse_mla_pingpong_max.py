"""A desk check of the ping-pong consumers' running max in
src/kernels/cuda/sparse_mla/sparse_mla_prefill_fp8ring.cu
(fp8ring_pingpong_consumer), written before the variant first ran on a GPU.

Per bunch each consumer votes alone whether its block's scores pass the shared
running max by the slack. One that does not pass writes P relative to the old
max and puts its own block into its O at once; one that passes puts a
non-passing partner's block into its O before it rescales. This script replays
those orders (every combination of who passes: random, rising, falling and
one-sided score orders, missing keys) with P rounded to f16 as the kernel does,
and checks each consumer's O, the row sums and the lse against a float64
softmax, and that no P exceeds 2^slack. It does not model the mbarriers (see
sparse_mla_pingpong_protocol.py), the fragments or the PTX.

    python3 tools/kernel_emulation/sparse_mla_pingpong_max.py   # pure Python, ~1 s
"""
import math
import random
import struct

SLACK = 8.0
NO_MAX = -1e30
BLOCK = 64
DIMS = 8


def f16(x):
    return struct.unpack("<e", struct.pack("<e", x))[0]


def exp2(x):
    return 0.0 if x == -math.inf else 2.0 ** x


def run(scores, values):
    """scores [keys] (log2 units, -inf for missing), values [keys][DIMS]."""
    keys = len(scores)
    bunches = (keys + 2 * BLOCK - 1) // (2 * BLOCK)
    ref = NO_MAX
    o = [[0.0] * DIMS, [0.0] * DIMS]  # consumer c's O (on the GPU its own output dims)
    sums = [0.0, 0.0]
    largest_p = 0.0

    def block(b, c):
        lo = (2 * b + c) * BLOCK
        s = [scores[k] if k < keys else -math.inf for k in range(lo, lo + BLOCK)]
        v = [values[k] if k < keys else [0.0] * DIMS for k in range(lo, lo + BLOCK)]
        return s, v

    def tile(s, m):
        return [f16(exp2(x - m)) for x in s]

    def accumulate(c, p, v):
        for pk, vk in zip(p, v):
            for d in range(DIMS):
                o[c][d] += pk * vk[d]

    def scale(c, factor):
        o[c] = [x * factor for x in o[c]]

    for b in range(bunches):
        blocks = [block(b, 0), block(b, 1)]
        passed = [any(x > ref + SLACK for x in blocks[c][0]) for c in range(2)]
        new = ref
        for c in range(2):
            if passed[c]:
                new = max(new, max(blocks[c][0]))
        factor = exp2(ref - new)
        tiles = [None, None]
        for c in range(2):  # a consumer that does not pass: its tile relative to the old max
            if not passed[c]:
                tiles[c] = tile(blocks[c][0], ref)
                sums[c] += sum(tiles[c])
        for c in range(2):  # a consumer that passes: its sums rescaled, its tile relative to new
            if passed[c]:
                sums[c] *= factor
                tiles[c] = tile(blocks[c][0], new)
                sums[c] += sum(tiles[c])
        for c in range(2):
            x = 1 - c
            if not passed[c]:
                accumulate(c, tiles[c], blocks[c][1])  # its own block, old max
                if passed[x]:
                    scale(c, factor)
                    sums[c] *= factor
                accumulate(c, tiles[x], blocks[x][1])
            else:
                if not passed[x]:
                    accumulate(c, tiles[x], blocks[x][1])  # the partner's tile, old max
                scale(c, factor)
                accumulate(c, tiles[c], blocks[c][1])
                if passed[x]:
                    accumulate(c, tiles[x], blocks[x][1])
        largest_p = max(largest_p, max(max(t) for t in tiles))
        ref = new
    total = sums[0] + sums[1]
    valid = [k for k in range(keys) if scores[k] != -math.inf]
    top = max(scores[k] for k in valid)
    w = {k: 2.0 ** (scores[k] - top) for k in valid}
    w_sum = sum(w.values())
    want = [sum(w[k] * values[k][d] for k in valid) / w_sum for d in range(DIMS)]
    scale_want = max(abs(x) for x in want)
    error = max(abs(o[c][d] / total - want[d]) / scale_want for c in range(2) for d in range(DIMS))
    lse_error = abs(ref + math.log2(total) - (top + math.log2(w_sum)))
    return error, lse_error, largest_p


def main():
    rng = random.Random(3)
    worst = (0.0, 0.0, 0.0)
    cases = 0
    for keys in (7, 64, 100, 128, 300, 2048):
        for order in ("random", "rising", "falling", "one_side"):
            scores = [rng.gauss(0, 4) for _ in range(keys)]
            if order == "rising":  # every bunch raises the max
                scores = [3 * x for x in sorted(scores)]
            elif order == "falling":
                scores.sort(reverse=True)
            elif order == "one_side":  # only consumer 1's blocks rise
                scores = [rng.gauss(0, 1) + (10 * (k // (2 * BLOCK)) if (k // BLOCK) % 2 else 0)
                          for k in range(keys)]
            scores = [-math.inf if rng.random() < 0.1 else x for x in scores]
            scores[0] = rng.gauss(0, 1)
            values = [[rng.gauss(0, 1) for _ in range(DIMS)] for _ in range(keys)]
            result = run(scores, values)
            worst = tuple(max(a, b) for a, b in zip(worst, result))
            cases += 1
    print(f"{cases} cases: O relative error {worst[0]:.2e}, lse error (log2) {worst[1]:.2e}, "
          f"largest P {worst[2]:.1f}")
    assert worst[0] < 3e-3 and worst[1] < 1e-3 and worst[2] <= 2 ** SLACK


if __name__ == "__main__":
    main()
