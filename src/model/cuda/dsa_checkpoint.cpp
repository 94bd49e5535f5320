// make_cuda_dsa_model_from_checkpoint, make_cuda_dsa_model_random_fp8 and
// cuda_weight_bytes (model/cuda/cuda_model.h):
// the fp8-native load feeds the same CudaDsaModel constructor as
// make_cuda_dsa_model, with CudaWeights read from the checkpoint.
#if MEGACTX_HAVE_CUDA
#include "core/error.h"
#include "model/cuda/cuda_dsa_model.h"

namespace megactx {

std::unique_ptr<LanguageModel> make_cuda_dsa_model_from_checkpoint(
    const Checkpoint& checkpoint, const CudaModelOptions& options,
    const DsaModelOptions& model_options) {
  const ModelConfig& config = checkpoint.config();
  const int64_t index_topk = model_options.index_topk_override.value_or(config.index_topk);
  cuda::CudaDsaModel::prepare_device(config, index_topk, options);
  auto weights = std::make_unique<cuda::CudaWeights>(config, checkpoint, options.bf16_weights);
  return std::make_unique<cuda::CudaDsaModel>(config, index_topk, std::move(weights), options);
}

std::unique_ptr<LanguageModel> make_cuda_dsa_model_random_fp8(
    const ModelConfig& config, uint64_t seed, const CudaModelOptions& options,
    const DsaModelOptions& model_options) {
  const int64_t index_topk = model_options.index_topk_override.value_or(config.index_topk);
  cuda::CudaDsaModel::prepare_device(config, index_topk, options);
  const std::unique_ptr<MatrixSource> source = make_random_fp8_matrices(seed);
  auto weights = std::make_unique<cuda::CudaWeights>(config, *source, options.bf16_weights);
  return std::make_unique<cuda::CudaDsaModel>(config, index_topk, std::move(weights), options);
}

CudaWeightBytes cuda_weight_bytes(const LanguageModel& model) {
  const auto* cuda_model = dynamic_cast<const cuda::CudaDsaModel*>(&model);
  MEGACTX_CHECK(cuda_model != nullptr, "cuda_weight_bytes: not a CUDA model");
  const cuda::CudaWeights& w = cuda_model->weights();
  return {static_cast<int64_t>(w.bytes()), static_cast<int64_t>(w.matrix_bytes()),
          static_cast<int64_t>(w.fp8_bytes()), w.fp8_parameters()};
}

}  // namespace megactx
#endif  // MEGACTX_HAVE_CUDA
