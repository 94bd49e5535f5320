#include "model/cuda_memory_plan.h"

#include <algorithm>

#include "core/error.h"

#if MEGACTX_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/common/cuda_check.h"
#endif

namespace megactx {

int64_t cuda_step_scratch_bytes(const ModelConfig& config, int64_t tokens, int64_t max_context,
                                int64_t logit_rows, int64_t index_topk) {
  const int64_t hidden = config.hidden_size;
  const int64_t heads = config.num_attention_heads;
  const int64_t qk = config.qk_nope_head_dim + config.qk_rope_head_dim;
  const int64_t lora = config.kv_lora_rank;
  const int64_t entry = lora + config.qk_rope_head_dim;
  const int64_t q_lora = config.q_lora_rank.value_or(0);
  const int64_t inter =
      std::max(config.intermediate_size,
               config.moe_intermediate_size * std::max<int64_t>(config.n_shared_experts, 1));
  const int64_t top_k = config.num_experts_per_tok;
  // Floats (or int32) per new token, buffer by buffer of CudaDsaModel::Scratch.
  int64_t per_token = 0;
  per_token += 3 * hidden;                                        // x, h, branch
  per_token += q_lora + heads * qk + entry;                       // q_resid, q, kv
  per_token += 2 * heads * lora + heads * config.v_head_dim;      // q_latent, o_latent, o
  per_token += config.index_n_heads * config.index_head_dim;      // indexer q
  per_token += 2 * config.index_head_dim + config.index_n_heads;  // k_raw, k, weights
  per_token += index_topk + 1;                                    // top-k, counts
  per_token += 3 * inter;                                         // gate_up, act
  per_token += config.n_routed_experts + 4 * top_k;  // router logits, ids, gates, dispatch
  per_token += 3 * hidden;                           // expert in / out, moe out
  per_token += 8 + config.qk_rope_head_dim;          // ids, positions, paging, cos, sin
  int64_t bytes = per_token * tokens * 4;
  bytes += tokens * max_context * 4;                       // indexer scores
  bytes += logit_rows * (hidden + config.vocab_size) * 4;  // normed rows, logits
  return bytes;
}

CudaMemoryPlan plan_cuda_memory(const ModelConfig& config, const CudaMemoryRequest& request) {
  MEGACTX_CHECK(request.budget_bytes > 0 && request.max_step_tokens > 0 &&
                    request.max_context > 0 && request.index_topk > 0,
                "CUDA memory plan: budget, step tokens, context and index_topk must be positive");
  CudaMemoryPlan plan;
  plan.weight_bytes = request.weight_bytes;
  plan.scratch_bytes =
      cuda_step_scratch_bytes(config, request.max_step_tokens, request.max_context,
                              std::max<int64_t>(request.max_logit_rows, 1), request.index_topk);
  plan.kv_bytes_per_page = request.kv.bytes_per_page();
  const int64_t fixed = plan.weight_bytes + plan.scratch_bytes;
  MEGACTX_CHECK(fixed < request.budget_bytes,
                "CUDA model does not fit: weights {} MiB + step scratch {} MiB ({} tokens, context "
                "{}) exceed the {} MiB budget",
                plan.weight_bytes >> 20, plan.scratch_bytes >> 20, request.max_step_tokens,
                request.max_context, request.budget_bytes >> 20);
  MEGACTX_CHECK(plan.kv_bytes_per_page > 0, "CUDA memory plan: KV spec has no pools");
  plan.kv_pages = (request.budget_bytes - fixed) / plan.kv_bytes_per_page;
  const int64_t pages_needed =
      (request.max_context + request.kv.page_size - 1) / request.kv.page_size;
  MEGACTX_CHECK(plan.kv_pages >= pages_needed,
                "CUDA model: {} MiB left after weights and scratch hold {} KV pages, one sequence "
                "of {} tokens needs {}",
                (request.budget_bytes - fixed) >> 20, plan.kv_pages, request.max_context,
                pages_needed);
  return plan;
}

DeviceMemoryInfo query_device_memory(int device_ordinal) {
#if MEGACTX_HAVE_CUDA
  int devices = 0;
  MEGACTX_CUDA_CHECK(cudaGetDeviceCount(&devices));
  MEGACTX_CHECK(device_ordinal >= 0 && device_ordinal < devices,
                "CUDA device {} requested, {} present", device_ordinal, devices);
  MEGACTX_CUDA_CHECK(cudaSetDevice(device_ordinal));
  MEGACTX_CUDA_CHECK(cudaFree(nullptr));  // creates the context before measuring
  size_t free_bytes = 0, total_bytes = 0;
  MEGACTX_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
#else
  fail("device {}: this build has no CUDA backend (configure with -DMEGACTX_CUDA=ON)",
       device_ordinal);
#endif
}

}  // namespace megactx
