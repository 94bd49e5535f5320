// When the CUDA model runs DSA attention on the fp8 DSA kernels (the fast
// path of model/cuda/dsa_fast_attention.cpp), and how much step scratch that
// path adds. Plain C++ (no CUDA): the device memory planner
// (model/cuda/memory_plan.h) can add it in every build.
#pragma once

#include <cstdint>

#include "cache/kv_cache.h"
#include "io/model_config.h"

namespace megactx {

// The attention shapes the fp8 DSA kernels serve (GLM-5.x, DeepSeek-V3.2):
// kv_lora_rank 512, qk_rope_head_dim 64, index_head_dim 128, 1..64 indexer
// heads (padded to 32 or 64).
bool cuda_fast_attention_shapes(const ModelConfig& config);

// Whether a CUDA model with `config` and CudaModelOptions::fast_attention =
// `enabled` takes the fast path over a cache of `dtype` with `page_size`.
bool cuda_fast_attention_used(const ModelConfig& config, KvDType dtype, int64_t page_size,
                              bool enabled);

// Steps whose indexer scores [rows, context] would pass this many floats take
// the fused indexer + top-k (kernels/cuda/indexer_topk: a streaming top-k per
// row, no score matrix); smaller steps (decode) keep the two-kernel path
// (indexer_scores + radix_topk) and its scores, so the fast path's scores
// never exceed 256 MiB, whatever the context.
inline constexpr int64_t kCudaIndexerScoresCap = int64_t{1} << 26;

// Whether the fused indexer + top-k serves the model at this top-k width (the
// fast path's shapes and index_topk <= 2048).
bool cuda_fused_indexer_serves(const ModelConfig& config, int64_t index_topk);

// Whether the fast path runs a step of `tokens` rows over `max_context` with
// the fused indexer + top-k (CudaDsaModel::fast_indexer decides with this).
bool cuda_fused_indexer_chosen(const ModelConfig& config, int64_t index_topk, int64_t tokens,
                               int64_t max_context);

// The fast path's indexer scores (CudaDsaModel::Scratch::scores, floats) after
// steps of at most `tokens` rows over contexts of at most `max_context`:
// tokens x max_context where the fused path does not serve, else capped at
// kCudaIndexerScoresCap.
int64_t cuda_fast_attention_score_floats(const ModelConfig& config, int64_t index_topk,
                                         int64_t tokens, int64_t max_context);

// An upper bound of the fused indexer + top-k workspace for `rows` rows on
// `multiprocessors` persistent CTAs (fused_indexer_topk_workspace_bytes).
int64_t cuda_fused_indexer_workspace_bytes(int64_t rows, int64_t multiprocessors);

// An upper bound of the fast path's own workspaces (CudaDsaModel::FastScratch)
// after any steps of at most `tokens` new tokens (rows, CUDA-graph padding
// included) over contexts of at most `max_context` (graph buckets included),
// on a GPU with `multiprocessors` SMs. The indexer scores buffer is shared
// with the fallback and counted by cuda_step_scratch_bytes. Per token:
// token tables, padded bf16 + e4m3 indexer queries, slot lists, bf16 MLA
// queries [heads_padded, 576] and outputs [heads_padded, 512]; plus the
// split-K partial states (bounded by the SM count) and the top-k histograms
// (16 KiB per row, only past 32K keys). Where the fused indexer serves, its
// workspace is added and the two-kernel path's token tables and histograms
// are bounded by the steps that still take it (rows x context <=
// kCudaIndexerScoresCap): nothing here grows with the context then.
// The sparse MLA's buffers (slots, bf16 queries and outputs, lse) are those of
// one row block (CudaModelOptions::row_block; 0: the whole step).
int64_t cuda_fast_attention_scratch_bytes(const ModelConfig& config, int64_t tokens,
                                          int64_t max_context, int64_t index_topk,
                                          int64_t multiprocessors = 132, int64_t row_block = 0);

// The live host tier on CUDA: a step (row block) of at most this many rows
// has its selected offload-page entries staged in device memory before its
// sparse MLA (kernels/cuda/kv_copy/stage_offload.h); larger ones read them
// from host memory in the attention kernel.
inline constexpr int64_t kOffloadStagingRows = 64;

// Lines of the hot cache that keeps staged offload entries across steps (per
// selection group a table of tags, per latent layer this many entries):
// 86 MB per layer.
inline constexpr int64_t kOffloadHotLines = 131072;
// Blocks of the side stream's hot-line fills (MEGACTX_OFFLOAD_FILL_BLOCKS).
inline constexpr int kOffloadFillBlocks = 32;

// Steps of more rows than kOffloadStagingRows stage the union of their
// selected offload entries (kernels/cuda/kv_copy/offload_union.h) in at most this many device
// rows (688 MB of fp8 latents; fewer when the tier has fewer offload slots;
// MEGACTX_OFFLOAD_UNION_ROWS lowers it, 0: read over the bus per row).
inline constexpr int64_t kOffloadUnionRows = int64_t{1} << 20;

// The staging's and the hot cache's bytes (FastScratch::staging, staged_slots
// and copy flags; CudaDsaModel's hot tables and entries) at `index_topk`, for
// `latent_layers` layers and `groups` selection groups (the indexer layers),
// and the union staging's for a tier of `offload_tokens` slots, steps of up
// to `step_rows` rows and row blocks of `block_rows` rows.
int64_t cuda_offload_staging_bytes(int64_t index_topk, int64_t latent_layers, int64_t groups,
                                   int64_t offload_tokens, int64_t step_rows, int64_t block_rows);

}  // namespace megactx
