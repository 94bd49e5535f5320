// Sparse MLA prefill, the fp8-ring layout (wgmma, sm_90a): one CTA = one query
// row x 64 heads x one split of its slots in whole bunches of 128 keys (the
// split rule: sparse_mla_bunch_splits). launch_sparse_mla_prefill takes it for
// one split, beside the f16-ring layout (sparse_mla_prefill.cu) for decode's
// splits: on an H100 it runs at 378 / 331 / 318 TFLOP/s against 335 / 317 / 307
// (dsa_attention_bench: 32K and 128K prompts, 16K rows over a 1M pool;
// docs/benchmarks.md, twenty-ninth session). What it changes, and why:
//
// The f16-ring layout converts the gathered e4m3 entries to f16 in shared memory
// before its SS wgmmas read them; the conversion needs registers, registers
// cap the gathers in flight, and the f16 ring leaves no room for a deeper one.
// Here the ring holds the pool's 656-byte entries as they are, and the
// consumers convert while they build their wgmma A fragments in registers:
//
//   warpgroup 2, the producer (40 registers): cp.async of every entry of a
//     64-key block (zero bytes for a missing slot) into a ring of three
//     blocks (126 KB), completing on the block's `full` mbarrier; no
//     conversion, so a whole block is in flight per SM;
//   warpgroups 0 and 1, the consumers (232 registers), per bunch of two
//     blocks, consumer c:
//       S^T_c[64 keys][64 heads] = K_c . Q^T    36 x wgmma m64n64k16, A = the
//           keys of block c from registers (one 4-byte load of e4m3 per row
//           and k-step, converted and scaled; the rope dims from bf16), B = Q
//           [64 heads][576] f16 in shared memory (K-major)
//       one running max per head for both consumers: a vote per bunch
//           (bar.red.or) whether any score passed it by kRescaleSlack, and
//           the full reduction over keys only then (the first bunch, rarely
//           later); P^T_c = exp2(S^T_c - max) into shared memory [64 keys][64
//           heads] f16, MN-major
//       O^T_c[256 dims][64 heads] += V^T . P^T over both blocks: 4 dim tiles x
//           8 key steps of wgmma m64n64k16, A = V^T from registers (a 2-byte
//           load of two adjacent dims per key, converted, keys paired with
//           prmt, scaled), B = P^T; block 0's steps first, so that its ring
//           slot is released half a bunch early
//     (consumer c: the scores of the bunch's block c, the output dims
//     256c .. 256c + 256 over both blocks: each MMA is done once).
//
// Orders inside a 16-wide k step, chosen for conflict-free 4- and 2-byte loads
// at the 656-byte pitch and mirrored in the B operands: score k-slot 2t + e
// (e < 2) is dim 4t + e, slot 2t + 8 + e is dim 4t + 2 + e (the Q tile is
// stored in that order); output k-slot 2t / 2t + 1 / 2t + 8 / 2t + 9 is key t
// / t + 4 / t + 8 / t + 12 of the step (P^T rows in that order), and
// accumulator rows g / g + 8 of a dim tile are dims 2g / 2g + 1.
//
// Q is stored as f16 times 2^-6 as in the default kernel; the online softmax
// runs in the log2 domain. Results: the general kernel's up to summation order.
//
// Persistent for one split (MEGACTX_SPARSE_MLA_PERSISTENT=0: a CTA per row
// instead, A/B runs): one CTA per SM runs every gridDim.x-th (row, head
// block); the producer streams from one row's last block into the next row's
// first while the consumers finish the row (its epilogue staged in the Q
// tile's space). On an H100: 341 against 329-332 TFLOP/s at a 128K prompt,
// 327-332 against 320-327 over a 1M pool, level at 32K (forty-eighth session).
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/sparse_mla/sparse_mla_prefill_fp8ring.cuh"

namespace megactx::cuda {
namespace {

using namespace fp8ring;  // NOLINT: this file is the layout's one user

// ---- The consumers in lockstep ----------------------------------------------
// Per bunch, both consumers: scores of their own block, one vote over both
// whether the shared running max must move, P^T_c, a barrier, the output MMAs
// over both blocks. kScalesAhead (MEGACTX_SPARSE_MLA_SCALES_AHEAD=1, off until
// measured): the output steps' group scales loaded half a step before they
// are packed; ncu put the packs' wait on those shared loads among the output
// loop's largest stalls (fifty-first session).
template <bool kPersistent, bool kScalesAhead>
__device__ __forceinline__ void fp8ring_consumer(const SparseMlaParams& p, uint8_t* shared) {
  set_max_registers_inc<kConsumerRegisters>();
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);
  const int tid = static_cast<int>(threadIdx.x);
  const ConsumerThread th{tid, tid / 128, (tid % 128) / 32, (tid % 32) / 4, tid % 4};
  const int c = th.c, warp = th.warp, g = th.g, t = th.t;
  const BunchRange range = bunch_range(p, kBunchKeys);
  const int begin = range.first * kBunchKeys;
  const float scale_log2 = p.softmax_scale * kLog2e / kQueryPrescale;
  const uint8_t* ring = shared + kRingOffset;
  uint8_t* p_tiles = shared + kPOffset;
  const uint32_t q_address = shared_address(shared + kQOffset);
  const uint32_t p_address = shared_address(p_tiles);
  WorkItem item;
  for (int k = 0; work_item<kPersistent>(p, k, item); ++k) {
    // Blocks of earlier items: the ring's position and phases go on from them.
    const int done = k * 2 * range.count;
    const int32_t* row_slots = p.slots + item.row * p.top_k;
    load_query_tile(p, shared, item.row, item.head0, tid);

    float s[32];
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float row_sum[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) row_sum[i] = 0.f;

    for (int bunch = 0; bunch < range.count; ++bunch) {
      const int own_block = 2 * bunch + c;  // of this item; done + own_block in the ring
      const int own_slot = (done + own_block) % kSlots;
      mbarrier_wait(&misc.full[own_slot], ((done + own_block) / kSlots) & 1);
      score_mmas(s, o, ring, own_slot, q_address, th);
      scale_and_mask(s, p, row_slots, begin + own_block * kBlockKeys, scale_log2, th);

      // ---- The running max and P^T_c -------------------------------------------
      bool passes = false;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float limit = misc.row_max[8 * j + 2 * t + e] + kRescaleSlack;
          passes |= s[4 * j + e] > limit || s[4 * j + 2 + e] > limit;
        }
      // Every consumer has finished the last bunch's output MMAs here (each waits
      // for them before its scores), so the P^T tiles are free.
      if (any_thread(passes, kVoteBarrier, kConsumerThreads)) {
        // The block maxima per head over both consumers' keys: the thread's two
        // rows, the 8 g lanes, the 4 warps, the 2 consumers.
        publish_warp_maxima(s, misc.exchange[c], th);
        named_barrier(kMaxBarrier, kConsumerThreads);
        float factor[16], new_max[16];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int head = 8 * j + 2 * t + e;
            const float old_max = misc.row_max[head];
            float m = old_max;
#pragma unroll
            for (int x = 0; x < 2; ++x)
#pragma unroll
              for (int w = 0; w < 4; ++w) m = fmaxf(m, misc.exchange[x][w][head]);
            new_max[2 * j + e] = m;
            factor[2 * j + e] = fast_exp2(old_max - m);  // kNoMax - m: 0
            s[4 * j + e] -= m;
            s[4 * j + 2 + e] -= m;
          }
#pragma unroll
        for (int i = 0; i < 16; ++i) row_sum[i] *= factor[i];
        rescale_output(o, factor);
        // Everyone has read row_max and the exchange: the new max replaces it.
        named_barrier(kMaxBarrier, kConsumerThreads);
        if (c == 0 && warp == 0 && g == 0) {
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) misc.row_max[8 * j + 2 * t + e] = new_max[2 * j + e];
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float m = misc.row_max[8 * j + 2 * t + e];
            s[4 * j + e] -= m;
            s[4 * j + 2 + e] -= m;
          }
      }
      write_p_tile(s, row_sum, p_tiles + c * kPTileBytes, th);
      fence_proxy_async_shared();  // st.shared -> the output MMAs' reads (async proxy)
      named_barrier(kPBarrier, kConsumerThreads);

      // ---- O^T_c += V^T . P^T over both blocks ---------------------------------
      const int block0 = done + 2 * bunch;  // the bunch's blocks in the ring
      const int slot0 = block0 % kSlots, slot1 = (block0 + 1) % kSlots;
      if (c == 1)  // consumer 0 waited for block 2 * bunch already
        mbarrier_wait(&misc.full[slot0], (block0 / kSlots) & 1);
      else
        mbarrier_wait(&misc.full[slot1], ((block0 + 1) / kSlots) & 1);
      const int slots[2] = {slot0, slot1}, tiles[2] = {0, 1};
      output_mmas<2, kScalesAhead>(o, ring, p_address, slots, tiles, &misc.empty[slot0], th);
      mbarrier_arrive(&misc.empty[slot1]);
    }
    consumer_epilogue<kPersistent>(p, shared, o, row_sum, item.row, item.head0, th);
  }
}

// ---- The consumers half a phase apart (ping-pong) --------------------------
// MEGACTX_SPARSE_MLA_PINGPONG=1 (off until measured): the lockstep's vote, P
// and max barriers of both consumers (with the softmax between them, ~19% of
// a consumer's time in the fifty-first session's ncu profile) replaced by
// mbarriers that carry only the data each consumer needs from the other, so
// one consumer's softmax can overlap the other's MMAs. Both consumers keep
// the same running max per head (`ref`), which moves only in a bunch where a
// consumer's scores pass it by kRescaleSlack; each warp holds its own copy of
// it, and of the last move's factor exp2(old - new), in shared memory (in
// registers they took the consumers into spills). Consumer c, per bunch n
// (counted over the CTA's items, for the mbarrier phases):
//
//   scores of its block; a vote among its own 128 threads: `pass`;
//   wait released[c] (the other consumer is done with c's P^T tile, flag and
//     maxima of bunch n - 1);
//   no pass: flag 0; P^T_c relative to ref; arrive tile[c] and vote[c];
//     output MMAs over its own block; wait vote[1 - c]; if the other passed,
//     move ref to max(ref, its maxima) and rescale o and row_sum (its own
//     block's part included: it was relative to the old ref); wait tile[1 - c];
//     output MMAs over the other block; arrive released[1 - c];
//   pass: its block maxima into exchange[c]; flag 1; arrive vote[c]; wait
//     vote[1 - c]; new = max(ref, own maxima, the other's if it passed);
//     row_sum rescaled; P^T_c relative to new; arrive tile[c]. If the other
//     passed too: o rescaled, output MMAs over its own block, then (wait
//     tile[1 - c]) over the other's. If not, the other's P^T is relative to
//     the old max, as o still is: wait tile[1 - c], output MMAs over the other
//     block first, then o rescaled, then its own block.
//   Either way one output loop runs twice (one block each), and the other
//   block's pass ends with an arrival on released[1 - c].
//
// Both consumers compute the same new max from the same shared maxima. A
// barrier phase cannot be overrun: c arrives vote[c] / tile[c] of bunch n + 1
// only after released[c] of bunch n, which the other consumer arrives after its
// last read of c's bunch-n data. kAlternate (MEGACTX_SPARSE_MLA_PINGPONG=2):
// the score loops of the two consumers also take turns (consumer 0 first), as
// FlashAttention-3's warp scheduler barriers do, so that one consumer's
// softmax and output MMAs run beside the other's scores. Desk checks (CTest,
// pure Python): tools/kernel_emulation/sparse_mla_pingpong_protocol.py
// model-checks these waits and arrivals over random interleavings (no
// deadlock, overrun or stale read); sparse_mla_pingpong_max.py the max's
// arithmetic against a float64 softmax.
template <bool kPersistent, bool kAlternate>
__device__ __forceinline__ void fp8ring_pingpong_consumer(const SparseMlaParams& p,
                                                          uint8_t* shared) {
  set_max_registers_inc<kConsumerRegisters>();
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);
  const int tid = static_cast<int>(threadIdx.x);
  const ConsumerThread th{tid, tid / 128, (tid % 128) / 32, (tid % 32) / 4, tid % 4};
  const int c = th.c, other = 1 - c, warp = th.warp, g = th.g, t = th.t;
  const BunchRange range = bunch_range(p, kBunchKeys);
  const int begin = range.first * kBunchKeys;
  const float scale_log2 = p.softmax_scale * kLog2e / kQueryPrescale;
  const uint8_t* ring = shared + kRingOffset;
  const uint32_t q_address = shared_address(shared + kQOffset);
  const uint32_t p_address = shared_address(shared + kPOffset);
  float* ref = misc.warp_max[c][warp];             // [head]
  float* move_factor = misc.warp_factor[c][warp];  // [head]
  // Consumer 0's first score loop goes first.
  if (kAlternate && c == 1) named_barrier_arrive(kTurnBarrier, kConsumerThreads);
  WorkItem item;
  for (int k = 0; work_item<kPersistent>(p, k, item); ++k) {
    const int done = k * 2 * range.count;  // blocks of earlier items
    const int32_t* row_slots = p.slots + item.row * p.top_k;
    load_query_tile(p, shared, item.row, item.head0, tid);

    float s[32];
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float row_sum[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) row_sum[i] = 0.f;
    // The previous item's epilogue (its barriers) has read this warp's max.
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) ref[8 * j + 2 * t + e] = kNoMax;
    }
    __syncwarp();

    for (int bunch = 0; bunch < range.count; ++bunch) {
      const int n = done / 2 + bunch;  // this bunch over the CTA's items
      const int own_block = done + 2 * bunch + c, other_block = done + 2 * bunch + other;
      const int own_slot = own_block % kSlots, other_slot = other_block % kSlots;
      mbarrier_wait(&misc.full[own_slot], (own_block / kSlots) & 1);
      if (kAlternate) named_barrier(kTurnBarrier + c, kConsumerThreads);
      score_mmas(s, o, ring, own_slot, q_address, th);
      if (kAlternate) named_barrier_arrive(kTurnBarrier + other, kConsumerThreads);
      scale_and_mask(s, p, row_slots, begin + (2 * bunch + c) * kBlockKeys, scale_log2, th);
      bool passes = false;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float limit = ref[8 * j + 2 * t + e] + kRescaleSlack;
          passes |= s[4 * j + e] > limit || s[4 * j + 2 + e] > limit;
        }
      const bool pass = any_thread(passes, kOwnVoteBarrier + c, 128);
      if (n > 0) mbarrier_wait(&misc.released[c], (n - 1) & 1);

      // ref = max(ref, the passing consumers' maxima), and the warp's factor
      // copy exp2(old - new), which o and the sums are multiplied by (kept in
      // shared memory: 16 registers live through an output loop spilled).
      auto move_max = [&](bool own_passed, bool other_passed) {
        float new_max[16], factor[16];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int head = 8 * j + 2 * t + e;
            float m = ref[head];
#pragma unroll
            for (int w = 0; w < 4; ++w) {
              if (own_passed) m = fmaxf(m, misc.exchange[c][w][head]);
              if (other_passed) m = fmaxf(m, misc.exchange[other][w][head]);
            }
            factor[2 * j + e] = fast_exp2(ref[head] - m);  // kNoMax - m: 0
            new_max[2 * j + e] = m;
          }
        __syncwarp();  // every lane has read the old max
        if (g == 0) {
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              ref[8 * j + 2 * t + e] = new_max[2 * j + e];
              move_factor[8 * j + 2 * t + e] = factor[2 * j + e];
            }
        }
        __syncwarp();
      };
      auto rescale_by_move = [&](bool sums, bool output) {
        float factor[16];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) factor[2 * j + e] = move_factor[8 * j + 2 * t + e];
        if (sums) {
#pragma unroll
          for (int i = 0; i < 16; ++i) row_sum[i] *= factor[i];
        }
        if (output) rescale_output(o, factor);
      };
      // P^T_c relative to ref, announced on tile[c] (and visible to every warp
      // of this consumer's MMAs).
      auto own_tile_relative_to_ref = [&] {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float m = ref[8 * j + 2 * t + e];
            s[4 * j + e] -= m;
            s[4 * j + 2 + e] -= m;
          }
        write_p_tile(s, row_sum, shared + kPOffset + c * kPTileBytes, th);
        fence_proxy_async_shared();  // st.shared -> both consumers' MMAs (async proxy)
        mbarrier_arrive(&misc.tile[c]);
      };

      // P^T_c out, and the order of the two blocks' output MMAs: the own block
      // first, except where this consumer passed and the other did not (the
      // other's P^T is relative to the old max, as o is until the rescale).
      bool other_first = false;
      if (!pass) {
        if (tid % 128 == 0) misc.flag[c] = 0;
        own_tile_relative_to_ref();
        mbarrier_arrive(&misc.vote[c]);
      } else {
        publish_warp_maxima(s, misc.exchange[c], th);
        if (tid % 128 == 0) misc.flag[c] = 1;
        named_barrier(kOwnMaxBarrier + c, 128);  // exchange[c] complete for c's threads
        mbarrier_arrive(&misc.vote[c]);
        mbarrier_wait(&misc.vote[other], n & 1);
        const bool other_passed = misc.flag[other] != 0;
        move_max(true, other_passed);
        rescale_by_move(true, other_passed);
        own_tile_relative_to_ref();
        other_first = !other_passed;
      }
      named_barrier(kOwnMaxBarrier + c, 128);  // every warp's rows of the own tile
      // One copy of the output loop for both blocks (two inlined copies per
      // block took the persistent kernel's consumers into spills).
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
        const bool other_now = (half == 0) == other_first;
        if (other_now) {
          mbarrier_wait(&misc.tile[other], n & 1);
          mbarrier_wait(&misc.full[other_slot], (other_block / kSlots) & 1);
        }
        const int slot = other_now ? other_slot : own_slot;
        const int tile = other_now ? other : c;
        const int slots[2] = {slot, slot}, tiles[2] = {tile, tile};
        output_mmas<1, false>(o, ring, p_address, slots, tiles, nullptr, th);
        mbarrier_arrive(&misc.empty[slot]);
        // The other consumer's tile, flag and maxima are read.
        if (other_now) mbarrier_arrive(&misc.released[other]);
        if (half == 0) {
          if (other_first) {
            rescale_by_move(false, true);
          } else if (!pass) {
            mbarrier_wait(&misc.vote[other], n & 1);
            if (misc.flag[other] != 0) {
              // The other consumer moved the max: this consumer's o and sums
              // (its own block's share included) follow.
              move_max(false, true);
              rescale_by_move(true, true);
            }
          }
        }
      }
    }
    // The final max for the epilogue's lse (both consumers hold the same).
    if (c == 0 && warp == 0 && g == 0) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) misc.row_max[8 * j + 2 * t + e] = ref[8 * j + 2 * t + e];
    }
    consumer_epilogue<kPersistent>(p, shared, o, row_sum, item.row, item.head0, th);
  }
  // Consumer 1's last turn is taken, so that no arrival is left pending at exit.
  if (kAlternate && c == 0) named_barrier(kTurnBarrier, kConsumerThreads);
}

// kConsumers: the consumers' form (launch_sparse_mla_prefill_fp8ring).
enum Consumers { kLockstep, kLockstepScalesAhead, kPingPong, kPingPongAlternate };

template <bool kTiered, bool kPersistent, int kConsumers>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_fp8ring_kernel(SparseMlaParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = shared_raw + ((1024 - (shared_address(shared_raw) & 1023)) & 1023);
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);
  if (threadIdx.x == 0) {
    for (int slot = 0; slot < kSlots; ++slot) {
      mbarrier_init(&misc.full[slot], kThreads - kConsumerThreads);
      mbarrier_init(&misc.empty[slot], kConsumerThreads);
    }
    for (int c = 0; c < 2; ++c) {
      mbarrier_init(&misc.vote[c], kConsumerThreads / 2);
      mbarrier_init(&misc.tile[c], kConsumerThreads / 2);
      mbarrier_init(&misc.released[c], kConsumerThreads / 2);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= kConsumerThreads)
    fp8ring_producer<std::conditional_t<kTiered, LatentAddressing, DeviceLatentAddressing>,
                     kPersistent>(p, shared);
  else if constexpr (kConsumers == kPingPong || kConsumers == kPingPongAlternate)
    fp8ring_pingpong_consumer<kPersistent, kConsumers == kPingPongAlternate>(p, shared);
  else
    fp8ring_consumer<kPersistent, kConsumers == kLockstepScalesAhead>(p, shared);
}

}  // namespace

namespace detail {

int sparse_mla_bunch_splits(int num_splits, int top_k) {
  const int bunches = std::max(1, (top_k + kBunchKeys - 1) / kBunchKeys);
  const int per_split = (bunches + std::max(1, num_splits) - 1) / std::max(1, num_splits);
  return (bunches + per_split - 1) / per_split;
}

bool sparse_mla_fp8ring_persistent() {
  static const bool on = [] {
    const char* value = std::getenv("MEGACTX_SPARSE_MLA_PERSISTENT");
    return value == nullptr || value[0] != '0';
  }();
  return on;
}

template <int kConsumers>
static void launch_fp8ring(const SparseMlaParams& params, cudaStream_t stream) {
  if (sparse_mla_fp8ring_persistent() &&
      sparse_mla_bunch_splits(params.num_splits, params.top_k) == 1) {
    // One CTA per SM (the ring and Q take its shared memory).
    sparse_mla_prefill::launch_bunch_layout<sparse_mla_fp8ring_kernel<false, true, kConsumers>,
                                            sparse_mla_fp8ring_kernel<true, true, kConsumers>>(
        params, kThreads, kSharedBytes, stream, current_device_multiprocessors());
    return;
  }
  sparse_mla_prefill::launch_bunch_layout<sparse_mla_fp8ring_kernel<false, false, kConsumers>,
                                          sparse_mla_fp8ring_kernel<true, false, kConsumers>>(
      params, kThreads, kSharedBytes, stream);
}

// The consumers' form, from the environment (A/B switches, off until
// measured): MEGACTX_SPARSE_MLA_PINGPONG=1 ping-pong, =2 ping-pong with
// alternating score loops; else MEGACTX_SPARSE_MLA_SCALES_AHEAD=1 the lockstep
// with its output scales loaded ahead; else the lockstep.
static int fp8ring_consumers() {
  static const int consumers = [] {
    const char* pingpong = std::getenv("MEGACTX_SPARSE_MLA_PINGPONG");
    if (pingpong != nullptr && pingpong[0] == '1') return int{kPingPong};
    if (pingpong != nullptr && pingpong[0] == '2') return int{kPingPongAlternate};
    const char* ahead = std::getenv("MEGACTX_SPARSE_MLA_SCALES_AHEAD");
    return ahead != nullptr && ahead[0] == '1' ? int{kLockstepScalesAhead} : int{kLockstep};
  }();
  return consumers;
}

void launch_sparse_mla_prefill_fp8ring(const SparseMlaParams& params, cudaStream_t stream) {
  switch (fp8ring_consumers()) {
    case kPingPong:
      return launch_fp8ring<kPingPong>(params, stream);
    case kPingPongAlternate:
      return launch_fp8ring<kPingPongAlternate>(params, stream);
    case kLockstepScalesAhead:
      return launch_fp8ring<kLockstepScalesAhead>(params, stream);
    default:
      return launch_fp8ring<kLockstep>(params, stream);
  }
}

}  // namespace detail
}  // namespace megactx::cuda
