// RoPE tables for the MLA and indexer rotary parts (both qk_rope_head_dim
// wide), following HF's default and YaRN initializers, and the attention
// softmax scale with YaRN's mscale.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"

namespace megactx {

struct RopeTable {
  int64_t dim = 0;                // rotary dims (qk_rope_head_dim)
  std::vector<float> inv_freq;    // [dim / 2], float32 as HF computes it
  float attention_factor = 1.0f;  // YaRN: multiplies cos and sin

  // cos/sin: [count, dim / 2] for the given positions.
  void fill(const int64_t* positions, int64_t count, float* cos, float* sin) const;
};

RopeTable make_rope_table(const ModelConfig& config);

// qk_head_dim^-0.5, times get_mscale(factor, mscale_all_dim)^2 for YaRN.
float attention_softmax_scale(const ModelConfig& config);

}  // namespace megactx
