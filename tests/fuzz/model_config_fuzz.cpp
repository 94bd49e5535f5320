// Fuzzes parse_model_config: any text must give a consistent ModelConfig (one
// schedule entry per layer) or a megactx::Error, never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "io/model_config.h"
#include "io/model_summary.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const megactx::ModelConfig config =
        megactx::parse_model_config(std::string(reinterpret_cast<const char*>(data), size));
    const auto layers = static_cast<size_t>(config.num_hidden_layers);
    if (config.indexer_types.size() != layers || config.mlp_layer_types.size() != layers)
      std::abort();
    for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
      if (config.indexer_source_layer(layer) > layer) std::abort();
    // Small configs only: the summary enumerates every expert tensor.
    if (config.num_hidden_layers * (config.n_routed_experts + 1) < 4096)
      (void)megactx::summarize_model(config, 1ull << 30);
  } catch (const megactx::Error&) {
  }
  return 0;
}
