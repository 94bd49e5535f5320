// Sparse MLA on Hopper warpgroup MMAs (wgmma, sm_90a). One CTA = one query
// row x 64 heads x one split of its top-k slots: prefill has rows enough to
// fill the GPU with one split; decode and MTP batches split the slots in
// whole 64-key stages (blockIdx.z) into partial states that the general
// kernel's merge combines. Stages of two K blocks of 32 keys in a two-stage ring
// (sparse_mla_prefill_tiles.cuh: shapes, shared memory, the gather). Warp
// specialisation, four warpgroups (512 threads):
//
//   producers (warpgroups 2 and 3, 64 registers after setmaxnreg): gather
//     both blocks of every stage from the paged fp8 pool (656-byte entries,
//     one key per load instruction across the 32 lanes) and dequantise them
//     to f16 (e4m3 -> f16 exact, the group scale one f16 multiply, rope
//     bf16 -> f16) into the ring in the 128-byte swizzle layout; producer warp
//     w takes keys 8 (w % 4) .. + 8 of block w / 4 in two groups of 4, and
//     prefetches the entries of the next stage into L2. Two producer warps
//     share each scheduler, so one's conversions hide the other's loads;
//   consumers (warpgroups 0 and 1, 192 registers), stage after stage,
//     warpgroup c on block c of the stage:
//       S_c[64 heads][32]  = Q[64][576] . K_c^T          (36 wgmma m64n32k16)
//       row maxima exchanged in shared memory, so both share one running max;
//       P_c = exp2(S_c - max) written to its half of P[64][64] (f16, swizzled);
//       O_c[64][256]      += P[64][64] . [K_0; K_1][:, 256c .. 256c+256)
//                                               (2 x 4 wgmma m64n128k16)
//     i.e. each consumer computes the scores of its own block and the output
//     columns of its half of the latent over both blocks (FlashMLA's split of
//     the work between two warpgroups), so no MMA is done twice. K doubles as
//     V (the value is the latent itself), read MN-major by the PV MMA.
//
// Handshakes on named barriers of all 512 threads: FULL + r (the producer
// arrives once a stage's blocks are in ring r, the consumers wait before its
// score MMAs) and EMPTY + r (the consumers arrive once the PV that read ring
// r has completed, the producer waits before writing the stage after next).
// setmaxnreg moves registers from the producers to the consumers: ptxas
// allocates the code after setmaxnreg.inc with the raised count (a 512-thread
// launch starts every thread at 128). But ptxas applies the launch's cap to
// every instruction: an m64n256 wgmma (128 accumulators) needs 154 registers,
// hence the PV as two m64n128 halves. Measured (docs/benchmarks.md): an
// earlier kernel whose two warpgroups both gathered and computed in lockstep
// 302 / 292 TFLOP/s at 32K / 128K prompts; one producer warpgroup (384
// threads, 120 registers, two 4-key groups in flight) 317 / 299; this layout
// 338-352 / 319.
//
// Q is stored as f16 times 2^-6 (|q| up to 4e6 fits f16), folded back into the
// softmax scale; the online softmax runs in the log2 domain. The results are
// the general kernel's (sparse_mla_attention.cu) up to summation order.
#include <climits>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/sparse_mla/sparse_mla_prefill_tiles.cuh"

namespace megactx::cuda {
namespace {

using namespace sparse_mla_prefill;

constexpr int kConsumerThreads = 256;  // warpgroups 0 and 1

// The CTA's split between the producers and the consumers. setmaxnreg.inc
// only takes registers that setmaxnreg.dec gave back: the launch holds
// 65,536 / 512 = 128 per thread, so 256 x consumer + 256 x producer must not
// exceed that, or the consumers' inc waits forever (a 384-thread kernel hung
// at 200 / 112).
struct Layout {
  static constexpr int kThreads = 512;
  static constexpr int kLaunchRegisters = 65536 / kThreads;
  static constexpr int kConsumerRegisters = 192;
  static constexpr int kProducerRegisters = 64;  // ptxas: no spills untiered at 192 / 64
  static constexpr int kProducerWarps = (kThreads - kConsumerThreads) / 32;
  // A producer warp's keys per stage, in groups of kGroupKeys.
  static constexpr int kWarpKeys = 2 * kKeys / kProducerWarps;
  static constexpr int kWarpGroups = kWarpKeys / kGroupKeys;
  static_assert(kConsumerThreads * kConsumerRegisters +
                        (kThreads - kConsumerThreads) * kProducerRegisters <=
                    kThreads * kLaunchRegisters,
                "setmaxnreg would ask for more registers than the launch holds");
};

constexpr int kExchangeBarrier = 1;  // consumers only
constexpr int kProbBarrier = 2;
constexpr int kQueryBarrier = 3;
constexpr int kFullBarrier = 4;   // + ring: all threads
constexpr int kEmptyBarrier = 6;  // + ring: all threads

// The slots [begin, end) of this CTA's split (blockIdx.z of num_splits):
// whole 64-key stages, ceil(stages / num_splits) each (the host launches no
// split without a slot: sparse_mla_prefill_splits).
struct SplitRange {
  int begin, end, stages;
};
__device__ __forceinline__ SplitRange split_range(const SparseMlaParams& p) {
  const int all_stages = (p.top_k + 2 * kKeys - 1) / (2 * kKeys);
  const int per_split = (all_stages + p.num_splits - 1) / p.num_splits;
  const int begin = static_cast<int>(blockIdx.z) * per_split * 2 * kKeys;
  const int end = min(p.top_k, begin + per_split * 2 * kKeys);
  return {begin, end, (end - begin + 2 * kKeys - 1) / (2 * kKeys)};
}

// A producer: `stages` stages of 64 keys; warp w gathers Layout::kWarpKeys
// keys of block w / (Layout::kProducerWarps / 2) of each stage, in groups of 4
// keys (with one group of 8, its loads issued right before its conversion,
// the first profile of this kernel had the producer waiting for them once
// per group and the consumers waiting for the producer).
template <typename Addressing>
__device__ __forceinline__ void sparse_mla_prefill_producer(const SparseMlaParams& p,
                                                            uint8_t* shared) {
  using L = Layout;
  set_max_registers_dec<L::kProducerRegisters>();
  constexpr unsigned kAll = 0xffffffffu;
  constexpr int kWarpKeys = L::kWarpKeys, kWarpGroups = L::kWarpGroups;
  uint8_t* k_tiles = shared + kKOffset;
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);
  const int producer_thread = static_cast<int>(threadIdx.x) - kConsumerThreads;
  const int warp = producer_thread / 32, lane = producer_thread % 32;
  const int block = warp / (L::kProducerWarps / 2);
  const int key_base = kWarpKeys * (warp % (L::kProducerWarps / 2));
  const int64_t row = blockIdx.x;
  const SplitRange range = split_range(p);
  const int stages = range.stages;
  const int32_t* row_slots = p.slots + row * p.top_k;
  // Lane l: the slot of the warp's key l % kWarpKeys of a stage (-1 past the
  // row's slots). Read two stages ahead, so that neither the loads nor the L2
  // prefetch (one stage ahead: the pool of a long context does not fit L2)
  // wait for them.
  auto stage_slot = [&](int stage) -> int32_t {
    const int index =
        range.begin + stage * (2 * kKeys) + block * kKeys + key_base + lane % kWarpKeys;
    return stage < stages && index < range.end ? row_slots[index] : -1;
  };
  // Group q's slots as load_warp_entries takes them (lane l: key l % 4).
  auto group_slot = [&](int32_t slots, int q) {
    return __shfl_sync(kAll, slots, kGroupKeys * q + lane % kGroupKeys);
  };
  auto prefetch_stage = [&](int32_t slots) {
    if (lane < kWarpKeys && slots >= 0) prefetch_l2_bulk(Addressing(p)(slots), kLatentBytes);
  };

  int32_t current = stage_slot(0), next = stage_slot(1), far = stage_slot(2);
  WarpEntries entries;  // the next group to store, its loads in flight
  load_warp_entries<Addressing>(entries, p, group_slot(current, 0), lane);
  prefetch_stage(next);
  for (int stage = 0; stage < stages; ++stage) {
    const int ring = stage & 1, buffer = 2 * ring + block;
    uint8_t* tile = k_tiles + buffer * kKBytes;
    // Stage s + 2 goes where stage s was: wait for its PV.
    if (stage >= 2) named_barrier(kEmptyBarrier + ring, L::kThreads);
    const unsigned valid = __ballot_sync(kAll, current >= 0);
    if (lane == 0) {
      uint8_t* bits = &misc.valid_bits[buffer][key_base / 8];
      if constexpr (kWarpKeys == 16)
        *reinterpret_cast<uint16_t*>(bits) = static_cast<uint16_t>(valid);
      else
        *bits = static_cast<uint8_t>(valid);
    }
#pragma unroll
    for (int q = 0; q < kWarpGroups; ++q) {
      store_warp_entries(entries, tile, key_base + kGroupKeys * q, lane);
      // The following group: in this stage or the next.
      const int32_t slot = q + 1 < kWarpGroups ? group_slot(current, q + 1) : group_slot(next, 0);
      if (q + 1 < kWarpGroups || stage + 1 < stages)
        load_warp_entries<Addressing>(entries, p, slot, lane);
    }
    fence_proxy_async_shared();  // st.shared -> the consumers' wgmma reads (async proxy)
    named_barrier_arrive(kFullBarrier + ring, L::kThreads);
    prefetch_stage(far);
    current = next;
    next = far;
    far = stage_slot(stage + 3);
  }
}

// A consumer warpgroup C: its block of each stage for the scores, its half of
// the latent for the output (FlashMLA's split, above).
template <int C, bool kSkipUnitRescale>
__device__ __forceinline__ void sparse_mla_prefill_consumer(const SparseMlaParams& p,
                                                            uint8_t* shared) {
  using L = Layout;
  set_max_registers_inc<L::kConsumerRegisters>();
  uint8_t* q_tile = shared + kQOffset;
  uint8_t* k_tiles = shared + kKOffset;
  uint8_t* p_tile = shared + kPOffset;
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);

  const int tid = static_cast<int>(threadIdx.x);
  const int c = C;
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t row = blockIdx.x;
  const int head0 = static_cast<int>(blockIdx.y) * kHeads;
  const int stages = split_range(p).stages;
  const float scale_log2 = p.softmax_scale * kLog2e / kQueryPrescale;

  store_query_tile<kConsumerThreads>(p, row, head0, q_tile, tid);
  fence_proxy_async_shared();  // st.shared -> the wgmma operand reads (async proxy)
  named_barrier(kQueryBarrier, kConsumerThreads);

  const uint32_t q_address = shared_address(q_tile);
  const uint32_t k_address = shared_address(k_tiles);
  const uint32_t p_address = shared_address(p_tile);
  float s[16];
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) {
    o[i] = 0.f;
    fence_operand(o[i]);
  }
  float running_max[2] = {-INFINITY, -INFINITY};  // rows g and g + 8 of this warp's 16 heads
  float running_sum[2] = {0.f, 0.f};              // this thread's columns only (reduced at the end)

  // S_c of a stage: 36 k-steps of 16 over Q's and the block's 9 swizzled
  // chunks. The descriptors' low words are 32-bit adds to a base the compiler
  // cannot see through (else it hoists all 72 descriptors out of the stage
  // loop into registers); a runtime loop over the chunks instead made ptxas
  // wait for every wgmma.
  auto issue_scores = [&](int stage) {
    uint32_t q_low = swizzle128_descriptor_low(q_address);
    asm volatile("" : "+r"(q_low));
    const uint32_t k_low = swizzle128_descriptor_low(k_address + (2 * (stage & 1) + c) * kKBytes);
#pragma unroll
    for (int i = 0; i < 16; ++i) fence_operand(s[i]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks) {
      const uint32_t column = ks / 4, step = (ks % 4) * 32;
      wgmma_m64n32k16_f16_ss(s,
                             descriptor_from_words(q_low + ((column * kQChunkBytes + step) >> 4),
                                                   kSwizzle128DescriptorHigh),
                             descriptor_from_words(k_low + ((column * kKChunkBytes + step) >> 4),
                                                   kSwizzle128DescriptorHigh),
                             ks > 0);
    }
    wgmma_commit();
  };

  const int head_low = warp * 16 + g;
  named_barrier(kFullBarrier, L::kThreads);  // stage 0 in ring 0
  issue_scores(0);
  for (int stage = 0; stage < stages; ++stage) {
    const int ring = stage & 1;
    // The last stage's ring is free once its PV is done (committed before
    // this stage's S): the producer writes stage + 1 there while S runs.
    wgmma_wait<1>();
    if (stage >= 1 && stage + 1 < stages)
      named_barrier_arrive(kEmptyBarrier + (ring ^ 1), L::kThreads);
    wgmma_wait_all();  // S of this stage
#pragma unroll
    for (int i = 0; i < 16; ++i) fence_operand(s[i]);
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);

    // Scale and mask (into a copy: the accumulator registers are written by
    // wgmma only); the block maxima of rows g and g + 8, shared with the other warpgroup.
    float score[16];
    const uint32_t valid = *reinterpret_cast<const uint32_t*>(misc.valid_bits[2 * ring + c]);
    float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& value = score[4 * j + 2 * r + e];
          value =
              (valid >> (8 * j + 2 * t + e)) & 1u ? s[4 * j + 2 * r + e] * scale_log2 : -INFINITY;
          block_max[r] = fmaxf(block_max[r], value);
        }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
      if (t == 0) misc.row_max[c][head_low + 8 * r] = block_max[r];
    }
    named_barrier(kExchangeBarrier, kConsumerThreads);
    // The running max moves only when a block's max passes it by more than
    // kRescaleSlack (log2 units), FlashAttention-4's lazy rescaling: P stays
    // below 2^kRescaleSlack (f16 holds it as precisely as values below 1) and
    // the sums are fp32. Both warpgroups decide from the same values, so they
    // keep the same max.
    float factor[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float other = misc.row_max[c ^ 1][head_low + 8 * r];
      const float stage_max = fmaxf(block_max[r], other);
      const bool raise = stage_max > running_max[r] + kRescaleSlack;
      const float new_max = raise ? stage_max : running_max[r];
      factor[r] = raise ? exp2f(running_max[r] - new_max) : 1.f;  // -inf - x: 0
      const bool empty = new_max == -INFINITY;  // nothing valid yet: avoid inf - inf
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& value = score[4 * j + 2 * r + e];
          value = empty ? 0.f : exp2f(value - new_max);
          sum += value;
        }
      running_sum[r] = running_sum[r] * factor[r] + sum;
      running_max[r] = new_max;
    }
    // With the lazy rescaling a raise is rare: most stages leave both of the
    // thread's rows as they are (128 multiplies by 1 skipped).
    if (!kSkipUnitRescale || factor[0] != 1.f || factor[1] != 1.f) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j + 0] *= factor[0];
        o[4 * j + 1] *= factor[0];
        o[4 * j + 2] *= factor[1];
        o[4 * j + 3] *= factor[1];
      }
    }
    // P_c -> columns 32c .. 32c + 32 of P (f16, K-major, swizzled): unit 4c + j.
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(p_tile + swizzled(head_low + 8 * r, 4 * c + j) + 4 * t) =
            pack_half2(score[4 * j + 2 * r], score[4 * j + 2 * r + 1]);
    fence_proxy_async_shared();
    named_barrier(kProbBarrier, kConsumerThreads);
    // The rescaled O must be in its registers before the MMAs that accumulate
    // into it are issued (else ptxas serialises every wgmma of the kernel).
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);

    // O_c += P . V: keys 0-31 from block 0's buffer, 32-63 from block 1's;
    // latent columns 256c .. 256c + 256 = chunks 4c .. 4c + 3.
    wgmma_fence();
    const uint32_t p_low = swizzle128_descriptor_low(p_address);
    const uint32_t v_base = k_address + 2 * ring * kKBytes + 4 * c * kKChunkBytes;
    // Key step ks: keys 16 ks .. + 16, in block ks / 2's buffer.
    auto v_step = [](uint32_t v_low, int ks) {
      return descriptor_from_words(v_low + (((ks / 2) * kKBytes + (ks % 2) * 16 * 128) >> 4),
                                   kSwizzle128DescriptorHigh);
    };
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t v_low =
          swizzle128_mn_descriptor_low(v_base + 2 * half * kKChunkBytes, kKChunkBytes);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_m64n128k16_f16_ss_tb(o + 64 * half,
                                   descriptor_from_words(p_low + 2 * ks, kSwizzle128DescriptorHigh),
                                   v_step(v_low, ks));
    }
    wgmma_commit();
    if (stage + 1 < stages) {
      // The next stage's blocks (written by the producer while this stage's
      // softmax ran), then its scores, queued behind this PV.
      named_barrier(kFullBarrier + (ring ^ 1), L::kThreads);
      issue_scores(stage + 1);
    }
  }
  wgmma_wait_all();
#pragma unroll
  for (int i = 0; i < 128; ++i) fence_operand(o[i]);
  // Finalise: out = O / (both warpgroups' row sums), and the lse.
  store_consumer_rows(p, o, running_sum, running_max, misc.row_sum, kExchangeBarrier, row, head0,
                      head_low, c, t);
}

// kTiered: slots may be past pool_slots (a host tier's entries).
// kSkipUnitRescale: O's rows are multiplied only when their max moved.
template <bool kTiered, bool kSkipUnitRescale>
__global__ void __launch_bounds__(Layout::kThreads, 1)
    sparse_mla_prefill_kernel(SparseMlaParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = shared_raw + ((1024 - (shared_address(shared_raw) & 1023)) & 1023);
  if (threadIdx.x >= kConsumerThreads)
    sparse_mla_prefill_producer<
        std::conditional_t<kTiered, LatentAddressing, DeviceLatentAddressing>>(p, shared);
  else if (threadIdx.x < 128)
    sparse_mla_prefill_consumer<0, kSkipUnitRescale>(p, shared);
  else
    sparse_mla_prefill_consumer<1, kSkipUnitRescale>(p, shared);
}

}  // namespace

namespace detail {

void launch_sparse_mla_prefill(const SparseMlaParams& params, cudaStream_t stream) {
  // The fp8-ring layout for one split: 1.04-1.13x the f16-ring layout's rate
  // on an H100 (dsa_attention_bench, docs/benchmarks.md, twenty-ninth
  // session); its 128-key bunches split decode's rows coarser. Read once.
  static const bool fp8ring = [] {
    const char* value = std::getenv("MEGACTX_SPARSE_MLA_FP8RING");
    return !(value != nullptr && value[0] == '0');
  }();
  // MEGACTX_SPARSE_MLA_FP8RING_SPLITS=1 (off until measured): decode's splits
  // on the fp8-ring layout too. Up to 16 splits of top-k 2048 (all that
  // sparse_mla_splits asks for) its 128-key bunches split a row as finely as
  // the f16 ring's 64-key stage pairs, and one split runs 1.04-1.13x faster
  // there; whether short splits do (Q tile, ring fill, epilogue) is measured by
  // scripts/sparse-mla-switch-ab.sh. Read once.
  static const bool fp8ring_splits = [] {
    const char* value = std::getenv("MEGACTX_SPARSE_MLA_FP8RING_SPLITS");
    return value != nullptr && value[0] == '1';
  }();
  if (fp8ring && (params.num_splits == 1 || fp8ring_splits))
    launch_sparse_mla_prefill_fp8ring(params, stream);
  else
    launch_sparse_mla_prefill_f16ring(params, stream);
}

void launch_sparse_mla_prefill_f16ring(const SparseMlaParams& requested, cudaStream_t stream) {
  if (requested.rows == 0) return;
  // Whole 64-key stages per split, none empty (fewer splits than asked for
  // when they do not divide; the partial buffers hold num_splits).
  SparseMlaParams params = requested;
  params.num_splits = sparse_mla_prefill_splits(requested.num_splits, requested.top_k);
  static const bool configured = [] {
    for (auto kernel :
         {sparse_mla_prefill_kernel<false, false>, sparse_mla_prefill_kernel<true, false>,
          sparse_mla_prefill_kernel<false, true>, sparse_mla_prefill_kernel<true, true>})
      MEGACTX_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
    return true;
  }();
  (void)configured;
  // MEGACTX_SPARSE_MLA_SKIP_UNIT_RESCALE=0: rescale O every stage (A/B runs; read once).
  static const bool skip = [] {
    const char* value = std::getenv("MEGACTX_SPARSE_MLA_SKIP_UNIT_RESCALE");
    return !(value != nullptr && value[0] == '0');
  }();
  const dim3 grid(static_cast<unsigned>(params.rows), static_cast<unsigned>(params.heads / kHeads),
                  static_cast<unsigned>(params.num_splits));
  const bool tiered = params.pool_slots != INT64_MAX;
  auto kernel =
      tiered
          ? (skip ? sparse_mla_prefill_kernel<true, true> : sparse_mla_prefill_kernel<true, false>)
          : (skip ? sparse_mla_prefill_kernel<false, true>
                  : sparse_mla_prefill_kernel<false, false>);
  launch_kernel(kernel, grid, Layout::kThreads, kSharedBytes, stream, params);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  if (params.num_splits > 1) launch_sparse_mla_merge(params, stream);
}

}  // namespace detail
}  // namespace megactx::cuda
