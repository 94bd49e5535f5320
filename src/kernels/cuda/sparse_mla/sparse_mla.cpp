// Parameter checks and split planning for sparse MLA (host side).
#include "kernels/cuda/sparse_mla/sparse_mla.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace megactx::cuda {
namespace {
constexpr int64_t kSparseMlaClusterMaxCtas = 64;
}  // namespace

int sparse_mla_default_splits(int rows, int heads, int top_k, int multiprocessors) {
  const int64_t ctas = std::max<int64_t>(1, int64_t{rows} * (heads / kSparseMlaHeadBlock));
  const int blocks = std::max(1, (top_k + kSparseMlaKeyBlock - 1) / kSparseMlaKeyBlock);
  const int most = std::max(1, blocks / 2);  // keep at least 64 slots per split
  const int64_t wanted = std::max<int64_t>(1, multiprocessors / ctas);
  return static_cast<int>(std::min<int64_t>(most, wanted));
}

bool sparse_mla_cluster_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("MEGACTX_SPARSE_MLA_CLUSTER");
    return value == nullptr || std::string_view(value) != "0";
  }();
  return enabled;
}

bool sparse_mla_early_inputs_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("MEGACTX_SPARSE_MLA_EARLY_INPUTS");
    return value == nullptr || std::string_view(value) != "0";
  }();
  return enabled;
}

int sparse_mla_cluster_splits(int rows, int heads, int top_k) {
  if (!sparse_mla_cluster_enabled() || rows < 1 || heads % kSparseMlaClusterHeads != 0) return 0;
  const int64_t groups = int64_t{rows} * (heads / kSparseMlaClusterHeads);
  // Measured on the H200 (the kernel is latency-bound: one 8-warp CTA per SM,
  // ~15 cycles per issued instruction, ncu): one row of 64 heads in 16 splits
  // takes 14.0 us against the general kernel's 22.0, but 128 CTAs (two rows in
  // 16 splits) took 30 us against its 22.6 (an H200 holds 7 clusters of 16 at
  // once). So: at most 64 CTAs, each at least one 64-slot chunk and at most
  // kSparseMlaClusterKeys slots.
  const int chunks = (top_k + 63) / 64;
  const int most = detail::sparse_mla_cluster_max_splits();
  for (int splits = most; splits >= 8; splits /= 2)
    if (groups * splits <= kSparseMlaClusterMaxCtas && chunks >= splits &&
        chunks * 64 <= splits * kSparseMlaClusterKeys)
      return splits;
  return 0;
}

bool sparse_mla_prefill_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("MEGACTX_SPARSE_MLA_WGMMA");
    return value == nullptr || std::string_view(value) != "0";
  }();
  return enabled;
}

bool sparse_mla_prefill_decode_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("MEGACTX_SPARSE_MLA_WGMMA_DECODE");
    return value == nullptr || std::string_view(value) != "0";
  }();
  return enabled;
}

bool sparse_mla_prefill_selected(const SparseMlaParams& params) {
  if (!sparse_mla_prefill_enabled() || params.cluster_merge) return false;
  const bool many_rows =
      int64_t{params.rows} * (params.heads / kSparseMlaHeadBlock) >= kSparseMlaPrefillMinCtas;
  if (params.num_splits == 1 && (params.fixed_kernel || many_rows)) return true;
  // Fewer rows (decode, MTP verification): the same kernel over splits of the
  // slots, ~3x the general kernel's rate per CTA (docs/benchmarks.md). Not in
  // the batch-invariant mode, whose results may not follow the split count.
  return !params.fixed_kernel && sparse_mla_prefill_decode_enabled();
}

int sparse_mla_splits(int rows, int heads, int top_k, int multiprocessors) {
  if (!sparse_mla_prefill_enabled() || !sparse_mla_prefill_decode_enabled())
    return sparse_mla_default_splits(rows, heads, top_k, multiprocessors);
  // Fitted to dsa_attention_bench's sweep on the H200 (132 SMs, top-k 2048 =
  // 32 stages of 64 keys, 64 heads; us per layer, best in brackets):
  //   rows      1 split  2      4      8      16     32
  //   4         101.6    55.0   32.9   21.4  [17.6]  29.7
  //   8         102.8    57.1   33.3  [22.8]  26.4   42.2
  //   16        104.3    58.5   35.9  [28.6]  42.5   77.9
  //   32        104.1    59.8  [39.9]  51.5   84.4
  //   64        102.7   [66.8]  78.3  108.1
  //   128      [112.7]  137.7  160.4
  // The best fills the SMs once (CTAs x splits <= SMs), and from 8 CTAs on
  // keeps at least 4 stages per split (the merge of 16 splits of 8 rows costs
  // more than their shorter splits save); at most 16 splits (2 stages) at all.
  const int64_t ctas = std::max<int64_t>(1, int64_t{rows} * (heads / kSparseMlaHeadBlock));
  const int64_t most = ctas <= 4 ? 16 : 8;
  int splits = 1;
  while (splits * 2 <= most && ctas * splits * 2 <= multiprocessors) splits *= 2;
  return sparse_mla_prefill_splits(splits, top_k);
}

int sparse_mla_prefill_splits(int num_splits, int top_k) {
  const int stages =
      std::max(1, (top_k + 2 * kSparseMlaPrefillKeyBlock - 1) / (2 * kSparseMlaPrefillKeyBlock));
  const int per_split = (stages + std::max(1, num_splits) - 1) / std::max(1, num_splits);
  return (stages + per_split - 1) / per_split;
}

void sparse_mla_attention(const SparseMlaParams& params, cudaStream_t stream) {
  MEGACTX_CHECK(params.heads > 0 && params.heads % kSparseMlaHeadBlock == 0,
                "sparse MLA: {} heads (must be a positive multiple of {})", params.heads,
                kSparseMlaHeadBlock);
  MEGACTX_CHECK(params.rows >= 0, "sparse MLA: negative row count {}", params.rows);
  MEGACTX_CHECK(params.top_k >= 1, "sparse MLA: top_k must be positive, got {}", params.top_k);
  const int blocks = (params.top_k + kSparseMlaKeyBlock - 1) / kSparseMlaKeyBlock;
  MEGACTX_CHECK(params.active_heads >= 0 && params.active_heads <= params.heads &&
                    params.active_heads % kSparseMlaClusterHeads == 0,
                "sparse MLA: active_heads {} (a multiple of {} up to heads {})",
                params.active_heads, kSparseMlaClusterHeads, params.heads);
  if (params.cluster_merge) {
    MEGACTX_CHECK(params.num_splits == 8 ||
                      (params.num_splits == 16 && detail::sparse_mla_cluster_max_splits() == 16),
                  "sparse MLA: a cluster of {} splits (8, or 16 where the GPU can hold one)",
                  params.num_splits);
    const int chunks = (params.top_k + 63) / 64;
    MEGACTX_CHECK(
        (chunks + params.num_splits - 1) / params.num_splits * 64 <= kSparseMlaClusterKeys,
        "sparse MLA: top_k {} over {} cluster splits exceeds {} slots per split", params.top_k,
        params.num_splits, kSparseMlaClusterKeys);
  } else {
    MEGACTX_CHECK(params.num_splits >= 1 && params.num_splits <= blocks,
                  "sparse MLA: num_splits {} outside 1..{}", params.num_splits, blocks);
  }
  MEGACTX_CHECK(params.softmax_scale > 0, "sparse MLA: softmax_scale must be positive");
  if (params.rows > 0) {
    MEGACTX_CHECK(params.q && params.slots && params.kv_pool && params.out && params.lse,
                  "sparse MLA: a required pointer is null");
    MEGACTX_CHECK(params.cluster_merge || params.num_splits == 1 ||
                      (params.partial_out && params.partial_lse),
                  "sparse MLA: {} splits need partial_out and partial_lse", params.num_splits);
    MEGACTX_CHECK(reinterpret_cast<uintptr_t>(params.kv_pool) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(params.q) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(params.offload_pool) % 16 == 0,
                  "sparse MLA: q, kv_pool and offload_pool must be 16-byte aligned");
    MEGACTX_CHECK(params.pool_slots == INT64_MAX || params.offload_pool != nullptr,
                  "sparse MLA: slots past pool_slots {} but no offload pool", params.pool_slots);
    MEGACTX_CHECK(
        params.staging_slots == INT64_MAX ||
            (params.staging_pool != nullptr && params.staging_slots >= params.pool_slots &&
             reinterpret_cast<uintptr_t>(params.staging_pool) % 16 == 0),
        "sparse MLA: slots past staging_slots {} but no aligned staging pool",
        params.staging_slots);
  }
  if (params.q_rope_bf16 != nullptr) {
    MEGACTX_CHECK(params.cluster_merge,
                  "sparse MLA: unrotated rope columns need the cluster kernel");
    MEGACTX_CHECK(params.rope_cos != nullptr && params.rope_sin != nullptr &&
                      reinterpret_cast<uintptr_t>(params.q_rope_bf16) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(params.rope_cos) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(params.rope_sin) % 16 == 0 &&
                      params.rope_row_stride % 8 == 0 && params.rope_head_stride % 8 == 0,
                  "sparse MLA: unrotated rope columns need cos / sin and 16-byte aligned rows");
  }
  if (params.cluster_merge) {
    detail::launch_sparse_mla_cluster(params, stream);
  } else if (sparse_mla_prefill_selected(params)) {
    detail::launch_sparse_mla_prefill(params, stream);
  } else {
    detail::launch_sparse_mla(params, stream);
  }
}

}  // namespace megactx::cuda
