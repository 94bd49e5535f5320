// ModelConfig: every field of a Hugging Face `config.json` that changes the
// math of a glm_moe_dsa (GLM-5.x) or deepseek_v32 (DeepSeek-V3.2) model.
// Built once by parse_model_config() and immutable afterwards. Field names
// follow the HF keys; derived facts (the layer schedule) are methods.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace megactx {

enum class ModelType { GlmMoeDsa, DeepseekV32 };

struct RopeParameters {
  std::string rope_type = "default";  // "default" or "yarn"
  double rope_theta = 10000.0;
  // YaRN only:
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct QuantizationConfig {
  std::string quant_method;  // "fp8" or empty when the checkpoint is not quantized
  std::string fmt = "e4m3";
  std::vector<int64_t> weight_block_size;  // e.g. {128, 128}
  std::string activation_scheme = "dynamic";
  std::vector<std::string> modules_to_not_convert;
  std::string scale_fmt;  // DeepSeek-V3.2: "ue8m0" (power-of-two scales); empty when absent
};

enum class IndexerType : uint8_t { Full, Shared };
enum class MlpType : uint8_t { Dense, Sparse };

struct ModelConfig {
  ModelType model_type = ModelType::GlmMoeDsa;
  std::string model_type_name;  // the HF string, e.g. "glm_moe_dsa"
  std::string torch_dtype;      // "bfloat16", "float32", ... (dtype of the stored weights)

  // ---- sizes ----
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP
  int64_t moe_intermediate_size = 0;  // per routed/shared expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  std::string hidden_act = "silu";
  bool attention_bias = false;
  bool tie_word_embeddings = false;

  // ---- MLA ----
  std::optional<int64_t> q_lora_rank;  // absent: a plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }

  // ---- RoPE ----
  RopeParameters rope;
  bool rope_interleave = true;          // MLA rope: interleaved pairs
  bool indexer_rope_interleave = true;  // GLM: interleaved; DeepSeek-V3.2: half-split

  // ---- DSA indexer ----
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  // The resolved schedule, one entry per decoder layer (explicit indexer_types,
  // index_topk_pattern, or derived from freq/offset).
  std::vector<IndexerType> indexer_types;
  int64_t index_topk_freq = 1;
  int64_t index_skip_topk_offset = 0;
  std::string index_topk_pattern;  // as given, e.g. "FFFSSSF..."; empty when absent
  bool index_share_for_mtp_iteration = false;

  // ---- MoE ----
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_shared_experts = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;
  std::vector<MlpType> mlp_layer_types;  // resolved, one per decoder layer
  std::string scoring_func = "sigmoid";
  std::string topk_method = "noaux_tc";
  // Dense/MoE pattern of the MTP layers (model.layers.{num_hidden_layers + k}.*):
  // like HF's rule, layers at or past first_k_dense_replace are MoE.
  bool mtp_layer_is_moe() const { return num_hidden_layers >= first_k_dense_replace; }

  // ---- MTP ----
  int64_t num_nextn_predict_layers = 0;

  // ---- quantization ----
  QuantizationConfig quantization;

  // ---- special tokens ----
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> pad_token_id;

  // ---- derived schedule ----
  bool layer_runs_indexer(int64_t layer) const {
    return indexer_types.at(static_cast<size_t>(layer)) == IndexerType::Full;
  }
  bool layer_is_moe(int64_t layer) const {
    return mlp_layer_types.at(static_cast<size_t>(layer)) == MlpType::Sparse;
  }
  std::vector<int64_t> full_indexer_layers() const;
  // For a shared layer: the most recent full layer at or before it (whose top-k it reuses).
  int64_t indexer_source_layer(int64_t layer) const;
  bool is_fp8_checkpoint() const { return quantization.quant_method == "fp8"; }
};

// Parses config.json text. Throws megactx::Error naming the offending field for
// an unknown model_type, a missing required field, a wrong JSON type or
// inconsistent values (e.g. indexer_types of the wrong length).
ModelConfig parse_model_config(const std::string& json_text);
// Reads DIR/config.json.
ModelConfig load_model_config(const std::string& model_dir);

}  // namespace megactx
