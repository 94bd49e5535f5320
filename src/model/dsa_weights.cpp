#include "model/dsa_weights.h"

#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace megactx {
namespace {

MlpWeights load_mlp(WeightSource& source, const std::string& prefix, int64_t hidden,
                    int64_t intermediate) {
  MlpWeights mlp;
  mlp.intermediate = intermediate;
  const Tensor gate = source.get(prefix + "gate_proj.weight", {intermediate, hidden});
  const Tensor up = source.get(prefix + "up_proj.weight", {intermediate, hidden});
  mlp.gate_up = Tensor::empty({2 * intermediate, hidden});
  std::memcpy(mlp.gate_up.data<float>(), gate.data<float>(), gate.nbytes());
  std::memcpy(mlp.gate_up.data<float>() + gate.numel(), up.data<float>(), up.nbytes());
  mlp.down = source.get(prefix + "down_proj.weight", {hidden, intermediate});
  return mlp;
}

AttentionWeights load_attention(const ModelConfig& c, WeightSource& source,
                                const std::string& prefix, bool has_indexer) {
  const int64_t hidden = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  const int64_t lora = c.kv_lora_rank;
  const int64_t nope = c.qk_nope_head_dim;
  const int64_t value = c.v_head_dim;
  AttentionWeights a;
  if (c.q_lora_rank) {
    const int64_t q = *c.q_lora_rank;
    a.q_a = source.get(prefix + "q_a_proj.weight", {q, hidden});
    a.q_a_norm = source.get(prefix + "q_a_layernorm.weight", {q});
    a.q_b = source.get(prefix + "q_b_proj.weight", {heads * c.qk_head_dim(), q});
  } else {
    a.q_b = source.get(prefix + "q_proj.weight", {heads * c.qk_head_dim(), hidden});
  }
  a.kv_a = source.get(prefix + "kv_a_proj_with_mqa.weight", {lora + c.qk_rope_head_dim, hidden});
  a.kv_a_norm = source.get(prefix + "kv_a_layernorm.weight", {lora});
  // kv_b_proj: [Nh * (Dn + Dv), L]; head h owns rows [h (Dn + Dv), (h + 1)(Dn + Dv)):
  // first Dn rows W_UK[h] (key nope), then Dv rows W_UV[h] (value).
  const Tensor kv_b = source.get(prefix + "kv_b_proj.weight", {heads * (nope + value), lora});
  a.w_uk_t = Tensor::empty({heads, lora, nope});
  a.w_uv = Tensor::empty({heads, value, lora});
  const float* src = kv_b.data<float>();
  for (int64_t h = 0; h < heads; ++h) {
    const float* block = src + h * (nope + value) * lora;
    float* uk = a.w_uk_t.data<float>() + h * lora * nope;
    for (int64_t d = 0; d < nope; ++d)
      for (int64_t l = 0; l < lora; ++l) uk[l * nope + d] = block[d * lora + l];
    std::memcpy(a.w_uv.data<float>() + h * value * lora, block + nope * lora,
                static_cast<size_t>(value * lora) * sizeof(float));
  }
  a.o = source.get(prefix + "o_proj.weight", {hidden, heads * value});
  a.has_indexer = has_indexer;
  if (has_indexer) {
    MEGACTX_CHECK(c.q_lora_rank.has_value(), "the DSA indexer needs q_lora_rank");
    const std::string p = prefix + "indexer.";
    const int64_t dim = c.index_head_dim;
    a.indexer.wq_b = source.get(p + "wq_b.weight", {c.index_n_heads * dim, *c.q_lora_rank});
    a.indexer.wk = source.get(p + "wk.weight", {dim, hidden});
    a.indexer.k_norm_weight = source.get(p + "k_norm.weight", {dim});
    a.indexer.k_norm_bias = source.get(p + "k_norm.bias", {dim});
    a.indexer.weights_proj = source.get(p + "weights_proj.weight", {c.index_n_heads, hidden});
  }
  return a;
}

}  // namespace

LayerWeights load_layer_weights(const ModelConfig& c, WeightSource& source, const LayerPlan& plan) {
  const int64_t i = plan.layer;
  const int64_t hidden = c.hidden_size;
  const std::string prefix = fmt::format("model.layers.{}.", i);
  LayerWeights layer;
  layer.input_norm = source.get(prefix + "input_layernorm.weight", {hidden});
  layer.post_norm = source.get(prefix + "post_attention_layernorm.weight", {hidden});
  layer.attention = load_attention(c, source, prefix + "self_attn.", plan.runs_indexer);
  layer.is_moe = plan.moe;
  if (layer.is_moe) {
    const int64_t experts = c.n_routed_experts;  // plan_model checked the MoE shapes
    layer.moe.router = source.get(prefix + "mlp.gate.weight", {experts, hidden});
    const std::string bias = prefix + "mlp.gate.e_score_correction_bias";
    layer.moe.bias = source.has(bias) ? source.get(bias, {experts}) : Tensor::zeros({experts});
    for (int64_t e = 0; e < experts; ++e) {
      layer.moe.experts.push_back(load_mlp(source, fmt::format("{}mlp.experts.{}.", prefix, e),
                                           hidden, c.moe_intermediate_size));
    }
    if (c.n_shared_experts > 0) {
      layer.moe.shared = load_mlp(source, prefix + "mlp.shared_experts.", hidden,
                                  c.moe_intermediate_size * c.n_shared_experts);
    }
  } else {
    layer.dense = load_mlp(source, prefix + "mlp.", hidden, c.intermediate_size);
  }
  return layer;
}

DsaWeights load_dsa_weights(const ModelConfig& c, const ModelPlan& plan, WeightSource& source) {
  DsaWeights w;
  const int64_t hidden = c.hidden_size;
  w.embed = source.get("model.embed_tokens.weight", {c.vocab_size, hidden});
  w.final_norm = source.get("model.norm.weight", {hidden});
  if (c.tie_word_embeddings && !source.has("lm_head.weight")) {
    w.lm_head = w.embed;
  } else {
    w.lm_head = source.get("lm_head.weight", {c.vocab_size, hidden});
  }
  for (const LayerPlan& layer : plan.layers)
    w.layers.push_back(load_layer_weights(c, source, layer));
  std::vector<std::string> mtp;
  for (int64_t i = 0; i < std::max<int64_t>(c.num_nextn_predict_layers, 1); ++i) {
    mtp.push_back(fmt::format("model.layers.{}.", c.num_hidden_layers + i));
  }
  source.check_all_used(mtp);
  return w;
}

namespace {

// Rows [begin, end) of a row-major tensor of any rank (dim 0), copied.
Tensor copy_rows(const Tensor& whole, int64_t begin, int64_t end) {
  Shape shape = whole.shape();
  const int64_t row = whole.numel() / shape[0];
  shape[0] = end - begin;
  Tensor part = Tensor::empty(shape);
  std::memcpy(part.data<float>(), whole.data<float>() + begin * row,
              static_cast<size_t>((end - begin) * row) * sizeof(float));
  return part;
}

// Columns [begin, end) of a [rows, columns] tensor, copied.
Tensor copy_columns(const Tensor& whole, int64_t begin, int64_t end) {
  const int64_t rows = whole.dim(0), columns = whole.dim(1), width = end - begin;
  Tensor part = Tensor::empty({rows, width});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(part.data<float>() + r * width, whole.data<float>() + r * columns + begin,
                static_cast<size_t>(width) * sizeof(float));
  return part;
}

// A SwiGLU MLP's share: gate rows, up rows (gate_up is [gate; up]) and the
// matching down columns.
MlpWeights shard_mlp(const MlpWeights& whole, int rank, int size) {
  const int64_t width = whole.intermediate / size, begin = rank * width;
  MlpWeights part;
  part.intermediate = width;
  const Tensor gate = copy_rows(whole.gate_up, begin, begin + width);
  const Tensor up =
      copy_rows(whole.gate_up, whole.intermediate + begin, whole.intermediate + begin + width);
  part.gate_up = Tensor::empty({2 * width, whole.gate_up.dim(1)});
  std::memcpy(part.gate_up.data<float>(), gate.data<float>(), gate.nbytes());
  std::memcpy(part.gate_up.data<float>() + gate.numel(), up.data<float>(), up.nbytes());
  part.down = copy_columns(whole.down, begin, begin + width);
  return part;
}

}  // namespace

LayerWeights parallel_shard_layer(const LayerWeights& layer, const ModelPlan& plan) {
  const int rank = plan.tensor_parallel_rank, size = plan.tensor_parallel_size;
  const bool tensor = size > 1, experts = plan.expert_parallel_size > 1;
  const AttentionDims& d = plan.attention;  // heads: this rank's
  const int64_t first_head = rank * d.heads;
  LayerWeights out = layer;  // norms, q_a, kv_a, the indexer, the router: whole (shared storage)
  if (tensor) {
    const AttentionWeights& a = layer.attention;
    out.attention.q_b = copy_rows(a.q_b, first_head * d.qk, (first_head + d.heads) * d.qk);
    out.attention.w_uk_t = copy_rows(a.w_uk_t, first_head, first_head + d.heads);
    out.attention.w_uv = copy_rows(a.w_uv, first_head, first_head + d.heads);
    out.attention.o = copy_columns(a.o, first_head * d.value, (first_head + d.heads) * d.value);
    if (!layer.is_moe) out.dense = shard_mlp(layer.dense, rank, size);
    if (plan.indexer_split && a.indexer.wq_b.defined()) {
      // This rank's indexer heads: their rows of wq_b ([heads * dim, q_lora])
      // and of weights_proj ([heads, hidden]).
      const int64_t heads = d.index_heads, first = rank * heads;
      out.attention.indexer.wq_b =
          copy_rows(a.indexer.wq_b, first * d.index_dim, (first + heads) * d.index_dim);
      out.attention.indexer.weights_proj = copy_rows(a.indexer.weights_proj, first, first + heads);
    }
    if (layer.is_moe && layer.moe.shared.intermediate > 0)
      out.moe.shared = shard_mlp(layer.moe.shared, rank, size);
    if (layer.is_moe && !experts)
      for (size_t e = 0; e < layer.moe.experts.size(); ++e)
        out.moe.experts[e] = shard_mlp(layer.moe.experts[e], rank, size);
  }
  if (layer.is_moe && experts)
    out.moe.experts.assign(layer.moe.experts.begin() + plan.first_expert,
                           layer.moe.experts.begin() + plan.first_expert + plan.local_experts);
  return out;
}

DsaWeights parallel_shard(const DsaWeights& whole, const ModelPlan& plan) {
  DsaWeights part;
  part.embed = whole.embed;
  part.final_norm = whole.final_norm;
  part.lm_head = whole.lm_head;
  for (const LayerWeights& layer : whole.layers) {
    part.layers.push_back(parallel_shard_layer(layer, plan));
    const auto index = static_cast<int64_t>(part.layers.size()) - 1;
    if (!plan.holds_kv(index)) {
      // LayerSplit: another rank computes this layer's latents and top-k
      // (has_indexer stays: the layer still takes the owner's selection).
      AttentionWeights& a = part.layers.back().attention;
      a.kv_a = Tensor{};
      a.kv_a_norm = Tensor{};
      a.indexer = IndexerWeights{};
    }
  }
  return part;
}

}  // namespace megactx
