// CudaWeights straight from a checkpoint or random fp8 weights (the
// fp8-native load; see model/cuda/weights.h). Walks the same names and shapes as
// load_dsa_weights (dsa_weights.cpp), uploading each tensor as soon as it is
// read. The routed experts of a layer are stacked (one allocation per
// matrix kind, fp8 bytes and scales as shipped) so the grouped device MoE
// serves them.
#if MEGACTX_HAVE_CUDA
#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"
#include "model/cuda/weights.h"

namespace megactx::cuda {
namespace {

// What one stacked slot of an expert matrix holds; every expert of a stack
// must agree on it.
struct Slot {
  bool fp8 = false;
  int64_t rows = 0, cols = 0;
  int64_t scale_rows = 0, scale_cols = 0, scale_split = 0;  // fp8 only
  bool operator==(const Slot&) const = default;
  size_t value_bytes(bool bf16) const {
    return static_cast<size_t>(rows * cols) * (fp8 ? 1 : bf16 ? 2 : 4);
  }
  int64_t scale_floats() const { return scale_rows * scale_cols; }
};

Slot slot_of(const CheckpointMatrix& m) {
  Slot slot;
  slot.fp8 = m.fp8();
  slot.rows = m.rows();
  slot.cols = m.cols();
  if (slot.fp8) {
    slot.scale_rows = m.scales.dim(0);
    slot.scale_cols = m.scales.dim(1);
    slot.scale_split = m.scale_split;
  }
  return slot;
}

}  // namespace

void CudaWeights::copy_checkpoint_matrix(const CheckpointMatrix& matrix, void* values,
                                         float* scales) {
  if (!matrix.fp8()) {
    copy_matrix(matrix.values, values);
    return;
  }
  const size_t bytes = matrix.values.nbytes(), scale_bytes = matrix.scales.nbytes();
  MEGACTX_CUDA_CHECK(cudaMemcpy(values, matrix.values.raw(), bytes, cudaMemcpyHostToDevice));
  MEGACTX_CUDA_CHECK(cudaMemcpy(scales, matrix.scales.raw(), scale_bytes, cudaMemcpyHostToDevice));
  // The accounting of upload_matrix(CheckpointMatrix).
  fp8_bytes_ += bytes + scale_bytes;
  fp8_parameters_ += matrix.values.numel();
  matrix_bytes_ += bytes + scale_bytes;
}

void CudaWeights::upload_checkpoint_experts(MatrixSource& source, const std::string& prefix,
                                            int64_t first_expert, int64_t experts, int64_t hidden,
                                            int64_t intermediate, DeviceLayer& d) {
  struct Expert {
    CheckpointMatrix gate_up;  // [2I, H]: gate rows then up rows
    CheckpointMatrix down;     // [H, I]
  };
  auto read = [&](int64_t e) {
    const std::string p = fmt::format("{}experts.{}.", prefix, first_expert + e);
    Expert x;
    x.gate_up = stack_rows(source.matrix(p + "gate_proj.weight", {intermediate, hidden}),
                           source.matrix(p + "up_proj.weight", {intermediate, hidden}));
    x.down = source.matrix(p + "down_proj.weight", {hidden, intermediate});
    return x;
  };
  // Expert 0 fixes the slots; the stacks are reserved once (uninitialised,
  // each expert copied in as it is read), so the host holds one expert at a
  // time and the device one copy.
  Expert first = read(0);
  const Slot gate_up_slot = slot_of(first.gate_up), down_slot = slot_of(first.down);
  const size_t gate_up_bytes = gate_up_slot.value_bytes(bf16_);
  const size_t down_bytes = down_slot.value_bytes(bf16_);
  const auto count = static_cast<size_t>(experts);
  auto* gate_up = static_cast<char*>(reserve_bytes(gate_up_bytes * count));
  auto* down = static_cast<char*>(reserve_bytes(down_bytes * count));
  float* gate_up_scales = nullptr;
  float* down_scales = nullptr;
  if (gate_up_slot.fp8) {
    gate_up_scales = static_cast<float*>(
        reserve_bytes(static_cast<size_t>(gate_up_slot.scale_floats()) * 4 * count));
  }
  if (down_slot.fp8) {
    down_scales = static_cast<float*>(
        reserve_bytes(static_cast<size_t>(down_slot.scale_floats()) * 4 * count));
  }
  bool stacked = true;
  for (int64_t e = 0; e < experts; ++e) {
    const Expert x = e == 0 ? std::move(first) : read(e);
    if (!(slot_of(x.gate_up) == gate_up_slot && slot_of(x.down) == down_slot)) {
      // An expert unlike expert 0 (another dtype or scale grid): its own
      // upload; the layer then takes the host dispatch.
      stacked = false;
      d.experts.push_back({upload_matrix(x.gate_up), upload_matrix(x.down), intermediate});
      continue;
    }
    const auto index = static_cast<size_t>(e);
    char* gate_up_values = gate_up + index * gate_up_bytes;
    char* down_values = down + index * down_bytes;
    float* gate_up_scale =
        gate_up_scales ? gate_up_scales + index * gate_up_slot.scale_floats() : nullptr;
    float* down_scale = down_scales ? down_scales + index * down_slot.scale_floats() : nullptr;
    copy_checkpoint_matrix(x.gate_up, gate_up_values, gate_up_scale);
    copy_checkpoint_matrix(x.down, down_values, down_scale);
    DeviceMlp view;
    view.gate_up = {gate_up_values, !gate_up_slot.fp8 && bf16_, gate_up_scale,
                    gate_up_slot.scale_split};
    view.down = {down_values, !down_slot.fp8 && bf16_, down_scale, down_slot.scale_split};
    view.intermediate = intermediate;
    d.experts.push_back(view);
  }
  if (stacked) {
    d.experts_gate_up = {gate_up, !gate_up_slot.fp8 && bf16_, gate_up_scales,
                         gate_up_slot.scale_split};
    d.experts_down = {down, !down_slot.fp8 && bf16_, down_scales, down_slot.scale_split};
  }
}

DeviceMatrix CudaWeights::upload_matrix(const CheckpointMatrix& matrix) {
  if (!matrix.fp8()) return upload_matrix(matrix.values);
  const size_t bytes = matrix.values.nbytes();
  const void* data = upload_bytes(matrix.values.raw(), bytes);
  const auto* scale =
      static_cast<const float*>(upload_bytes(matrix.scales.raw(), matrix.scales.nbytes()));
  fp8_bytes_ += bytes + matrix.scales.nbytes();
  fp8_parameters_ += matrix.values.numel();
  matrix_bytes_ += bytes + matrix.scales.nbytes();
  DeviceMatrix device;
  device.data = data;
  device.scale = scale;
  device.scale_split = matrix.scale_split;
  return device;
}

DeviceMlp CudaWeights::upload_mlp(MatrixSource& source, const std::string& prefix, int64_t hidden,
                                  int64_t intermediate) {
  // gate rows then up rows: one GEMM for both, as MlpWeights::gate_up.
  const CheckpointMatrix gate_up =
      stack_rows(source.matrix(prefix + "gate_proj.weight", {intermediate, hidden}),
                 source.matrix(prefix + "up_proj.weight", {intermediate, hidden}));
  DeviceMlp mlp;
  mlp.gate_up = upload_matrix(gate_up);
  mlp.down = upload_matrix(source.matrix(prefix + "down_proj.weight", {hidden, intermediate}));
  mlp.intermediate = intermediate;
  return mlp;
}

DeviceLayer CudaWeights::upload_checkpoint_layer(const ModelConfig& c, MatrixSource& source,
                                                 const ModelPlan& plan, const LayerPlan& layer) {
  const int64_t index = layer.layer;
  const int64_t hidden = c.hidden_size;
  // A rank's shapes (parallel_shard_layer's, dsa_weights.h): its heads and
  // its share of every MLP width over the tensor-parallel group; its routed
  // experts whole under expert parallelism.
  const int64_t heads = plan.attention.heads;
  const int64_t tensor_ranks = plan.tensor_parallel_size;
  const bool expert_parallel = plan.expert_parallel_size > 1;
  const int64_t lora = c.kv_lora_rank;
  const int64_t nope = c.qk_nope_head_dim;
  const int64_t value = c.v_head_dim;
  const std::string prefix = fmt::format("model.layers.{}.", index);
  auto vector = [&](const std::string& name, int64_t size) {
    return upload(source.float_tensor(name, {size}));
  };
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    return upload_matrix(source.matrix(name, {rows, cols}));
  };
  DeviceLayer d;
  d.input_norm = vector(prefix + "input_layernorm.weight", hidden);
  d.post_norm = vector(prefix + "post_attention_layernorm.weight", hidden);

  const std::string a = prefix + "self_attn.";
  const std::string kv_a = a + "kv_a_proj_with_mqa.weight";
  if (c.q_lora_rank) {
    const int64_t q = *c.q_lora_rank;
    d.qkv_a_rows = upload_stacked(source.matrix(a + "q_a_proj.weight", {q, hidden}),
                                  source.matrix(kv_a, {lora + c.qk_rope_head_dim, hidden}), d.qkv_a,
                                  d.q_a, d.kv_a);
    d.q_a_norm = vector(a + "q_a_layernorm.weight", q);
    d.q_b = matrix(a + "q_b_proj.weight", heads * c.qk_head_dim(), q);
  } else {
    d.q_b = matrix(a + "q_proj.weight", heads * c.qk_head_dim(), hidden);
    d.kv_a = matrix(kv_a, lora + c.qk_rope_head_dim, hidden);
  }
  d.kv_a_norm = vector(a + "kv_a_layernorm.weight", lora);
  // kv_b_proj [Nh (Dn + Dv), L]: head h's first Dn rows are W_UK[h], the next
  // Dv rows W_UV[h] (as dsa_weights.cpp): W_UK^T [Nh, L, Dn], W_UV [Nh, Dv, L].
  const Tensor kv_b = source.float_tensor(a + "kv_b_proj.weight", {heads * (nope + value), lora});
  Tensor w_uk_t = Tensor::empty({heads, lora, nope});
  Tensor w_uv = Tensor::empty({heads, value, lora});
  for (int64_t h = 0; h < heads; ++h) {
    const float* block = kv_b.data<float>() + h * (nope + value) * lora;
    float* uk = w_uk_t.data<float>() + h * lora * nope;
    for (int64_t i = 0; i < nope; ++i)
      for (int64_t l = 0; l < lora; ++l) uk[l * nope + i] = block[i * lora + l];
    std::memcpy(w_uv.data<float>() + h * value * lora, block + nope * lora,
                static_cast<size_t>(value * lora) * sizeof(float));
  }
  upload_absorbed(w_uk_t, w_uv, d);
  d.o = matrix(a + "o_proj.weight", hidden, heads * value);
  d.has_indexer = layer.runs_indexer;
  if (d.has_indexer) {
    MEGACTX_CHECK(c.q_lora_rank.has_value(), "the DSA indexer needs q_lora_rank");
    const std::string p = a + "indexer.";
    const int64_t dim = c.index_head_dim;
    d.wq_b = matrix(p + "wq_b.weight", c.index_n_heads * dim, *c.q_lora_rank);
    d.wk = matrix(p + "wk.weight", dim, hidden);
    d.k_norm_weight = vector(p + "k_norm.weight", dim);
    d.k_norm_bias = vector(p + "k_norm.bias", dim);
    d.weights_proj = matrix(p + "weights_proj.weight", c.index_n_heads, hidden);
  }

  d.is_moe = layer.moe;
  if (!d.is_moe) {
    d.dense = upload_mlp(source, prefix + "mlp.", hidden, c.intermediate_size / tensor_ranks);
    return d;
  }
  const int64_t experts = c.n_routed_experts;  // plan_model checked the MoE shapes
  d.router = upload(source.float_tensor(prefix + "mlp.gate.weight", {experts, hidden}));
  const std::string bias = prefix + "mlp.gate.e_score_correction_bias";
  d.bias =
      upload(source.has(bias) ? source.float_tensor(bias, {experts}) : Tensor::zeros({experts}));
  if (expert_parallel) {
    upload_checkpoint_experts(source, prefix + "mlp.", plan.first_expert, plan.local_experts,
                              hidden, c.moe_intermediate_size, d);
  } else {
    upload_checkpoint_experts(source, prefix + "mlp.", 0, experts, hidden,
                              c.moe_intermediate_size / tensor_ranks, d);
  }
  if (c.n_shared_experts > 0) {
    d.shared = upload_mlp(source, prefix + "mlp.shared_experts.", hidden,
                          c.moe_intermediate_size * c.n_shared_experts / tensor_ranks);
  }
  return d;
}

CudaWeights::CudaWeights(const ModelConfig& config, const Checkpoint& checkpoint, bool bf16)
    : CudaWeights(config, *make_checkpoint_matrices(checkpoint), bf16, plan_model(config)) {}

CudaWeights::CudaWeights(const ModelConfig& c, MatrixSource& source, bool bf16,
                         const ModelPlan& plan)
    : bf16_(bf16) {
  // plan_model's checks ran when the plan was made (model_plan.h), before
  // any upload.
  const int64_t hidden = c.hidden_size;
  {
    // One [V, H] float32 host copy at a time (the embedding is a gather and
    // stays float32; a tied lm_head is the same values as a GEMM weight).
    const Tensor embed_host =
        source.float_tensor("model.embed_tokens.weight", {c.vocab_size, hidden});
    embed = upload(embed_host);
    if (c.tie_word_embeddings && !source.has("lm_head.weight")) {
      lm_head = upload_matrix(embed_host);
    }
  }
  if (!lm_head) {
    lm_head = upload_matrix(source.matrix("lm_head.weight", {c.vocab_size, hidden}));
  }
  final_norm = upload(source.float_tensor("model.norm.weight", {hidden}));
  for (const LayerPlan& layer : plan.layers)
    layers.push_back(upload_checkpoint_layer(c, source, plan, layer));
  // Nothing left unread but the MTP layers (as load_dsa_weights).
  std::vector<std::string> mtp;
  for (int64_t i = 0; i < std::max<int64_t>(c.num_nextn_predict_layers, 1); ++i) {
    mtp.push_back(fmt::format("model.layers.{}.", c.num_hidden_layers + i));
  }
  source.check_all_used(mtp);
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
