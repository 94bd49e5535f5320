// One warp's share of an fp8 block-scaled product whose MMA rows are the
// weight's rows: 16 weight rows (e4m3, 128x128 block scales, as fp8
// checkpoints ship them) against up to 8 * kColumnGroups input rows (e4m3,
// one float32 scale per 1x128 group, quantize_e4m3_groups) on mma.sync
// m16n8k32, with DeepGEMM-style promotion: each 128-column group's partial
// sums leave the MMA unscaled and are added to float32 accumulators times
// input scale * weight scale, so the MMA's limited internal accumulation
// spans 128 products only.
//
// This is the shape of decode and MTP verification (few rows, many weights):
// every weight byte is read once by one warp, and the input rows are the
// MMA's N, so 32 rows cost no more weight traffic than one. Used by the dense
// linears (fp8_block_gemm_skinny.cu) and the routed experts
// (moe/grouped_experts_fp8.cu).
//
// Operand order: a dot product's k order is free inside a 128-column group
// (one scale pair per group), so lane (g, t) = (lane / 4, lane % 4) loads
// 8 contiguous bytes at 32j + 8t of the group for j = 0..3 (one warp load
// covers 32 contiguous bytes of each of 8 rows: whole sectors), and MMA
// k-step j takes the first word as logical k 4t..4t+3 and the second as
// 16+4t..16+4t+3 (the fragment layout in device_primitives.cuh). Weights and
// inputs use the same map, so the products pair up. `in` must be a multiple
// of 8 (an 8-byte load is wholly inside or past the row) and every row
// pointer 8-byte aligned. Only for .cu files (sm_90a).
#pragma once

#include <cstdint>

#include "kernels/cuda/common/device_primitives.cuh"

namespace megactx::cuda {

inline constexpr int kFp8MmaGroup = 128;  // scale block edge (weights) and group width (inputs)

// What one lane reads. Null pointers read as zeros (rows past the matrix or
// the batch); their sums are computed and never stored.
template <int kColumnGroups>
struct Fp8WeightRows {
  const uint8_t* low = nullptr;      // weight row of MMA row g: [in] e4m3
  const uint8_t* high = nullptr;     // weight row of MMA row g + 8
  const float* low_scale = nullptr;  // their block scales per group: [groups]
  const float* high_scale = nullptr;
  // Input row of column group q that this lane loads (tile row 8q + g): [in] e4m3.
  const uint8_t* input[kColumnGroups] = {};
  // Group scales of the tile rows whose sums this lane holds (8q + 2t + i): [groups].
  const float* input_scale[kColumnGroups][2] = {};
  int64_t in = 0;
  int active_groups = kColumnGroups;  // column groups with a valid row (uniform over the warp)
};

// One 128-column group's operands of one lane, loaded ahead of their MMAs.
template <int kColumnGroups>
struct Fp8GroupOperands {
  uint2 low[4], high[4];
  uint2 input[kColumnGroups][4];
  float low_scale, high_scale;
  float input_scale[kColumnGroups][2];
};

template <int kColumnGroups>
__device__ __forceinline__ void fp8_load_group(const Fp8WeightRows<kColumnGroups>& rows,
                                               int64_t group, Fp8GroupOperands<kColumnGroups>& o) {
  const int t = static_cast<int>(threadIdx.x) % 4;
  const uint2 zero = make_uint2(0, 0);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t k = group * kFp8MmaGroup + 32 * j + 8 * t;
    const bool in_range = k < rows.in;
    o.low[j] = in_range && rows.low ? __ldg(reinterpret_cast<const uint2*>(rows.low + k)) : zero;
    o.high[j] = in_range && rows.high ? __ldg(reinterpret_cast<const uint2*>(rows.high + k)) : zero;
#pragma unroll
    for (int q = 0; q < kColumnGroups; ++q)
      o.input[q][j] = q < rows.active_groups && in_range && rows.input[q]
                          ? __ldg(reinterpret_cast<const uint2*>(rows.input[q] + k))
                          : zero;
  }
  o.low_scale = rows.low_scale ? __ldg(rows.low_scale + group) : 0.0f;
  o.high_scale = rows.high_scale ? __ldg(rows.high_scale + group) : 0.0f;
#pragma unroll
  for (int q = 0; q < kColumnGroups; ++q)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      o.input_scale[q][i] = rows.input_scale[q][i] ? __ldg(rows.input_scale[q][i] + group) : 0.0f;
}

// acc[q]: c0, c1 = weight row g at tile rows 8q + 2t, 8q + 2t + 1; c2, c3 = row g + 8.
template <int kColumnGroups>
__device__ __forceinline__ void fp8_mma_group(const Fp8GroupOperands<kColumnGroups>& o,
                                              int active_groups, float (&acc)[kColumnGroups][4]) {
  float part[kColumnGroups][4];
#pragma unroll
  for (int q = 0; q < kColumnGroups; ++q)
#pragma unroll
    for (int e = 0; e < 4; ++e) part[q][e] = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t a[4] = {o.low[j].x, o.high[j].x, o.low[j].y, o.high[j].y};
#pragma unroll
    for (int q = 0; q < kColumnGroups; ++q) {
      if (q >= active_groups) break;
      mma_e4m3_16x8x32(part[q], a, o.input[q][j].x, o.input[q][j].y);
    }
  }
#pragma unroll
  for (int q = 0; q < kColumnGroups; ++q) {
    acc[q][0] += part[q][0] * (o.input_scale[q][0] * o.low_scale);
    acc[q][1] += part[q][1] * (o.input_scale[q][1] * o.low_scale);
    acc[q][2] += part[q][2] * (o.input_scale[q][0] * o.high_scale);
    acc[q][3] += part[q][3] * (o.input_scale[q][1] * o.high_scale);
  }
}

// How many 128-column groups a warp keeps in flight: the loop is bound by a
// memory round trip per group whatever the MMAs cost (fp8_linear_bench on the
// H200: two in flight streamed GLM-5.2's o_proj at 1.45 TB/s at 16 rows, the
// latency of one group per iteration), so up to 2 column groups keep four
// (~34 registers each); 4 column groups (~58 each) keep two (three spill).
template <int kColumnGroups>
inline constexpr int kFp8GroupsInFlight = kColumnGroups <= 2 ? 4 : 2;

// Adds groups [begin, end) of the product into acc (zeroed by the caller) in
// that order, the next kStages - 1 groups' loads in flight while the current
// one's MMAs run (a ring of operand sets, indexed at compile time so that it
// stays in registers). A contiguous range keeps each weight row's loads in
// flight contiguous too (kStages x 128 bytes).
template <int kColumnGroups, int kStages = kFp8GroupsInFlight<kColumnGroups>>
__device__ __forceinline__ void fp8_weight_rows_mma(const Fp8WeightRows<kColumnGroups>& rows,
                                                    int64_t begin, int64_t end,
                                                    float (&acc)[kColumnGroups][4]) {
  static_assert(kStages >= 1);
  Fp8GroupOperands<kColumnGroups> ring[kStages];
#pragma unroll
  for (int s = 0; s < kStages; ++s)
    if (begin + s < end) fp8_load_group(rows, begin + s, ring[s]);
  for (int64_t base = begin; base < end; base += kStages) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      const int64_t group = base + s;
      if (group >= end) break;  // uniform over the warp
      fp8_mma_group(ring[s], rows.active_groups, acc);
      if (group + kStages < end) fp8_load_group(rows, group + kStages, ring[s]);
    }
  }
}

}  // namespace megactx::cuda
