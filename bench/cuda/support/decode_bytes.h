// What one decode step must read at least, the numerator of the decode
// benchmarks' floors (model_decode_bench, mtp_engine_bench): the GEMM weights
// a batch touches (expected distinct experts for uniform routing). The
// denominator is read_bandwidth.h's measured read-only bandwidth.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "io/model_config.h"

namespace megactx::bench {

// Bytes per element of the GEMM weights of one precision: the projection and
// expert matrices, and lm_head + the indexer's weights_proj (bf16 in fp8
// checkpoints). W_UK/W_UV and the router are float32 in every precision.
struct WeightBytes {
  double matrix = 4.0;
  double plain = 4.0;
};

inline WeightBytes weight_bytes_of(const std::string& precision) {
  if (precision == "bf16") return {2.0, 2.0};
  // e4m3 + one float32 scale per 128 x 128 block.
  if (precision == "fp8") return {1.0 + 4.0 / (128.0 * 128.0), 2.0};
  return {4.0, 4.0};
}

// Bytes of GEMM weights one decode step of `batch` tokens reads.
inline double step_weight_bytes(const ModelConfig& c, int64_t batch, WeightBytes per) {
  const double h = static_cast<double>(c.hidden_size);
  const double q_lora = static_cast<double>(c.q_lora_rank.value_or(0));
  const double heads = static_cast<double>(c.num_attention_heads);
  const double lora = static_cast<double>(c.kv_lora_rank);
  const double nope = static_cast<double>(c.qk_nope_head_dim);
  const double rope = static_cast<double>(c.qk_rope_head_dim);
  const double v = static_cast<double>(c.v_head_dim);
  double matrices = 0.0, plain = 0.0, f32 = 0.0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    matrices += h * q_lora + q_lora * heads * (nope + rope) + h * (lora + rope) + heads * v * h;
    f32 += heads * lora * nope + heads * v * lora;
    if (c.layer_runs_indexer(layer)) {
      const double ih = static_cast<double>(c.index_n_heads);
      const double id = static_cast<double>(c.index_head_dim);
      matrices += q_lora * ih * id + h * id;
      plain += h * ih;  // weights_proj
    }
    if (c.layer_is_moe(layer)) {
      const double e = static_cast<double>(c.n_routed_experts);
      const double k = static_cast<double>(c.num_experts_per_tok);
      const double used = e * (1.0 - std::pow(1.0 - k / e, static_cast<double>(batch)));
      const double expert = 3.0 * h * static_cast<double>(c.moe_intermediate_size);
      matrices += (used + static_cast<double>(c.n_shared_experts)) * expert;
      f32 += e * h;
    } else {
      matrices += 3.0 * h * static_cast<double>(c.intermediate_size);
    }
  }
  plain += static_cast<double>(c.vocab_size) * h;  // lm_head
  return matrices * per.matrix + plain * per.plain + f32 * 4.0;
}

}  // namespace megactx::bench
