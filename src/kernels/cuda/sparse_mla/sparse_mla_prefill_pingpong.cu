// Sparse MLA prefill, the ping-pong layout (wgmma, sm_90a): one CTA = one
// query row x 64 heads x one split of its slots in whole bunches of 128 keys
// (prefill rows fill the GPU with one split; decode and MTP batches split and
// the general kernel's merge combines the splits), three warpgroups (384 threads). An experiment
// beside sparse_mla_prefill.cu (the default), chosen with MEGACTX_SPARSE_MLA_PINGPONG=1 (written
// without a GPU: sparse_mla_test's PingPong cases and dsa_attention_bench's ping-pong column are
// its first checks); what it changes, and why:
//
// The default kernel's consumers score 32 keys each per stage (m64n32: both
// read all of Q from shared memory per 32 keys) and softmax in lockstep, so
// the tensor pipe idles while both run their softmax; with a perfect producer
// it reaches ~410 TFLOP/s (a probe that skipped the gather, H100). Here:
//
//   warpgroup 2, the producer (104 registers): gathers blocks of 64 keys from
//     the paged fp8 pool, dequantised to f16 (as the default kernel) into two
//     K buffers in the 128-byte swizzle layout, [9 chunks][64 keys][128 B].
//     Each buffer is two halves with their own ready / free mbarriers: left =
//     chunks 0-3 (latent dims 0..255), right = chunks 4-8 (dims 256..511 and
//     the rope), so a half is refilled as soon as its last reader is done;
//   warpgroups 0 and 1, the consumers (200 registers), per bunch of two blocks
//     (block 2b in buffer 0, 2b + 1 in buffer 1): consumer c alone scores
//     buffer c (S_c = Q K_c^T, m64n64k16: Q read once per 64 keys) and owns the
//     output columns 256c .. 256c + 256 over both blocks:
//       O_c += P_c     . V_c[:, half c]       (P_c from registers)
//       O_c += P_(c^1) . V_(c^1)[:, half c]   (P written by the other consumer:
//                                               P_0 over buffer 0's rope chunk,
//                                               which S_0 no longer reads; P_1
//                                               in a buffer of its own)
//     Consumer 1 runs behind consumer 0 by one softmax: it takes consumer 0's
//     running max as its own start (so both end a bunch with the same max),
//     and consumer 0 rescales its P_0 to that max before publishing it. One
//     consumer's softmax runs while the other's MMAs keep the tensor pipe busy.
//
// Readers of each half, hence who frees it: buffer 0 left: S_0, consumer 0's
// local PV (frees it); buffer 0 right: S_0, consumer 1's remote PV and P_0
// (frees it); buffer 1 left: S_1, consumer 0's remote PV (frees it); buffer 1
// right: S_1, consumer 1's local PV (frees it). The producer fills the halves
// in the order they are freed: 0L, 1R, 1L, 0R; consumer 1 scores 1R first.
//
// The next S_c is issued right after the remote PV; between its two halves the
// remote PV is waited for and its half freed (the producer fills the second
// half only after that free: freeing it later deadlocks).
//
// Q is f16 times 2^-6 as in the default kernel; the online softmax runs in
// the log2 domain with an exact running max. Results: the general kernel's up
// to summation order.
#include <algorithm>
#include <climits>
#include <cstdlib>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/sparse_mla/sparse_mla_prefill_tiles.cuh"

namespace megactx::cuda {
namespace {

using sparse_mla_prefill::bunch_range;
using sparse_mla_prefill::BunchRange;
using sparse_mla_prefill::kChunks;
using sparse_mla_prefill::kDim;
using sparse_mla_prefill::kHeads;
using sparse_mla_prefill::kLog2e;
using sparse_mla_prefill::kQChunkBytes;
using sparse_mla_prefill::kQueryPrescale;
using sparse_mla_prefill::store_consumer_rows;
using sparse_mla_prefill::store_e4m3x16_swizzled;
using sparse_mla_prefill::store_query_tile;
using sparse_mla_prefill::swizzled;
using sparse_mla_prefill::wgmma_m64n256k16_f16_ss_tb;

constexpr int kThreads = 384;
constexpr int kConsumerThreads = 256;
constexpr int kConsumerRegisters = 200;
constexpr int kProducerRegisters = 104;
static_assert(kConsumerThreads * kConsumerRegisters +
                      (kThreads - kConsumerThreads) * kProducerRegisters <=
                  65536,
              "setmaxnreg would ask for more registers than the launch holds");

constexpr int kBlockKeys = 64;
constexpr int kBunchKeys = 2 * kBlockKeys;
constexpr int kChunkBytes = kBlockKeys * 128;  // 8192: [64 keys][128 B]
constexpr int kBufferBytes = kChunks * kChunkBytes;

// Shared memory from a 1024-byte aligned base.
constexpr int kQOffset = 0;                                  // [9][64 heads][128 B]
constexpr int kKOffset = kQOffset + kChunks * kQChunkBytes;  // [2 buffers][9][64 keys][128 B]
constexpr int kP1Offset = kKOffset + 2 * kBufferBytes;       // P_1 [64 heads][64 keys] f16
constexpr int kMiscOffset = kP1Offset + kHeads * 128;

struct Misc {
  uint64_t ready[2][2];      // [buffer][half]: the producer's 128 threads arrive
  uint64_t free[2][2];       // [buffer][half]: the freeing consumer's 128 threads arrive
  uint64_t valid[2];         // [buffer]: bit k = key k's slot is a real entry
  float row_max[2][kHeads];  // [consumer]: the running max after its block (log2 units)
  float row_sum[2][kHeads];  // [consumer]: the final sums
};
constexpr int kSharedBytes = kMiscOffset + static_cast<int>(sizeof(Misc)) + 1024;
static_assert(kSharedBytes <= 227 * 1024, "sparse MLA ping-pong: shared memory");

// Named barriers (1..15; 0 is __syncthreads), each between the two consumers.
constexpr int kMax0Barrier = 1;      // consumer 0 published its max (1 waits)
constexpr int kMax1Barrier = 2;      // consumer 1 published its max (0 waits)
constexpr int kP0Barrier = 3;        // P_0 in buffer 0's rope chunk (1 waits)
constexpr int kP1Barrier = 4;        // P_1 in its buffer (0 waits)
constexpr int kEpilogueBarrier = 5;  // the row sums (both)
constexpr int kQueryBarrier = 6;     // Q stored (both)

constexpr int kLeft = 0, kRight = 1;

// D[64 x 64] (+)= A[64 x 16] * B[16 x 64], f16 in, fp32 accumulate, both
// K-major from shared memory. Thread (warp w, lane g*4+t):
// d[4j + 2r + e] = D[16w + g + 8r][8j + 2t + e].
__device__ __forceinline__ void wgmma_m64n64k16_f16_ss(float (&d)[32], uint64_t a, uint64_t b,
                                                       int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " MEGACTX_WGMMA_D32_TEXT
      ", "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : MEGACTX_WGMMA_D32(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 256] += A[64 x 16] * B[16 x 256]: A from registers (four f16 pairs
// per thread: rows g / g + 8 x k 2t.. / 2t + 8..), B MN-major from shared memory.
__device__ __forceinline__ void wgmma_m64n256k16_f16_rs_tb(float (&d)[128], const uint32_t (&a)[4],
                                                           uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " MEGACTX_WGMMA_D128_TEXT
      ", "
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : MEGACTX_WGMMA_D128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// ---- The producer -----------------------------------------------------------
// Warp w takes keys 16w .. 16w + 15 of every half it fills, in two passes of
// 8 keys; one load instruction covers a half-key each for two keys (lanes
// 0-15 and 16-31: 16 bytes each of the half's 256 e4m3), two more the rope
// of the right half (8 lanes per key). The loads of the next pass are in
// flight while this pass is converted and stored.
struct PassEntries {
  uint4 latent[4];  // key 2i + lane / 16 of the pass: e4m3 bytes 16 (lane % 16) .. of the half
  float scale[4];   // its group's scale
  uint4 rope[2];    // right halves: key 4r + lane / 8: rope bytes 16 (lane % 8) ..
};

template <typename Addressing>
__device__ __forceinline__ void load_pass(PassEntries& e, const SparseMlaParams& p, int32_t slots,
                                          int half, int pass, int lane) {
  const Addressing entry(p);
  constexpr unsigned kAll = 0xffffffffu;
  int32_t key_slot[4], rope_slot[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) key_slot[i] = __shfl_sync(kAll, slots, 8 * pass + 2 * i + lane / 16);
#pragma unroll
  for (int r = 0; r < 2; ++r) rope_slot[r] = __shfl_sync(kAll, slots, 8 * pass + 4 * r + lane / 8);
  const int column = 256 * half + 16 * (lane % 16);
  const int group = column / kLatentGroup;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t* base = entry(key_slot[i] < 0 ? 0 : key_slot[i]);
    e.latent[i] = load_or_zero(base + column, key_slot[i] >= 0);
    e.scale[i] = load_or_zero_f32(base + kLatentScaleOffset + 4 * group, key_slot[i] >= 0);
  }
  if (half == kRight) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      e.rope[r] = load_or_zero(
          entry(rope_slot[r] < 0 ? 0 : rope_slot[r]) + kLatentRopeOffset + 16 * (lane % 8),
          rope_slot[r] >= 0);
  }
}

// The pass's keys (rows key0 + ... of the buffer) as f16. A lane's 16 dims
// are units 2 (s % 4) and + 1 of chunk 4 half + s / 4 (s = lane % 16); lanes
// of odd chunks store their odd unit first, so that each 8-lane store phase
// writes 8 distinct 16-byte columns of one key row (no bank conflicts).
__device__ __forceinline__ void store_pass(const PassEntries& e, uint8_t* buffer, int half,
                                           int key0, int lane) {
  const int s = lane % 16;
  const int chunk = 4 * half + s / 4;
  const bool odd = (chunk & 1) != 0;
  const int first_unit = 2 * (s % 4) + (odd ? 1 : 0);
  uint8_t* chunk_base = buffer + chunk * kChunkBytes;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int key = key0 + 2 * i + lane / 16;
    const __half2 scale = __float2half2_rn(e.scale[i]);
    store_e4m3x16_swizzled(e.latent[i], scale, chunk_base, key, first_unit, odd);
  }
  if (half == kRight) {
    uint8_t* rope_chunk = buffer + 8 * kChunkBytes;
#pragma unroll
    for (int r = 0; r < 2; ++r)
      store_bf16x8_as_half(
          e.rope[r], 1.f,
          reinterpret_cast<__half*>(rope_chunk + swizzled(key0 + 4 * r + lane / 8, lane % 8)));
  }
}

// The order the halves are filled in (and freed): buffer 0 left, buffer 1
// right, buffer 1 left, buffer 0 right.
__device__ __forceinline__ int item_buffer(int item) {
  return item == 0 || item == 3 ? 0 : 1;
}
__device__ __forceinline__ int item_half(int item) {
  return item == 0 || item == 2 ? kLeft : kRight;
}

template <typename Addressing>
__device__ __forceinline__ void pingpong_producer(const SparseMlaParams& p, uint8_t* shared) {
  set_max_registers_dec<kProducerRegisters>();
  constexpr unsigned kAll = 0xffffffffu;
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);
  const int producer_thread = static_cast<int>(threadIdx.x) - kConsumerThreads;
  const int warp = producer_thread / 32, lane = producer_thread % 32;
  const int64_t row = blockIdx.x;
  const BunchRange range = bunch_range(p, kBunchKeys);
  const int32_t* row_slots = p.slots + row * p.top_k + range.first * kBunchKeys;
  const int bunches = range.count;
  const int top_k = p.top_k - range.first * kBunchKeys;  // the split's slots from its first
  // Lane l: the slot of key 16 warp + l % 16 of buffer `buffer` in bunch `bunch`.
  auto key_slot = [&](int bunch, int buffer) -> int32_t {
    const int index = bunch * kBunchKeys + buffer * kBlockKeys + 16 * warp + lane % 16;
    return bunch < bunches && index < top_k ? row_slots[index] : -1;
  };
  int32_t slots[2] = {key_slot(0, 0), key_slot(0, 1)};
  int32_t next_slots[2] = {key_slot(1, 0), key_slot(1, 1)};
  // Items in order (bunch, item), each two passes; entries[pass] holds a pass
  // whose loads are in flight: pass 1's go out before pass 0 is stored, the
  // next item's pass 0 before pass 1 is.
  const int items = bunches * 4;
  PassEntries entries[2];
  load_pass<Addressing>(entries[0], p, slots[0], kLeft, 0, lane);
#pragma unroll 1
  for (int index = 0; index < items; ++index) {
    const int bunch = index / 4, item = index % 4;
    const int buffer = item_buffer(item), half = item_half(item);
    if (item == 0 && bunch > 0) {
      slots[0] = next_slots[0];
      slots[1] = next_slots[1];
      next_slots[0] = key_slot(bunch + 1, 0);
      next_slots[1] = key_slot(bunch + 1, 1);
    }
    if (item == 0) {
      // The next bunch's entries into L2 (a long context's pool does not fit L2).
      const Addressing entry(p);
#pragma unroll
      for (int b = 0; b < 2; ++b)
        if (lane < 16 && next_slots[b] >= 0) prefetch_l2_bulk(entry(next_slots[b]), kLatentBytes);
    }
    load_pass<Addressing>(entries[1], p, slots[buffer], half, 1, lane);
    if (bunch > 0) mbarrier_wait(&misc.free[buffer][half], (bunch - 1) & 1);
    // The buffer's valid bits go with the half filled first (0: left, 1: right).
    if ((buffer == 0) == (half == kLeft)) {
      const unsigned valid = __ballot_sync(kAll, slots[buffer] >= 0) & 0xffffu;
      if (lane == 0)
        reinterpret_cast<uint16_t*>(&misc.valid[buffer])[warp] = static_cast<uint16_t>(valid);
    }
    uint8_t* tile = shared + kKOffset + buffer * kBufferBytes;
    store_pass(entries[0], tile, half, 16 * warp, lane);
    if (index + 1 < items) {
      // The next item's first pass (past this bunch's last item: the next bunch's).
      const int next_item = (index + 1) % 4;
      const int next_buffer = item_buffer(next_item);
      const int32_t source = next_item == 0 ? next_slots[next_buffer] : slots[next_buffer];
      load_pass<Addressing>(entries[0], p, source, item_half(next_item), 0, lane);
    }
    store_pass(entries[1], tile, half, 16 * warp + 8, lane);
    fence_proxy_async_shared();  // st.shared -> the consumers' wgmma reads (async proxy)
    mbarrier_arrive(&misc.ready[buffer][half]);
  }
}

// ---- The consumers ----------------------------------------------------------
template <int C>
__device__ __forceinline__ void pingpong_consumer(const SparseMlaParams& p, uint8_t* shared) {
  set_max_registers_inc<kConsumerRegisters>();
  uint8_t* q_tile = shared + kQOffset;
  uint8_t* k_tiles = shared + kKOffset;
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int head_low = 16 * warp + g;  // rows head_low and head_low + 8
  const int64_t row = blockIdx.x;
  const int head0 = static_cast<int>(blockIdx.y) * kHeads;
  const int bunches = bunch_range(p, kBunchKeys).count;
  const float scale_log2 = p.softmax_scale * kLog2e / kQueryPrescale;

  store_query_tile<kConsumerThreads>(p, row, head0, q_tile, tid);
  fence_proxy_async_shared();
  named_barrier(kQueryBarrier, kConsumerThreads);

  const uint32_t q_address = shared_address(q_tile);
  const uint32_t own_address = shared_address(k_tiles + C * kBufferBytes);
  const uint32_t other_address = shared_address(k_tiles + (C ^ 1) * kBufferBytes);
  // Where the other consumer's P is: P_0 over buffer 0's rope chunk, P_1 in its own buffer.
  uint8_t* own_p = C == 0 ? k_tiles + 8 * kChunkBytes : shared + kP1Offset;
  const uint32_t other_p_address =
      shared_address(C == 0 ? shared + kP1Offset : k_tiles + 8 * kChunkBytes);
  float s[32];
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) {
    o[i] = 0.f;
    fence_operand(o[i]);
  }
  float running_max[2] = {-INFINITY, -INFINITY};
  float running_sum[2] = {0.f, 0.f};  // this thread's columns only (reduced at the end)

  // S_C: the 36 k-steps over chunks `first` .. `first + count` of Q and the own buffer.
  auto issue_chunks = [&](int first, int count, bool fresh) {
    // The compiler must not see through the bases, else it hoists every
    // descriptor of the bunch loop into registers (both tiles are at fixed
    // addresses here).
    uint32_t q_low = swizzle128_descriptor_low(q_address);
    uint32_t k_low = swizzle128_descriptor_low(own_address);
    asm volatile("" : "+r"(q_low), "+r"(k_low));
#pragma unroll
    for (int ks = 0; ks < 20; ++ks) {
      if (ks >= 4 * count) break;
      const uint32_t column = first + ks / 4, step = (ks % 4) * 32;
      wgmma_m64n64k16_f16_ss(s,
                             descriptor_from_words(q_low + ((column * kQChunkBytes + step) >> 4),
                                                   kSwizzle128DescriptorHigh),
                             descriptor_from_words(k_low + ((column * kChunkBytes + step) >> 4),
                                                   kSwizzle128DescriptorHigh),
                             fresh && ks == 0 ? 0 : 1);
    }
  };
  // S_C of `bunch`, first the half the producer fills first for this
  // consumer. Between the halves the last bunch's remote PV (committed just
  // before) is waited for and its half freed: the producer fills the second
  // half only after that free (0L, 1R, 1L, 0R), so freeing it later, at the
  // top of the next bunch, would deadlock.
  auto issue_scores = [&](int bunch) {
    const unsigned phase = bunch & 1;
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(s[i]);
    wgmma_fence();
    mbarrier_wait(&misc.ready[C][C == 0 ? kLeft : kRight], phase);
    if (C == 0)
      issue_chunks(0, 4, true);
    else
      issue_chunks(4, 5, true);
    wgmma_commit();
    if (bunch > 0) {
      wgmma_wait<1>();
      mbarrier_arrive(C == 0 ? &misc.free[1][kLeft] : &misc.free[0][kRight]);
    }
    mbarrier_wait(&misc.ready[C][C == 0 ? kRight : kLeft], phase);
    if (C == 0)
      issue_chunks(4, 5, false);
    else
      issue_chunks(0, 4, false);
    wgmma_commit();
  };
  // O_C += A . V over 64 keys: V = `buffer_address`'s chunks 4C .. 4C + 3 (MN-major).
  auto v_descriptor = [&](uint32_t buffer_address, int ks) {
    uint32_t v_low =
        swizzle128_mn_descriptor_low(buffer_address + 4 * C * kChunkBytes, kChunkBytes);
    asm volatile("" : "+r"(v_low));
    return descriptor_from_words(v_low + ((ks * 16 * 128) >> 4), kSwizzle128DescriptorHigh);
  };

  issue_scores(0);
#pragma unroll 1
  for (int bunch = 0; bunch < bunches; ++bunch) {
    wgmma_wait_all();  // S_C (and the last bunch's remote PV)
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(s[i]);
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);

    // Scale and mask; the block's row maxima.
    const uint64_t valid = misc.valid[C];
    float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& value = s[4 * j + 2 * r + e];
          value = (valid >> (8 * j + 2 * t + e)) & 1u ? value * scale_log2 : -INFINITY;
          block_max[r] = fmaxf(block_max[r], value);
        }
    float new_max[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
    }
    if (C == 1) named_barrier(kMax0Barrier, kConsumerThreads);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // Consumer 1 starts from consumer 0's max of this bunch (never below its own).
      const float start = C == 0 ? running_max[r] : misc.row_max[0][head_low + 8 * r];
      new_max[r] = fmaxf(start, block_max[r]);
      const bool empty = new_max[r] == -INFINITY;  // nothing valid yet: avoid inf - inf
      const float factor = empty ? 1.f : exp2f(running_max[r] - new_max[r]);
      running_sum[r] *= factor;
      // Past the first bunches a row's max seldom moves: most rows skip the 64 multiplies.
      if (factor != 1.f) {
#pragma unroll
        for (int j = 0; j < 32; ++j) o[4 * j + 2 * r] *= factor, o[4 * j + 2 * r + 1] *= factor;
      }
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& value = s[4 * j + 2 * r + e];
          value = empty ? 0.f : exp2f(value - new_max[r]);
          sum += value;
        }
      running_sum[r] += sum;
      running_max[r] = new_max[r];
      if (t == 0) misc.row_max[C][head_low + 8 * r] = new_max[r];
    }
    named_barrier_arrive(C == 0 ? kMax0Barrier : kMax1Barrier, kConsumerThreads);

    // O_C += P_C . V_C[:, half C], P from registers: a[ks] holds keys 16 ks ..
    // + 16 as the A fragment (rows g, g + 8 x keys 2t.., 2t + 8..), which is
    // also what the P tiles are written from (the fp32 scores die here).
    uint32_t a[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      a[ks][0] = pack_half2(s[8 * ks + 0], s[8 * ks + 1]);
      a[ks][1] = pack_half2(s[8 * ks + 2], s[8 * ks + 3]);
      a[ks][2] = pack_half2(s[8 * ks + 4], s[8 * ks + 5]);
      a[ks][3] = pack_half2(s[8 * ks + 6], s[8 * ks + 7]);
    }
    // The P tile [64 heads][64 keys] f16, K-major swizzled: key pair 8j + 2t of
    // rows g / g + 8 is a[j / 2][2 (j % 2) + r], times `scale` (f16 pairs).
    auto store_p = [&](uint8_t* tile, __half2 scale0, __half2 scale1) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t pair = a[j / 2][2 * (j % 2) + r];
          const __half2 scaled =
              __hmul2(*reinterpret_cast<const __half2*>(&pair), r == 0 ? scale0 : scale1);
          *reinterpret_cast<uint32_t*>(tile + swizzled(head_low + 8 * r, j) + 4 * t) =
              *reinterpret_cast<const uint32_t*>(&scaled);
        }
    };
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n256k16_f16_rs_tb(o, a[ks], v_descriptor(own_address, ks));
    wgmma_commit();
    if (C == 1) {
      // P_1 for consumer 0 (already at the bunch's final max).
      const __half2 one = __float2half2_rn(1.f);
      store_p(own_p, one, one);
      fence_proxy_async_shared();
      named_barrier_arrive(kP1Barrier, kConsumerThreads);
    }
    wgmma_wait_all();
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);
    mbarrier_arrive(C == 0 ? &misc.free[0][kLeft] : &misc.free[1][kRight]);

    if (C == 0) {
      // Consumer 1's max is the bunch's: P_0 and O_0 move to it.
      named_barrier(kMax1Barrier, kConsumerThreads);
      float factor[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float final_max = misc.row_max[1][head_low + 8 * r];
        factor[r] = final_max == -INFINITY ? 1.f : exp2f(running_max[r] - final_max);
        running_max[r] = final_max;
        running_sum[r] *= factor[r];
      }
      store_p(own_p, __float2half2_rn(factor[0]), __float2half2_rn(factor[1]));
      fence_proxy_async_shared();
      named_barrier_arrive(kP0Barrier, kConsumerThreads);
      if (factor[0] != 1.f || factor[1] != 1.f) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          o[4 * j + 0] *= factor[0];
          o[4 * j + 1] *= factor[0];
          o[4 * j + 2] *= factor[1];
          o[4 * j + 3] *= factor[1];
        }
      }
      named_barrier(kP1Barrier, kConsumerThreads);
    } else {
      named_barrier(kP0Barrier, kConsumerThreads);
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) fence_operand(o[i]);

    // O_C += P_(C^1) . V_(C^1)[:, half C], P from the other consumer's tile.
    wgmma_fence();
    {
      uint32_t p_low = swizzle128_descriptor_low(other_p_address);
      asm volatile("" : "+r"(p_low));
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_m64n256k16_f16_ss_tb(o,
                                   descriptor_from_words(p_low + 2 * ks, kSwizzle128DescriptorHigh),
                                   v_descriptor(other_address, ks), 1);
    }
    wgmma_commit();
    if (bunch + 1 < bunches) issue_scores(bunch + 1);
  }
  wgmma_wait_all();
#pragma unroll
  for (int i = 0; i < 128; ++i) fence_operand(o[i]);
  // Finalise: out = O / (both warpgroups' row sums), and the lse.
  store_consumer_rows(p, o, running_sum, running_max, misc.row_sum, kEpilogueBarrier, row, head0,
                      head_low, C, t);
}

template <bool kTiered>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_pingpong_kernel(SparseMlaParams p) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared = shared_raw + ((1024 - (shared_address(shared_raw) & 1023)) & 1023);
  Misc& misc = *reinterpret_cast<Misc*>(shared + kMiscOffset);
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        mbarrier_init(&misc.ready[b][h], kThreads - kConsumerThreads);
        mbarrier_init(&misc.free[b][h], 128);
      }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= kConsumerThreads)
    pingpong_producer<std::conditional_t<kTiered, LatentAddressing, DeviceLatentAddressing>>(
        p, shared);
  else if (threadIdx.x < 128)
    pingpong_consumer<0>(p, shared);
  else
    pingpong_consumer<1>(p, shared);
}

}  // namespace

namespace detail {

bool sparse_mla_pingpong_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("MEGACTX_SPARSE_MLA_PINGPONG");
    return value != nullptr && value[0] == '1';
  }();
  return enabled;
}

int sparse_mla_pingpong_splits(int num_splits, int top_k) {
  const int bunches = std::max(1, (top_k + kBunchKeys - 1) / kBunchKeys);
  const int per_split = (bunches + std::max(1, num_splits) - 1) / std::max(1, num_splits);
  return (bunches + per_split - 1) / per_split;
}

void launch_sparse_mla_prefill_pingpong(const SparseMlaParams& params, cudaStream_t stream) {
  sparse_mla_prefill::launch_bunch_layout<sparse_mla_pingpong_kernel<false>,
                                          sparse_mla_pingpong_kernel<true>>(params, kThreads,
                                                                            kSharedBytes, stream);
}

}  // namespace detail
}  // namespace megactx::cuda
