#if MEGACTX_HAVE_CUDA
#include "model/cuda/weights.h"

#include <cstdlib>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8_blocks.h"
#include "kernels/cuda/common/cuda_check.h"

namespace megactx::cuda {

void* CudaWeights::upload_bytes(const void* data, size_t bytes) {
  size_t free_bytes = 0, total_bytes = 0;
  MEGACTX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  MEGACTX_CHECK(bytes <= free_bytes,
                "CUDA model: out of device memory uploading weights ({} MiB so far, {} MiB more "
                "needed, {} MiB free)",
                bytes_ >> 20, bytes >> 20, free_bytes >> 20);
  DeviceBuffer buffer(bytes);
  MEGACTX_CUDA_CHECK(cudaMemcpy(buffer.as<void>(), data, bytes, cudaMemcpyHostToDevice));
  bytes_ += bytes;
  storage_.push_back(std::move(buffer));
  return storage_.back().as<void>();
}

const float* CudaWeights::upload(const Tensor& tensor) {
  if (!tensor.defined() || tensor.numel() == 0) return nullptr;
  MEGACTX_CHECK(tensor.dtype() == DType::F32 && tensor.device() == Device::CPU,
                "CUDA model: weights must be host float32");
  return static_cast<const float*>(
      upload_bytes(tensor.data<float>(), static_cast<size_t>(tensor.numel()) * sizeof(float)));
}

DeviceMatrix CudaWeights::upload_matrix(const Tensor& tensor) {
  if (!tensor.defined() || tensor.numel() == 0) return {};
  if (!bf16_) {
    const float* data = upload(tensor);
    matrix_bytes_ += static_cast<size_t>(tensor.numel()) * sizeof(float);
    return {data, false};
  }
  matrix_bytes_ += static_cast<size_t>(tensor.numel()) * 2;
  return {upload_bf16(tensor), true};
}

const uint16_t* CudaWeights::upload_bf16(const Tensor& tensor) {
  MEGACTX_CHECK(tensor.dtype() == DType::F32 && tensor.device() == Device::CPU,
                "CUDA model: weights must be host float32");
  // Round to nearest even on the host (a bf16 checkpoint round-trips exactly).
  const float* values = tensor.data<float>();
  std::vector<uint16_t> bits(static_cast<size_t>(tensor.numel()));
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16(values[i]);
  return static_cast<const uint16_t*>(upload_bytes(bits.data(), bits.size() * 2));
}

int64_t CudaWeights::upload_stacked(const CheckpointMatrix& top, const CheckpointMatrix& bottom,
                                    DeviceMatrix& stacked, DeviceMatrix& first,
                                    DeviceMatrix& second) {
  if (top.fp8() != bottom.fp8()) {  // stack_rows would dequantise the fp8 one
    first = upload_matrix(top);
    second = upload_matrix(bottom);
    stacked = {};
    return 0;
  }
  CheckpointMatrix both = stack_rows(top, bottom);
  const int64_t whole = (both.rows() + kFp8WeightBlock - 1) / kFp8WeightBlock * kFp8WeightBlock;
  // MEGACTX_CUDA_PAD_STACKED=0: no padding (A/B runs).
  static const bool pad = [] {
    const char* value = std::getenv("MEGACTX_CUDA_PAD_STACKED");
    return !(value != nullptr && value[0] == '0');
  }();
  if (pad && both.fp8() && top.rows() % kFp8WeightBlock == 0 && whole != both.rows())
    both = pad_rows(both, whole);
  const int64_t rows = both.rows();
  stacked = upload_matrix(both);
  const int64_t element = top.fp8() ? 1 : (bf16_ ? 2 : 4);
  first = stacked;
  first.scale_split = 0;  // its rows are all before the split
  second = stacked;
  second.scale_split = 0;
  second.data = static_cast<const char*>(stacked.data) + top.rows() * top.cols() * element;
  if (top.fp8()) {
    // Bottom's scale rows follow top's ceil(rows / 128) (stack_rows).
    second.scale = stacked.scale + (top.rows() + 127) / 128 * ((top.cols() + 127) / 128);
  }
  return rows;
}

void CudaWeights::upload_absorbed(const Tensor& w_uk_t, const Tensor& w_uv, DeviceLayer& d) {
  d.w_uk_t = upload(w_uk_t);
  d.w_uv = upload(w_uv);
  if (!bf16_ || d.w_uk_t == nullptr) return;
  // Not GEMM matrices of the read-per-step count (matrix_bytes): a step
  // reads one of the two copies.
  d.w_uk_t_bf16 = upload_bf16(w_uk_t);
  d.w_uv_bf16 = upload_bf16(w_uv);
}

void* CudaWeights::reserve_bytes(size_t bytes) {
  size_t free_bytes = 0, total_bytes = 0;
  MEGACTX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  MEGACTX_CHECK(bytes <= free_bytes,
                "CUDA model: out of device memory uploading weights ({} MiB so far, {} MiB more "
                "needed, {} MiB free)",
                bytes_ >> 20, bytes >> 20, free_bytes >> 20);
  storage_.emplace_back(bytes);
  bytes_ += bytes;
  return storage_.back().as<void>();
}

void CudaWeights::copy_matrix(const Tensor& tensor, void* device) {
  MEGACTX_CHECK(tensor.dtype() == DType::F32 && tensor.device() == Device::CPU,
                "CUDA model: weights must be host float32");
  const float* values = tensor.data<float>();
  const size_t count = static_cast<size_t>(tensor.numel());
  if (!bf16_) {
    MEGACTX_CUDA_CHECK(cudaMemcpy(device, values, count * 4, cudaMemcpyHostToDevice));
  } else {
    // As upload_matrix: round to nearest even on the host.
    std::vector<uint16_t> bits(count);
    for (size_t i = 0; i < count; ++i) bits[i] = float_to_bf16(values[i]);
    MEGACTX_CUDA_CHECK(cudaMemcpy(device, bits.data(), count * 2, cudaMemcpyHostToDevice));
  }
  matrix_bytes_ += count * (bf16_ ? 2 : 4);
}

void CudaWeights::upload_experts(const std::vector<MlpWeights>& experts, DeviceLayer& d) {
  bool uniform = !experts.empty();
  for (const MlpWeights& e : experts) {
    uniform = uniform && e.gate_up.numel() > 0 && e.down.numel() > 0 &&
              e.gate_up.shape() == experts[0].gate_up.shape() &&
              e.down.shape() == experts[0].down.shape() &&
              e.intermediate == experts[0].intermediate;
  }
  if (!uniform) {
    for (const MlpWeights& e : experts) d.experts.push_back(upload(e));
    return;
  }
  // One allocation per matrix kind, expert e at e * (elements per expert).
  const size_t element = bf16_ ? 2 : 4;
  const size_t gate_up_bytes = static_cast<size_t>(experts[0].gate_up.numel()) * element;
  const size_t down_bytes = static_cast<size_t>(experts[0].down.numel()) * element;
  auto* gate_up = static_cast<char*>(reserve_bytes(gate_up_bytes * experts.size()));
  auto* down = static_cast<char*>(reserve_bytes(down_bytes * experts.size()));
  d.experts_gate_up.data = gate_up;
  d.experts_gate_up.bf16 = bf16_;
  d.experts_down.data = down;
  d.experts_down.bf16 = bf16_;
  for (size_t e = 0; e < experts.size(); ++e) {
    DeviceMlp view;
    view.gate_up.data = gate_up + e * gate_up_bytes;
    view.gate_up.bf16 = bf16_;
    view.down.data = down + e * down_bytes;
    view.down.bf16 = bf16_;
    view.intermediate = experts[e].intermediate;
    copy_matrix(experts[e].gate_up, gate_up + e * gate_up_bytes);
    copy_matrix(experts[e].down, down + e * down_bytes);
    d.experts.push_back(view);
  }
}

DeviceMlp CudaWeights::upload(const MlpWeights& mlp) {
  return {upload_matrix(mlp.gate_up), upload_matrix(mlp.down), mlp.intermediate};
}

CudaWeights::CudaWeights(const DsaWeights& host, bool bf16) : bf16_(bf16) {
  embed = upload(host.embed);
  final_norm = upload(host.final_norm);
  lm_head = upload_matrix(host.lm_head);
  for (const LayerWeights& w : host.layers) layers.push_back(upload_layer(w));
}

DeviceLayer CudaWeights::upload_layer(const LayerWeights& w) {
  DeviceLayer d;
  d.input_norm = upload(w.input_norm);
  d.post_norm = upload(w.post_norm);
  const AttentionWeights& a = w.attention;
  if (a.q_a.defined() && a.q_a.numel() > 0) {
    d.qkv_a_rows = upload_stacked(CheckpointMatrix{a.q_a, {}, 0}, CheckpointMatrix{a.kv_a, {}, 0},
                                  d.qkv_a, d.q_a, d.kv_a);
  } else {
    d.kv_a = upload_matrix(a.kv_a);
  }
  d.q_a_norm = upload(a.q_a_norm);
  d.q_b = upload_matrix(a.q_b);
  d.kv_a_norm = upload(a.kv_a_norm);
  upload_absorbed(a.w_uk_t, a.w_uv, d);
  d.o = upload_matrix(a.o);
  d.has_indexer = a.has_indexer;
  if (a.has_indexer) {
    d.wq_b = upload_matrix(a.indexer.wq_b);
    d.wk = upload_matrix(a.indexer.wk);
    d.k_norm_weight = upload(a.indexer.k_norm_weight);
    d.k_norm_bias = upload(a.indexer.k_norm_bias);
    d.weights_proj = upload_matrix(a.indexer.weights_proj);
  }
  d.is_moe = w.is_moe;
  if (w.is_moe) {
    d.router = upload(w.moe.router);
    d.bias = upload(w.moe.bias);
    upload_experts(w.moe.experts, d);
    d.shared = upload(w.moe.shared);
  } else {
    d.dense = upload(w.dense);
  }
  return d;
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
