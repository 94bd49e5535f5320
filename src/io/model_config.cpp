// config.json -> ModelConfig. Defaults are those of transformers'
// GlmMoeDsaConfig / DeepseekV32Config (which differ in a few places: eps,
// heads, ranks, groups, the indexer offset); schedules are resolved the way
// their __post_init__ does.
#include "io/model_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/bounded_json.h"
#include "io/json_fields.h"

namespace megactx {

namespace {

// HF defaults per model type (configuration_glm_moe_dsa.py, configuration_deepseek_v32.py).
struct Defaults {
  int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
      num_key_value_heads, q_lora_rank, qk_nope_head_dim, v_head_dim, n_group, topk_group,
      max_position_embeddings, index_n_heads, index_skip_topk_offset;
  double rms_norm_eps;
  bool indexer_rope_interleave;
};

constexpr Defaults kGlmDefaults{154880, 6144, 12288, 78,     64, 64, 2048, 192,
                                256,    1,    1,     202752, 32, 2,  1e-5, true};
constexpr Defaults kDeepseekDefaults{129280, 7168, 18432, 61,     128, 128, 1536, 128,
                                     128,    8,    4,     163840, 64,  0,   1e-6, false};

RopeParameters parse_rope(const nlohmann::json& root, const JsonFields& fields,
                          int64_t max_position_embeddings) {
  // Like HF's convert_rope_params_to_dict: the legacy `rope_scaling` wins when
  // set, else `rope_parameters`; `rope_theta` comes from that dict or the top level.
  const nlohmann::json* legacy = fields.find("rope_scaling");
  const nlohmann::json* modern = fields.find("rope_parameters");
  const bool use_legacy = legacy != nullptr && !(legacy->is_object() && legacy->empty());
  const nlohmann::json* chosen = use_legacy ? legacy : modern;
  const std::string name = use_legacy ? "rope_scaling" : "rope_parameters";
  static const nlohmann::json kEmpty = nlohmann::json::object();
  if (chosen == nullptr) chosen = &kEmpty;
  JsonFields rope_fields(*chosen, fields.where() + ": " + name);
  (void)root;

  RopeParameters rope;
  rope.rope_type = rope_fields.string("rope_type", rope_fields.string("type", "default"));
  rope.rope_theta = rope_fields.number("rope_theta", fields.number("rope_theta", 10000.0));
  MEGACTX_CHECK(rope.rope_theta > 0, "{}: field 'rope_theta' must be positive",
                rope_fields.where());
  if (rope.rope_type == "yarn" || rope.rope_type == "deepseek_yarn") {
    rope.rope_type = "yarn";
    MEGACTX_CHECK(rope_fields.has("factor"), "{}: YaRN needs field 'factor'", rope_fields.where());
    rope.factor = rope_fields.number("factor", 1.0);
    MEGACTX_CHECK(rope.factor >= 1.0, "{}: field 'factor' must be >= 1, got {}",
                  rope_fields.where(), rope.factor);
    rope.original_max_position_embeddings =
        rope_fields.integer("original_max_position_embeddings", max_position_embeddings);
    MEGACTX_CHECK(rope.original_max_position_embeddings > 0,
                  "{}: field 'original_max_position_embeddings' must be positive",
                  rope_fields.where());
    rope.beta_fast = rope_fields.number("beta_fast", 32.0);
    rope.beta_slow = rope_fields.number("beta_slow", 1.0);
    rope.mscale = rope_fields.number("mscale", 1.0);
    rope.mscale_all_dim = rope_fields.number("mscale_all_dim", 0.0);
  } else if (rope.rope_type != "default") {
    fail("{}: rope_type '{}' is not supported (only 'default' and 'yarn')", rope_fields.where(),
         rope.rope_type);
  }
  return rope;
}

QuantizationConfig parse_quantization(const JsonFields& fields) {
  QuantizationConfig quantization;
  const nlohmann::json* value = fields.find("quantization_config");
  if (value == nullptr) return quantization;
  JsonFields q(*value, "config.json: quantization_config");
  quantization.quant_method = q.string("quant_method", "");
  MEGACTX_CHECK(quantization.quant_method == "fp8",
                "config.json: quantization_config.quant_method '{}' is not supported (only 'fp8')",
                quantization.quant_method);
  quantization.fmt = q.string("fmt", "e4m3");
  MEGACTX_CHECK(quantization.fmt == "e4m3",
                "config.json: quantization_config.fmt '{}' is not supported (only 'e4m3')",
                quantization.fmt);
  quantization.weight_block_size = q.integer_list("weight_block_size");
  if (quantization.weight_block_size.empty()) quantization.weight_block_size = {128, 128};
  MEGACTX_CHECK(quantization.weight_block_size.size() == 2 &&
                    quantization.weight_block_size[0] > 0 && quantization.weight_block_size[1] > 0,
                "config.json: quantization_config.weight_block_size must be two positive integers");
  quantization.activation_scheme = q.string("activation_scheme", "dynamic");
  quantization.modules_to_not_convert = q.string_list("modules_to_not_convert");
  quantization.scale_fmt = q.string("scale_fmt", "");
  return quantization;
}

// indexer_types: explicit list > index_topk_pattern > freq/offset rule
// (a layer is full iff max(i - offset + 1, 0) % freq == 0, freq clamped to >= 1).
void resolve_indexer_schedule(const JsonFields& fields, const Defaults& defaults,
                              ModelConfig& config) {
  const size_t layers = static_cast<size_t>(config.num_hidden_layers);
  config.index_topk_freq = std::max<int64_t>(fields.integer("index_topk_freq", 1), 1);
  config.index_skip_topk_offset =
      fields.integer("index_skip_topk_offset", defaults.index_skip_topk_offset);

  std::vector<std::string> names;
  std::string source;
  if (fields.has("indexer_types")) {
    names = fields.string_list("indexer_types");
    source = "indexer_types";
  }
  if (const nlohmann::json* pattern = fields.find("index_topk_pattern")) {
    if (pattern->is_string()) {
      config.index_topk_pattern = pattern->get<std::string>();
      if (source.empty()) {
        for (char c : config.index_topk_pattern) {
          MEGACTX_CHECK(c == 'F' || c == 'S',
                        "config.json: field 'index_topk_pattern' may hold only 'F' and 'S', got "
                        "'{}'",
                        c);
          names.push_back(c == 'F' ? "full" : "shared");
        }
        source = "index_topk_pattern";
      }
    } else if (source.empty()) {
      names = fields.string_list("index_topk_pattern");
      source = "index_topk_pattern";
    }
  }
  if (config.model_type == ModelType::DeepseekV32) {
    // DeepseekV32Config reads none of the schedule knobs: every layer runs its indexer.
    names.assign(layers, "full");
    source = "model_type";
  } else if (source.empty()) {
    for (size_t i = 0; i < layers; ++i) {
      const int64_t shifted =
          std::max<int64_t>(static_cast<int64_t>(i) - config.index_skip_topk_offset + 1, 0);
      names.push_back(shifted % config.index_topk_freq == 0 ? "full" : "shared");
    }
    source = "index_topk_freq";
  }
  MEGACTX_CHECK(names.size() == layers,
                "config.json: field '{}' has {} entries but num_hidden_layers is {}", source,
                names.size(), layers);
  config.indexer_types.clear();
  for (size_t i = 0; i < layers; ++i) {
    MEGACTX_CHECK(names[i] == "full" || names[i] == "shared",
                  "config.json: field '{}'[{}] must be 'full' or 'shared', got '{}'", source, i,
                  names[i]);
    config.indexer_types.push_back(names[i] == "full" ? IndexerType::Full : IndexerType::Shared);
  }
  // A shared layer reuses the top-k of an earlier full layer, so layer 0 must be full.
  MEGACTX_CHECK(layers == 0 || config.indexer_types[0] == IndexerType::Full,
                "config.json: field '{}': layer 0 must run the indexer ('full'); a shared layer "
                "needs an earlier full layer",
                source);
}

void resolve_mlp_schedule(const JsonFields& fields, ModelConfig& config) {
  const size_t layers = static_cast<size_t>(config.num_hidden_layers);
  config.first_k_dense_replace = fields.integer("first_k_dense_replace", 3);
  MEGACTX_CHECK(config.first_k_dense_replace >= 0,
                "config.json: field 'first_k_dense_replace' must be >= 0");
  config.mlp_layer_types.clear();
  if (fields.has("mlp_layer_types")) {
    const auto names = fields.string_list("mlp_layer_types");
    MEGACTX_CHECK(names.size() == layers,
                  "config.json: field 'mlp_layer_types' has {} entries but num_hidden_layers is {}",
                  names.size(), layers);
    for (size_t i = 0; i < layers; ++i) {
      MEGACTX_CHECK(names[i] == "dense" || names[i] == "sparse",
                    "config.json: field 'mlp_layer_types'[{}] must be 'dense' or 'sparse', got "
                    "'{}'",
                    i, names[i]);
      config.mlp_layer_types.push_back(names[i] == "dense" ? MlpType::Dense : MlpType::Sparse);
    }
  } else {
    const size_t dense = std::min(static_cast<size_t>(config.first_k_dense_replace), layers);
    config.mlp_layer_types.assign(layers, MlpType::Sparse);
    std::fill_n(config.mlp_layer_types.begin(), dense, MlpType::Dense);
  }
}

// Dimensions past 2^24 are not a real model but could overflow size arithmetic.
constexpr int64_t kMaxDimension = int64_t{1} << 24;

// Head counts and head dimensions multiply with ranks in tensor shapes: keep
// every shape's element count far below 2^63.
constexpr int64_t kMaxHeads = int64_t{1} << 16;

void check_positive(int64_t value, const char* field, int64_t limit = kMaxDimension) {
  MEGACTX_CHECK(value > 0, "config.json: field '{}' must be positive, got {}", field, value);
  MEGACTX_CHECK(value <= limit, "config.json: field '{}' is implausibly large: {}", field, value);
}

void validate(ModelConfig& config) {
  check_positive(config.vocab_size, "vocab_size");
  check_positive(config.hidden_size, "hidden_size", int64_t{1} << 20);
  check_positive(config.num_hidden_layers, "num_hidden_layers");
  check_positive(config.num_attention_heads, "num_attention_heads", kMaxHeads);
  check_positive(config.num_key_value_heads, "num_key_value_heads", kMaxHeads);
  check_positive(config.max_position_embeddings, "max_position_embeddings");
  check_positive(config.kv_lora_rank, "kv_lora_rank", int64_t{1} << 20);
  check_positive(config.qk_rope_head_dim, "qk_rope_head_dim", kMaxHeads);
  check_positive(config.v_head_dim, "v_head_dim", kMaxHeads);
  check_positive(config.index_n_heads, "index_n_heads", kMaxHeads);
  check_positive(config.index_head_dim, "index_head_dim", kMaxHeads);
  check_positive(config.index_topk, "index_topk");
  MEGACTX_CHECK(config.num_hidden_layers <= 100000,
                "config.json: field 'num_hidden_layers' is "
                "implausibly large: {}",
                config.num_hidden_layers);
  MEGACTX_CHECK(config.n_routed_experts <= 65536 && config.num_experts_per_tok <= 65536 &&
                    config.n_shared_experts <= 65536 && config.n_group <= 65536,
                "config.json: field 'n_routed_experts' is implausibly large: {}",
                config.n_routed_experts);
  MEGACTX_CHECK(config.num_nextn_predict_layers <= 64,
                "config.json: field 'num_nextn_predict_layers' is implausibly large: {}",
                config.num_nextn_predict_layers);
  MEGACTX_CHECK(config.qk_nope_head_dim >= 0 && config.qk_nope_head_dim <= kMaxHeads,
                "config.json: field 'qk_nope_head_dim' must be >= 0");
  MEGACTX_CHECK(config.qk_rope_head_dim % 2 == 0,
                "config.json: field 'qk_rope_head_dim' must be even (RoPE rotates pairs), got {}",
                config.qk_rope_head_dim);
  MEGACTX_CHECK(config.index_head_dim >= config.qk_rope_head_dim,
                "config.json: field 'index_head_dim' ({}) must be >= qk_rope_head_dim ({}): an "
                "indexer head is [rope | nope]",
                config.index_head_dim, config.qk_rope_head_dim);
  if (config.q_lora_rank) check_positive(*config.q_lora_rank, "q_lora_rank", int64_t{1} << 20);
  MEGACTX_CHECK(config.rms_norm_eps > 0, "config.json: field 'rms_norm_eps' must be positive");
  MEGACTX_CHECK(config.num_nextn_predict_layers >= 0,
                "config.json: field 'num_nextn_predict_layers' must be >= 0");

  const bool any_dense =
      std::count(config.mlp_layer_types.begin(), config.mlp_layer_types.end(), MlpType::Dense) > 0;
  const bool any_moe = std::count(config.mlp_layer_types.begin(), config.mlp_layer_types.end(),
                                  MlpType::Sparse) > 0 ||
                       (config.num_nextn_predict_layers > 0 && config.mtp_layer_is_moe());
  if (any_dense) check_positive(config.intermediate_size, "intermediate_size");
  if (any_moe) {
    check_positive(config.moe_intermediate_size, "moe_intermediate_size");
    check_positive(config.n_routed_experts, "n_routed_experts");
    check_positive(config.num_experts_per_tok, "num_experts_per_tok");
    check_positive(config.n_group, "n_group");
    check_positive(config.topk_group, "topk_group");
    MEGACTX_CHECK(config.n_shared_experts >= 0,
                  "config.json: field 'n_shared_experts' must be >= 0");
    MEGACTX_CHECK(config.num_experts_per_tok <= config.n_routed_experts,
                  "config.json: field 'num_experts_per_tok' ({}) exceeds n_routed_experts ({})",
                  config.num_experts_per_tok, config.n_routed_experts);
    MEGACTX_CHECK(config.n_routed_experts % config.n_group == 0,
                  "config.json: field 'n_group' ({}) must divide n_routed_experts ({})",
                  config.n_group, config.n_routed_experts);
    MEGACTX_CHECK(config.topk_group <= config.n_group,
                  "config.json: field 'topk_group' ({}) exceeds n_group ({})", config.topk_group,
                  config.n_group);
    // Group-limited routing keeps topk_group groups, which must hold the top-k experts.
    MEGACTX_CHECK(config.num_experts_per_tok <=
                      config.topk_group * (config.n_routed_experts / config.n_group),
                  "config.json: field 'num_experts_per_tok' ({}) exceeds the experts in topk_group "
                  "({}) groups",
                  config.num_experts_per_tok, config.topk_group);
    MEGACTX_CHECK(config.scoring_func == "sigmoid" || config.scoring_func == "softmax",
                  "config.json: field 'scoring_func' '{}' is not supported", config.scoring_func);
  }
  for (int64_t id : config.eos_token_ids)
    MEGACTX_CHECK(id >= 0 && id < config.vocab_size,
                  "config.json: field 'eos_token_id' {} is outside the vocabulary (size {})", id,
                  config.vocab_size);
  if (config.bos_token_id)
    MEGACTX_CHECK(*config.bos_token_id >= 0 && *config.bos_token_id < config.vocab_size,
                  "config.json: field 'bos_token_id' {} is outside the vocabulary",
                  *config.bos_token_id);
  if (config.pad_token_id)
    MEGACTX_CHECK(*config.pad_token_id >= 0 && *config.pad_token_id < config.vocab_size,
                  "config.json: field 'pad_token_id' {} is outside the vocabulary",
                  *config.pad_token_id);
}

}  // namespace

std::vector<int64_t> ModelConfig::full_indexer_layers() const {
  std::vector<int64_t> layers;
  for (size_t i = 0; i < indexer_types.size(); ++i)
    if (indexer_types[i] == IndexerType::Full) layers.push_back(static_cast<int64_t>(i));
  return layers;
}

int64_t ModelConfig::indexer_source_layer(int64_t layer) const {
  MEGACTX_CHECK(layer >= 0 && layer < static_cast<int64_t>(indexer_types.size()),
                "layer {} is outside the model's {} layers", layer, indexer_types.size());
  for (int64_t i = layer; i >= 0; --i)
    if (indexer_types[static_cast<size_t>(i)] == IndexerType::Full) return i;
  fail("layer {} has no full indexer layer at or before it", layer);
}

ModelConfig parse_model_config(const std::string& json_text) {
  nlohmann::json root;
  try {
    root = parse_json(json_text);
  } catch (const nlohmann::json::exception& error) {
    fail("config.json is not valid JSON: {}", error.what());
  }
  MEGACTX_CHECK(root.is_object(), "config.json must be a JSON object, got {}",
                json_type_name(root));
  JsonFields fields(root, "config.json");

  ModelConfig config;
  MEGACTX_CHECK(fields.has("model_type"), "config.json: field 'model_type' is missing");
  config.model_type_name = fields.string("model_type", "");
  if (config.model_type_name == "glm_moe_dsa") {
    config.model_type = ModelType::GlmMoeDsa;
  } else if (config.model_type_name == "deepseek_v32") {
    config.model_type = ModelType::DeepseekV32;
  } else {
    fail(
        "config.json: field 'model_type' '{}' is not supported (expected 'glm_moe_dsa' or "
        "'deepseek_v32')",
        config.model_type_name);
  }
  const Defaults& d = config.model_type == ModelType::GlmMoeDsa ? kGlmDefaults : kDeepseekDefaults;

  // transformers 5 writes "dtype", older versions "torch_dtype".
  config.torch_dtype = fields.string("dtype", fields.string("torch_dtype", "bfloat16"));

  config.vocab_size = fields.integer("vocab_size", d.vocab_size);
  config.hidden_size = fields.integer("hidden_size", d.hidden_size);
  config.intermediate_size = fields.integer("intermediate_size", d.intermediate_size);
  config.moe_intermediate_size = fields.integer("moe_intermediate_size", 2048);
  config.num_hidden_layers = fields.integer("num_hidden_layers", d.num_hidden_layers);
  config.num_attention_heads = fields.integer("num_attention_heads", d.num_attention_heads);
  config.num_key_value_heads = fields.integer("num_key_value_heads", d.num_key_value_heads);
  config.max_position_embeddings =
      fields.integer("max_position_embeddings", d.max_position_embeddings);
  config.rms_norm_eps = fields.number("rms_norm_eps", d.rms_norm_eps);
  config.hidden_act = fields.string("hidden_act", "silu");
  config.attention_bias = fields.boolean("attention_bias", false);
  config.tie_word_embeddings = fields.boolean("tie_word_embeddings", false);

  // q_lora_rank: null means a plain q_proj (absent means the HF default).
  if (root.contains("q_lora_rank") && root["q_lora_rank"].is_null()) {
    config.q_lora_rank.reset();
  } else {
    config.q_lora_rank = fields.integer("q_lora_rank", d.q_lora_rank);
  }
  config.kv_lora_rank = fields.integer("kv_lora_rank", 512);
  config.qk_nope_head_dim = fields.integer("qk_nope_head_dim", d.qk_nope_head_dim);
  config.qk_rope_head_dim = fields.integer("qk_rope_head_dim", 64);
  config.v_head_dim = fields.integer("v_head_dim", d.v_head_dim);

  config.rope = parse_rope(root, fields, config.max_position_embeddings);
  config.rope_interleave = fields.boolean("rope_interleave", true);
  config.indexer_rope_interleave =
      fields.boolean("indexer_rope_interleave", d.indexer_rope_interleave);

  config.index_n_heads = fields.integer("index_n_heads", d.index_n_heads);
  config.index_head_dim = fields.integer("index_head_dim", 128);
  config.index_topk = fields.integer("index_topk", 2048);
  config.index_share_for_mtp_iteration = fields.boolean("index_share_for_mtp_iteration", false);

  config.n_routed_experts = fields.integer("n_routed_experts", fields.integer("num_experts", 256));
  config.num_experts_per_tok = fields.integer("num_experts_per_tok", 8);
  config.n_shared_experts = fields.integer("n_shared_experts", 1);
  config.n_group = fields.integer("n_group", d.n_group);
  config.topk_group = fields.integer("topk_group", d.topk_group);
  config.norm_topk_prob = fields.boolean("norm_topk_prob", true);
  config.routed_scaling_factor = fields.number("routed_scaling_factor", 2.5);
  config.scoring_func = fields.string("scoring_func", "sigmoid");
  config.topk_method = fields.string("topk_method", "noaux_tc");
  config.num_nextn_predict_layers = fields.integer("num_nextn_predict_layers", 0);

  config.quantization = parse_quantization(fields);

  // bos defaults to 0 and eos to 1 like HF; an explicit null clears them.
  if (root.contains("bos_token_id") && root["bos_token_id"].is_null())
    config.bos_token_id.reset();
  else
    config.bos_token_id = fields.integer("bos_token_id", 0);
  if (root.contains("eos_token_id") && root["eos_token_id"].is_null())
    config.eos_token_ids.clear();
  else if (!root.contains("eos_token_id"))
    config.eos_token_ids = {1};
  else
    config.eos_token_ids = fields.integer_or_list("eos_token_id");
  config.pad_token_id = fields.optional_integer("pad_token_id");

  // Sizes must be sane before the schedules are built from them.
  check_positive(config.num_hidden_layers, "num_hidden_layers");
  MEGACTX_CHECK(config.num_hidden_layers <= 100000,
                "config.json: field 'num_hidden_layers' is implausibly large: {}",
                config.num_hidden_layers);
  resolve_indexer_schedule(fields, d, config);
  resolve_mlp_schedule(fields, config);
  validate(config);
  return config;
}

ModelConfig load_model_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::error_code ignored;
  MEGACTX_CHECK(std::filesystem::is_regular_file(path, ignored), "cannot read {}: no such file",
                path);
  std::ifstream file(path, std::ios::binary);
  MEGACTX_CHECK(file.good(), "cannot read {}: no such file or not readable", path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  MEGACTX_CHECK(!file.bad(), "cannot read {}", path);
  try {
    return parse_model_config(buffer.str());
  } catch (const Error& error) {
    fail("{}: {}", path, error.what());
  }
}

}  // namespace megactx
