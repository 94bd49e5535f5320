// The two supported architectures. Both run DsaModel; each file checks what
// is specific to its model type before building it.
#pragma once

#include <memory>

#include "model/backend.h"
#include "model/dsa_model.h"
#include "model/weight_source.h"

namespace megactx {

// glm_moe_dsa (GLM-5.x): IndexShare schedule, interleaved indexer RoPE.
std::unique_ptr<LanguageModel> build_glm_moe_dsa(const ModelConfig& config, WeightSource& weights,
                                                 std::unique_ptr<Backend> backend,
                                                 const DsaModelOptions& options);
// deepseek_v32 (DeepSeek-V3.2): an indexer on every layer, half-split indexer RoPE.
std::unique_ptr<LanguageModel> build_deepseek_v32(const ModelConfig& config, WeightSource& weights,
                                                  std::unique_ptr<Backend> backend,
                                                  const DsaModelOptions& options);

}  // namespace megactx
