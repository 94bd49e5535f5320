// Backend: the operations the host forward pass (DsaModel) calls, on host
// float32 row-major pointers: the CPU backend runs OpenBLAS + the thread pool,
// the reference backend plain fp32 loops (the oracle the fast kernels are
// tested against). The GPU runs its own LanguageModel (model/cuda/cuda_model.h
// says why); both read the same ModelPlan (model/model_plan.h).
#pragma once

#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace megactx {

struct RouterParams {
  int64_t num_experts = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t top_k = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

struct IndexerTopkOp {
  const float* q = nullptr;          // [queries, heads, dim] (rope applied)
  const float* weights = nullptr;    // [queries, heads], times heads^-0.5
  const float* keys = nullptr;       // [keys_count, dim]
  const int64_t* visible = nullptr;  // [queries]: query i sees keys [0, visible[i])
  int64_t queries = 0, heads = 0, dim = 0, keys_count = 0, topk = 0;
  float scale = 1.0f;          // dim^-0.5
  int32_t* indices = nullptr;  // [queries, topk] out, increasing, tail -1
  int64_t* counts = nullptr;   // [queries] out
  // The indexer split over ranks (ModelPlan::indexer_split), in two calls:
  // with scores_out, only the scores over these heads, [queries, keys_count]
  // (0 past visible[i]), and no top-k; with scores_in (the group's sums, the
  // same layout), only their top-k (q, weights and keys unused).
  float* scores_out = nullptr;
  const float* scores_in = nullptr;
};

struct MlaAttentionOp {
  const float* q_latent = nullptr;   // [queries, heads, kv_lora]
  const float* q_rope = nullptr;     // [queries, heads, rope]
  const float* latents = nullptr;    // [rows, kv_lora + rope]
  const int32_t* indices = nullptr;  // [queries, index_stride]
  const int64_t* counts = nullptr;   // [queries]
  int64_t index_stride = 0, queries = 0, heads = 0, kv_lora = 0, rope = 0;
  float scale = 1.0f;
  float* out = nullptr;  // [queries, heads, kv_lora]
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;

  // y[rows, out] (row stride y_stride) = x[rows, in] (row stride x_stride) . w[out, in]^T
  virtual void linear(const float* x, int64_t rows, int64_t in, int64_t x_stride, const float* w,
                      int64_t out, float* y, int64_t y_stride) = 0;
  void linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y) {
    linear(x, rows, in, in, w, out, y, out);
  }
  virtual void rmsnorm(const float* x, int64_t rows, int64_t n, int64_t x_stride,
                       const float* weight, float eps, float* y, int64_t y_stride) = 0;
  virtual void layernorm(const float* x, int64_t rows, int64_t n, const float* weight,
                         const float* bias, float eps, float* y) = 0;
  // out[rows, n] = silu(gate) * up; gate/up rows have stride `stride`.
  virtual void silu_mul(const float* gate, const float* up, int64_t rows, int64_t n, int64_t stride,
                        float* out) = 0;
  // In place on x[rows, heads, ...]; cos/sin [rows, dim/2].
  virtual void rope(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride,
                    int64_t dim, const float* cos, const float* sin, bool interleaved) = 0;
  virtual void indexer_topk(const IndexerTopkOp& op) = 0;
  virtual void mla_attention(const MlaAttentionOp& op) = 0;
  // logits [rows, num_experts] -> ids [rows, top_k], weights [rows, top_k].
  virtual void moe_route(const float* logits, const float* bias, int64_t rows,
                         const RouterParams& params, int32_t* ids, float* weights) = 0;
};

// "cpu": OpenBLAS + thread pool; with `batch_invariant` (the deterministic
// mode) the GEMMs of kernels/cpu/batch_invariant_linear.h instead of OpenBLAS.
// "reference": plain loops.
std::unique_ptr<Backend> make_cpu_backend(bool batch_invariant = false);
std::unique_ptr<Backend> make_reference_backend();

}  // namespace megactx
