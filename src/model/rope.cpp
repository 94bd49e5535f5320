#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace megactx {
namespace {

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

bool is_yarn(const ModelConfig& config) {
  return config.rope.rope_type == "yarn";
}

double yarn_factor(const ModelConfig& config) {
  const RopeParameters& rope = config.rope;
  if (rope.factor > 0.0) return rope.factor;
  MEGACTX_CHECK(rope.original_max_position_embeddings > 0,
                "rope: YaRN needs factor or original_max_position_embeddings");
  return static_cast<double>(config.max_position_embeddings) /
         static_cast<double>(rope.original_max_position_embeddings);
}

}  // namespace

RopeTable make_rope_table(const ModelConfig& config) {
  const RopeParameters& rope = config.rope;
  MEGACTX_CHECK(rope.rope_type == "default" || rope.rope_type == "yarn",
                "rope: unsupported rope_type '{}' (default or yarn)", rope.rope_type);
  RopeTable table;
  table.dim = config.qk_rope_head_dim;
  MEGACTX_CHECK(table.dim % 2 == 0, "rope: qk_rope_head_dim {} must be even", table.dim);
  const int64_t half = table.dim / 2;
  const float base = static_cast<float>(rope.rope_theta);
  // pos_freqs = base ** (arange(0, dim, 2) / dim) in float32, as torch does.
  std::vector<float> pos_freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(table.dim);
    pos_freqs[i] = std::pow(base, exponent);
  }
  table.inv_freq.resize(static_cast<size_t>(half));
  if (!is_yarn(config)) {
    for (int64_t i = 0; i < half; ++i) table.inv_freq[i] = 1.0f / pos_freqs[i];
    return table;
  }
  const double factor = yarn_factor(config);
  if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0) {
    table.attention_factor = static_cast<float>(yarn_mscale(factor, rope.mscale) /
                                                yarn_mscale(factor, rope.mscale_all_dim));
  } else {
    table.attention_factor = static_cast<float>(yarn_mscale(factor, 1.0));
  }
  const double beta_fast = rope.beta_fast != 0.0 ? rope.beta_fast : 32.0;
  const double beta_slow = rope.beta_slow != 0.0 ? rope.beta_slow : 1.0;
  const double original = static_cast<double>(rope.original_max_position_embeddings);
  MEGACTX_CHECK(original > 0, "rope: YaRN needs original_max_position_embeddings");
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(table.dim) *
           std::log(original / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(rope.rope_theta));
  };
  // HF truncates the correction range to whole dimensions by default.
  double low = std::max(std::floor(correction_dim(beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(beta_slow)), static_cast<double>(table.dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const float ramp =
        std::clamp(static_cast<float>((static_cast<double>(i) - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    const float extrapolation = 1.0f / pos_freqs[i];
    const float interpolation = 1.0f / (static_cast<float>(factor) * pos_freqs[i]);
    table.inv_freq[i] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return table;
}

void RopeTable::fill(const int64_t* positions, int64_t count, float* cos, float* sin) const {
  const int64_t half = dim / 2;
  for (int64_t t = 0; t < count; ++t) {
    const float position = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = inv_freq[i] * position;
      cos[t * half + i] =
          static_cast<float>(std::cos(static_cast<double>(angle))) * attention_factor;
      sin[t * half + i] =
          static_cast<float>(std::sin(static_cast<double>(angle))) * attention_factor;
    }
  }
}

float attention_softmax_scale(const ModelConfig& config) {
  double scale = 1.0 / std::sqrt(static_cast<double>(config.qk_head_dim()));
  if (is_yarn(config) && config.rope.mscale_all_dim != 0.0) {
    const double m = yarn_mscale(yarn_factor(config), config.rope.mscale_all_dim);
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

}  // namespace megactx
