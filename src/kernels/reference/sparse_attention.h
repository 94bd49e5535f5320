// Reference DSA pieces for one query token: the indexer score and its causal
// top-k, MLA attention in absorbed (MQA) form over selected tokens, and the
// MoE router. Plain fp32 loops with double accumulators: the oracle.
#pragma once

#include <cstdint>

namespace megactx::reference {

// score[s] = sum_h weights[h] * relu(q[h] . keys[s] * scale), s in [0, n).
// q: [heads, dim]; weights: [heads] (already times heads^-0.5); keys: [n, dim].
void indexer_scores(const float* q, const float* weights, int64_t heads, int64_t dim,
                    const float* keys, int64_t n, float scale, float* scores);

// The k = min(k, n) largest of scores[0, n) as indices in increasing index
// order; equal scores prefer the lower index. Returns the count written.
int64_t topk_indices(const float* scores, int64_t n, int64_t k, int32_t* out);

// Absorbed MLA for one query over `count` selected cache rows.
// q_latent: [heads, kv_lora] (q_nope . W_UK); q_rope: [heads, rope];
// latents: rows of [c_kv (kv_lora) | k_rope (rope)], row stride kv_lora + rope;
// selected: [count] row indices; out: [heads, kv_lora] = softmax(scores) . c_kv.
// count == 0 gives zeros.
void mla_attention(const float* q_latent, const float* q_rope, int64_t heads, int64_t kv_lora,
                   int64_t rope, const float* latents, const int32_t* selected, int64_t count,
                   float scale, float* out);

struct RouterSpec {
  int64_t num_experts = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t top_k = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

// Sigmoid router with correction bias and group-limited choice (DeepSeek-V3
// noaux_tc): logits [num_experts] -> ids [top_k], weights [top_k].
// bias may be null (zero).
void moe_route(const float* logits, const float* bias, const RouterSpec& spec, int32_t* ids,
               float* weights);

}  // namespace megactx::reference
