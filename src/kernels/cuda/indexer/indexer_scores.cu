// Indexer scoring kernel: fp8 tensor cores over the paged indexer-key cache.
//
// Work split: grid.y = groups of rows_per_group rows of one request, grid.x =
// chunks of kChunkPages pages of that request's keys. A CTA copies its pages
// (64 keys x 132 B each, contiguous in the pool) into shared memory with
// cp.async, then each warp scores n-tiles of 8 keys for one row:
//   acc[head, key] = q8[row, head, :] . k8[key, :]      (mma m16n8k32 e4m3)
//   score[key]     = key_scale * sum_head w[head] * relu(acc[head, key])
// The 128-dim dot product is summed in a permuted k order so that each thread
// reads 32 contiguous bytes of a key (the sum does not care about order).
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/indexer/indexer.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunkPages = 8;
constexpr int kPageBytes = kPageTokens * kIndexerKeyBytes;  // 8448, a multiple of 16

// Waits until at most `pending` of this thread's cp.async groups are in flight.
__device__ __forceinline__ void wait_pages(int pending) {
  switch (pending) {
    case 0:
      cp_async_wait<0>();
      break;
    case 1:
      cp_async_wait<1>();
      break;
    case 2:
      cp_async_wait<2>();
      break;
    case 3:
      cp_async_wait<3>();
      break;
    case 4:
      cp_async_wait<4>();
      break;
    case 5:
      cp_async_wait<5>();
      break;
    case 6:
      cp_async_wait<6>();
      break;
    default:
      cp_async_wait<7>();
      break;
  }
}

template <int MTiles>  // heads / 16
__global__ void __launch_bounds__(kThreads) indexer_scores_kernel(IndexerScoreParams p) {
  extern __shared__ __align__(16) uint8_t pages_shared[];  // [kChunkPages][64 keys][132 B]
  const int rows_per_group = p.rows_per_group;
  const int row0 = blockIdx.y * rows_per_group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  int group_visible = 0;
  for (int i = 0; i < rows_per_group; ++i)
    group_visible = max(group_visible, p.row_visible[row0 + i]);
  const int64_t first_page = static_cast<int64_t>(blockIdx.x) * kChunkPages;
  const int64_t pages_visible =
      (static_cast<int64_t>(group_visible) + kPageTokens - 1) / kPageTokens;
  if (first_page >= pages_visible) return;
  const int pages =
      static_cast<int>(min(static_cast<int64_t>(kChunkPages), pages_visible - first_page));
  const int32_t* table =
      p.block_table + static_cast<int64_t>(p.row_request[row0]) * p.block_table_stride;

  // One commit group per page slot (empty ones too) so wait_pages counts uniformly.
  for (int i = 0; i < kChunkPages; ++i) {
    if (i < pages) {
      const uint8_t* source = p.key_pool + static_cast<int64_t>(table[first_page + i]) * kPageBytes;
      uint8_t* destination = pages_shared + i * kPageBytes;
      for (int piece = threadIdx.x; piece < kPageBytes / 16; piece += kThreads)
        cp_async_16(destination + piece * 16, source + piece * 16);
    }
    cp_async_commit();
  }

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

  for (int i = 0; i < pages; ++i) {
    wait_pages(kChunkPages - 1 - i);
    __syncthreads();  // every thread's copies of page i have landed
    if (!has_row) continue;
    const uint8_t* page = pages_shared + i * kPageBytes;
    const int64_t page_position = (first_page + i) * kPageTokens;
    for (int tile = sub_warp; tile < kPageTokens / 8; tile += warps_per_row) {
      const int64_t tile_position = page_position + tile * 8;
      if (tile_position >= visible) break;  // uniform across the warp
      const uint8_t* key = page + (tile * 8 + g) * kIndexerKeyBytes + t * 32;
      uint32_t b[8];
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        b[2 * s] = *reinterpret_cast<const uint32_t*>(key + s * 8);
        b[2 * s + 1] = *reinterpret_cast<const uint32_t*>(key + s * 8 + 4);
      }
      float score0 = 0.f, score1 = 0.f;  // keys 2t and 2t+1 of the tile, partial over heads
#pragma unroll
      for (int mt = 0; mt < MTiles; ++mt) {
        float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < 4; ++s) mma_e4m3_16x8x32(c, a[mt][s], b[2 * s], b[2 * s + 1]);
        score0 += weight[mt][0] * fmaxf(c[0], 0.f) + weight[mt][1] * fmaxf(c[2], 0.f);
        score1 += weight[mt][0] * fmaxf(c[1], 0.f) + weight[mt][1] * fmaxf(c[3], 0.f);
      }
#pragma unroll
      for (int mask = 4; mask < 32; mask <<= 1) {  // sum over g: the heads
        score0 += __shfl_xor_sync(0xffffffffu, score0, mask);
        score1 += __shfl_xor_sync(0xffffffffu, score1, mask);
      }
      if (g == 0) {
        const int local = tile * 8 + 2 * t;
        const float scale0 =
            *reinterpret_cast<const float*>(page + local * kIndexerKeyBytes + kIndexerHeadDim);
        const float scale1 = *reinterpret_cast<const float*>(page + (local + 1) * kIndexerKeyBytes +
                                                             kIndexerHeadDim);
        const int64_t position = tile_position + 2 * t;
        if (position < visible) row_scores[position] = score0 * scale0;
        if (position + 1 < visible) row_scores[position + 1] = score1 * scale1;
      }
    }
  }
}

// One warp per (row, head): amax over 128 values, e4m3 with scale amax / 448.
__global__ void quantize_indexer_queries_kernel(QuantizeIndexerParams p) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= static_cast<int64_t>(p.rows) * p.heads) return;
  const uint16_t* source = p.queries + item * kIndexerHeadDim + lane * 4;
  float values[4];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    values[i] = __uint_as_float(static_cast<uint32_t>(source[i]) << 16);
    amax = fmaxf(amax, fabsf(values[i]));
  }
#pragma unroll
  for (int mask = 1; mask < 32; mask <<= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, mask));
  const float scale = amax > 0.f ? amax / 448.f : 1.f;
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    packed |= static_cast<uint32_t>(float_to_e4m3(values[i] / scale)) << (8 * i);
  *reinterpret_cast<uint32_t*>(p.queries_fp8 + item * kIndexerHeadDim + lane * 4) = packed;
  if (lane == 0) p.weights[item] = p.head_weights[item] * scale * p.softmax_scale;
}

template <int MTiles>
void launch_scores(const IndexerScoreParams& params, cudaStream_t stream) {
  constexpr int shared_bytes = kChunkPages * kPageBytes;
  static const bool configured = [] {
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(
        indexer_scores_kernel<MTiles>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
    return true;
  }();
  (void)configured;
  const int64_t chunk_keys = static_cast<int64_t>(kChunkPages) * kPageTokens;
  const unsigned chunks = static_cast<unsigned>((params.max_visible + chunk_keys - 1) / chunk_keys);
  const int64_t groups = params.rows / params.rows_per_group;
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t first = 0; first < groups; first += kMaxGridY) {
    IndexerScoreParams part = params;
    const int64_t row0 = first * params.rows_per_group;
    part.queries += row0 * params.heads * kIndexerHeadDim;
    part.weights += row0 * params.heads;
    part.row_request += row0;
    part.row_visible += row0;
    part.scores += row0 * params.score_stride;
    const unsigned count = static_cast<unsigned>(min(kMaxGridY, groups - first));
    part.rows = static_cast<int>(count) * params.rows_per_group;
    indexer_scores_kernel<MTiles><<<dim3(chunks, count), kThreads, shared_bytes, stream>>>(part);
    MEGACTX_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

namespace detail {

void launch_indexer_scores(const IndexerScoreParams& params, cudaStream_t stream) {
  if (params.rows == 0 || params.max_visible == 0) return;
  if (params.heads == 32)
    launch_scores<2>(params, stream);
  else
    launch_scores<4>(params, stream);
}

void launch_quantize_indexer_queries(const QuantizeIndexerParams& params, cudaStream_t stream) {
  const int64_t items = static_cast<int64_t>(params.rows) * params.heads;
  if (items == 0) return;
  constexpr int kItemsPerBlock = 8;
  const unsigned blocks = static_cast<unsigned>((items + kItemsPerBlock - 1) / kItemsPerBlock);
  quantize_indexer_queries_kernel<<<blocks, kItemsPerBlock * 32, 0, stream>>>(params);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace megactx::cuda
