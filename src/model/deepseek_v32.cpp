// deepseek_v32 (DeepSeek-V3.2). Every layer runs its indexer (HF's
// DeepseekV32Attention always builds one); the indexer rotates its rope-first
// slice half-split (rotate_half), the MLA part interleaved. YaRN scales cos/sin
// by its attention factor and the softmax by mscale_all_dim^2 (model/rope.cpp).
// The MTP layer (model.layers.{num_hidden_layers}.*) has its own embedding and
// head.
#include "core/error.h"
#include "model/architectures.h"

namespace megactx {

void check_deepseek_v32(const ModelConfig& config) {
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    MEGACTX_CHECK(config.layer_runs_indexer(layer),
                  "deepseek_v32: layer {} is marked shared, but DeepSeek-V3.2 runs an indexer on "
                  "every layer",
                  layer);
  }
}

}  // namespace megactx
