// Facts about a model derived from its config alone (what `megactx inspect`
// prints): layer schedule, parameter counts, KV-cache bytes per token and how
// many tokens fit in a memory budget.
//
// KV bytes per token, per attention layer (the layouts of cache/kv_cache.h):
//   fp8:  latent kv_lora e4m3 + one f32 scale per 128 + rope part in bf16
//         = 512 + 4*4 + 64*2 = 656 B for kv_lora 512 / rope 64;
//         indexer key index_head_dim e4m3 + one f32 scale per 128 = 132 B (dim 128)
//   bf16: (kv_lora + qk_rope_head_dim) * 2 = 1152 B; indexer index_head_dim * 2 = 256 B.
// The indexer cache exists only on layers that run the indexer (full layers).
// The headline numbers (kv_bytes_per_token_*) count the main model's layers only:
// the MTP layer's cache is a separate, speculative-decoding cost, reported in
// *_mtp fields, and included in the *_with_mtp totals.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/model_config.h"

namespace megactx {

struct LayerRun {  // consecutive layers with the same kind
  int64_t first = 0, last = 0;
  bool moe = false;
  bool full_indexer = true;
  int64_t indexer_source = 0;  // for shared runs: the full layer whose top-k they reuse
  bool mtp = false;
};

struct ModelSummary {
  std::string model_type;
  int64_t num_hidden_layers = 0;
  int64_t mtp_layers = 0;
  std::vector<LayerRun> schedule;  // main layers, then MTP layers
  std::vector<int64_t> full_indexer_layer_ids;
  int64_t dense_layers = 0, moe_layers = 0;

  int64_t params_total = 0;  // main model (embedding, layers, final norm, lm_head)
  // Per token: everything except the routed experts not chosen and the embedding
  // rows not looked up (the model cards' "activated parameters").
  int64_t params_active = 0;
  int64_t params_mtp = 0;  // the MTP layers (their own tensors only)
  int64_t params_mtp_active = 0;
  int64_t params_embedding = 0;  // embed_tokens (+ untied lm_head), part of params_total
  int64_t weight_bytes = 0;      // main + MTP, in the checkpoint's storage format

  int64_t kv_bytes_per_token_fp8 = 0, kv_bytes_per_token_bf16 = 0;
  int64_t kv_bytes_per_token_fp8_mtp = 0, kv_bytes_per_token_bf16_mtp = 0;
  int64_t kv_latent_bytes_fp8 = 0, kv_latent_bytes_bf16 = 0;    // per attention layer
  int64_t kv_indexer_bytes_fp8 = 0, kv_indexer_bytes_bf16 = 0;  // per full layer

  std::optional<uint64_t> memory_budget_bytes;  // for the KV cache
};

ModelSummary summarize_model(const ModelConfig& config,
                             std::optional<uint64_t> memory_budget_bytes = std::nullopt);

// "80GiB", "80 GB", "512MiB", "1.5TiB", "123456" (bytes). Binary units for
// KiB/MiB/GiB/TiB and for bare K/M/G/T; decimal for KB/MB/GB/TB.
uint64_t parse_memory_size(const std::string& text);

nlohmann::json summary_to_json(const ModelSummary& summary);
std::string summary_to_text(const ModelSummary& summary);

}  // namespace megactx
