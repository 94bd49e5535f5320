// The bf16 few-row tensor-core linear; see bf16_skinny.h.
//
// Both operands go through shared memory: every cp.async of a warp copies
// whole 128-byte lines of a row (the weights' loads straight into registers,
// in the MMA fragment's order, touched 16 rows' half lines per instruction and
// ran at ~60% of the read rate on the H100), and ldmatrix builds the
// fragments (A: 16 weight rows x 16 k; B: 8 input rows x 16 k, k contiguous).
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common/alignment.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/gemm/bf16_skinny.h"

namespace megactx::cuda {
namespace {

constexpr int kWarps = kBf16SkinnyWarps;  // weight-row warps per CTA, 16 weight rows each
constexpr int kThreads = 32 * kWarps;
constexpr int kTileRows = 16 * kWarps;    // weight rows staged per CTA
constexpr int kChunk = kBf16SkinnyChunk;  // k per pipeline stage: one 128-byte line per row
constexpr int kSegments = kChunk / 8;     // 16-byte segments of a staged row
// Shared memory per CTA that keeps two CTAs on a multiprocessor (228 KB, 1 KB of it reserved per
// CTA).
constexpr size_t kSharedPerCta = 113 * 1024;
static_assert(kSegments == 8, "the swizzle below assumes 8 segments per staged row");

// Byte offset of segment `segment` of staged row `row`: the segment index is
// XOR-ed with the row's low 3 bits, so the 8 rows an ldmatrix phase reads at
// one k sit on 8 different 16-byte bank groups.
__device__ __forceinline__ int swizzled(int row, int segment) {
  return row * (2 * kChunk) + ((segment ^ (row & 7)) * 16);
}

template <int kGroups>
constexpr size_t stage_bytes() {
  return static_cast<size_t>(kTileRows + 8 * kGroups) * 2 * kChunk;
}
// Bf16SkinnyPipeline::Deep: as many stages as two CTAs per multiprocessor
// allow, up to 6 (6 / 6 / 5 / 4 for 1 / 2 / 4 / 8 column groups).
template <int kGroups>
constexpr int deep_stages() {
  const size_t fit = kSharedPerCta / stage_bytes<kGroups>();
  return fit < 6 ? static_cast<int>(fit) : 6;
}

// Grid (tiles, split). A CTA stages its 128 weight rows (kSwiglu: gate rows
// 64 tile .. + 63, then the same up rows) and every input row, kChunk of k at
// a time through kStages buffers (cp.async, kStages - 1 in flight); warp w multiplies staged rows
// 16w .. 16w + 15 (kSwiglu: gate rows 8w .. 8w + 7 and their up rows) with
// ldmatrix fragments. Part blockIdx.y takes chunks [y chunks_per_part,
// (y + 1) chunks_per_part).
template <int kGroups, bool kSwiglu, int kStages>
__global__ void __launch_bounds__(kThreads)
    bf16_skinny_kernel(Bf16Skinny g, int split, int64_t chunks_per_part) {
  constexpr int kRows = 8 * kGroups;  // input rows staged (the batch rounded up to 8)
  extern __shared__ __align__(128) uint8_t shared[];
  // Stage s: weights [kTileRows][kChunk] then x [kRows][kChunk], swizzled.
  const auto weights_of = [&](int stage) { return shared + stage * stage_bytes<kGroups>(); };
  const auto x_of = [&](int stage) { return weights_of(stage) + kTileRows * 2 * kChunk; };
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int gq = lane / 4, t = lane % 4;
  const int64_t tile = blockIdx.x;
  // The weight row of staged row r (negative: past the matrix, staged as zeros).
  const auto weight_row_of = [&](int r) -> int64_t {
    if constexpr (kSwiglu) {
      const int64_t column = tile * (kTileRows / 2) + r % (kTileRows / 2);
      return column < g.out ? (r < kTileRows / 2 ? column : g.out + column) : -1;
    } else {
      const int64_t row = tile * kTileRows + r;
      return row < g.out ? row : -1;
    }
  };
  // The staged row of MMA row m (0-15) of warp warp_of (kSwiglu: rows 0-7
  // gate, 8-15 the same columns' up rows).
  const auto staged_row_of = [](int warp_of, int m) {
    if constexpr (kSwiglu) return m < 8 ? 8 * warp_of + m : kTileRows / 2 + 8 * warp_of + m - 8;
    return 16 * warp_of + m;
  };
  // This lane's output entries: weight rows low_row (MMA rows gq) and
  // high_row (gq + 8).
  const int64_t low_row = weight_row_of(staged_row_of(warp, gq)),
                high_row = weight_row_of(staged_row_of(warp, gq + 8));
  const bool low_valid = low_row >= 0, high_valid = high_row >= 0;
  const auto* w = static_cast<const uint8_t*>(g.w);
  const auto* x = static_cast<const uint8_t*>(g.x);
  const int groups = static_cast<int>((g.rows + 7) / 8);  // <= kGroups
  const int64_t chunks = (g.in + kChunk - 1) / kChunk;
  const int64_t chunk_begin = static_cast<int64_t>(blockIdx.y) * chunks_per_part;
  const int64_t chunk_end =
      chunk_begin + chunks_per_part < chunks ? chunk_begin + chunks_per_part : chunks;
  const int64_t steps = chunk_end - chunk_begin;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  // Copies `rows` staged rows of chunk `step` into `base`: row r from
  // source(r) (its element 0; null past the matrix or the batch). Segments
  // past `in` (whole: in % 8 == 0) and null rows are zeros, so their products
  // add nothing.
  const auto stage_rows = [&](int64_t step, uint8_t* base, int rows, auto source) {
    const int64_t k0 = (chunk_begin + step) * kChunk;
    for (int i = static_cast<int>(threadIdx.x); i < rows * kSegments; i += kThreads) {
      const int r = i / kSegments, segment = i % kSegments;
      const int64_t k = k0 + 8 * segment;
      const uint8_t* row = source(r);
      uint8_t* destination = base + swizzled(r, segment);
      if (row != nullptr && k < g.in)
        cp_async_16(destination, row + k * 2);
      else
        *reinterpret_cast<uint4*>(destination) = zero;
    }
  };
  const auto stage_weights = [&](int64_t step) {
    if (step >= steps) return;
    stage_rows(step, weights_of(static_cast<int>(step % kStages)), kTileRows,
               [&](int r) -> const uint8_t* {
                 const int64_t row = weight_row_of(r);
                 return row >= 0 ? w + row * g.in * 2 : nullptr;
               });
  };
  const auto stage_x = [&](int64_t step) {
    if (step >= steps) return;
    stage_rows(step, x_of(static_cast<int>(step % kStages)), kRows, [&](int r) -> const uint8_t* {
      return r < g.rows ? x + r * g.x_stride * 2 : nullptr;
    });
  };

  // Weights are never written by a step: the first stages' copies need not wait.
  for (int s = 0; s < kStages - 1; ++s) stage_weights(s);
  grid_dependency_wait();
  grid_dependency_trigger();
  for (int s = 0; s < kStages - 1; ++s) {
    stage_x(s);
    cp_async_commit();  // group s: x of stage s (and, in group 0, the weights above)
  }

  // c[q]: MMA rows gq (c[q][0..1]) and gq + 8 (c[q][2..3]) at input rows
  // 8q + 2t, + 1.
  float c[kGroups][4];
#pragma unroll
  for (int q = 0; q < kGroups; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i) c[q][i] = 0.0f;
  // ldmatrix rows of this lane: A (16 MMA rows x 16 k) as four 8x8 matrices
  // (rows 0-7 / 8-15 at k 0-7, then at k 8-15), B (8 input rows x 32 k).
  const int a_mma_row = (lane & 7) + 8 * ((lane >> 3) & 1);
  const int a_staged = staged_row_of(warp, a_mma_row);
  const int a_segment = lane >> 4;                    // + 2 per 16-wide k step
  const int b_row = lane & 7, b_segment = lane >> 3;  // + 4 per 32-wide k pair of steps

  for (int64_t step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage `step` landed; every warp is done with stage step - 1
    stage_weights(step + kStages - 1);
    stage_x(step + kStages - 1);
    cp_async_commit();
    const uint8_t* weights = weights_of(static_cast<int>(step % kStages));
    const uint8_t* staged_x = x_of(static_cast<int>(step % kStages));
#pragma unroll
    for (int pair = 0; pair < kChunk / 32; ++pair) {
      uint32_t a0[4], a1[4];
      ldmatrix_x4(a0, weights + swizzled(a_staged, a_segment + 4 * pair));
      ldmatrix_x4(a1, weights + swizzled(a_staged, a_segment + 4 * pair + 2));
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
        if (q >= groups) break;  // uniform over the CTA
        uint32_t b[4];  // k 0-7, 8-15 (step one), 16-23, 24-31 (step two) of input rows 8q ..
        ldmatrix_x4(b, staged_x + swizzled(8 * q + b_row, b_segment + 4 * pair));
        mma_bf16_16x8x16(c[q], a0, b[0], b[1]);
        mma_bf16_16x8x16(c[q], a1, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();

  // fn(q, i, r) for each of this lane's entries in the batch: c[q][i] and
  // c[q][2 + i] at input row r = 8q + 2t + i.
  const auto for_entries = [&](auto fn) {
#pragma unroll
    for (int q = 0; q < kGroups; ++q)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int64_t r = 8 * q + 2 * t + i;
        if (r < g.rows) fn(q, i, r);
      }
  };

  if (split > 1) {
    // Store this part's sums; the tile's last CTA adds the parts in order.
    const int64_t weight_rows = kSwiglu ? 2 * g.out : g.out;
    const auto at = [&](int64_t part, int64_t r, int64_t weight_row) {
      return (part * g.rows + r) * weight_rows + weight_row;
    };
    for_entries([&](int q, int i, int64_t r) {
      if (low_valid) g.parts[at(blockIdx.y, r, low_row)] = c[q][i];
      if (high_valid) g.parts[at(blockIdx.y, r, high_row)] = c[q][2 + i];
    });
    __threadfence();
    __syncthreads();
    __shared__ bool last;  // this CTA is the tile's last part to finish
    if (threadIdx.x == 0) last = atomicAdd(g.done + tile, 1) == split - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Every part's value of an entry is requested before any is added: one
    // L2 round trip per entry, not one per part (a loop that adds as it loads
    // waits for each load in turn).
    for_entries([&](int q, int i, int64_t r) {
      float low_parts[kBf16SkinnyMaxSplit], high_parts[kBf16SkinnyMaxSplit];
#pragma unroll
      for (int part = 0; part < kBf16SkinnyMaxSplit; ++part) {
        if (part >= split) break;
        low_parts[part] = low_valid ? __ldcg(g.parts + at(part, r, low_row)) : 0.0f;
        high_parts[part] = high_valid ? __ldcg(g.parts + at(part, r, high_row)) : 0.0f;
      }
      float low_sum = 0.0f, high_sum = 0.0f;
#pragma unroll
      for (int part = 0; part < kBf16SkinnyMaxSplit; ++part) {
        if (part >= split) break;
        low_sum += low_parts[part];
        high_sum += high_parts[part];
      }
      c[q][i] = low_sum;
      c[q][2 + i] = high_sum;
    });
    if (threadIdx.x == 0) g.done[tile] = 0;
  }

  for_entries([&](int q, int i, int64_t r) {
    const int64_t base = r * g.y_stride;
    if constexpr (kSwiglu) {
      // silu_mul_bf16's expression on the bf16-rounded gate and up: the
      // bits of the plain kernel into bf16 followed by silu_mul_bf16.
      const float gate = __bfloat162float(__float2bfloat16_rn(c[q][i]));
      const float up = __bfloat162float(__float2bfloat16_rn(c[q][2 + i]));
      if (low_valid)
        static_cast<__nv_bfloat16*>(g.y)[base + low_row] =
            __float2bfloat16_rn(gate / (1.0f + expf(-gate)) * up);
    } else if (g.y_f32) {
      auto* y = static_cast<float*>(g.y);
      if (low_valid) y[base + low_row] = c[q][i];
      if (high_valid) y[base + high_row] = c[q][2 + i];
    } else {
      auto* y = static_cast<__nv_bfloat16*>(g.y);
      if (low_valid) y[base + low_row] = __float2bfloat16_rn(c[q][i]);
      if (high_valid) y[base + high_row] = __float2bfloat16_rn(c[q][2 + i]);
    }
  });
}

template <int kGroups, bool kSwiglu, int kStages>
void launch(const Bf16Skinny& g, int split, int64_t chunks_per_part, cudaStream_t stream) {
  constexpr size_t kShared = kStages * stage_bytes<kGroups>();
  static_assert(kShared <= kSharedPerCta, "two CTAs per multiprocessor");
  static const bool attribute_set = [] {
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(bf16_skinny_kernel<kGroups, kSwiglu, kStages>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(kShared)));
    return true;
  }();
  (void)attribute_set;
  const dim3 grid(static_cast<unsigned>(bf16_skinny_tiles(g)), static_cast<unsigned>(split));
  launch_kernel(bf16_skinny_kernel<kGroups, kSwiglu, kStages>, grid, kThreads, kShared, stream, g,
                split, chunks_per_part);
}

template <int kGroups>
void launch(const Bf16Skinny& g, int split, int64_t chunks_per_part, bool deep,
            cudaStream_t stream) {
  constexpr int kDeep = deep_stages<kGroups>();
  if (g.swiglu) {
    if (deep)
      launch<kGroups, true, kDeep>(g, split, chunks_per_part, stream);
    else
      launch<kGroups, true, 4>(g, split, chunks_per_part, stream);
  } else {
    if (deep)
      launch<kGroups, false, kDeep>(g, split, chunks_per_part, stream);
    else
      launch<kGroups, false, 4>(g, split, chunks_per_part, stream);
  }
}

}  // namespace

void launch_bf16_skinny(const Bf16Skinny& g, int split, int64_t chunks_per_part, bool deep,
                        cudaStream_t stream) {
  if (g.rows <= 8) {
    launch<1>(g, split, chunks_per_part, deep, stream);
  } else if (g.rows <= 16) {
    launch<2>(g, split, chunks_per_part, deep, stream);
  } else if (g.rows <= 32) {
    launch<4>(g, split, chunks_per_part, deep, stream);
  } else {
    launch<8>(g, split, chunks_per_part, deep, stream);
  }
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace megactx::cuda
