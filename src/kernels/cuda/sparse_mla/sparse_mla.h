// Sparse MLA attention over the fp8 latent cache, absorbed form.
//
// For each query row (a decode token, an MTP verification token or a prefill
// token) and head h, over the row's selected cache slots j (top-k, -1 = none):
//   logit[h, j] = softmax_scale * (q[h, :512] . c_kv[j] + q[h, 512:] . k_rope[j])
//   out[h, :]   = sum_j softmax(logit[h, :])_j * c_kv[j]       (512 wide)
//   lse[h]      = log sum_j exp(logit[h, j])                   (natural log)
// c_kv is dequantised from the 656-byte entries (kv_cache.h): 512 e4m3 times
// the fp32 scale of its 128-group, k_rope bf16. A row with no valid slot gives
// out = 0 and lse = -inf. q is q_nope already multiplied by W_UK (absorbed),
// followed by the roped q_pe; the caller applies W_UV to `out`.
//
// Decode and prefill are the same kernel: rows are independent, each with its
// own slots. Long rows are split over keys (num_splits) into fp32 partial
// states that a merge kernel combines with their log-sum-exps.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/dsa_layout.h"

namespace megactx::cuda {

inline constexpr int kSparseMlaHeadBlock = 64;  // heads per CTA; heads must be a multiple
inline constexpr int kSparseMlaKeyBlock = 32;   // keys per inner step
inline constexpr int kSparseMlaQueryDim = kLatentRank + kLatentRope;  // 576
// Heads per CTA of the cluster kernel (sparse_mla_cluster.cu), and the most
// slots a CTA takes: top_k may be up to num_splits x 128.
inline constexpr int kSparseMlaClusterHeads = 16;
inline constexpr int kSparseMlaClusterKeys = 128;
inline constexpr int kSparseMlaClusterMaxSplits = 16;  // a cluster of 16 CTAs at most
// The wgmma prefill kernel (sparse_mla_prefill.cu): keys per block (two blocks
// per pipeline stage), and the fewest CTAs (rows x 64-head blocks) it is chosen for.
inline constexpr int kSparseMlaPrefillKeyBlock = 32;
inline constexpr int64_t kSparseMlaPrefillMinCtas = 132;

struct SparseMlaParams {
  const uint16_t* q = nullptr;       // [rows, heads, 576] bf16
  const int32_t* slots = nullptr;    // [rows, top_k] physical cache slots, -1 = padding
  const uint8_t* kv_pool = nullptr;  // [num_slots, 656] latent cache of this layer
  // The live host tier (cache/kv_cache.h offload pages): slots from
  // pool_slots on are entries slot - pool_slots of offload_pool, this layer's
  // latents in pinned host memory, read over the bus through unified
  // addressing. Without a tier pool_slots stays past every slot.
  // With a hot cache (kernels/cuda/kv_copy/stage_offload.h) offload_pool is
  // this layer's hot entries and slots from staging_slots on are entries
  // slot - staging_slots of staging_pool (the step's staging rows).
  const uint8_t* offload_pool = nullptr;
  int64_t pool_slots = INT64_MAX;
  const uint8_t* staging_pool = nullptr;
  int64_t staging_slots = INT64_MAX;
  uint16_t* out = nullptr;  // [rows, heads, 512] bf16
  float* lse = nullptr;     // [rows, heads]
  // Split-K partial states, used when num_splits > 1:
  float* partial_out = nullptr;  // [rows, num_splits, heads, 512]
  float* partial_lse = nullptr;  // [rows, num_splits, heads]
  int rows = 0;
  int heads = 0;  // 64 (GLM-5.x) or 128 (DeepSeek-V3.2); any multiple of 64
  int top_k = 0;
  int num_splits = 1;  // 1..ceil(top_k / 32)
  float softmax_scale = 0;
  // The cluster kernel (few decode rows): num_splits (8 or 16) CTAs of one
  // thread-block cluster per (row, 16 heads) split the slots and merge in
  // distributed shared memory; partial_out / partial_lse are not used.
  bool cluster_merge = false;
  // Heads [0, active_heads) are the model's (a multiple of 16; 0: all), the
  // others' out / lse left unwritten: the cluster kernel computes only those,
  // the split merge merges only those (the general kernels still compute
  // every head of their 64-head blocks): a model with fewer heads than the 64
  // its q layout is padded to (glm_1b: 16) skips the padding.
  int active_heads = 0;
  // The batch-invariant mode: the kernel may not follow the row count (a row's
  // result may not depend on the rows launched with it), so one-split launches
  // always take the wgmma prefill kernel while it is enabled.
  bool fixed_kernel = false;
  // The caller's promise that the kernel launched right before this one (in
  // the stream) writes neither the slots nor the entries they select, and
  // that every producer of those follows launch.cuh's wait-then-trigger
  // contract (or is an ordinary launch): the cluster kernel then loads them
  // before its grid-dependency wait, overlapping its predecessor's tail
  // (sparse_mla_cluster.cu). The other kernels ignore it. Set by the decode
  // path when sparse_mla_early_inputs_enabled().
  bool inputs_ready_at_launch = false;
  // The cluster kernel only: Q's rope columns (512..575 of each head) rotated
  // in the kernel from this unrotated bf16 source (row t, head h at
  // q_rope_bf16 + t * rope_row_stride + h * rope_head_stride, 64 values),
  // with interleaved pairs (2i, 2i + 1) and the rows' rope_cos / rope_sin
  // ([rows, 32] fp32), instead of read from q: the query pack's rotation, the
  // same bits, without its launch. Null: q holds them rotated. Meant with
  // inputs_ready_at_launch: otherwise Q's loads and their rotation come
  // before the entries' loads (correct, slower).
  const uint16_t* q_rope_bf16 = nullptr;
  int64_t rope_row_stride = 0, rope_head_stride = 0;
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
};

// Splits that fill `multiprocessors` SMs for this many rows x head blocks
// (fitted to the general kernel).
int sparse_mla_default_splits(int rows, int heads, int top_k, int multiprocessors);

// The split count of a launch that is neither a cluster launch nor in the
// batch-invariant mode: fitted to the wgmma kernel where decode batches take
// it (sparse_mla_prefill_selected), else sparse_mla_default_splits.
int sparse_mla_splits(int rows, int heads, int top_k, int multiprocessors);

// The cluster kernel's split count for rows x heads (the heads it computes)
// and top_k: 16 or 8, or 0 where the general kernel is faster (measured: past
// 64 CTAs, or more than two 64-slot chunks per CTA) or the environment sets
// MEGACTX_SPARSE_MLA_CLUSTER=0 (A/B runs).
int sparse_mla_cluster_splits(int rows, int heads, int top_k);
bool sparse_mla_cluster_enabled();
// Whether callers that can promise SparseMlaParams::inputs_ready_at_launch
// should, and hand the cluster kernel Q's rope columns unrotated
// (q_rope_bf16) instead of launching the query pack: yes unless the
// environment sets MEGACTX_SPARSE_MLA_EARLY_INPUTS=0 (A/B runs). Measured on
// the H100: 10.1 -> 8.5 us per decode layer at 8K (docs/benchmarks.md).
bool sparse_mla_early_inputs_enabled();

// Whether sparse_mla_attention runs these params on the wgmma prefill kernel:
// no cluster merge and the environment does not set MEGACTX_SPARSE_MLA_WGMMA=0
// (A/B runs); then one split with at least kSparseMlaPrefillMinCtas CTAs (or
// fixed_kernel), or any other split count (decode and MTP batches: the
// kernel splits the slots in whole 64-key stages and the merge combines
// them) unless MEGACTX_SPARSE_MLA_WGMMA_DECODE=0 (A/B runs: the general
// kernel for those, as before).
bool sparse_mla_prefill_selected(const SparseMlaParams& params);
bool sparse_mla_prefill_enabled();
bool sparse_mla_prefill_decode_enabled();
// The split count the wgmma kernel uses for `num_splits` requested over
// top_k: at most num_splits, each split at least one 64-key stage, none
// empty (the partial buffers sized for num_splits hold them).
int sparse_mla_prefill_splits(int num_splits, int top_k);

// Validates (megactx::Error) and launches on `stream` (attention + merge).
void sparse_mla_attention(const SparseMlaParams& params, cudaStream_t stream);

// The split merge that reads every split's lse and loads its partial rows in
// batches (the same sums in the same order as the plain merge, so the same
// bits: SparseMla.PrefetchMergeEqualsThePlainMergeBitForBit) instead of a
// chain of dependent loads (~9 us per decode layer).
inline constexpr bool kSparseMlaPrefetchMerge = true;

namespace detail {
void launch_sparse_mla(const SparseMlaParams& params, cudaStream_t stream);
// With the merge chosen (tests compare the two).
void launch_sparse_mla(const SparseMlaParams& params, bool prefetch_merge, cudaStream_t stream);
void launch_sparse_mla_cluster(const SparseMlaParams& params, cudaStream_t stream);
// The wgmma prefill kernel whatever the policy (tests compare it with the
// general kernel), in the layout for the split count: one split (prefill, and
// the batch-invariant mode at every row count) the fp8-ring layout, several
// (decode's splits) the f16-ring layout, whose 64-key stages split finer;
// MEGACTX_SPARSE_MLA_FP8RING=0 in the environment: the f16-ring layout always
// (A/B runs).
void launch_sparse_mla_prefill(const SparseMlaParams& params, cudaStream_t stream);
// The f16-ring layout (sparse_mla_prefill.cu: producers gather and convert the
// entries to f16 in shared memory for SS wgmmas), and the merge after it when
// num_splits > 1: each split takes whole 64-key stages, and num_splits must
// leave none without a slot (sparse_mla_prefill_splits).
void launch_sparse_mla_prefill_f16ring(const SparseMlaParams& params, cudaStream_t stream);
// The split count of the layouts that take a row's slots in 128-key bunches
// (the fp8-ring layout) for `num_splits` requested over top_k: at most
// num_splits, each split at least one bunch, none empty.
int sparse_mla_bunch_splits(int num_splits, int top_k);
// The fp8-ring layout (sparse_mla_prefill_fp8ring.cu: the ring holds the
// pool's e4m3 entries, the consumers convert them into their wgmma
// fragments), and the merge after it when num_splits > 1 (whole 128-key
// bunches per split, sparse_mla_bunch_splits). One split runs persistent: a
// CTA per SM over every gridDim.x-th row (MEGACTX_SPARSE_MLA_PERSISTENT=0: a
// CTA per row).
void launch_sparse_mla_prefill_fp8ring(const SparseMlaParams& params, cudaStream_t stream);
// The split merge of partial_out / partial_lse into out / lse.
void launch_sparse_mla_merge(const SparseMlaParams& params, cudaStream_t stream);
void launch_sparse_mla_merge(const SparseMlaParams& params, bool prefetch_merge,
                             cudaStream_t stream);
// 16 when a 16-CTA cluster of the kernel can be resident on this GPU, else 8.
int sparse_mla_cluster_max_splits();
}  // namespace detail

}  // namespace megactx::cuda
