// The architectures DsaModel and the CUDA model run. Each file checks what is
// specific to its model type; plan_model (model_plan.h) calls the check, so
// every load path, on every device, applies it before reading a weight.
#pragma once

#include "io/model_config.h"

namespace megactx {

// glm_moe_dsa (GLM-5.x): IndexShare schedule, interleaved indexer RoPE.
void check_glm_moe_dsa(const ModelConfig& config);
// deepseek_v32 (DeepSeek-V3.2): an indexer on every layer, half-split indexer RoPE.
void check_deepseek_v32(const ModelConfig& config);

}  // namespace megactx
