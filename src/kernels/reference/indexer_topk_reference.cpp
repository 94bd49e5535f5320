#include "kernels/reference/indexer_topk_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/dtype.h"

namespace megactx::reference {

void encode_indexer_key_fp8(const float* key, uint8_t* entry) {
  float amax = 0.f;
  for (int i = 0; i < kIndexerDim; ++i) amax = std::max(amax, std::fabs(key[i]));
  const float scale = amax > 0.f ? amax / 448.f : 1.f;
  for (int i = 0; i < kIndexerDim; ++i) entry[i] = float_to_fp8_e4m3(key[i] / scale);
  std::memcpy(entry + kIndexerDim, &scale, sizeof(float));
}

void decode_indexer_key_fp8(const uint8_t* entry, float* key) {
  float scale;
  std::memcpy(&scale, entry + kIndexerDim, sizeof(float));
  for (int i = 0; i < kIndexerDim; ++i) key[i] = fp8_e4m3_to_float(entry[i]) * scale;
}

void quantize_indexer_query(const float* query, float head_weight, float softmax_scale,
                            uint8_t* query_fp8, float* folded_weight) {
  float amax = 0.f;
  for (int i = 0; i < kIndexerDim; ++i) amax = std::max(amax, std::fabs(query[i]));
  const float scale = amax > 0.f ? amax / 448.f : 1.f;
  for (int i = 0; i < kIndexerDim; ++i) query_fp8[i] = float_to_fp8_e4m3(query[i] / scale);
  *folded_weight = head_weight * scale * softmax_scale;
}

void indexer_scores_reference(const float* queries, const float* weights, int heads,
                              const uint8_t* key_pool, const int32_t* block_table, int64_t visible,
                              float* scores) {
  float key[kIndexerDim];
  for (int64_t p = 0; p < visible; ++p) {
    const int64_t slot = position_to_slot(block_table, p);
    decode_indexer_key_fp8(key_pool + slot * kIndexerEntryBytes, key);
    float score = 0.f;
    for (int h = 0; h < heads; ++h) {
      float dot = 0.f;
      for (int i = 0; i < kIndexerDim; ++i) dot += queries[h * kIndexerDim + i] * key[i];
      score += weights[h] * std::max(dot, 0.f);
    }
    scores[p] = score;
  }
}

std::vector<int32_t> topk_slots_reference(const float* scores, int64_t visible, int top_k,
                                          const int32_t* block_table) {
  const int64_t taken = std::min<int64_t>(top_k, visible);
  std::vector<int64_t> order(static_cast<size_t>(visible));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + taken, order.end(), [&](int64_t a, int64_t b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
  });
  std::vector<int32_t> slots(static_cast<size_t>(top_k), -1);
  for (int64_t i = 0; i < taken; ++i) slots[i] = position_to_slot(block_table, order[i]);
  return slots;
}

}  // namespace megactx::reference
