// Device copies of DsaWeights: the same structure with device pointers, owned
// by one CudaWeights; null where the host tensor is absent (no q_lora, no
// indexer on a shared layer). GEMM weights are DeviceMatrix: float32 in the
// parity mode, bf16 in the bf16 mode. Norms, the router (expert choice must
// not flip on rounding), the per-head absorbed W_UK/W_UV (small, batched; the
// bf16 mode adds bf16 copies) and the embedding (a gather) stay float32 in both.
#pragma once

#include <vector>

#include "io/checkpoint.h"
#include "kernels/cuda/gemm/gemm.h"
#include "model/cuda/checkpoint_matrix.h"
#include "model/cuda/device_buffer.h"
#include "model/dsa_weights.h"
#include "model/model_plan.h"

namespace megactx::cuda {

struct DeviceMlp {
  DeviceMatrix gate_up;  // [2I, H]
  DeviceMatrix down;     // [H, I]
  int64_t intermediate = 0;
};

struct DeviceLayer {
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  // Attention (shapes as AttentionWeights).
  DeviceMatrix q_a, q_b, kv_a, o;
  // q_a's rows then kv_a's, [q_lora + kv_lora + rope, H], stored once: one
  // GEMM reads h for both (q_a and kv_a are views into it). Empty without a
  // q-LoRA or when only one of the two is fp8. fp8 stacks end in zero rows
  // up to whole 128-row blocks where q_a's rows are whole blocks (pad_rows:
  // one cuBLASLt GEMM); qkv_a_rows counts them (the GEMM's output width).
  DeviceMatrix qkv_a;
  int64_t qkv_a_rows = 0;
  const float *q_a_norm = nullptr, *kv_a_norm = nullptr, *w_uk_t = nullptr, *w_uv = nullptr;
  // The bf16 mode: the same two rounded to bf16 once at load (the bf16
  // absorbed products' weights, CudaModelOptions::bf16_absorbed_min_rows);
  // null in the float32 mode.
  const uint16_t *w_uk_t_bf16 = nullptr, *w_uv_bf16 = nullptr;
  bool has_indexer = false;
  DeviceMatrix wq_b, wk, weights_proj;
  const float *k_norm_weight = nullptr, *k_norm_bias = nullptr;
  bool is_moe = false;
  DeviceMlp dense;
  const float* router = nullptr;  // [E, H]
  const float* bias = nullptr;    // [E]
  std::vector<DeviceMlp> experts;
  DeviceMlp shared;
  // The routed experts stacked for the grouped device dispatch
  // (kernels/cuda/moe): [E, 2I, H] and [E, H, I] in the mode's precision, or
  // as shipped for fp8 checkpoint experts (e4m3 bytes, `scale` then the
  // stacked block scales [E, scale rows, ceil(in / 128)] and scale_split each
  // expert's); experts[e] are views into them (no second copy). Null when
  // the experts are not stacked (shapes or kinds differ between experts):
  // moe() then takes the host dispatch.
  DeviceMatrix experts_gate_up, experts_down;
};

class CudaWeights {
 public:
  // Synchronous upload; throws a clear Error when the device is out of memory.
  CudaWeights(const DsaWeights& host, bool bf16);
  // The fp8-native load (model/cuda/weights_checkpoint.cpp): every tensor is read
  // from `checkpoint` and uploaded one at a time, so the host never holds the
  // model. fp8 matrices stay as shipped (e4m3 + 128x128 block scales, used by
  // the fp8 GEMM); other matrices go up as bf16 (`bf16`) or float32; norms,
  // router, embedding float32 as in the other constructor. kv_b_proj is
  // dequantised on the host one layer at a time ([Nh (Dn + Dv), L], small)
  // into the float32 W_UK^T / W_UV. Checks names, shapes, scale shapes and
  // unexpected tensors like load_dsa_weights.
  CudaWeights(const ModelConfig& config, const Checkpoint& checkpoint, bool bf16);
  // The same from any MatrixSource (random fp8 weights for benchmarks), in
  // the shapes of `plan`: a rank of a parallel group asks for its heads,
  // widths and experts (plan.first_expert ..), which a share source cuts
  // (model/cuda/checkpoint_shares.h); plan_model(config) is the whole model.
  CudaWeights(const ModelConfig& config, MatrixSource& source, bool bf16, const ModelPlan& plan);

  const float* embed = nullptr;       // [V, H]
  const float* final_norm = nullptr;  // [H]
  DeviceMatrix lm_head;               // [V, H]
  std::vector<DeviceLayer> layers;
  size_t bytes() const { return bytes_; }
  // Bytes of the GEMM weights alone (what a decode step streams per layer use).
  size_t matrix_bytes() const { return matrix_bytes_; }
  // The fp8 matrices alone: their e4m3 bytes plus float32 scales, and their
  // parameter count (bytes / parameters is 1 + 4 / 128^2: no upcast copy).
  size_t fp8_bytes() const { return fp8_bytes_; }
  int64_t fp8_parameters() const { return fp8_parameters_; }

  // Uploads owned by this object (also used for the MTP layer's weights,
  // which live beside the target's): float32 tensors, GEMM matrices in the
  // mode's precision, a whole decoder layer.
  const float* upload(const Tensor& tensor);
  DeviceMatrix upload_matrix(const Tensor& tensor);
  DeviceLayer upload_layer(const LayerWeights& w);

 private:
  // `top` and `bottom` stacked by rows into one allocation (`stacked`), with
  // views of each (`first`, `second`; fp8 scale pointers adjusted); each
  // alone, and `stacked` empty, when only one of them is fp8. fp8 stacks
  // are padded with zero rows to whole 128-row blocks when top's rows are
  // whole blocks (pad_rows). Returns the stacked rows, padding included (0
  // when not stacked).
  int64_t upload_stacked(const CheckpointMatrix& top, const CheckpointMatrix& bottom,
                         DeviceMatrix& stacked, DeviceMatrix& first, DeviceMatrix& second);
  // A host float32 tensor rounded to bf16 (nearest even) and uploaded.
  const uint16_t* upload_bf16(const Tensor& tensor);
  // The absorbed W_UK^T / W_UV (float32) and, in the bf16 mode, their bf16 copies.
  void upload_absorbed(const Tensor& w_uk_t, const Tensor& w_uv, DeviceLayer& d);
  DeviceMlp upload(const MlpWeights& mlp);
  DeviceMatrix upload_matrix(const CheckpointMatrix& matrix);
  DeviceMlp upload_mlp(MatrixSource& source, const std::string& prefix, int64_t hidden,
                       int64_t intermediate);
  DeviceLayer upload_checkpoint_layer(const ModelConfig& config, MatrixSource& source,
                                      const ModelPlan& plan, const LayerPlan& layer);
  // The routed experts first .. first + experts - 1 of a checkpoint layer
  // (`prefix` "model.layers.N.mlp.") stacked into d.experts_gate_up /
  // d.experts_down with d.experts as views (d.experts[e - first]), one expert
  // read from `source` at a time (model/cuda/weights_checkpoint.cpp).
  void upload_checkpoint_experts(MatrixSource& source, const std::string& prefix, int64_t first,
                                 int64_t experts, int64_t hidden, int64_t intermediate,
                                 DeviceLayer& d);
  // One stacked slot: an fp8 matrix's bytes and scales (accounted as
  // upload_matrix(CheckpointMatrix) does), else its float32 values in the
  // mode's precision.
  void copy_checkpoint_matrix(const CheckpointMatrix& matrix, void* values, float* scales);
  void* upload_bytes(const void* data, size_t bytes);
  // Uninitialised device bytes owned by this object (out-of-memory checked).
  void* reserve_bytes(size_t bytes);
  // A host float32 matrix into `device` in the mode's precision.
  void copy_matrix(const Tensor& tensor, void* device);
  // d.experts as views into d.experts_gate_up / d.experts_down when every
  // expert has the same shapes, else one upload per expert.
  void upload_experts(const std::vector<MlpWeights>& experts, DeviceLayer& d);
  std::vector<DeviceBuffer> storage_;
  size_t bytes_ = 0;
  size_t matrix_bytes_ = 0;
  size_t fp8_bytes_ = 0;
  int64_t fp8_parameters_ = 0;
  bool bf16_ = false;
};

}  // namespace megactx::cuda
