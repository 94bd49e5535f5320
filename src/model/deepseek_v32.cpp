// deepseek_v32 (DeepSeek-V3.2). Every layer runs its indexer (HF's
// DeepseekV32Attention always builds one); the indexer rotates its rope-first
// slice half-split (rotate_half), the MLA part interleaved. YaRN scales cos/sin
// by its attention factor and the softmax by mscale_all_dim^2 (model/rope.cpp).
// The MTP layer (model.layers.{num_hidden_layers}.*, own embedding and head)
// is accepted but not run here.
#include "model/architectures.h"

#include "core/error.h"

namespace megactx {

std::unique_ptr<LanguageModel> build_deepseek_v32(const ModelConfig& config, WeightSource& weights,
                                                  std::unique_ptr<Backend> backend,
                                                  const DsaModelOptions& options) {
  MEGACTX_CHECK(config.model_type == ModelType::DeepseekV32,
                "build_deepseek_v32: model_type is '{}'", config.model_type_name);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    MEGACTX_CHECK(config.layer_runs_indexer(layer),
                  "deepseek_v32: layer {} is marked shared, but DeepSeek-V3.2 runs an indexer on "
                  "every layer",
                  layer);
  }
  DsaWeights loaded = load_dsa_weights(config, weights);
  return std::make_unique<DsaModel>(config, std::move(loaded), std::move(backend), options);
}

}  // namespace megactx
