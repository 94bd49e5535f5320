// The decode rows' indexer scores and top-k in one launch (see decode_select.h).
//
// One cluster of kCtas CTAs per row; CTA r owns pages [r * P, (r + 1) * P) of
// the row (P = pages_per_cta, the same for every row of a launch):
//   1. its P key pages (8448 B each) arrive by bulk copies, one mbarrier per
//      page; warp w scores pages w, w + 8 with indexer_tiles' steps and keeps
//      the ordered image of each score in shared memory, keys[P * 64];
//   2. a thread holds keys tid + 256 m (m < 4) in registers for the levels:
//      histogram of the level's 8-bit digit in shared memory (double-buffered
//      by level), one cluster barrier, thread b sums bin b over the 16 CTAs
//      (16 remote loads), a warp suffix scan finds the bin of the k-th key;
//   3. the collect: per-thread counts of keys above the threshold and tied
//      with it, a block scan, the CTA totals written into every CTA, one
//      cluster barrier, each CTA writes its keys at positions after those of
//      the lower ranks.
// Why the redundant decision (every CTA sums all histograms): cluster_topk.cu
// splits the bins among the CTAs and needs three cluster barriers per level;
// with 256 bins the 16 remote loads per thread cost less than two barriers.
#include <cooperative_groups.h>
#include <cstdlib>  // PROBE

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_primitives.cuh"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/indexer/indexer_tiles.cuh"
#include "kernels/cuda/indexer_topk/decode_select.h"
#include "kernels/cuda/topk/warp_counts.cuh"

namespace megactx::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kCtas = kDecodeSelectCtas;
constexpr int kMaxPages = kDecodeSelectMaxPagesPerCta;
constexpr int kPageBytes = kPageTokens * kIndexerKeyBytes;  // 8448, a multiple of 128
constexpr int kMaxKeys = kMaxPages * kPageTokens;           // 1024 keys per CTA
constexpr int kKeysPerThread = kMaxKeys / kThreads;         // 4
constexpr int kDigitBits = 8;
constexpr int kBins = 1 << kDigitBits;
constexpr int kLevels = 32 / kDigitBits;
constexpr int kMaxDynamicShared = kMaxPages * kPageBytes + kMaxKeys * 4;
static_assert(kBins == kThreads && kBins == 32 * 8, "one bin per thread to clear, 8 per lane of warp 0");
static_assert(kMaxPages <= kThreads && kCtas <= kThreads);

struct SelectShared {
  uint32_t histogram[2][kBins];  // [level parity] this CTA's counts of the level's digit
  int decision[3];               // digit, ties still needed in its bin, whether taken whole
  int warp_counts[kWarps];       // the collect's packed counts per warp
  int cta_counts[kCtas];         // [rank] packed (above | ties << 16), written by each CTA
  int32_t page_ids[kMaxPages];   // physical pages of this CTA's keys
  uint64_t page_full[kMaxPages];
};

__host__ __device__ constexpr int pages_per_cta(int max_visible) {
  const int pages = (max_visible + kPageTokens - 1) / kPageTokens;
  const int share = (pages + kCtas - 1) / kCtas;
  return share > 0 ? share : 1;
}

template <int MTiles>  // heads / 16
__global__ void __launch_bounds__(kThreads, 1) decode_select_kernel(DecodeSelectParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ __align__(128) uint8_t dynamic_shared[];
  __shared__ SelectShared s;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t row = blockIdx.x / kCtas;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int share = pages_per_cta(p.max_visible);
  // Every load that does not depend on the row's length goes out first: the
  // page ids (within the pages of max_visible) and the queries.
  const int32_t* table =
      p.block_table + static_cast<int64_t>(p.row_request[row]) * p.block_table_stride;
  const int max_pages = (p.max_visible + kPageTokens - 1) / kPageTokens;
  const int32_t page_id =
      tid < share && rank * share + tid < max_pages ? table[rank * share + tid] : 0;
  uint32_t a[MTiles][4][4];
  float weight[MTiles][2];
  indexer_tiles::load_query<MTiles>(p.queries, p.weights, row, p.heads, g, t, a, weight);
  const int visible = p.row_visible[row];
  const int k = p.top_k;
  int32_t* out = p.out + row * k;

  if (visible <= k) {  // every key is taken (row-uniform: the whole cluster returns here)
    for (int i = rank * kThreads + tid; i < k; i += kCtas * kThreads) {
      int32_t value = -1;
      if (i < visible)
        value = p.write_slots ? table[i / kPageTokens] * kPageTokens + i % kPageTokens : i;
      out[i] = value;
    }
    return;
  }

  const int base = rank * share * kPageTokens;  // the position of this CTA's first key
  const int my_keys = max(0, min(visible - base, share * kPageTokens));
  const int my_pages = (my_keys + kPageTokens - 1) / kPageTokens;
  uint8_t* pages = dynamic_shared;  // [share][8448]
  uint32_t* keys = reinterpret_cast<uint32_t*>(dynamic_shared + share * kPageBytes);  // [share * 64]

  // 1. Pages and scores.
  if (tid < my_pages) {
    mbarrier_init(&s.page_full[tid], 1);
    mbarrier_init_fence();
    s.page_ids[tid] = page_id;
  }
  s.histogram[0][tid] = 0;
  s.histogram[1][tid] = 0;
  __syncthreads();  // the page barriers are initialised
  if (tid < my_pages) {
    mbarrier_arrive_expect_bytes(&s.page_full[tid], kPageBytes);
    bulk_copy_to_shared(pages + tid * kPageBytes,
                        p.key_pool + static_cast<int64_t>(page_id) * kPageBytes, kPageBytes,
                        &s.page_full[tid]);
  }
  for (int page = warp; page < my_pages; page += kWarps) {
    mbarrier_wait(&s.page_full[page], 0);
    const uint8_t* page_keys = pages + page * kPageTokens * kIndexerKeyBytes;
    const int page_position = base + page * kPageTokens;
    constexpr int kTiles = 4;  // per step: four MMA chains in flight
#pragma unroll 1
    for (int first = 0; first < kPageTokens / 8; first += kTiles) {
      if (page_position + first * 8 >= visible) break;  // warp-uniform
      const uint8_t* tile_keys[kTiles];
#pragma unroll
      for (int u = 0; u < kTiles; ++u) tile_keys[u] = page_keys + (first + u) * 8 * kIndexerKeyBytes;
      float score[kTiles][2];  // [tile][key 2t or 2t + 1]
      indexer_tiles::score_tiles<MTiles, kTiles>(a, weight, tile_keys, g, t, score);
      if (g == 0) {
#pragma unroll
        for (int u = 0; u < kTiles; ++u)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int local = (first + u) * 8 + 2 * t + e;  // key within the page
            const float value = score[u][e] * indexer_tiles::key_scale(page_keys, local);
            keys[page * kPageTokens + local] = float_to_ordered(value);
            const int position = page_position + local;
            if (p.scores != nullptr && position < visible)
              p.scores[row * p.score_stride + position] = value;
          }
      }
    }
  }
  __syncthreads();  // keys[] is complete
  if ((p.probe_stage & 15) == 1) { cluster.sync(); return; }  // PROBE

  uint32_t key[kKeysPerThread];
  bool valid[kKeysPerThread];
#pragma unroll
  for (int m = 0; m < kKeysPerThread; ++m) {
    const int local = tid + m * kThreads;
    valid[m] = local < my_keys;
    key[m] = valid[m] ? keys[local] : 0u;
  }

  // 2. The levels. A CTA reads the other CTAs' histogram of level L between
  // the barriers of levels L and L + 1, so each CTA may clear the buffer of
  // level L + 1 (last read at level L - 1) once level L's barrier is passed.
  // Warp 0 decides: lane l sums bins 8l .. 8l + 7 over the cluster (two
  // 16-byte loads per CTA) and the warp finds the bin of the k-th key by a
  // suffix scan, bins ascending with the lane.
  uint32_t prefix = 0;  // the threshold's digits so far
  int need = k;         // keys of the threshold prefix still to take
  int settled_shift = 0;
#pragma unroll
  for (int level = 0; level < kLevels; ++level) {
    const int shift = 32 - kDigitBits * (level + 1);
    uint32_t* histogram = s.histogram[level & 1];
#pragma unroll
    for (int m = 0; m < kKeysPerThread; ++m)
      warp_count_digit(histogram,
                  valid[m] && (level == 0 || (key[m] >> (shift + kDigitBits)) == prefix),
                  (key[m] >> shift) & (kBins - 1));
    cluster.sync();  // every CTA's histogram is complete and visible to the cluster
    s.histogram[(level + 1) & 1][tid] = 0;
    if (p.probe_stage & 16) {  // PROBE: version 1's decision by every thread
      int total = 0;
#pragma unroll
      for (int c = 0; c < kCtas; ++c)
        total += static_cast<int>(cluster.map_shared_rank(histogram, c)[tid]);
      int suffix = total;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int other = __shfl_down_sync(0xffffffffu, suffix, offset);
        if (lane + offset < 32) suffix += other;
      }
      if (lane == 0) s.warp_counts[warp] = suffix;
      __syncthreads();
      int above = suffix - total;
      for (int w = warp + 1; w < kWarps; ++w) above += s.warp_counts[w];
      if (above < need && above + total >= need) {
        s.decision[0] = tid;
        s.decision[1] = need - above;
        s.decision[2] = total == need - above;
      }
    } else if (warp == 0) {
      int bins[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // bins 8 lane .. 8 lane + 7, in rank order
#pragma unroll
      for (int c = 0; c < kCtas; ++c) {
        const uint4* remote =
            reinterpret_cast<const uint4*>(cluster.map_shared_rank(histogram, c)) + 2 * lane;
        const uint4 low = remote[0], high = remote[1];
        bins[0] += low.x, bins[1] += low.y, bins[2] += low.z, bins[3] += low.w;
        bins[4] += high.x, bins[5] += high.y, bins[6] += high.z, bins[7] += high.w;
      }
      int own = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) own += bins[b];
      int suffix = own;  // candidates in this lane's bins and the lanes above
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int other = __shfl_down_sync(0xffffffffu, suffix, offset);
        if (lane + offset < 32) suffix += other;
      }
      int above = suffix - own;  // candidates in the bins above this lane's
      if (above < need && above + own >= need) {  // exactly one lane, then one bin
#pragma unroll
        for (int b = 7; b >= 0; --b) {
          if (above < need && above + bins[b] >= need) {
            s.decision[0] = 8 * lane + b;
            s.decision[1] = need - above;
            s.decision[2] = bins[b] == need - above;
          }
          above += bins[b];
        }
      }
    }
    __syncthreads();
    prefix = (prefix << kDigitBits) | static_cast<uint32_t>(s.decision[0]);
    need = s.decision[1];
    if ((p.probe_stage & 15) == 3 + level) { cluster.sync(); return; }  // PROBE
    if (s.decision[2] != 0) {  // every key of the bin is taken: the lower digits decide nothing
      settled_shift = shift;
      break;  // cluster-uniform: every CTA made the same decision
    }
  }
  if ((p.probe_stage & 15) == 2) { cluster.sync(); return; }  // PROBE

  // 3. The collect: counts packed as above | ties << 16 (at most 1024 each per CTA).
  bool is_above[kKeysPerThread], is_tie[kKeysPerThread];
  int mine = 0;
#pragma unroll
  for (int m = 0; m < kKeysPerThread; ++m) {
    const uint32_t digits = key[m] >> settled_shift;
    is_above[m] = valid[m] && digits > prefix;
    is_tie[m] = valid[m] && digits == prefix;
    mine += static_cast<int>(is_above[m]) + (static_cast<int>(is_tie[m]) << 16);
  }
  int inclusive = mine;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) s.warp_counts[warp] = inclusive;
  __syncthreads();
  int before = inclusive - mine, cta_total = 0;
  for (int w = 0; w < kWarps; ++w) {
    const int count = s.warp_counts[w];
    if (w < warp) before += count;
    cta_total += count;
  }
  if (tid < kCtas) cluster.map_shared_rank(s.cta_counts, tid)[rank] = cta_total;
  cluster.sync();  // every CTA's totals everywhere; no remote access follows
  int above_index = before & 0xffff, tie_index = before >> 16;
  for (int c = 0; c < rank; ++c) {
    above_index += s.cta_counts[c] & 0xffff;
    tie_index += s.cta_counts[c] >> 16;
  }
  const int above_total = k - need;
#pragma unroll
  for (int m = 0; m < kKeysPerThread; ++m) {
    const int local = tid + m * kThreads;
    const int position = base + local;
    const int32_t value =
        p.write_slots ? s.page_ids[local / kPageTokens] * kPageTokens + local % kPageTokens
                      : position;
    if (is_above[m]) {
      out[above_index++] = value;
    } else if (is_tie[m]) {
      if (tie_index < need) out[above_total + tie_index] = value;
      ++tie_index;
    }
  }
}

template <int MTiles>
void configure() {
  static const bool configured = [] {
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(decode_select_kernel<MTiles>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            kMaxDynamicShared));
    MEGACTX_CUDA_CHECK(cudaFuncSetAttribute(decode_select_kernel<MTiles>,
                                            cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    return true;
  }();
  (void)configured;
}

template <int MTiles>
bool resident() {
  configure<MTiles>();
  cudaLaunchAttribute attributes[2];
  const cudaLaunchConfig_t config = cluster_launch_config(
      dim3(kCtas), dim3(kThreads), kMaxDynamicShared, nullptr, kCtas, attributes);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, decode_select_kernel<MTiles>, &config) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  return clusters > 0;
}

template <int MTiles>
void launch(const DecodeSelectParams& params, cudaStream_t stream) {
  configure<MTiles>();
  static const int probe = [] { const char* v = std::getenv("MEGACTX_DECODE_SELECT_PROBE"); return v ? std::atoi(v) : 0; }();  // PROBE
  const_cast<DecodeSelectParams&>(params).probe_stage = probe;  // PROBE
  const int share = pages_per_cta(params.max_visible);
  const size_t shared_bytes = static_cast<size_t>(share) * (kPageBytes + kPageTokens * 4);
  cudaLaunchAttribute attributes[2];
  const cudaLaunchConfig_t config =
      cluster_launch_config(dim3(static_cast<unsigned>(params.rows * kCtas)), dim3(kThreads),
                            shared_bytes, stream, kCtas, attributes);
  MEGACTX_CUDA_CHECK(cudaLaunchKernelEx(&config, decode_select_kernel<MTiles>, params));
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

namespace detail {

bool decode_select_resident() {
  // 16 SMs of one GPC with ~140 KB free each (a MIG slice or another part may have none).
  static const bool fits = resident<2>() && resident<4>();
  return fits;
}

void launch_decode_indexer_select(const DecodeSelectParams& params, cudaStream_t stream) {
  if (params.rows == 0) return;
  params.heads == 32 ? launch<2>(params, stream) : launch<4>(params, stream);
}

}  // namespace detail
}  // namespace megactx::cuda
