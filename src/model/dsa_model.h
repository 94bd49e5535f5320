// DsaModel: the forward pass shared by glm_moe_dsa and deepseek_v32 (MLA with
// q-LoRA and a latent KV cache, the DSA indexer with IndexShare, dense SwiGLU
// and group-limited sigmoid MoE), over the PagedKvCache, on a Backend.
// The architecture files (glm_moe_dsa.cpp, deepseek_v32.cpp) check what is
// specific to each and build it.
#pragma once

#include <memory>
#include <optional>

#include "model/backend.h"
#include "model/dsa_weights.h"
#include "model/language_model.h"
#include "model/rope.h"

namespace megactx {

struct DsaModelOptions {
  // Replaces config.index_topk (tests: a value >= the context attends densely).
  std::optional<int64_t> index_topk_override;
};

class DsaModel final : public LanguageModel {
 public:
  DsaModel(ModelConfig config, DsaWeights weights, std::unique_ptr<Backend> backend,
           DsaModelOptions options);

  const ModelConfig& config() const override { return config_; }
  Device device() const override { return backend_->device(); }
  ForwardOutput forward(const ForwardBatch& batch, PagedKvCache& cache) override;

  int64_t index_topk() const { return index_topk_; }

 private:
  struct Step;  // per-forward token bookkeeping and scratch (dsa_model.cpp)

  void check_batch(const ForwardBatch& batch, const PagedKvCache& cache) const;
  void attention(int64_t layer, const float* h, Step& step, PagedKvCache& cache, float* out);
  void indexer(int64_t layer, const float* h, const float* q_resid, Step& step,
               PagedKvCache& cache);
  void mlp(const MlpWeights& w, const float* h, int64_t rows, float* out);
  void moe(const MoeWeights& w, const float* h, int64_t rows, float* out);

  ModelConfig config_;
  DsaWeights weights_;
  std::unique_ptr<Backend> backend_;
  RopeTable rope_;
  float softmax_scale_ = 1.0f;
  int64_t index_topk_ = 0;
};

}  // namespace megactx
