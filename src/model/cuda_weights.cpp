#if MEGACTX_HAVE_CUDA
#include "model/cuda_weights.h"

#include "core/error.h"

namespace megactx::cuda {

const float* CudaWeights::upload(const Tensor& tensor) {
  if (!tensor.defined() || tensor.numel() == 0) return nullptr;
  MEGACTX_CHECK(tensor.dtype() == DType::F32 && tensor.device() == Device::CPU,
                "CUDA model: weights must be host float32");
  const size_t bytes = static_cast<size_t>(tensor.numel()) * sizeof(float);
  size_t free_bytes = 0, total_bytes = 0;
  MEGACTX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  MEGACTX_CHECK(bytes <= free_bytes,
                "CUDA model: out of device memory uploading weights ({} MiB so far, {} MiB more "
                "needed, {} MiB free); fp32 parity mode needs the whole model in float32",
                bytes_ >> 20, bytes >> 20, free_bytes >> 20);
  DeviceBuffer buffer(bytes);
  MEGACTX_CUDA_CHECK(
      cudaMemcpy(buffer.as<void>(), tensor.data<float>(), bytes, cudaMemcpyHostToDevice));
  bytes_ += bytes;
  storage_.push_back(std::move(buffer));
  return storage_.back().as<const float>();
}

DeviceMlp CudaWeights::upload(const MlpWeights& mlp) {
  return {upload(mlp.gate_up), upload(mlp.down), mlp.intermediate};
}

CudaWeights::CudaWeights(const DsaWeights& host) {
  embed = upload(host.embed);
  final_norm = upload(host.final_norm);
  lm_head = upload(host.lm_head);
  for (const LayerWeights& w : host.layers) {
    DeviceLayer d;
    d.input_norm = upload(w.input_norm);
    d.post_norm = upload(w.post_norm);
    const AttentionWeights& a = w.attention;
    d.q_a = upload(a.q_a);
    d.q_a_norm = upload(a.q_a_norm);
    d.q_b = upload(a.q_b);
    d.kv_a = upload(a.kv_a);
    d.kv_a_norm = upload(a.kv_a_norm);
    d.w_uk_t = upload(a.w_uk_t);
    d.w_uv = upload(a.w_uv);
    d.o = upload(a.o);
    d.has_indexer = a.has_indexer;
    if (a.has_indexer) {
      d.wq_b = upload(a.indexer.wq_b);
      d.wk = upload(a.indexer.wk);
      d.k_norm_weight = upload(a.indexer.k_norm_weight);
      d.k_norm_bias = upload(a.indexer.k_norm_bias);
      d.weights_proj = upload(a.indexer.weights_proj);
    }
    d.is_moe = w.is_moe;
    if (w.is_moe) {
      d.router = upload(w.moe.router);
      d.bias = upload(w.moe.bias);
      for (const MlpWeights& e : w.moe.experts) d.experts.push_back(upload(e));
      d.shared = upload(w.moe.shared);
    } else {
      d.dense = upload(w.dense);
    }
    layers.push_back(std::move(d));
  }
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
