// CudaDsaModel: DsaModel's forward pass on the GPU (see model/cuda_model.h for
// why it is its own LanguageModel). Internal to the CUDA build: included only
// by the cuda_dsa_*.cpp files.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "kernels/cuda/dense/dsa_fallback.h"
#include "kernels/cuda/gemm/gemm.h"
#include "model/cuda_buffer.h"
#include "model/cuda_model.h"
#include "model/cuda_phase_timer.h"
#include "model/cuda_weights.h"
#include "model/rope.h"

namespace megactx::cuda {

class CudaDsaModel final : public LanguageModel {
 public:
  CudaDsaModel(const DsaModel& host, const CudaModelOptions& options);
  ~CudaDsaModel() override;

  const ModelConfig& config() const override { return config_; }
  Device device() const override { return Device::CUDA; }
  ForwardOutput forward(const ForwardBatch& batch, PagedKvCache& cache) override;

 private:
  // Per-forward device views: the batch's tokens, paging and RoPE tables.
  struct Step {
    int64_t tokens = 0;
    int64_t max_context = 0;     // largest start + count of the batch
    PagedRows rows;              // device pointers
    const float* cos = nullptr;  // [tokens, rope / 2]
    const float* sin = nullptr;
    CacheLayout latent, indexer;  // per-token entry layouts of the two pools
    int32_t* topk = nullptr;      // [tokens, index_topk]: the latest full layer's selection
    int32_t* counts = nullptr;    // [tokens]
  };
  // Scratch reused across steps (grow-only).
  struct Scratch {
    DeviceBuffer ids, positions, table_offset, page_tables, cos, sin, logit_rows;
    DeviceBuffer x, h, branch, normed, logits;
    DeviceBuffer q_resid, q, kv, q_latent, o_latent, o;
    DeviceBuffer iq, k_raw, k, iw, scores, topk, counts;
    DeviceBuffer gate_up, act, router_logits, route_ids, route_gates;
    DeviceBuffer expert_rows, expert_gates, expert_in, expert_out, moe_out;
  };

  void check_batch(const ForwardBatch& batch, const PagedKvCache& cache) const;
  void decoder_layer(const DeviceLayer& w, int64_t layer, Step& step, PagedKvCache& cache,
                     float* x);
  void attention(const DeviceLayer& w, int64_t layer, const float* h, Step& step,
                 PagedKvCache& cache, float* out);
  void indexer(const DeviceLayer& w, int64_t layer, const float* h, const float* q_resid,
               Step& step, PagedKvCache& cache);
  // out[rows, H] = down(silu(gate(h)) * up(h)); uses scratch gate_up/act.
  void mlp(const DeviceMlp& w, const float* h, int64_t rows, float* out);
  void moe(const DeviceLayer& w, const float* h, int64_t rows, float* out);

  ModelConfig config_;
  CudaModelOptions options_;
  int64_t index_topk_ = 0;
  RopeTable rope_;
  float softmax_scale_ = 1.0f;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Blas> blas_;
  std::unique_ptr<CudaWeights> weights_;
  Scratch scratch_;
  PhaseTimer timer_;  // MEGACTX_CUDA_PHASE_TIMES=1
  double forward_wall_ms_ = 0.0;
};

}  // namespace megactx::cuda
