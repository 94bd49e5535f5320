#include "kernels/reference/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace megactx::reference {

void indexer_scores(const float* q, const float* weights, int64_t heads, int64_t dim,
                    const float* keys, int64_t n, float scale, float* scores) {
  for (int64_t s = 0; s < n; ++s) {
    const float* key = keys + s * dim;
    double total = 0.0;
    for (int64_t h = 0; h < heads; ++h) {
      double dot = 0.0;
      for (int64_t d = 0; d < dim; ++d) dot += static_cast<double>(q[h * dim + d]) * key[d];
      const double value = dot * scale;
      if (value > 0.0) total += weights[h] * value;
    }
    scores[s] = static_cast<float>(total);
  }
}

int64_t topk_indices(const float* scores, int64_t n, int64_t k, int32_t* out) {
  const int64_t count = std::min(k, n);
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + count, order.end(), [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  std::sort(order.begin(), order.begin() + count);
  std::copy(order.begin(), order.begin() + count, out);
  return count;
}

void mla_attention(const float* q_latent, const float* q_rope, int64_t heads, int64_t kv_lora,
                   int64_t rope, const float* latents, const int32_t* selected, int64_t count,
                   float scale, float* out) {
  const int64_t row = kv_lora + rope;
  std::vector<double> logits(static_cast<size_t>(count));
  std::vector<double> acc(static_cast<size_t>(kv_lora));
  for (int64_t h = 0; h < heads; ++h) {
    const float* ql = q_latent + h * kv_lora;
    const float* qr = q_rope + h * rope;
    double max_logit = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < count; ++j) {
      const float* entry = latents + static_cast<int64_t>(selected[j]) * row;
      double dot = 0.0;
      for (int64_t d = 0; d < kv_lora; ++d) dot += static_cast<double>(ql[d]) * entry[d];
      for (int64_t d = 0; d < rope; ++d) dot += static_cast<double>(qr[d]) * entry[kv_lora + d];
      logits[j] = dot * scale;
      max_logit = std::max(max_logit, logits[j]);
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    double denominator = 0.0;
    for (int64_t j = 0; j < count; ++j) {
      const double p = std::exp(logits[j] - max_logit);
      denominator += p;
      const float* entry = latents + static_cast<int64_t>(selected[j]) * row;
      for (int64_t d = 0; d < kv_lora; ++d) acc[d] += p * entry[d];
    }
    for (int64_t d = 0; d < kv_lora; ++d) {
      out[h * kv_lora + d] = count == 0 ? 0.0f : static_cast<float>(acc[d] / denominator);
    }
  }
}

void moe_route(const float* logits, const float* bias, const RouterSpec& spec, int32_t* ids,
               float* weights) {
  const int64_t experts = spec.num_experts;
  const int64_t group_size = experts / spec.n_group;
  std::vector<float> score(static_cast<size_t>(experts));
  std::vector<float> choice(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    score[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[e] = score[e] + (bias != nullptr ? bias[e] : 0.0f);
  }
  // Group score: the sum of the group's two best choice scores.
  std::vector<float> group_score(static_cast<size_t>(spec.n_group));
  for (int64_t g = 0; g < spec.n_group; ++g) {
    std::vector<float> members(choice.begin() + g * group_size,
                               choice.begin() + (g + 1) * group_size);
    std::sort(members.begin(), members.end(), std::greater<float>());
    group_score[g] = members[0] + (group_size > 1 ? members[1] : 0.0f);
  }
  std::vector<int32_t> groups(static_cast<size_t>(spec.n_group));
  groups.resize(static_cast<size_t>(
      topk_indices(group_score.data(), spec.n_group, spec.topk_group, groups.data())));
  std::vector<float> masked(static_cast<size_t>(experts), -std::numeric_limits<float>::infinity());
  for (int32_t g : groups) {
    for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) masked[e] = choice[e];
  }
  topk_indices(masked.data(), experts, spec.top_k, ids);
  double sum = 0.0;
  for (int64_t i = 0; i < spec.top_k; ++i) sum += score[ids[i]];
  for (int64_t i = 0; i < spec.top_k; ++i) {
    float w = score[ids[i]];
    if (spec.norm_topk_prob) w = static_cast<float>(w / (sum + 1e-20));
    weights[i] = w * spec.routed_scaling_factor;
  }
}

}  // namespace megactx::reference
