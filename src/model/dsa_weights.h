// The float32 weights of a DSA decoder (glm_moe_dsa / deepseek_v32), loaded
// by Hub tensor name and checked shape. Shapes use the ModelConfig names:
// H hidden, Nh heads, L kv_lora_rank, R qk_rope_head_dim, Dn qk_nope_head_dim,
// Dv v_head_dim, Q q_lora_rank, HI/DI indexer heads/dim.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "io/model_config.h"
#include "model/model_plan.h"
#include "model/weight_source.h"

namespace megactx {

struct MlpWeights {
  Tensor gate_up;  // [2I, H]: gate rows then up rows (one GEMM for both)
  Tensor down;     // [H, I]
  int64_t intermediate = 0;
};

struct IndexerWeights {
  Tensor wq_b;           // [HI * DI, Q]
  Tensor wk;             // [DI, H]
  Tensor k_norm_weight;  // [DI]
  Tensor k_norm_bias;    // [DI]
  Tensor weights_proj;   // [HI, H]
};

struct AttentionWeights {
  Tensor q_a;        // [Q, H]
  Tensor q_a_norm;   // [Q]
  Tensor q_b;        // [Nh * (Dn + R), Q]; q_proj [Nh * (Dn + R), H] when there is no q_lora
  Tensor kv_a;       // [L + R, H]
  Tensor kv_a_norm;  // [L]
  Tensor w_uk_t;     // [Nh, L, Dn]: kv_b_proj's key half, transposed per head (absorbs q_nope)
  Tensor w_uv;       // [Nh, Dv, L]: kv_b_proj's value half (expands the latent output)
  Tensor o;          // [H, Nh * Dv]
  bool has_indexer = false;
  IndexerWeights indexer;
};

struct MoeWeights {
  Tensor router;  // [E, H]
  Tensor bias;    // [E] e_score_correction_bias
  std::vector<MlpWeights> experts;
  MlpWeights shared;  // n_shared_experts * moe_intermediate wide
};

struct LayerWeights {
  Tensor input_norm;  // [H]
  Tensor post_norm;   // [H]
  AttentionWeights attention;
  bool is_moe = false;
  MlpWeights dense;
  MoeWeights moe;
};

struct DsaWeights {
  Tensor embed;       // [V, H]
  Tensor final_norm;  // [H]
  Tensor lm_head;     // [V, H]
  std::vector<LayerWeights> layers;
};

// One decoder layer `model.layers.{layer.layer}.*` (the MTP layer is
// ModelPlan::mtp, index num_hidden_layers).
LayerWeights load_layer_weights(const ModelConfig& config, WeightSource& source,
                                const LayerPlan& layer);

// Loads every weight the plan names; then checks that the source holds
// nothing else (MTP layers model.layers.{num_hidden_layers + i}.* are allowed).
DsaWeights load_dsa_weights(const ModelConfig& config, const ModelPlan& plan, WeightSource& source);

// The weights of one rank of a parallel group (plan: parallel_plan's) cut from
// the whole model's. Tensor parallel: the rank's heads of q_b, W_UK, W_UV and
// the matching columns of o_proj; the rank's share of every dense MLP's and
// shared expert's gate, up (rows) and down (columns), and of every routed
// expert's unless expert parallel. Expert parallel: only the rank's routed
// experts (moe.experts[e - plan.first_expert]). LayerSplit: no kv_a, kv_a
// norm or indexer tensors for the layers another rank owns (only a layer's
// owner computes its latents and runs its indexer). Everything else whole.
// The cut tensors are copies (the caller releases the whole weights).
DsaWeights parallel_shard(const DsaWeights& whole, const ModelPlan& plan);
// The same cut of one layer (also the MTP layer's).
LayerWeights parallel_shard_layer(const LayerWeights& layer, const ModelPlan& plan);

}  // namespace megactx
