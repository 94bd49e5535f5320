// Register-operand helpers of the sparse MLA kernels that build wgmma A
// fragments from the cache's e4m3 entries themselves (the fp8-ring prefill
// layout, sparse_mla_prefill_fp8ring.cu, and its probe,
// bench/cuda/sparse_mla_fragment_probe.cu): the m64n64k16 MMA with A from
// registers, and the f16 pair conversions. Only for .cu files.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/dsa_layout.h"
#include "kernels/cuda/common/wgmma.cuh"

namespace megactx::cuda {

// D[64 x 64] (+)= A[64 x 16] * B[16 x 64]: A from registers (f16 pairs: rows g
// / g + 8 x k-slots 2t.. / 2t + 8..), B from shared memory, K-major (kTransB
// 0) or MN-major (1). Thread (warp w, lane g*4+t): d[4j + 2r + e] = D[16w + g
// + 8r][8j + 2t + e].
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float* d, const uint32_t (&a)[4], uint64_t b,
                                                   int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " MEGACTX_WGMMA_D32_TEXT
      ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : MEGACTX_WGMMA_D32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(kTransB));
}

// Two e4m3 (the low 16 bits) -> an f16 pair, exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t pair) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t x, uint32_t y) {
  const __half2 r =
      __hmul2(*reinterpret_cast<const __half2*>(&x), *reinterpret_cast<const __half2*>(&y));
  return *reinterpret_cast<const uint32_t*>(&r);
}
// Bytes of {b, a} picked by `selector` (PTX prmt): 0x5410 pairs the low
// halves of a and b, 0x7632 the high halves.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}
// A bf16 pair -> an f16 pair (round to nearest).
__device__ __forceinline__ uint32_t bf16x2_to_half2(uint32_t pair) {
  return pack_half2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xffff0000u));
}

// The four 128-dim group scales of score rows `row0` / `row1` as f16 pairs
// (s, s), loaded once per block (16 bytes per row) rather than per k-step.
struct ScoreScales {
  uint32_t row0[4], row1[4];  // [group]
};
__device__ __forceinline__ ScoreScales entry_score_scales(const uint8_t* row0,
                                                          const uint8_t* row1) {
  const float4 f0 = *reinterpret_cast<const float4*>(row0 + kLatentScaleOffset);
  const float4 f1 = *reinterpret_cast<const float4*>(row1 + kLatentScaleOffset);
  return {{pack_half2(f0.x, f0.x), pack_half2(f0.y, f0.y), pack_half2(f0.z, f0.z),
           pack_half2(f0.w, f0.w)},
          {pack_half2(f1.x, f1.x), pack_half2(f1.y, f1.y), pack_half2(f1.z, f1.z),
           pack_half2(f1.w, f1.w)}};
}

// The score A fragment of k-step ks (of 36) for S^T = K . Q^T: key rows
// `row0` and `row1` (two 656-byte entries, rows g and g + 8 of the thread's
// warp), k-slots 2t + e / 2t + 8 + e = dims 16 ks + 4t + e / + 2 + e (one
// 4-byte load per row; the Q tile is stored in that order): e4m3 times the
// group scale (`scales`, of the same rows), or bf16 rope (ks >= 32).
__device__ __forceinline__ void entry_score_fragment(const uint8_t* row0, const uint8_t* row1,
                                                     int ks, int t, const ScoreScales& scales,
                                                     uint32_t (&a)[4]) {
  if (ks < 32) {
    const uint32_t s0 = scales.row0[ks / 8], s1 = scales.row1[ks / 8];
    const uint32_t w0 = *reinterpret_cast<const uint32_t*>(row0 + 16 * ks + 4 * t);
    const uint32_t w1 = *reinterpret_cast<const uint32_t*>(row1 + 16 * ks + 4 * t);
    a[0] = hmul2_bits(e4m3x2_to_half2(w0), s0);
    a[2] = hmul2_bits(e4m3x2_to_half2(w0 >> 16), s0);
    a[1] = hmul2_bits(e4m3x2_to_half2(w1), s1);
    a[3] = hmul2_bits(e4m3x2_to_half2(w1 >> 16), s1);
  } else {
    const int offset = kLatentRopeOffset + 2 * (16 * (ks - 32) + 4 * t);
    const uint2 r0 = *reinterpret_cast<const uint2*>(row0 + offset);
    const uint2 r1 = *reinterpret_cast<const uint2*>(row1 + offset);
    a[0] = bf16x2_to_half2(r0.x);
    a[2] = bf16x2_to_half2(r0.y);
    a[1] = bf16x2_to_half2(r1.x);
    a[3] = bf16x2_to_half2(r1.y);
  }
}

// The scales of one output key step (the four keys at `key0` + 4e x 656
// bytes) for two adjacent groups `group` (even) and `group` + 1, as the f16
// pairs entry_output_fragment takes: [group - `group`][keys (0, 1) / (2, 3)].
// One 8-byte load per key, shared by the step's fragments of both groups.
struct OutputScales {
  uint32_t pair[2][2];
};
// The same scales as loaded (the four keys' float pairs), so that a kernel can
// load them ahead of their packing; entry_output_scales does both at once.
struct OutputScaleWords {
  float2 f[4];
};
__device__ __forceinline__ OutputScaleWords entry_output_scale_words(const uint8_t* key0,
                                                                     int group) {
  OutputScaleWords w;
#pragma unroll
  for (int e = 0; e < 4; ++e)
    w.f[e] = *reinterpret_cast<const float2*>(key0 + 4 * e * kLatentBytes + kLatentScaleOffset +
                                              4 * group);
  return w;
}
__device__ __forceinline__ OutputScales pack_output_scales(const OutputScaleWords& w) {
  return {{{pack_half2(w.f[0].x, w.f[1].x), pack_half2(w.f[2].x, w.f[3].x)},
           {pack_half2(w.f[0].y, w.f[1].y), pack_half2(w.f[2].y, w.f[3].y)}}};
}
__device__ __forceinline__ OutputScales entry_output_scales(const uint8_t* key0, int group) {
  return pack_output_scales(entry_output_scale_words(key0, group));
}

// The output A fragment of V^T for O^T = V^T . P^T: dims `dim`, `dim` + 1 (rows
// g, g + 8) of the four keys at `key0` + 4e x 656 bytes (k-slots 2t, 2t + 1,
// 2t + 8, 2t + 9: P^T's rows in that order), e4m3 times each key's scale of
// the dims' group (`pairs`: OutputScales::pair of that group; one 2-byte load
// per key, keys paired with prmt).
__device__ __forceinline__ void entry_output_fragment(const uint8_t* key0, int dim,
                                                      const uint32_t (&pairs)[2],
                                                      uint32_t (&a)[4]) {
  uint32_t x[4];
#pragma unroll
  for (int e = 0; e < 4; ++e)
    x[e] = e4m3x2_to_half2(*reinterpret_cast<const uint16_t*>(key0 + 4 * e * kLatentBytes + dim));
  a[0] = hmul2_bits(prmt(x[0], x[1], 0x5410), pairs[0]);
  a[1] = hmul2_bits(prmt(x[0], x[1], 0x7632), pairs[0]);
  a[2] = hmul2_bits(prmt(x[2], x[3], 0x5410), pairs[1]);
  a[3] = hmul2_bits(prmt(x[2], x[3], 0x7632), pairs[1]);
}

}  // namespace megactx::cuda
