// Plain fp32 reference of sparse MLA attention (absorbed form) over the fp8
// latent cache: the oracle of the CUDA sparse MLA kernels. Layout of one entry
// (kv_cache.h, 656 B): 512 e4m3 c_kv | 4 fp32 scales (amax / 448 per group of
// 128; 1 for an all-zero group) | 64 bf16 k_rope.
#pragma once

#include <cstdint>

namespace megactx::reference {

inline constexpr int kLatentRankDim = 512;
inline constexpr int kLatentRopeDim = 64;
inline constexpr int kLatentEntryBytes = 656;

void encode_latent_fp8(const float* c_kv, const float* k_rope,
                       uint8_t* entry);                                    // [512], [64] -> 656 B
void decode_latent_fp8(const uint8_t* entry, float* c_kv, float* k_rope);  // 656 B -> [512], [64]

// One query row. q [heads, 576] = (absorbed q_nope [512] | q_rope [64]) per
// head; slots [top_k] physical slots into kv_pool [slots, 656], -1 = none.
//   logit[h, j] = softmax_scale * (q[h, :512] . c_kv[j] + q[h, 512:] . k_rope[j])
//   out[h] = sum_j softmax_j(logit[h]) c_kv[j] (out [heads, 512]),
//   lse[h] = log sum_j exp(logit[h, j]) (natural log).
// No valid slot: out = 0, lse = -inf.
void sparse_mla_reference(const float* q, int heads, const int32_t* slots, int top_k,
                          const uint8_t* kv_pool, float softmax_scale, float* out, float* lse);

}  // namespace megactx::reference
