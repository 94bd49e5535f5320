#include "io/tensor_layout.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <set>

#include <fmt/format.h>

namespace megactx {

namespace {

class LayoutBuilder {
 public:
  LayoutBuilder(const ModelConfig& config, std::vector<TensorSpec>& out)
      : config_(config), out_(out) {}

  void add(std::string name, Shape shape, TensorRole role, int64_t layer, bool quantized = false) {
    // modules_to_not_convert lists name prefixes kept in bf16.
    if (quantized)
      for (const auto& module : config_.quantization.modules_to_not_convert)
        if (!module.empty() && name.find(module) != std::string::npos) quantized = false;
    out_.push_back({std::move(name), std::move(shape), role, layer, quantized});
  }

  // One decoder layer at index `layer` (a main layer or an MTP layer).
  void decoder_layer(int64_t layer, bool runs_indexer, bool moe) {
    const ModelConfig& c = config_;
    const std::string p = fmt::format("model.layers.{}.", layer);
    const int64_t hidden = c.hidden_size;
    const int64_t heads = c.num_attention_heads;
    add(p + "input_layernorm.weight", {hidden}, TensorRole::Norm, layer);
    add(p + "post_attention_layernorm.weight", {hidden}, TensorRole::Norm, layer);

    // MLA: q via the low-rank q_a/q_b pair (or a plain q_proj), KV latent + shared rope key.
    const std::string a = p + "self_attn.";
    if (c.q_lora_rank) {
      add(a + "q_a_proj.weight", {*c.q_lora_rank, hidden}, TensorRole::Attention, layer, true);
      add(a + "q_a_layernorm.weight", {*c.q_lora_rank}, TensorRole::Norm, layer);
      add(a + "q_b_proj.weight", {heads * c.qk_head_dim(), *c.q_lora_rank}, TensorRole::Attention,
          layer, true);
    } else {
      add(a + "q_proj.weight", {heads * c.qk_head_dim(), hidden}, TensorRole::Attention, layer,
          true);
    }
    add(a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, hidden},
        TensorRole::Attention, layer, true);
    add(a + "kv_a_layernorm.weight", {c.kv_lora_rank}, TensorRole::Norm, layer);
    add(a + "kv_b_proj.weight", {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank},
        TensorRole::Attention, layer, true);
    add(a + "o_proj.weight", {hidden, heads * c.v_head_dim}, TensorRole::Attention, layer, true);
    if (c.attention_bias) add(a + "o_proj.bias", {hidden}, TensorRole::Attention, layer);

    if (runs_indexer) {
      // The indexer's query comes from the q_lora residual (hidden when there is no q_lora).
      const int64_t q_input = c.q_lora_rank ? *c.q_lora_rank : hidden;
      const std::string i = a + "indexer.";
      add(i + "wq_b.weight", {c.index_n_heads * c.index_head_dim, q_input}, TensorRole::Indexer,
          layer, true);
      add(i + "wk.weight", {c.index_head_dim, hidden}, TensorRole::Indexer, layer, true);
      add(i + "k_norm.weight", {c.index_head_dim}, TensorRole::Norm, layer);
      add(i + "k_norm.bias", {c.index_head_dim}, TensorRole::Norm, layer);
      add(i + "weights_proj.weight", {c.index_n_heads, hidden}, TensorRole::Indexer, layer);
    }

    const std::string m = p + "mlp.";
    if (!moe) {
      mlp(m, c.intermediate_size, TensorRole::DenseMlp, layer);
      return;
    }
    add(m + "gate.weight", {c.n_routed_experts, hidden}, TensorRole::Router, layer);
    add(m + "gate.e_score_correction_bias", {c.n_routed_experts}, TensorRole::Router, layer);
    for (int64_t e = 0; e < c.n_routed_experts; ++e)
      mlp(fmt::format("{}experts.{}.", m, e), c.moe_intermediate_size, TensorRole::RoutedExpert,
          layer);
    if (c.n_shared_experts > 0)
      mlp(m + "shared_experts.", c.moe_intermediate_size * c.n_shared_experts,
          TensorRole::SharedExpert, layer);
  }

  // SwiGLU: gate/up [inter, hidden], down [hidden, inter].
  void mlp(const std::string& prefix, int64_t inter, TensorRole role, int64_t layer) {
    const int64_t hidden = config_.hidden_size;
    add(prefix + "gate_proj.weight", {inter, hidden}, role, layer, true);
    add(prefix + "up_proj.weight", {inter, hidden}, role, layer, true);
    add(prefix + "down_proj.weight", {hidden, inter}, role, layer, true);
  }

  void mtp_extras(int64_t layer) {
    const ModelConfig& c = config_;
    const std::string p = fmt::format("model.layers.{}.", layer);
    add(p + "enorm.weight", {c.hidden_size}, TensorRole::Norm, layer);
    add(p + "hnorm.weight", {c.hidden_size}, TensorRole::Norm, layer);
    add(p + "eh_proj.weight", {c.hidden_size, 2 * c.hidden_size}, TensorRole::MtpProjection, layer);
    add(p + "shared_head.norm.weight", {c.hidden_size}, TensorRole::Norm, layer);
    if (c.model_type == ModelType::DeepseekV32) {
      add(p + "embed_tokens.weight", {c.vocab_size, c.hidden_size}, TensorRole::Embedding, layer);
      add(p + "shared_head.head.weight", {c.vocab_size, c.hidden_size}, TensorRole::LmHead, layer);
    }
  }

 private:
  const ModelConfig& config_;
  std::vector<TensorSpec>& out_;
};

}  // namespace

void for_each_expected_tensor(const ModelConfig& config, bool mtp,
                              const std::function<void(std::vector<TensorSpec>&)>& visit) {
  std::vector<TensorSpec> specs;
  LayoutBuilder builder(config, specs);
  auto flush = [&] {
    visit(specs);
    specs.clear();
  };
  if (mtp) {
    for (int64_t k = 0; k < config.num_nextn_predict_layers; ++k) {
      const int64_t layer = config.num_hidden_layers + k;
      builder.decoder_layer(layer, true, config.mtp_layer_is_moe());
      builder.mtp_extras(layer);
      flush();
    }
    return;
  }
  builder.add("model.embed_tokens.weight", {config.vocab_size, config.hidden_size},
              TensorRole::Embedding, -1);
  flush();
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    builder.decoder_layer(layer, config.layer_runs_indexer(layer), config.layer_is_moe(layer));
    flush();
  }
  builder.add("model.norm.weight", {config.hidden_size}, TensorRole::Norm, -1);
  if (!config.tie_word_embeddings)
    builder.add("lm_head.weight", {config.vocab_size, config.hidden_size}, TensorRole::LmHead, -1);
  flush();
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& config, bool mtp) {
  std::vector<TensorSpec> all;
  for_each_expected_tensor(config, mtp, [&](std::vector<TensorSpec>& specs) {
    std::move(specs.begin(), specs.end(), std::back_inserter(all));
  });
  return all;
}

Shape scale_shape(const ModelConfig& config, const Shape& weight_shape) {
  const auto& block = config.quantization.weight_block_size;
  const int64_t block_rows = block.size() == 2 ? block[0] : 128;
  const int64_t block_cols = block.size() == 2 ? block[1] : 128;
  return {(weight_shape.at(0) + block_rows - 1) / block_rows,
          (weight_shape.at(1) + block_cols - 1) / block_cols};
}

LayoutCheck check_layout(const ModelConfig& config, const std::vector<std::string>& names) {
  std::set<std::string> expected;
  for (bool mtp : {false, true})
    for (const auto& spec : expected_tensors(config, mtp)) {
      expected.insert(spec.name);
      if (spec.quantized && config.is_fp8_checkpoint()) expected.insert(spec.name + "_scale_inv");
    }
  const std::set<std::string> present(names.begin(), names.end());
  LayoutCheck check;
  std::set_difference(expected.begin(), expected.end(), present.begin(), present.end(),
                      std::back_inserter(check.missing));
  std::set_difference(present.begin(), present.end(), expected.begin(), expected.end(),
                      std::back_inserter(check.unexpected));
  return check;
}

}  // namespace megactx
