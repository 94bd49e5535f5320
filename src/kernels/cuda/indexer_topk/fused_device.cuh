// The wgmma shapes of the fused indexer + top-k (fused_indexer_topk.cu): the
// scores (e4m3 operands, A from registers) and the head sum (bf16, A from
// registers: the ReLU'd score accumulators themselves). The plumbing (fences, descriptors,
// barriers) is common/wgmma.cuh. Only for .cu files.
#pragma once

#include <cstdint>

#include "kernels/cuda/common/wgmma.cuh"

namespace megactx::cuda::fused {

// D[64 x 256] (+)= A[64 x 32] * B[32 x 256], e4m3 in, fp32 accumulate; A from
// registers (per warp the m16n8k32 A fragment of its 16 rows), B from shared
// memory (K-major, `b` its descriptor). accumulate == 0 ignores D's old value.
// Accumulator of thread (warp w, lane g*4+t): d[4j + 2r + e] = D[16w + g + 8r][8j + 2t + e].
__device__ __forceinline__ void wgmma_m64n256k32_e4m3(float (&d)[128], const uint32_t (&a)[4],
                                                      uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " MEGACTX_WGMMA_D128_TEXT
      ", "
      "{%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
      : MEGACTX_WGMMA_D128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// The same with N = 128 (d[0 .. 64): the accumulators of a quarter tile).
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], const uint32_t (&a)[4],
                                                      uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " MEGACTX_WGMMA_D64_TEXT
      ", "
      "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : MEGACTX_WGMMA_D64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// D[64 x 16] (+)= A[64 x 16] * B[16 x 16], bf16 in, fp32 accumulate; A from
// registers (per warp the m16n8k16 A fragment of its 16 rows: a[0] row g and
// a[1] row g + 8 at k 2t, 2t + 1; a[2], a[3] the same at k 2t + 8, 2t + 9), B
// from shared memory (K-major, `b` its descriptor). The accumulator layout is
// the one above: d[4j + 2r + e] = D[16w + g + 8r][8j + 2t + e].
__device__ __forceinline__ void wgmma_m64n16k16_bf16(float (&d)[8], const uint32_t* a, uint64_t b,
                                                     int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " MEGACTX_WGMMA_D8_TEXT
      ", {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : MEGACTX_WGMMA_D8(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// max(x, 0) of two floats rounded to bf16 and packed: `low` in bits 0-15 (the
// lower k index of an A fragment register), `high` in bits 16-31.
__device__ __forceinline__ uint32_t relu_bf16x2(float low, float high) {
  uint32_t packed;
  asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}

}  // namespace megactx::cuda::fused
