#include "model/cuda/fast_attention_plan.h"

#include <algorithm>

namespace megactx {
namespace {

// Constants of kernels/cuda/{common/dsa_layout.h, topk/topk.h,
// sparse_mla/sparse_mla.h}, repeated here because this file is plain C++
// (cuda_fast_attention_test checks the bound against the real buffers).
constexpr int64_t kPageTokens = 64;
constexpr int64_t kLatentRank = 512;
constexpr int64_t kLatentRope = 64;
constexpr int64_t kIndexerHeadDim = 128;
constexpr int64_t kHeadBlock = 64;        // sparse MLA heads per CTA
constexpr int64_t kTopkSmallRow = 32768;  // longer rows use the histograms
constexpr int64_t kTopkHistogramBytes = 4 * 4096;
constexpr int64_t kTopkRowStateBytes = 4 * 8;
// kernels/cuda/indexer_topk/fused_indexer_topk.h.
constexpr int64_t kFusedMaxTopk = 2048;
constexpr int64_t kFusedMaxTileRows = 16;
constexpr int64_t kFusedCandidates = 8192;

}  // namespace

bool cuda_fast_attention_shapes(const ModelConfig& config) {
  return config.kv_lora_rank == kLatentRank && config.qk_rope_head_dim == kLatentRope &&
         config.index_head_dim == kIndexerHeadDim && config.index_n_heads >= 1 &&
         config.index_n_heads <= 64;
}

bool cuda_fast_attention_used(const ModelConfig& config, KvDType dtype, int64_t page_size,
                              bool enabled) {
  return enabled && dtype == KvDType::FP8 && page_size == kPageTokens &&
         cuda_fast_attention_shapes(config);
}

bool cuda_fused_indexer_serves(const ModelConfig& config, int64_t index_topk) {
  return cuda_fast_attention_shapes(config) && index_topk >= 1 && index_topk <= kFusedMaxTopk;
}

bool cuda_fused_indexer_chosen(const ModelConfig& config, int64_t index_topk, int64_t tokens,
                               int64_t max_context) {
  return cuda_fused_indexer_serves(config, index_topk) &&
         tokens * max_context > kCudaIndexerScoresCap;
}

int64_t cuda_fast_attention_score_floats(const ModelConfig& config, int64_t index_topk,
                                         int64_t tokens, int64_t max_context) {
  const int64_t floats = tokens * max_context;
  return cuda_fused_indexer_serves(config, index_topk) ? std::min(floats, kCudaIndexerScoresCap)
                                                       : floats;
}

int64_t cuda_fused_indexer_workspace_bytes(int64_t rows, int64_t multiprocessors) {
  // Counters, then visible [rows] and tiles [rows] (int4: first row, rows,
  // pages), each rounded up to 256 bytes, then keys and positions [ctas, 16,
  // kFusedCandidates].
  const int64_t n = std::max<int64_t>(rows, 1);
  const int64_t ctas = std::max<int64_t>(multiprocessors, 1);
  return 256 + (4 * n + 255) + (16 * n + 255) + 2 * ctas * kFusedMaxTileRows * kFusedCandidates * 4;
}

int64_t cuda_fast_attention_scratch_bytes(const ModelConfig& config, int64_t tokens,
                                          int64_t max_context, int64_t index_topk,
                                          int64_t multiprocessors, int64_t row_block) {
  if (!cuda_fast_attention_shapes(config)) return 0;
  const int64_t n = std::max<int64_t>(tokens, 1);
  const int64_t index_heads = config.index_n_heads <= 32 ? 32 : 64;
  const int64_t heads = (config.num_attention_heads + kHeadBlock - 1) / kHeadBlock * kHeadBlock;
  const int64_t pages = std::max<int64_t>(1, (max_context + kPageTokens - 1) / kPageTokens);
  const int64_t columns = std::max<int64_t>(1, std::min(index_topk, max_context));
  const bool fused = cuda_fused_indexer_serves(config, index_topk);
  int64_t per_token = 0;
  per_token += 4 + 4;                          // visible, row ids
  per_token += index_heads * kIndexerHeadDim;  // e4m3 queries
  per_token += index_heads * 4;                // folded weights
  per_token += kTopkRowStateBytes;             // top-k row state
  int64_t per_block_row = 0;
  per_block_row += 4 * columns;                                                      // slots
  per_block_row += heads * (2 * (kLatentRank + kLatentRope) + 2 * kLatentRank + 4);  // q, out, lse
  // The bf16 absorbed products (CudaModelOptions::bf16_absorbed_min_rows):
  // q_b's output (then W_UV's) in bf16 per block row (their weights' bf16
  // copies are the model's, DeviceLayer::w_uk_t_bf16).
  const int64_t nope = config.qk_nope_head_dim, value = config.v_head_dim;
  per_block_row += 2 * heads * std::max(nope + config.qk_rope_head_dim, value);
  int64_t bytes = per_token * n + per_block_row * (row_block > 0 ? std::min(n, row_block) : n);
  // The two-kernel path's per-token page tables [rows, pages] and top-k
  // histograms: with the fused path only steps of rows x context <= the cap
  // take it, so rows x pages <= cap / 64 + rows and rows <= cap / context.
  const int64_t table_entries =
      fused ? std::min(n * pages, kCudaIndexerScoresCap / kPageTokens + n) : n * pages;
  bytes += 4 * table_entries;
  const int64_t histogram_rows =
      max_context > kTopkSmallRow
          ? (fused ? std::max<int64_t>(1, std::min(n, kCudaIndexerScoresCap / max_context)) : n)
          : 1;
  bytes += kTopkHistogramBytes * histogram_rows;
  if (fused) bytes += cuda_fused_indexer_workspace_bytes(n, multiprocessors);
  // Split-K partials exist only with splits > 1, which the planner picks only
  // while rows x splits x head blocks <= SMs: at most 64 * SMs head rows.
  bytes += kHeadBlock * std::max<int64_t>(multiprocessors, 1) * 4 * (kLatentRank + 1);
  return bytes + 4096;  // DeviceBuffer's one-element minimum per buffer, with room
}

int64_t cuda_offload_staging_bytes(int64_t index_topk, int64_t latent_layers, int64_t groups,
                                   int64_t offload_tokens, int64_t step_rows, int64_t block_rows) {
  // An fp8 latent entry (656 bytes: kv_cache.h), an int32 slot and a copy flag
  // per staged column; the hot entries per layer, three int32 per line per group.
  constexpr int64_t kEntryBytes = 656;
  const int64_t top_k = std::max<int64_t>(index_topk, 1);
  const int64_t staging = kOffloadStagingRows * top_k * (kEntryBytes + 5);
  const int64_t hot = kOffloadHotLines * (latent_layers * kEntryBytes + groups * 12);
  int64_t union_bytes = 0;
  if (step_rows > kOffloadStagingRows && offload_tokens > 0) {
    // Steps past the per-step staging use the union: marks and prefix sums
    // per offload slot, a list entry and a row per union row, the staged
    // slots of a row block, and the scan's storage (a few bytes per tile of
    // slots).
    const int64_t rows = std::min(offload_tokens, kOffloadUnionRows);
    union_bytes = 8 * offload_tokens + rows * (kEntryBytes + 4) + 4 * block_rows * top_k +
                  offload_tokens / 64 + (int64_t{1} << 20);
  }
  return staging + hot + union_bytes + 8192;
}

}  // namespace megactx
