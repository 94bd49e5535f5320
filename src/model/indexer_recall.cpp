#include "model/indexer_recall.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace megactx {

std::vector<float> dense_attention_probabilities(const AttentionProbeLayer& view, int64_t row,
                                                 const float* entries) {
  const int64_t visible = view.start + row + 1, entry = view.kv_lora + view.rope;
  std::vector<float> probabilities(static_cast<size_t>(view.heads * visible));
  std::vector<double> scores(static_cast<size_t>(visible));
  for (int64_t head = 0; head < view.heads; ++head) {
    const float* q_latent = view.q_latent + (row * view.heads + head) * view.kv_lora;
    const float* q_rope = view.q_rope + (row * view.heads + head) * view.rope;
    double top = -INFINITY;
    for (int64_t p = 0; p < visible; ++p) {
      const float* e = entries + p * entry;
      double dot = 0.0;
      for (int64_t j = 0; j < view.kv_lora; ++j) dot += double(q_latent[j]) * e[j];
      for (int64_t j = 0; j < view.rope; ++j) dot += double(q_rope[j]) * e[view.kv_lora + j];
      scores[p] = dot * view.scale;
      top = std::max(top, scores[p]);
    }
    double sum = 0.0;
    for (double& s : scores) sum += (s = std::exp(s - top));
    float* out = probabilities.data() + head * visible;
    for (int64_t p = 0; p < visible; ++p) out[p] = static_cast<float>(scores[p] / sum);
  }
  return probabilities;
}

void IndexerRecall::observe(const AttentionProbeLayer& view) {
  const int64_t first_row = std::max<int64_t>(0, first_position_ - view.start);
  if (first_row >= view.rows) return;
  const int64_t context = view.start + view.rows, entry = view.kv_lora + view.rope;
  if (context <= view.index_topk + 1) return;
  std::vector<float> entries(static_cast<size_t>(context * entry));
  for (int64_t p = 0; p < context; ++p) view.read_entry(p, entries.data() + p * entry);
  if (static_cast<int64_t>(sums_.size()) <= view.layer) sums_.resize(view.layer + 1);
  Layer& sum = sums_[view.layer];
  sum.layer = view.layer;
  sum.indexer_source = view.indexer_source;
  std::vector<double> mass;
  std::vector<int32_t> order;
  for (int64_t row = first_row; row < view.rows; ++row) {
    const int64_t visible = view.start + row + 1;
    if (visible <= view.index_topk) continue;
    const std::vector<float> probabilities =
        dense_attention_probabilities(view, row, entries.data());
    mass.assign(static_cast<size_t>(visible), 0.0);
    for (int64_t head = 0; head < view.heads; ++head)
      for (int64_t p = 0; p < visible; ++p)
        mass[p] += probabilities[head * visible + p] / static_cast<double>(view.heads);
    const int64_t k = view.index_topk, count = view.counts[row];
    MEGACTX_CHECK(count <= k, "indexer recall: {} selected of a top-{}", count, k);
    // The dense top-k: the k positions of most mass.
    order.resize(static_cast<size_t>(visible));
    std::iota(order.begin(), order.end(), 0);
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(),
                     [&](int32_t a, int32_t b) { return mass[a] > mass[b]; });
    std::vector<char> in_dense(static_cast<size_t>(visible), 0);
    for (int64_t i = 0; i < k; ++i) in_dense[order[i]] = 1;
    int64_t hits = 0;
    double held = 0.0;
    const int32_t* selected = view.topk + row * view.index_topk;
    for (int64_t i = 0; i < count; ++i) {
      const int32_t p = selected[i];
      MEGACTX_CHECK(p >= 0 && p < visible, "indexer recall: position {} of a row seeing {}", p,
                    visible);
      hits += in_dense[p];
      held += mass[p];
    }
    sum.rows += 1;
    sum.recall += static_cast<double>(hits) / static_cast<double>(k);
    sum.mass += held;
  }
}

std::vector<IndexerRecall::Layer> IndexerRecall::layers() const {
  std::vector<Layer> out;
  for (const Layer& sum : sums_) {
    if (sum.rows == 0) continue;
    Layer mean = sum;
    mean.recall /= static_cast<double>(sum.rows);
    mean.mass /= static_cast<double>(sum.rows);
    out.push_back(mean);
  }
  return out;
}

}  // namespace megactx
