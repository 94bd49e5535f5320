// The decode indexer's per-warp scoring steps, shared by the scoring kernel
// (indexer_scores.cu) and the scoring-and-selection kernel
// (indexer_topk/decode_select.cu), so that both compute every score with the
// same instructions in the same order: the same fp32 bits. Only for .cu files.
//
// A warp scores 8-key tiles of one query row from keys in shared memory
// (132 B per key: 128 e4m3 | fp32 scale), g = lane / 4, t = lane % 4:
//   acc[head, key] = q8[row, head, :] . k8[key, :]      (mma m16n8k32 e4m3)
//   score[key]     = key_scale * sum_head w[head] * relu(acc[head, key])
// The 128-dim dot product is summed in a permuted k order so that each thread
// reads 32 contiguous bytes of a key (the sum does not care about order).
#pragma once

#include <cstdint>

#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/dsa_layout.h"

namespace megactx::cuda::indexer_tiles {

// The query fragments of `row` in registers, k permuted: k-step s of thread t
// covers bytes t*32 + s*8 + [0, 8) of the 128-byte head vector; MTiles =
// heads / 16. queries [rows, heads, 128] e4m3, weights [rows, heads].
template <int MTiles>
__device__ __forceinline__ void load_query(const uint8_t* queries, const float* weights,
                                           int64_t row, int heads, int g, int t,
                                           uint32_t (&a)[MTiles][4][4],
                                           float (&weight)[MTiles][2]) {
#pragma unroll
  for (int mt = 0; mt < MTiles; ++mt) {
    const int head = mt * 16 + g;
    const uint8_t* q_low = queries + (row * heads + head) * kIndexerHeadDim;
    const uint8_t* q_high = q_low + 8 * kIndexerHeadDim;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int offset = t * 32 + s * 8;
      a[mt][s][0] = *reinterpret_cast<const uint32_t*>(q_low + offset);
      a[mt][s][1] = *reinterpret_cast<const uint32_t*>(q_high + offset);
      a[mt][s][2] = *reinterpret_cast<const uint32_t*>(q_low + offset + 4);
      a[mt][s][3] = *reinterpret_cast<const uint32_t*>(q_high + offset + 4);
    }
    weight[mt][0] = weights[row * heads + head];
    weight[mt][1] = weights[row * heads + head + 8];
  }
}

// Scores of Tiles 8-key tiles before the key scales: score[u][e] is key
// 2t + e of tile u, summed over all heads (every lane of a t column holds the
// same sums). tile_keys[u] points at the tile's first key in shared memory;
// several tiles at a time so that their MMA chains overlap. A key's sum is
// the same for any Tiles.
template <int MTiles, int Tiles>
__device__ __forceinline__ void score_tiles(const uint32_t (&a)[MTiles][4][4],
                                            const float (&weight)[MTiles][2],
                                            const uint8_t* const (&tile_keys)[Tiles], int g, int t,
                                            float (&score)[Tiles][2]) {
#pragma unroll
  for (int u = 0; u < Tiles; ++u) {
    const uint8_t* key = tile_keys[u] + g * kIndexerKeyBytes + t * 32;
    uint32_t b[8];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      b[2 * s] = *reinterpret_cast<const uint32_t*>(key + s * 8);
      b[2 * s + 1] = *reinterpret_cast<const uint32_t*>(key + s * 8 + 4);
    }
    score[u][0] = score[u][1] = 0.f;
#pragma unroll
    for (int mt = 0; mt < MTiles; ++mt) {
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int s = 0; s < 4; ++s) mma_e4m3_16x8x32(c, a[mt][s], b[2 * s], b[2 * s + 1]);
      score[u][0] += weight[mt][0] * fmaxf(c[0], 0.f) + weight[mt][1] * fmaxf(c[2], 0.f);
      score[u][1] += weight[mt][0] * fmaxf(c[1], 0.f) + weight[mt][1] * fmaxf(c[3], 0.f);
    }
  }
#pragma unroll
  for (int mask = 4; mask < 32; mask <<= 1)  // sum over g: the heads
#pragma unroll
    for (int u = 0; u < Tiles; ++u) {
      score[u][0] += __shfl_xor_sync(0xffffffffu, score[u][0], mask);
      score[u][1] += __shfl_xor_sync(0xffffffffu, score[u][1], mask);
    }
}

// The fp32 scale of key `index` of a run of keys in shared memory.
__device__ __forceinline__ float key_scale(const uint8_t* keys, int index) {
  return *reinterpret_cast<const float*>(keys + index * kIndexerKeyBytes + kIndexerHeadDim);
}

}  // namespace megactx::cuda::indexer_tiles
