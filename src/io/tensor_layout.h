// The tensors a Hugging Face glm_moe_dsa / deepseek_v32 checkpoint holds, by
// name and shape, derived from the config alone (Hub layout: per-expert
// mlp.experts.{e}.{gate,up,down}_proj). Used to count parameters (inspect) and
// to check a checkpoint for missing or unexpected tensors.
//
// Conventions:
//  * shared (IndexShare) layers have no self_attn.indexer.* tensors;
//  * the MTP layers are model.layers.{num_hidden_layers + k}.*: a full decoder
//    layer (with its indexer, MoE like HF's layer rule) plus enorm, hnorm,
//    eh_proj [hidden, 2*hidden] and shared_head.norm; DeepSeek-V3.2 also ships
//    its own embed_tokens and shared_head.head, GLM reuses the target's;
//  * in fp8 checkpoints `quantized` tensors are F8_E4M3 with a
//    `<name>_scale_inv` F32 tensor of [ceil(out/block0), ceil(in/block1)].
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"

namespace megactx {

enum class TensorRole : uint8_t {
  Embedding,     // model.embed_tokens, MTP embed_tokens
  LmHead,        // lm_head, MTP shared_head.head
  Norm,          // every RMSNorm / LayerNorm weight and bias
  Attention,     // MLA projections
  Indexer,       // DSA indexer projections
  DenseMlp,      // gate/up/down of dense layers
  Router,        // mlp.gate weight and e_score_correction_bias
  RoutedExpert,  // mlp.experts.{e}.*
  SharedExpert,  // mlp.shared_experts.*
  MtpProjection  // eh_proj
};

struct TensorSpec {
  std::string name;
  Shape shape;
  TensorRole role = TensorRole::Norm;
  int64_t layer = -1;      // decoder layer index (MTP layers >= num_hidden_layers); -1 global
  bool quantized = false;  // stored as F8_E4M3 + _scale_inv in fp8 checkpoints
  int64_t numel() const { return shape_numel(shape); }
};

// Every weight of the main model (mtp = false) or of the MTP layers only (mtp = true).
// Scale tensors are not listed; see scale_shape().
std::vector<TensorSpec> expected_tensors(const ModelConfig& config, bool mtp);
// The same, a group at a time (the global tensors, then one layer per call), so
// huge configs can be walked without holding every name at once.
void for_each_expected_tensor(const ModelConfig& config, bool mtp,
                              const std::function<void(std::vector<TensorSpec>&)>& visit);

// Shape of `<name>_scale_inv` for a quantized [out, in] weight.
Shape scale_shape(const ModelConfig& config, const Shape& weight_shape);

// Compares a checkpoint's tensor names with the expected ones (main model and
// MTP layers, plus _scale_inv for quantized weights in fp8 checkpoints).
struct LayoutCheck {
  std::vector<std::string> missing;     // expected, not in the checkpoint
  std::vector<std::string> unexpected;  // in the checkpoint, not expected
};
LayoutCheck check_layout(const ModelConfig& config, const std::vector<std::string>& names);

}  // namespace megactx
