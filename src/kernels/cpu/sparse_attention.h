// Fast CPU DSA kernels over a batch of query tokens of one sequence: the
// indexer (sgemm scores + ReLU-weighted head sum + causal top-k) and absorbed
// MLA attention over each query's selected rows. Same math as
// kernels/reference/sparse_attention.h; parallel over queries on the global
// ThreadPool.
#pragma once

#include <cstdint>

namespace megactx::cpu {

struct IndexerTopkArgs {
  const float* q = nullptr;          // [queries, heads, dim]
  const float* weights = nullptr;    // [queries, heads], already times heads^-0.5
  const float* keys = nullptr;       // [keys, dim]
  const int64_t* visible = nullptr;  // [queries]: query i sees keys [0, visible[i])
  int64_t queries = 0;
  int64_t heads = 0;
  int64_t dim = 0;
  int64_t keys_count = 0;
  int64_t topk = 0;
  float scale = 1.0f;          // dim^-0.5
  int32_t* indices = nullptr;  // [queries, topk], increasing; unused tail = -1
  int64_t* counts = nullptr;   // [queries]: min(topk, visible)
  // Either step alone: scores_out [queries, keys] gets the scores (0 past
  // visible) and no top-k is taken; scores_in (that layout) is ranked instead
  // of scoring.
  float* scores_out = nullptr;
  const float* scores_in = nullptr;
};
void indexer_topk(const IndexerTopkArgs& args);

// reference::topk_indices' result (the min(k, n) highest scores, ties to the
// lower index, written in increasing index order) in O(n): the k-th largest
// value by selection, then one pass in index order. Rows holding a NaN, for
// which that order is not defined, take the reference's own sort.
int64_t topk_indices(const float* scores, int64_t n, int64_t k, int32_t* out);

struct MlaAttentionArgs {
  const float* q_latent = nullptr;   // [queries, heads, kv_lora]
  const float* q_rope = nullptr;     // [queries, heads, rope]
  const float* latents = nullptr;    // [rows, kv_lora + rope]
  const int32_t* indices = nullptr;  // [queries, index_stride] rows into latents
  const int64_t* counts = nullptr;   // [queries]
  int64_t index_stride = 0;
  int64_t queries = 0;
  int64_t heads = 0;
  int64_t kv_lora = 0;
  int64_t rope = 0;
  float scale = 1.0f;
  float* out = nullptr;  // [queries, heads, kv_lora]
};
void mla_attention(const MlaAttentionArgs& args);

}  // namespace megactx::cpu
