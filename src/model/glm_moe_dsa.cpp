// glm_moe_dsa (GLM-5.x). As in HF's GlmMoeDsaAttention: layer i runs its own
// indexer iff indexer_types[i] == full (resolved by parse_model_config from
// indexer_types, index_topk_pattern or index_topk_freq/index_skip_topk_offset);
// a shared layer reuses the top-k of the latest full layer and has no indexer
// tensors. The indexer rotates its rope-first slice with interleaved pairs.
// MTP (model.layers.{num_hidden_layers}.*) reuses the target embedding and
// lm_head.
#include "core/error.h"
#include "model/architectures.h"

namespace megactx {

void check_glm_moe_dsa(const ModelConfig& config) {
  MEGACTX_CHECK(static_cast<int64_t>(config.indexer_types.size()) == config.num_hidden_layers,
                "glm_moe_dsa: {} indexer types for {} layers", config.indexer_types.size(),
                config.num_hidden_layers);
  MEGACTX_CHECK(config.num_hidden_layers > 0 && config.layer_runs_indexer(0),
                "glm_moe_dsa: layer 0 is 'shared' but no earlier full layer exists");
}

}  // namespace megactx
