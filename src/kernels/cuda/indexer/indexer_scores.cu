// Indexer scoring kernel: fp8 tensor cores over the paged indexer-key cache.
//
// Work split: grid.y = groups of rows_per_group rows of one request; grid.x =
// CTAs per group (two resident per SM in total), each streaming chunks of
// kStagePages pages (64 keys x 132 B each, contiguous in the pool) through a
// kStages-deep cp.async pipeline into shared memory. Each warp scores n-tiles
// of 8 keys for one row:
//   acc[head, key] = q8[row, head, :] . k8[key, :]      (mma m16n8k32 e4m3)
//   score[key]     = key_scale * sum_head w[head] * relu(acc[head, key])
// The 128-dim dot product is summed in a permuted k order so that each thread
// reads 32 contiguous bytes of a key (the sum does not care about order).
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/indexer/indexer.h"

#include <algorithm>

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kStagePages = 4;  // pages per pipeline stage (one "chunk")
constexpr int kStages = 3;      // chunks in flight per CTA
constexpr int kPageBytes = kPageTokens * kIndexerKeyBytes;  // 8448, a multiple of 16
constexpr int kSharedBytes = kStages * kStagePages * kPageBytes;

// Bulk: pages arrive by TMA bulk copies (one request per page, issued by one
// thread, completing on a per-stage mbarrier); otherwise by cp.async (one
// request per 16 bytes from every thread).
template <int MTiles, bool Bulk>  // MTiles = heads / 16
__global__ void __launch_bounds__(kThreads, MTiles == 2 ? 2 : 1)
    indexer_scores_kernel(IndexerScoreParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ __align__(16) uint8_t pages_shared[];  // [kStages][kStagePages][64 keys][132 B]
  __shared__ uint64_t stage_full[kStages];  // Bulk: completes when a stage's pages landed
  const int rows_per_group = p.rows_per_group;
  const int row0 = blockIdx.y * rows_per_group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  int group_visible = 0;
  for (int i = 0; i < rows_per_group; ++i)
    group_visible = max(group_visible, p.row_visible[row0 + i]);
  const int64_t pages_visible =
      (static_cast<int64_t>(group_visible) + kPageTokens - 1) / kPageTokens;
  const int64_t chunks = (pages_visible + kStagePages - 1) / kStagePages;
  if (blockIdx.x >= chunks) return;
  const int32_t* table =
      p.block_table + static_cast<int64_t>(p.row_request[row0]) * p.block_table_stride;

  if (Bulk) {
    if (threadIdx.x == 0) {
      for (int stage = 0; stage < kStages; ++stage) mbarrier_init(&stage_full[stage], 1);
      mbarrier_init_fence();
    }
    __syncthreads();
  }

  // This CTA streams chunks blockIdx.x, blockIdx.x + gridDim.x, ... through a
  // kStages-deep cp.async pipeline: one commit group per chunk (empty past the
  // end). Page ids are read one step before their copies are issued, so the
  // block-table latency hides behind a chunk of compute.
  auto load_page_ids = [&](int64_t step, int32_t(&ids)[kStagePages]) {
    const int64_t chunk = blockIdx.x + step * gridDim.x;
#pragma unroll
    for (int i = 0; i < kStagePages; ++i) {
      const int64_t page = chunk * kStagePages + i;
      ids[i] =
          (!Bulk || threadIdx.x == 0) && chunk < chunks && page < pages_visible ? table[page] : -1;
    }
  };
  auto issue = [&](const int32_t(&ids)[kStagePages], int stage) {
    if constexpr (Bulk) {
      if (threadIdx.x != 0) return;
      unsigned bytes = 0;
#pragma unroll
      for (int i = 0; i < kStagePages; ++i) bytes += ids[i] >= 0 ? kPageBytes : 0;
      if (bytes == 0) return;  // past the end: never waited for
      mbarrier_arrive_expect_bytes(&stage_full[stage], bytes);
#pragma unroll
      for (int i = 0; i < kStagePages; ++i)
        if (ids[i] >= 0)
          bulk_copy_to_shared(pages_shared + (stage * kStagePages + i) * kPageBytes,
                              p.key_pool + static_cast<int64_t>(ids[i]) * kPageBytes, kPageBytes,
                              &stage_full[stage]);
    } else {
#pragma unroll
      for (int i = 0; i < kStagePages; ++i) {
        if (ids[i] < 0) continue;
        const uint8_t* source = p.key_pool + static_cast<int64_t>(ids[i]) * kPageBytes;
        uint8_t* destination = pages_shared + (stage * kStagePages + i) * kPageBytes;
        for (int piece = threadIdx.x; piece < kPageBytes / 16; piece += kThreads)
          cp_async_16(destination + piece * 16, source + piece * 16);
      }
      cp_async_commit();
    }
  };
  int32_t next_ids[kStagePages];
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    load_page_ids(stage, next_ids);
    issue(next_ids, stage);
  }
  load_page_ids(kStages - 1, next_ids);

  // Warps per row: 8 for one row, 4 for two, 2 for 3..4, 1 for 5..8.
  const int warps_per_row = rows_per_group >= kWarps ? 1 : kWarps / rows_per_group;
  const int row_in_group = warp / warps_per_row;
  const int sub_warp = warp % warps_per_row;
  const bool has_row = row_in_group < rows_per_group;
  const int row = row0 + (has_row ? row_in_group : 0);
  const int visible = p.row_visible[row];

  // Query fragments in registers, k permuted: k-step s of thread t covers bytes
  // t*32 + s*8 + [0, 8) of the 128-byte head vector.
  uint32_t a[MTiles][4][4];
  float weight[MTiles][2];
#pragma unroll
  for (int mt = 0; mt < MTiles; ++mt) {
    const int head = mt * 16 + g;
    const uint8_t* q_low =
        p.queries + (static_cast<int64_t>(row) * p.heads + head) * kIndexerHeadDim;
    const uint8_t* q_high = q_low + 8 * kIndexerHeadDim;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int offset = t * 32 + s * 8;
      a[mt][s][0] = *reinterpret_cast<const uint32_t*>(q_low + offset);
      a[mt][s][1] = *reinterpret_cast<const uint32_t*>(q_high + offset);
      a[mt][s][2] = *reinterpret_cast<const uint32_t*>(q_low + offset + 4);
      a[mt][s][3] = *reinterpret_cast<const uint32_t*>(q_high + offset + 4);
    }
    weight[mt][0] = p.weights[static_cast<int64_t>(row) * p.heads + head];
    weight[mt][1] = p.weights[static_cast<int64_t>(row) * p.heads + head + 8];
  }
  float* row_scores = p.scores + static_cast<int64_t>(row) * p.score_stride;

  const int64_t steps = (chunks - blockIdx.x + gridDim.x - 1) / gridDim.x;
  for (int64_t step = 0; step < steps; ++step) {
    if constexpr (Bulk)
      mbarrier_wait(&stage_full[step % kStages], static_cast<unsigned>((step / kStages) & 1));
    else
      cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk `step` has landed; the stage of step - 1 is free again
    issue(next_ids, static_cast<int>((step + kStages - 1) % kStages));
    load_page_ids(step + kStages, next_ids);
    if (!has_row) continue;
    const int64_t chunk = blockIdx.x + step * gridDim.x;
    const uint8_t* stage_pages =
        pages_shared + static_cast<int>(step % kStages) * kStagePages * kPageBytes;
    // The chunk's 32 n-tiles of 8 keys (pages are contiguous in the stage);
    // a warp takes two at a time so that their MMA chains overlap.
    constexpr int kTiles = kStagePages * kPageTokens / 8;
    const int64_t chunk_position = chunk * kStagePages * kPageTokens;
    for (int first = sub_warp; first < kTiles; first += 2 * warps_per_row) {
      if (chunk_position + first * 8 >= visible) break;  // uniform across the warp
      const int tiles[2] = {first, first + warps_per_row};
      float score[2][2];  // [tile][key 2t or 2t+1], partial over heads
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        // A second tile past the chunk is computed on stale data and not stored.
        const uint8_t* key =
            stage_pages + (min(tiles[u], kTiles - 1) * 8 + g) * kIndexerKeyBytes + t * 32;
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
        for (int u = 0; u < 2; ++u) {
          score[u][0] += __shfl_xor_sync(0xffffffffu, score[u][0], mask);
          score[u][1] += __shfl_xor_sync(0xffffffffu, score[u][1], mask);
        }
      if (g == 0) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if (tiles[u] >= kTiles) continue;
          const int local = tiles[u] * 8 + 2 * t;  // key index within the chunk
          const float scale0 = *reinterpret_cast<const float*>(
              stage_pages + local * kIndexerKeyBytes + kIndexerHeadDim);
          const float scale1 = *reinterpret_cast<const float*>(
              stage_pages + (local + 1) * kIndexerKeyBytes + kIndexerHeadDim);
          const int64_t position = chunk_position + local;
          if (position < visible) row_scores[position] = score[u][0] * scale0;
          if (position + 1 < visible) row_scores[position + 1] = score[u][1] * scale1;
        }
      }
    }
  }
  if constexpr (!Bulk) cp_async_wait<0>();  // leave no copy in flight into freed shared memory
}

// One warp per (row, head): amax over 128 values, e4m3 with scale amax / 448.
__global__ void quantize_indexer_queries_kernel(QuantizeIndexerParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= static_cast<int64_t>(p.rows) * p.heads) return;
  float values[4];
  float head_weight = 0.f;
  if (p.queries_f32 != nullptr) {
    // Padded from the float32 queries (pad_indexer_queries' rounding).
    const int row = static_cast<int>(item / p.heads),
              h = static_cast<int>(item - int64_t{row} * p.heads);
    const bool real = h < p.source_heads;
    const int64_t source_item = int64_t{row} * p.source_heads + h;
    const float* source = p.queries_f32 + source_item * kIndexerHeadDim + lane * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      values[i] = real ? __uint_as_float(uint32_t{float_to_bf16_bits(source[i])} << 16) : 0.f;
    if (lane == 0 && real) head_weight = p.head_weights_f32[source_item] * p.head_weight_scale;
  } else {
    const uint16_t* source = p.queries + item * kIndexerHeadDim + lane * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) values[i] = __uint_as_float(static_cast<uint32_t>(source[i]) << 16);
    if (lane == 0) head_weight = p.head_weights[item];
  }
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(values[i]));
#pragma unroll
  for (int mask = 1; mask < 32; mask <<= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, mask));
  const float scale = amax > 0.f ? amax / 448.f : 1.f;
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    packed |= static_cast<uint32_t>(float_to_e4m3(values[i] / scale)) << (8 * i);
  *reinterpret_cast<uint32_t*>(p.queries_fp8 + item * kIndexerHeadDim + lane * 4) = packed;
  if (lane == 0) p.weights[item] = head_weight * scale * p.softmax_scale;
}

template <int MTiles, bool Bulk>
void launch_scores(const IndexerScoreParams& params, cudaStream_t stream) {
  static const bool configured = [] {
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(indexer_scores_kernel<MTiles, Bulk>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            kSharedBytes));
    return true;
  }();
  (void)configured;
  const int64_t chunk_keys = static_cast<int64_t>(kStagePages) * kPageTokens;
  const int64_t chunks = (params.max_visible + chunk_keys - 1) / chunk_keys;
  const int64_t groups = params.rows / params.rows_per_group;
  // Two resident CTAs per SM; each group gets an equal share of them, and each
  // CTA streams its chunks through the pipeline.
  const int64_t resident = 2 * static_cast<int64_t>(current_device_multiprocessors());
  const unsigned ctas_per_group = static_cast<unsigned>(
      std::min<int64_t>(chunks, std::max<int64_t>(1, (resident + groups - 1) / groups)));
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t first = 0; first < groups; first += kMaxGridY) {
    IndexerScoreParams part = params;
    const int64_t row0 = first * params.rows_per_group;
    part.queries += row0 * params.heads * kIndexerHeadDim;
    part.weights += row0 * params.heads;
    part.row_request += row0;
    part.row_visible += row0;
    part.scores += row0 * params.score_stride;
    const unsigned count = static_cast<unsigned>(std::min(kMaxGridY, groups - first));
    part.rows = static_cast<int>(count) * params.rows_per_group;
    launch_kernel(indexer_scores_kernel<MTiles, Bulk>, dim3(ctas_per_group, count), kThreads,
                  kSharedBytes, stream, part);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

namespace detail {

void launch_indexer_scores(const IndexerScoreParams& params, cudaStream_t stream) {
  if (params.rows == 0 || params.max_visible == 0) return;
  if (params.heads == 32)
    params.bulk_copies ? launch_scores<2, true>(params, stream)
                       : launch_scores<2, false>(params, stream);
  else
    params.bulk_copies ? launch_scores<4, true>(params, stream)
                       : launch_scores<4, false>(params, stream);
}

void launch_quantize_indexer_queries(const QuantizeIndexerParams& params, cudaStream_t stream) {
  const int64_t items = static_cast<int64_t>(params.rows) * params.heads;
  if (items == 0) return;
  constexpr int kItemsPerBlock = 8;
  const unsigned blocks = static_cast<unsigned>((items + kItemsPerBlock - 1) / kItemsPerBlock);
  launch_kernel(quantize_indexer_queries_kernel, blocks, kItemsPerBlock * 32, 0, stream, params);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace megactx::cuda
