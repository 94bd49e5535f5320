// Small random GLM-5.x-shaped models with the fp8 DSA kernels' attention
// shapes (kv_lora 512, rope 64, index dim 128; 4 layers: full, shared, full,
// shared indexers; dense MLPs), for the GPU tests of the fast attention path.
#pragma once

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "model/model_loader.h"

namespace megactx::testing {

struct Shape {
  int64_t heads = 16;
  int64_t index_heads = 8;
};

inline std::string shape_name(const Shape& shape) {
  return std::to_string(shape.heads) + " heads / " + std::to_string(shape.index_heads) +
         " indexer heads";
}

// A GLM-5.x-shaped config.json with small widths, written to the temp
// directory (the GPU machine runs the binaries outside the build tree).
inline std::string write_config(const Shape& shape) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("megactx_fast_attention_" + std::to_string(shape.heads) + "_" +
                             std::to_string(shape.index_heads) + ".json"))
                               .string();
  std::ofstream file(path);
  file << R"({
  "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
  "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
  "moe_intermediate_size": 64, "n_routed_experts": 4, "num_experts_per_tok": 2,
  "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": true,
  "routed_scaling_factor": 1.0, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
  "num_hidden_layers": 4, "first_k_dense_replace": 4,
  "mlp_layer_types": ["dense", "dense", "dense", "dense"],
  "num_attention_heads": )"
       << shape.heads << R"(, "num_key_value_heads": )" << shape.heads << R"(,
  "q_lora_rank": 128, "kv_lora_rank": 512, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64,
  "v_head_dim": 64, "head_dim": 64,
  "index_n_heads": )"
       << shape.index_heads << R"(, "index_head_dim": 128, "index_topk": 2048,
  "indexer_types": ["full", "shared", "full", "shared"],
  "rope_interleave": true, "indexer_rope_interleave": true,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "rope_theta": 10000.0,
  "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "hidden_act": "silu",
  "attention_bias": false, "tie_word_embeddings": false, "num_nextn_predict_layers": 0,
  "bos_token_id": 1, "eos_token_id": [0], "pad_token_id": 0
})";
  return path;
}

// The host model (random weights, seed 5) the CUDA models are uploaded from.
inline std::unique_ptr<LanguageModel> host_model(const Shape& shape, int64_t index_topk) {
  ModelLoadOptions options;
  options.random_weights = true;
  options.seed = 5;
  options.index_topk_override = index_topk;
  return load_language_model(write_config(shape), options);
}

}  // namespace megactx::testing
