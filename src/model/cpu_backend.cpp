// The CPU backend (OpenBLAS + thread pool) and the reference backend (plain
// fp32 loops), both behind model/backend.h.
#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/cpu/batch_invariant_linear.h"
#include "kernels/cpu/dense_ops.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/reference/dense_ops.h"
#include "kernels/reference/sparse_attention.h"
#include "model/backend.h"

namespace megactx {
namespace {

reference::RouterSpec router_spec(const RouterParams& p) {
  return {p.num_experts, p.n_group,        p.topk_group,
          p.top_k,       p.norm_topk_prob, p.routed_scaling_factor};
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(bool batch_invariant) : batch_invariant_(batch_invariant) {}
  Device device() const override { return Device::CPU; }
  const char* name() const override { return batch_invariant_ ? "cpu-deterministic" : "cpu"; }
  // The GEMMs are the only batch-dependent operation of the CPU forward: norms,
  // RoPE, the indexer, top-k and attention work per row in a fixed order, and
  // the MoE sums a token's experts in expert order.
  void linear(const float* x, int64_t rows, int64_t in, int64_t x_stride, const float* w,
              int64_t out, float* y, int64_t y_stride) override {
    if (batch_invariant_) {
      cpu::linear_batch_invariant(x, rows, in, x_stride, w, out, y, y_stride);
    } else {
      cpu::linear_strided(x, rows, in, x_stride, w, out, y, y_stride);
    }
  }
  void rmsnorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* weight,
               float eps, float* y, int64_t y_stride) override {
    cpu::rmsnorm(x, rows, n, x_stride, weight, eps, y, y_stride);
  }
  void layernorm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias,
                 float eps, float* y) override {
    cpu::layernorm(x, rows, n, weight, bias, eps, y);
  }
  void silu_mul(const float* gate, const float* up, int64_t rows, int64_t n, int64_t stride,
                float* out) override {
    cpu::silu_mul(gate, up, rows, n, stride, out);
  }
  void rope(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride,
            int64_t dim, const float* cos, const float* sin, bool interleaved) override {
    cpu::rope(x, rows, heads, row_stride, head_stride, dim, cos, sin, interleaved);
  }
  void indexer_topk(const IndexerTopkOp& op) override {
    cpu::indexer_topk({op.q, op.weights, op.keys, op.visible, op.queries, op.heads, op.dim,
                       op.keys_count, op.topk, op.scale, op.indices, op.counts, op.scores_out,
                       op.scores_in});
  }
  void mla_attention(const MlaAttentionOp& op) override {
    cpu::mla_attention({op.q_latent, op.q_rope, op.latents, op.indices, op.counts, op.index_stride,
                        op.queries, op.heads, op.kv_lora, op.rope, op.scale, op.out});
  }
  void moe_route(const float* logits, const float* bias, int64_t rows, const RouterParams& params,
                 int32_t* ids, float* weights) override {
    for (int64_t r = 0; r < rows; ++r) {
      reference::moe_route(logits + r * params.num_experts, bias, router_spec(params),
                           ids + r * params.top_k, weights + r * params.top_k);
    }
  }

 private:
  bool batch_invariant_ = false;
};

class ReferenceBackend final : public Backend {
 public:
  Device device() const override { return Device::CPU; }
  const char* name() const override { return "reference"; }
  void linear(const float* x, int64_t rows, int64_t in, int64_t x_stride, const float* w,
              int64_t out, float* y, int64_t y_stride) override {
    for (int64_t r = 0; r < rows; ++r) {
      reference::linear(x + r * x_stride, 1, in, w, out, y + r * y_stride);
    }
  }
  void rmsnorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* weight,
               float eps, float* y, int64_t y_stride) override {
    reference::rmsnorm(x, rows, n, x_stride, weight, eps, y, y_stride);
  }
  void layernorm(const float* x, int64_t rows, int64_t n, const float* weight, const float* bias,
                 float eps, float* y) override {
    reference::layernorm(x, rows, n, weight, bias, eps, y);
  }
  void silu_mul(const float* gate, const float* up, int64_t rows, int64_t n, int64_t stride,
                float* out) override {
    reference::silu_mul(gate, up, rows, n, stride, out);
  }
  void rope(float* x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride,
            int64_t dim, const float* cos, const float* sin, bool interleaved) override {
    reference::rope(x, rows, heads, row_stride, head_stride, dim, cos, sin, interleaved);
  }
  void indexer_topk(const IndexerTopkOp& op) override {
    std::vector<float> scores;
    for (int64_t i = 0; i < op.queries; ++i) {
      const int64_t n = op.visible[i];
      scores.resize(static_cast<size_t>(n));
      if (op.scores_in != nullptr) {
        std::copy_n(op.scores_in + i * op.keys_count, n, scores.begin());
      } else {
        reference::indexer_scores(op.q + i * op.heads * op.dim, op.weights + i * op.heads, op.heads,
                                  op.dim, op.keys, n, op.scale, scores.data());
      }
      if (op.scores_out != nullptr) {
        std::copy(scores.begin(), scores.end(), op.scores_out + i * op.keys_count);
        std::fill(op.scores_out + i * op.keys_count + n, op.scores_out + (i + 1) * op.keys_count,
                  0.0f);
        continue;
      }
      int32_t* out = op.indices + i * op.topk;
      const int64_t count = reference::topk_indices(scores.data(), n, op.topk, out);
      for (int64_t j = count; j < op.topk; ++j) out[j] = -1;
      op.counts[i] = count;
    }
  }
  void mla_attention(const MlaAttentionOp& op) override {
    const int64_t width = op.heads * op.kv_lora;
    for (int64_t i = 0; i < op.queries; ++i) {
      reference::mla_attention(op.q_latent + i * width, op.q_rope + i * op.heads * op.rope,
                               op.heads, op.kv_lora, op.rope, op.latents,
                               op.indices + i * op.index_stride, op.counts[i], op.scale,
                               op.out + i * width);
    }
  }
  void moe_route(const float* logits, const float* bias, int64_t rows, const RouterParams& params,
                 int32_t* ids, float* weights) override {
    for (int64_t r = 0; r < rows; ++r) {
      reference::moe_route(logits + r * params.num_experts, bias, router_spec(params),
                           ids + r * params.top_k, weights + r * params.top_k);
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(bool batch_invariant) {
  return std::make_unique<CpuBackend>(batch_invariant);
}
std::unique_ptr<Backend> make_reference_backend() {
  return std::make_unique<ReferenceBackend>();
}

}  // namespace megactx
