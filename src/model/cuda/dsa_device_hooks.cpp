// What the engine builds around the CUDA model (LanguageModel's device
// hooks): device pools, the pinned pools of the host tier and the page copies
// on the model's stream, the MTP layer on the device, host copies of logits,
// the final norm of host hidden states.
#if MEGACTX_HAVE_CUDA
#include "model/cuda/cuda_dsa_model.h"

#include <vector>

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/reference/dense_ops.h"
#include "model/cuda/checkpoint_shares.h"
#include "model/cuda/fast_attention_plan.h"
#include "model/weight_source.h"

namespace megactx::cuda {

std::unique_ptr<PagedKvCache> CudaDsaModel::make_kv_cache(const KvCacheSpec& spec) const {
  // Offload pages' latents are read where the fp8 sparse MLA kernels read an
  // entry (SparseMlaParams::offload_pool); the fallback kernels have no such path.
  MEGACTX_CHECK(spec.offload_pages == 0 ||
                    (options_.fast_attention && spec.dtype == KvDType::FP8 &&
                     spec.page_size == kPageTokens && cuda_fast_attention_shapes(config_)),
                "the live host tier (--host-latent-memory) on CUDA needs the fp8 KV cache "
                "(--kv-dtype fp8) and the fp8 DSA kernels (GLM-5.x / DeepSeek-V3.2 attention "
                "shapes)");
  MEGACTX_CHECK(spec.offload_pages == 0 || !plan_.layer_split,
                "the live host tier (--host-latent-memory) with LayerSplit runs on the CPU only "
                "so far");
  reset_offload_hot();
  // LayerSplit: this rank's layers' pools only (model_plan.h: layer_split_spec).
  return make_cuda_kv_cache(
      plan_.layer_split ? layer_split_spec(plan_, spec, plan_.tensor_parallel_rank) : spec);
}

std::unique_ptr<PagedKvCache> CudaDsaModel::make_host_kv_cache(const KvCacheSpec& spec) const {
  return make_cuda_host_kv_cache(spec);
}

KvPageCopy CudaDsaModel::kv_page_copy() const {
  return make_cuda_kv_page_copy(*this);
}

std::unique_ptr<MtpLayer> CudaDsaModel::load_mtp_layer(const Checkpoint& checkpoint) {
  return make_cuda_mtp_layer(*this, checkpoint);
}

void CudaDsaModel::reload_weights(const Checkpoint& checkpoint) {
  check_same_architecture(config_, checkpoint.config());
  // The initial load's path (model_loader.cpp): straight from the checkpoint
  // (e4m3 kept as shipped), or float32 on the host first for the upcast of an
  // fp8 checkpoint.
  std::unique_ptr<CudaWeights> loaded;
  const bool share = plan_.tensor_parallel_size > 1 || plan_.expert_parallel_size > 1;
  if (options_.reads_checkpoint(config_.is_fp8_checkpoint())) {
    // A rank of a group reads its share (checkpoint_shares.h).
    const std::unique_ptr<MatrixSource> matrices = make_checkpoint_matrices(checkpoint);
    const std::unique_ptr<MatrixSource> source =
        share ? make_share_matrices(*matrices, config_, plan_) : nullptr;
    loaded = std::make_unique<CudaWeights>(config_, share ? *source : *matrices,
                                           options_.bf16_weights, plan_);
  } else {
    // The upcast of an fp8 checkpoint: float32 on the host (the whole
    // model's shapes, then a rank's share).
    auto source = make_checkpoint_weights(checkpoint);
    DsaWeights host = load_dsa_weights(config_, whole_model_plan(plan_), *source);
    if (share) host = parallel_shard(host, plan_);
    loaded = std::make_unique<CudaWeights>(host, options_.bf16_weights);
  }
  // Nothing may still read the old weights; graphs hold their addresses.
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  graphs_.clear();
  graphs_mtp_.clear();  // the MTP layer's graphs read its old weights too
  mtp_.reset();         // its weights lived in the old CudaWeights
  weights_ = std::move(loaded);
  host_final_norm_.clear();
}

void CudaDsaModel::release_weights() {
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  graphs_.clear();
  graphs_mtp_.clear();
  mtp_.reset();
  weights_.reset();
  host_final_norm_.clear();
}

void CudaDsaModel::final_norm(const float* x, int64_t rows, float* out) const {
  // Host rows (the forward copied its hidden states to the host): the norm's
  // weight comes down once per set of weights, the plain loop does the rest.
  MEGACTX_CHECK(weights_ != nullptr, "the model's weights are released");
  const int64_t hidden = config_.hidden_size;
  if (host_final_norm_.empty()) {
    host_final_norm_.resize(static_cast<size_t>(hidden));
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(host_final_norm_.data(), weights_->final_norm,
                                       host_final_norm_.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  reference::rmsnorm(x, rows, hidden, hidden, host_final_norm_.data(), plan_.rms_norm_eps, out,
                     hidden);
}

Tensor CudaDsaModel::to_host(const Tensor& tensor) const {
  return megactx::to_host(tensor);
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
