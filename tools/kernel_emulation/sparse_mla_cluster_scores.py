"""A desk check of register_scores_softmax in
src/kernels/cuda/sparse_mla/sparse_mla_cluster.cu (MEGACTX_SPARSE_MLA_REGISTER_SCORES=1),
written before that variant first ran on a GPU: every warp's ldmatrix_x4 addresses
for Q ([16 heads][kStride] f16) and K ([128 keys][kStride] f16), the m16n8k16
fragments they make, the even / odd k-step accumulators and the (head, key) each
accumulator element is read as, against Q . K^T over the 576 dims, on small
integers (exact). It does not model the softmax, the barriers or the PV stage.

    python3 tools/kernel_emulation/sparse_mla_cluster_scores.py   # pure Python, ~1 s

When written it agreed; swapping the two halves of the K address (key half and
dim half) makes it report a mismatch."""
import sys
import random
kStride, kDim, H, KEYS = 584, 576, 16, 128
random.seed(1)
Q = [[random.randint(-3, 3) for _ in range(kStride)] for _ in range(H)]
K = [[random.randint(-3, 3) for _ in range(kStride)] for _ in range(KEYS)]
def ldmatrix_x4(mat, addr_of_lane):
    # addr_of_lane(l) -> (row, col) of the 8 halves lane l points at (matrix l // 8, row l % 8)
    regs = [[None] * 4 for _ in range(32)]
    for m in range(4):
        rows = [addr_of_lane(8 * m + r) for r in range(8)]
        for T in range(32):
            r, c = rows[T // 4]
            cc = c + 2 * (T % 4)
            regs[T][m] = (mat[r][cc], mat[r][cc + 1])
    return regs
def mma(acc, a, b0, b1):
    # acc[T] = [c0..c3]; a[T] = 4 pairs, b0[T], b1[T] pairs
    A = [[0] * 16 for _ in range(16)]; B = [[0] * 8 for _ in range(16)]
    for T in range(32):
        g, t = T // 4, T % 4
        for e in range(2):
            A[g][2 * t + e] = a[T][0][e]; A[g + 8][2 * t + e] = a[T][1][e]
            A[g][2 * t + 8 + e] = a[T][2][e]; A[g + 8][2 * t + 8 + e] = a[T][3][e]
            B[2 * t + e][g] = b0[T][e]; B[2 * t + 8 + e][g] = b1[T][e]
    for T in range(32):
        g, t = T // 4, T % 4
        for r in range(2):
            for e in range(2):
                acc[T][2 * r + e] += sum(A[g + 8 * r][k] * B[k][2 * t + e] for k in range(16))
ok = True
for warp in range(8):
    acc = [[[[0] * 4 for _ in range(32)] for _ in range(2)] for _ in range(2)]  # [parity][n][T][4]
    for ks in range(kDim // 16):
        a = ldmatrix_x4(Q, lambda l: (l % 16, (l // 16) * 8 + ks * 16))
        b = ldmatrix_x4(K, lambda l: (warp * 16 + l % 8 + (l // 16) * 8, ((l // 8) % 2) * 8 + ks * 16))
        mma(acc[ks % 2][0], a, [b[T][0] for T in range(32)], [b[T][1] for T in range(32)])
        mma(acc[ks % 2][1], a, [b[T][2] for T in range(32)], [b[T][3] for T in range(32)])
    for T in range(32):
        g, t = T // 4, T % 4
        for n in range(2):
            for e in range(2):
                key = warp * 16 + 8 * n + 2 * t + e
                for r in range(2):
                    got = acc[0][n][T][2 * r + e] + acc[1][n][T][2 * r + e]
                    want = sum(Q[g + 8 * r][d] * K[key][d] for d in range(kDim))
                    if got != want:
                        ok = False
print("register scores indexing:", "OK" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
