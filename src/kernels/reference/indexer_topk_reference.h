// Plain fp32 reference of the DSA lightning indexer over the fp8 key cache and
// of its top-k selection: the oracle the CUDA indexer and top-k are tested
// against. Layout of one indexer key (kv_cache.h): 128 e4m3 | fp32 scale,
// scale = amax / 448 (1 for an all-zero key). Positions p of a request map to
// physical slots block_table[p / 64] * 64 + p % 64.
#pragma once

#include <cstdint>
#include <vector>

namespace megactx::reference {

inline constexpr int kIndexerDim = 128;
inline constexpr int kIndexerEntryBytes = 132;
inline constexpr int kCachePageTokens = 64;

void encode_indexer_key_fp8(const float* key, uint8_t* entry);  // key [128] -> entry [132 B]
void decode_indexer_key_fp8(const uint8_t* entry, float* key);  // entry [132 B] -> key [128]

// e4m3 query of one head with scale amax / 448, and the head weight with that
// scale and softmax_scale folded in (what the GPU scorer consumes).
void quantize_indexer_query(const float* query, float head_weight, float softmax_scale,
                            uint8_t* query_fp8, float* folded_weight);

// scores[p] = sum_h weights[h] * relu(queries[h] . key(p)) for p < visible;
// queries [heads, 128], weights [heads], key(p) decoded from the pool
// [slots, 132] through block_table (this request's pages).
void indexer_scores_reference(const float* queries, const float* weights, int heads,
                              const uint8_t* key_pool, const int32_t* block_table, int64_t visible,
                              float* scores);

// The slots of the min(top_k, visible) largest scores (ties: lower position
// first), ordered by descending score, padded with -1 to top_k entries.
std::vector<int32_t> topk_slots_reference(const float* scores, int64_t visible, int top_k,
                                          const int32_t* block_table);

inline int32_t position_to_slot(const int32_t* block_table, int64_t position) {
  return block_table[position / kCachePageTokens] * kCachePageTokens +
         static_cast<int32_t>(position % kCachePageTokens);
}

}  // namespace megactx::reference
