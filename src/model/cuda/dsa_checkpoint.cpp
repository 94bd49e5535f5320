// make_cuda_dsa_model_from_checkpoint, make_cuda_dsa_model_random_fp8 and
// cuda_weight_bytes (model/cuda/cuda_model.h):
// the fp8-native load feeds the same CudaDsaModel constructor as
// make_cuda_dsa_model, with CudaWeights read from the checkpoint (a rank of
// a group: its share of it).
#if MEGACTX_HAVE_CUDA
#include "core/error.h"
#include "model/cuda/checkpoint_shares.h"
#include "model/cuda/cuda_dsa_model.h"
#include "model/dsa_model.h"

namespace megactx {

namespace {

// The model from `source` in the shapes of this process's plan: a rank of a
// group reads its share (checkpoint_shares.h), cut from the whole tensors.
std::unique_ptr<LanguageModel> build(const ModelConfig& config, MatrixSource& source,
                                     const CudaModelOptions& options,
                                     const DsaModelOptions& model_options) {
  const int64_t index_topk = model_options.index_topk_override.value_or(config.index_topk);
  cuda::CudaDsaModel::prepare_device(config, index_topk, options);
  ModelPlan plan = rank_model_plan(config, model_options);
  std::unique_ptr<cuda::CudaWeights> weights;
  if (plan.tensor_parallel_size > 1 || plan.expert_parallel_size > 1) {
    const std::unique_ptr<MatrixSource> share = make_share_matrices(source, config, plan);
    weights = std::make_unique<cuda::CudaWeights>(config, *share, options.bf16_weights, plan);
  } else {
    weights = std::make_unique<cuda::CudaWeights>(config, source, options.bf16_weights, plan);
  }
  return std::make_unique<cuda::CudaDsaModel>(config, index_topk, std::move(weights), options,
                                              std::move(plan));
}

}  // namespace

std::unique_ptr<LanguageModel> make_cuda_dsa_model_from_checkpoint(
    const Checkpoint& checkpoint, const CudaModelOptions& options,
    const DsaModelOptions& model_options) {
  const std::unique_ptr<MatrixSource> source = make_checkpoint_matrices(checkpoint);
  return build(checkpoint.config(), *source, options, model_options);
}

std::unique_ptr<LanguageModel> make_cuda_dsa_model_random_fp8(const ModelConfig& config,
                                                              uint64_t seed,
                                                              const CudaModelOptions& options,
                                                              const DsaModelOptions& model_options,
                                                              bool dequantized) {
  const std::unique_ptr<MatrixSource> source = make_random_fp8_matrices(seed, dequantized);
  return build(config, *source, options, model_options);
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
