// Device copies of DsaWeights (float32 in the parity mode): the same
// structure with device pointers, owned by one CudaWeights. nullptr where the
// host tensor is absent (no q_lora, no indexer on a shared layer).
#pragma once

#include <vector>

#include "model/cuda_buffer.h"
#include "model/dsa_weights.h"

namespace megactx::cuda {

struct DeviceMlp {
  const float* gate_up = nullptr;  // [2I, H]
  const float* down = nullptr;     // [H, I]
  int64_t intermediate = 0;
};

struct DeviceLayer {
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  // Attention (shapes as AttentionWeights).
  const float *q_a = nullptr, *q_a_norm = nullptr, *q_b = nullptr, *kv_a = nullptr,
              *kv_a_norm = nullptr, *w_uk_t = nullptr, *w_uv = nullptr, *o = nullptr;
  bool has_indexer = false;
  const float *wq_b = nullptr, *wk = nullptr, *k_norm_weight = nullptr, *k_norm_bias = nullptr,
              *weights_proj = nullptr;
  bool is_moe = false;
  DeviceMlp dense;
  const float* router = nullptr;  // [E, H]
  const float* bias = nullptr;    // [E]
  std::vector<DeviceMlp> experts;
  DeviceMlp shared;
};

class CudaWeights {
 public:
  // Synchronous upload; throws a clear Error when the device is out of memory.
  explicit CudaWeights(const DsaWeights& host);

  const float* embed = nullptr;       // [V, H]
  const float* final_norm = nullptr;  // [H]
  const float* lm_head = nullptr;     // [V, H]
  std::vector<DeviceLayer> layers;
  size_t bytes() const { return bytes_; }

 private:
  const float* upload(const Tensor& tensor);
  DeviceMlp upload(const MlpWeights& mlp);
  std::vector<DeviceBuffer> storage_;
  size_t bytes_ = 0;
};

}  // namespace megactx::cuda
