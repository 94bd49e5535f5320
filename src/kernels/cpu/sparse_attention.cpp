#include "kernels/cpu/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/dense_ops.h"
#include "kernels/reference/sparse_attention.h"

namespace megactx::cpu {
namespace {

// Dot product with independent partial sums, so the compiler can vectorize it
// without reassociation flags.
inline __attribute__((always_inline)) float dot(const float* a, const float* b, int64_t n) {
  float partial[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) partial[j] += a[i + j] * b[i + j];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (float p : partial) sum += p;
  return sum;
}

}  // namespace

int64_t topk_indices(const float* scores, int64_t n, int64_t k, int32_t* out) {
  const int64_t count = std::max<int64_t>(0, std::min(k, n));
  if (count == 0) return 0;
  if (count == n) {  // every position, in order
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(i);
    return count;
  }
  // The count-th largest value: every score above it is taken, and of those
  // equal to it the lowest-indexed `ties` (the reference's order).
  thread_local std::vector<float> values;
  float threshold = 0.0f;
  bool found = false;
  if (n >= 8 * count && n >= 1024) {
    // A long row: a value below the threshold from every 16th score (its
    // rank in the sample set a few places past the count's share), then the
    // exact threshold among the scores at or above it; the whole row when
    // fewer than `count` are.
    constexpr int64_t kStride = 16;
    const int64_t samples = n / kStride;
    values.resize(static_cast<size_t>(samples));
    for (int64_t i = 0; i < samples; ++i) values[i] = scores[i * kStride];
    const int64_t rank = std::min(samples, count * samples / n + 8);
    std::nth_element(values.begin(), values.begin() + (rank - 1), values.end(),
                     std::greater<float>());
    const float floor = values[static_cast<size_t>(rank - 1)];
    values.clear();
    for (int64_t i = 0; i < n; ++i) {
      const float v = scores[i];
      if (v != v) return reference::topk_indices(scores, n, k, out);  // NaN
      if (v >= floor) values.push_back(v);
    }
    if (static_cast<int64_t>(values.size()) >= count) {
      std::nth_element(values.begin(), values.begin() + (count - 1), values.end(),
                       std::greater<float>());
      threshold = values[static_cast<size_t>(count - 1)];
      found = true;
    }
  }
  if (!found) {
    values.assign(scores, scores + n);
    for (float v : values)
      if (std::isnan(v)) return reference::topk_indices(scores, n, k, out);
    std::nth_element(values.begin(), values.begin() + (count - 1), values.end(),
                     std::greater<float>());
    threshold = values[static_cast<size_t>(count - 1)];
  }
  // Every score above the threshold is in `values` (at or above the sample's
  // floor, or the whole row).
  int64_t above = 0;
  for (float v : values) above += v > threshold;
  int64_t ties = count - above, written = 0;
  for (int64_t i = 0; i < n && written < count; ++i) {
    const float v = scores[i];
    if (v > threshold || (v == threshold && ties-- > 0)) out[written++] = static_cast<int32_t>(i);
  }
  return count;
}

void indexer_topk(const IndexerTopkArgs& a) {
  if (a.scores_in != nullptr) {
    ThreadPool::global().parallel_for(a.queries, [&](int64_t begin, int64_t end) {
      for (int64_t query = begin; query < end; ++query) {
        int32_t* out = a.indices + query * a.topk;
        const int64_t count =
            topk_indices(a.scores_in + query * a.keys_count, a.visible[query], a.topk, out);
        std::fill(out + count, out + a.topk, -1);
        a.counts[query] = count;
      }
    });
    return;
  }
  // Queries in blocks so the [block * heads, keys] logit matrix stays bounded.
  const int64_t block = std::max<int64_t>(
      1, std::min<int64_t>(64, (1 << 22) / std::max<int64_t>(1, a.heads * a.keys_count)));
  std::vector<float> logits;
  for (int64_t q0 = 0; q0 < a.queries; q0 += block) {
    const int64_t nq = std::min(block, a.queries - q0);
    int64_t max_visible = 0;
    for (int64_t i = q0; i < q0 + nq; ++i) max_visible = std::max(max_visible, a.visible[i]);
    logits.resize(static_cast<size_t>(nq * a.heads * max_visible));
    // [nq * heads, max_visible] = q . keys^T
    linear(a.q + q0 * a.heads * a.dim, nq * a.heads, a.dim, a.keys, max_visible, logits.data());
    ThreadPool::global().parallel_for(nq, [&](int64_t begin, int64_t end) {
      std::vector<float> scores;
      for (int64_t i = begin; i < end; ++i) {
        const int64_t query = q0 + i;
        const int64_t n = a.visible[query];
        scores.assign(static_cast<size_t>(n), 0.0f);
        for (int64_t h = 0; h < a.heads; ++h) {
          const float w = a.weights[query * a.heads + h];
          const float* row = logits.data() + (i * a.heads + h) * max_visible;
          if (std::isfinite(w)) {
            // A select instead of a branch, so that the loop vectorizes: w * 0
            // adds a signed zero, which leaves every sum as the branch does.
            for (int64_t s = 0; s < n; ++s) {
              const float v = row[s] * a.scale;
              scores[s] += w * (v > 0.0f ? v : 0.0f);
            }
          } else {
            for (int64_t s = 0; s < n; ++s) {
              const float v = row[s] * a.scale;
              if (v > 0.0f) scores[s] += w * v;
            }
          }
        }
        if (a.scores_out != nullptr) {
          float* row = a.scores_out + query * a.keys_count;
          std::copy(scores.begin(), scores.end(), row);
          std::fill(row + n, row + a.keys_count, 0.0f);
          continue;
        }
        int32_t* out = a.indices + query * a.topk;
        const int64_t count = topk_indices(scores.data(), n, a.topk, out);
        std::fill(out + count, out + a.topk, -1);
        a.counts[query] = count;
      }
    });
  }
}

namespace {

// One (query, head) of mla_attention, compiled for AVX-512 and AVX2 beside the
// baseline and picked at load time (the 16 partial sums of `dot` are one
// AVX-512 register). This file is built without FMA contraction
// (CMakeLists.txt), so every clone rounds as the baseline does: the same bits
// on every machine.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MEGACTX_X86_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MEGACTX_X86_CLONES  // other architectures: the baseline build only
#endif
MEGACTX_X86_CLONES void mla_query_head(const MlaAttentionArgs& a, int64_t query, int64_t head,
                                       float* logits) {
  const int64_t row = a.kv_lora + a.rope;
  const float* ql = a.q_latent + (query * a.heads + head) * a.kv_lora;
  const float* qr = a.q_rope + (query * a.heads + head) * a.rope;
  const int32_t* selected = a.indices + query * a.index_stride;
  const int64_t count = a.counts[query];
  float* out = a.out + (query * a.heads + head) * a.kv_lora;
  std::fill(out, out + a.kv_lora, 0.0f);
  if (count == 0) return;
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < count; ++j) {
    const float* entry = a.latents + static_cast<int64_t>(selected[j]) * row;
    logits[j] = (dot(ql, entry, a.kv_lora) + dot(qr, entry + a.kv_lora, a.rope)) * a.scale;
    max_logit = std::max(max_logit, logits[j]);
  }
  float denominator = 0.0f;
  for (int64_t j = 0; j < count; ++j) {
    const float p = std::exp(logits[j] - max_logit);
    denominator += p;
    const float* entry = a.latents + static_cast<int64_t>(selected[j]) * row;
    for (int64_t d = 0; d < a.kv_lora; ++d) out[d] += p * entry[d];
  }
  const float inv = 1.0f / denominator;
  for (int64_t d = 0; d < a.kv_lora; ++d) out[d] *= inv;
}

}  // namespace

void mla_attention(const MlaAttentionArgs& a) {
  ThreadPool::global().parallel_for(a.queries * a.heads, [&](int64_t begin, int64_t end) {
    std::vector<float> logits;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t query = item / a.heads;
      logits.resize(static_cast<size_t>(std::max<int64_t>(1, a.counts[query])));
      mla_query_head(a, query, item % a.heads, logits.data());
    }
  });
}

}  // namespace megactx::cpu
