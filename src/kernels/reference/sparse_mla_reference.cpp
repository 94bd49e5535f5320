#include "kernels/reference/sparse_mla_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"

namespace megactx::reference {
namespace {
constexpr int kGroup = 128;
constexpr int kScaleOffset = kLatentRankDim;
constexpr int kRopeOffset = kLatentRankDim + 4 * (kLatentRankDim / kGroup);
}  // namespace

void encode_latent_fp8(const float* c_kv, const float* k_rope, uint8_t* entry) {
  for (int group = 0; group < kLatentRankDim / kGroup; ++group) {
    float amax = 0.f;
    for (int i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(c_kv[group * kGroup + i]));
    const float scale = amax > 0.f ? amax / 448.f : 1.f;
    for (int i = 0; i < kGroup; ++i)
      entry[group * kGroup + i] = float_to_fp8_e4m3(c_kv[group * kGroup + i] / scale);
    std::memcpy(entry + kScaleOffset + group * 4, &scale, 4);
  }
  for (int i = 0; i < kLatentRopeDim; ++i) {
    const uint16_t bits = float_to_bf16(k_rope[i]);
    std::memcpy(entry + kRopeOffset + 2 * i, &bits, 2);
  }
}

void decode_latent_fp8(const uint8_t* entry, float* c_kv, float* k_rope) {
  for (int group = 0; group < kLatentRankDim / kGroup; ++group) {
    float scale;
    std::memcpy(&scale, entry + kScaleOffset + group * 4, 4);
    for (int i = 0; i < kGroup; ++i)
      c_kv[group * kGroup + i] = fp8_e4m3_to_float(entry[group * kGroup + i]) * scale;
  }
  for (int i = 0; i < kLatentRopeDim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, entry + kRopeOffset + 2 * i, 2);
    k_rope[i] = bf16_to_float(bits);
  }
}

void sparse_mla_reference(const float* q, int heads, const int32_t* slots, int top_k,
                          const uint8_t* kv_pool, float softmax_scale, float* out, float* lse) {
  constexpr int kQueryDim = kLatentRankDim + kLatentRopeDim;
  // Decode the valid entries once: c_kv [valid, 512], k_rope [valid, 64].
  std::vector<float> c_kv, k_rope;
  for (int j = 0; j < top_k; ++j) {
    if (slots[j] < 0) continue;
    c_kv.resize(c_kv.size() + kLatentRankDim);
    k_rope.resize(k_rope.size() + kLatentRopeDim);
    decode_latent_fp8(kv_pool + static_cast<int64_t>(slots[j]) * kLatentEntryBytes,
                      c_kv.data() + c_kv.size() - kLatentRankDim,
                      k_rope.data() + k_rope.size() - kLatentRopeDim);
  }
  const size_t valid = c_kv.size() / kLatentRankDim;
  std::vector<float> logits(valid);
  for (int h = 0; h < heads; ++h) {
    const float* qh = q + static_cast<int64_t>(h) * kQueryDim;
    float* oh = out + static_cast<int64_t>(h) * kLatentRankDim;
    std::fill(oh, oh + kLatentRankDim, 0.f);
    if (valid == 0) {
      lse[h] = -std::numeric_limits<float>::infinity();
      continue;
    }
    float max_logit = -std::numeric_limits<float>::infinity();
    for (size_t j = 0; j < valid; ++j) {
      float dot = 0.f;
      for (int i = 0; i < kLatentRankDim; ++i) dot += qh[i] * c_kv[j * kLatentRankDim + i];
      for (int i = 0; i < kLatentRopeDim; ++i)
        dot += qh[kLatentRankDim + i] * k_rope[j * kLatentRopeDim + i];
      logits[j] = dot * softmax_scale;
      max_logit = std::max(max_logit, logits[j]);
    }
    float sum = 0.f;
    for (size_t j = 0; j < valid; ++j) {
      const float p = std::exp(logits[j] - max_logit);
      sum += p;
      for (int i = 0; i < kLatentRankDim; ++i) oh[i] += p * c_kv[j * kLatentRankDim + i];
    }
    for (int i = 0; i < kLatentRankDim; ++i) oh[i] /= sum;
    lse[h] = max_logit + std::log(sum);
  }
}

}  // namespace megactx::reference
