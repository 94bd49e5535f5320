// What the engine builds around the CUDA model (LanguageModel's device
// hooks): device pools, the pinned pools of the host tier and the page copies
// on the model's stream, the MTP layer on the device, host copies of logits.
#if MEGACTX_HAVE_CUDA
#include "model/cuda_dsa_model.h"

namespace megactx::cuda {

std::unique_ptr<PagedKvCache> CudaDsaModel::make_kv_cache(const KvCacheSpec& spec) const {
  return make_cuda_kv_cache(spec);
}

std::unique_ptr<PagedKvCache> CudaDsaModel::make_host_kv_cache(const KvCacheSpec& spec) const {
  return make_cuda_host_kv_cache(spec);
}

KvPageCopy CudaDsaModel::kv_page_copy() const {
  return make_cuda_kv_page_copy(*this);
}

std::unique_ptr<MtpLayer> CudaDsaModel::load_mtp_layer(const std::string& model_dir) {
  return make_cuda_mtp_layer(*this, model_dir);
}

Tensor CudaDsaModel::to_host(const Tensor& tensor) const {
  return megactx::to_host(tensor);
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
