// The fp8 block-scaled GEMM for few rows on tensor cores (fp8_block_gemm.h,
// fp8_block_gemm_skinny): decode batches and MTP verifications, where the
// 64 x 64 tiles of fp8_block_gemm_mma.cu leave most SMs idle (a 2048 -> 768
// projection is 12 CTAs) and the weights must be streamed once at the read
// bandwidth. Each warp owns 16 weight rows (fp8_weight_rows_mma.cuh: the
// weight rows are the MMA's M, up to 32 input rows its N). Grid (weight-row
// blocks, 32-row input tiles); a CTA of 4 warps takes 64 weight rows, or,
// where that leaves SMs idle, 32 or 16 weight rows with the 128-column
// groups dealt out to 2 or 4 warps in contiguous shares and their sums added
// in shared memory in warp order (deterministic).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/gemm/fp8_block_gemm.h"
#include "kernels/cuda/gemm/fp8_weight_rows_mma.cuh"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

template <int kColumnGroups, int kSplitK, int kStages>
__global__ void __launch_bounds__(kThreads) fp8_skinny_kernel(Fp8BlockGemm g) {
  constexpr int kRowBlocks = kWarps / kSplitK;  // 16-row weight blocks per CTA
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int gq = lane / 4, t = lane % 4;
  const int block = warp % kRowBlocks, split = warp / kRowBlocks;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kRowBlocks + block) * 16;
  // The CTA's weight rows, contiguous, asked for before the wait by its first
  // input tile's CTA (weights are never written by a step's kernels).
  if (g.prefetch_weights && threadIdx.x == 0 && blockIdx.y == 0) {
    const int64_t cta_first = static_cast<int64_t>(blockIdx.x) * kRowBlocks * 16;
    if (cta_first < g.out) {
      const int64_t rows =
          g.out - cta_first < kRowBlocks * 16 ? g.out - cta_first : kRowBlocks * 16;
      prefetch_l2(g.w + cta_first * g.in, rows * g.in);
    }
  }
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * 8 * kColumnGroups;
  const int64_t groups = (g.in + kFp8MmaGroup - 1) / kFp8MmaGroup;
  const auto* x = static_cast<const uint8_t*>(g.x);

  Fp8WeightRows<kColumnGroups> rows;
  rows.in = g.in;
  const int64_t low = first + gq, high = first + gq + 8;
  if (low < g.out) {
    rows.low = g.w + low * g.in;
    rows.low_scale = g.scale + fp8_scale_row(low, g.scale_split) * groups;
  }
  if (high < g.out) {
    rows.high = g.w + high * g.in;
    rows.high_scale = g.scale + fp8_scale_row(high, g.scale_split) * groups;
  }
  const int64_t left = g.rows - row0;  // >= 1
  rows.active_groups = static_cast<int>(left >= 8 * kColumnGroups ? kColumnGroups : (left + 7) / 8);
#pragma unroll
  for (int q = 0; q < kColumnGroups; ++q) {
    const int64_t r = row0 + 8 * q + gq;
    if (r < g.rows) rows.input[q] = x + r * g.x_stride;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t held = row0 + 8 * q + 2 * t + i;
      if (held < g.rows) rows.input_scale[q][i] = g.x_scale + held * groups;
    }
  }

  float acc[kColumnGroups][4];
#pragma unroll
  for (int q = 0; q < kColumnGroups; ++q)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[q][e] = 0.0f;
  // Split s takes a contiguous share of the groups (the sums still added in warp order).
  fp8_weight_rows_mma<kColumnGroups, kStages>(rows, groups * split / kSplitK,
                                              groups * (split + 1) / kSplitK, acc);

  if constexpr (kSplitK > 1) {
    // [warp, value, lane]: a warp's stores and loads touch 32 consecutive words.
    __shared__ float partial[kWarps][kColumnGroups * 4][32];
#pragma unroll
    for (int q = 0; q < kColumnGroups; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) partial[warp][4 * q + e][lane] = acc[q][e];
    __syncthreads();
    if (split != 0) return;
    for (int s = 1; s < kSplitK; ++s)
#pragma unroll
      for (int q = 0; q < kColumnGroups; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[q][e] += partial[s * kRowBlocks + block][4 * q + e][lane];
  }

#pragma unroll
  for (int q = 0; q < kColumnGroups; ++q) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + 8 * q + 2 * t + (e % 2);
      const int64_t col = e < 2 ? low : high;
      if (row >= g.rows || col >= g.out) continue;
      const int64_t index = row * g.y_stride + col;
      if (g.y_type == ActType::F32) {
        static_cast<float*>(g.y)[index] = acc[q][e];
      } else {
        static_cast<__nv_bfloat16*>(g.y)[index] = __float2bfloat16_rn(acc[q][e]);
      }
    }
  }
}

// MEGACTX_FP8_SKINNY_STAGES=2: two groups in flight per warp whatever the
// column groups (as before kFp8GroupsInFlight; A/B runs).
bool shallow_pipeline() {
  static const bool shallow = [] {
    const char* value = std::getenv("MEGACTX_FP8_SKINNY_STAGES");
    return value != nullptr && std::string_view(value) == "2";
  }();
  return shallow;
}

template <int kColumnGroups, int kSplitK>
void launch(const Fp8BlockGemm& g, cudaStream_t stream) {
  constexpr int64_t kRowsPerCta = 16 * (kWarps / kSplitK);
  const dim3 grid(static_cast<unsigned>((g.out + kRowsPerCta - 1) / kRowsPerCta),
                  static_cast<unsigned>((g.rows + 8 * kColumnGroups - 1) / (8 * kColumnGroups)));
  if (shallow_pipeline())
    launch_kernel(fp8_skinny_kernel<kColumnGroups, kSplitK, 2>, grid, kThreads, 0, stream, g);
  else
    launch_kernel(fp8_skinny_kernel<kColumnGroups, kSplitK, kFp8GroupsInFlight<kColumnGroups>>,
                  grid, kThreads, 0, stream, g);
}

template <int kColumnGroups>
void launch_split(const Fp8BlockGemm& g, int split, cudaStream_t stream) {
  if (split == 4) {
    launch<kColumnGroups, 4>(g, stream);
  } else if (split == 2) {
    launch<kColumnGroups, 2>(g, stream);
  } else {
    launch<kColumnGroups, 1>(g, stream);
  }
}

bool aligned8(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 8 == 0;
}

}  // namespace

int fp8_block_gemm_skinny_column_groups(int64_t rows, int64_t out, int multiprocessors) {
  if (rows <= 8) return 1;
  if (rows <= 16) return 2;
  // 32-row tiles read the weights once per 32 rows; a weight too small to
  // give every SM a 64-row block at that (the stacked q_a | kv_a's 64-row
  // tail: 8 CTAs took ~20 us at 64 rows, ncu) takes 16-row tiles, twice the
  // CTAs, each with twice the groups in flight (kFp8GroupsInFlight).
  const int64_t blocks = (out + 63) / 64 * ((rows + 31) / 32);
  return blocks >= multiprocessors ? 4 : 2;
}

int fp8_block_gemm_skinny_split(int64_t rows, int64_t in, int64_t out, int multiprocessors) {
  const int64_t column_groups = fp8_block_gemm_skinny_column_groups(rows, out, multiprocessors);
  const int64_t tiles = (rows + 8 * column_groups - 1) / (8 * column_groups);
  const int64_t groups = (in + kFp8MmaGroup - 1) / kFp8MmaGroup;
  // MEGACTX_FP8_SKINNY_SPLIT=1|2|4 (A/B runs): that split wherever the groups allow it.
  static const int forced = [] {
    const char* value = std::getenv("MEGACTX_FP8_SKINNY_SPLIT");
    const int split = value != nullptr ? std::atoi(value) : 0;
    return split == 1 || split == 2 || split == 4 ? split : 0;
  }();
  if (forced > 0) return groups >= 2 * forced ? forced : 1;
  // The fewest splits that give every SM a CTA, and no more splits than groups.
  for (const int split : {1, 2}) {
    const int64_t ctas = (out + 16 * (kWarps / split) - 1) / (16 * (kWarps / split)) * tiles;
    if (ctas >= multiprocessors || groups < 2 * split) return split;
  }
  return 4;
}

bool fp8_block_gemm_skinny(const Fp8BlockGemm& g, cudaStream_t stream) {
  if (g.x_type != ActType::E4M3 || g.rows < 1 || g.rows > kFp8SkinnyMaxRows || g.in % 8 != 0 ||
      g.x_stride % 8 != 0 || !aligned8(g.x) || !aligned8(g.w)) {
    return false;
  }
  if (g.out == 0) return true;
  const int multiprocessors = current_device_multiprocessors();
  const int split = fp8_block_gemm_skinny_split(g.rows, g.in, g.out, multiprocessors);
  switch (fp8_block_gemm_skinny_column_groups(g.rows, g.out, multiprocessors)) {
    case 1:
      launch_split<1>(g, split, stream);
      break;
    case 2:
      launch_split<2>(g, split, stream);
      break;
    default:
      launch_split<4>(g, split, stream);
      break;
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace megactx::cuda
