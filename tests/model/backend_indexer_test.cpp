// Both CPU backends' indexer in two steps (ModelPlan::indexer_split: scores
// over a share of the heads, the group's sum, then the top-k of the sums):
// with every head in one share it is the fused call exactly, and two shares'
// scores add up to the whole's within the head sum's rounding.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "model/backend.h"

namespace megactx {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(n);
  for (float& v : out) v = normal(rng);
  return out;
}

TEST(BackendIndexer, ScoresThenTopkEqualTheFusedCall) {
  const int64_t queries = 5, heads = 4, dim = 16, keys = 70, topk = 12;
  const auto q = random_values(queries * heads * dim, 1);
  const auto w = random_values(queries * heads, 2);
  const auto k = random_values(keys * dim, 3);
  std::vector<int64_t> visible(queries);
  for (int64_t i = 0; i < queries; ++i) visible[i] = 4 + 16 * i;  // some below topk
  for (const std::string name : {"cpu", "reference"}) {
    SCOPED_TRACE(name);
    auto backend = name == "cpu" ? make_cpu_backend() : make_reference_backend();
    IndexerTopkOp op;
    op.q = q.data();
    op.weights = w.data();
    op.keys = k.data();
    op.visible = visible.data();
    op.queries = queries;
    op.heads = heads;
    op.dim = dim;
    op.keys_count = keys;
    op.topk = topk;
    op.scale = 0.25f;
    std::vector<int32_t> fused(queries * topk), staged(queries * topk);
    std::vector<int64_t> fused_counts(queries), staged_counts(queries);
    op.indices = fused.data();
    op.counts = fused_counts.data();
    backend->indexer_topk(op);

    std::vector<float> whole(queries * keys, -1.0f);
    op.scores_out = whole.data();
    backend->indexer_topk(op);
    op.scores_out = nullptr;
    op.scores_in = whole.data();
    op.indices = staged.data();
    op.counts = staged_counts.data();
    backend->indexer_topk(op);
    EXPECT_EQ(staged, fused);
    EXPECT_EQ(staged_counts, fused_counts);

    // Two shares of the heads, added.
    std::vector<float> sums(queries * keys, 0.0f), part(queries * keys);
    for (int64_t share = 0; share < 2; ++share) {
      std::vector<float> sq, sw;
      for (int64_t i = 0; i < queries; ++i)
        for (int64_t h = share * heads / 2; h < (share + 1) * heads / 2; ++h) {
          sq.insert(sq.end(), q.begin() + (i * heads + h) * dim,
                    q.begin() + (i * heads + h + 1) * dim);
          sw.push_back(w[i * heads + h]);
        }
      IndexerTopkOp half = op;
      half.q = sq.data();
      half.weights = sw.data();
      half.heads = heads / 2;
      half.scores_in = nullptr;
      half.scores_out = part.data();
      backend->indexer_topk(half);
      for (size_t j = 0; j < sums.size(); ++j) sums[j] += part[j];
    }
    for (int64_t i = 0; i < queries; ++i)
      for (int64_t s = 0; s < keys; ++s) {
        if (s < visible[i])
          EXPECT_NEAR(sums[i * keys + s], whole[i * keys + s], 1e-5f) << i << ", " << s;
        else
          EXPECT_EQ(sums[i * keys + s], 0.0f) << i << ", " << s << " (past visible)";
      }
  }
}

}  // namespace
}  // namespace megactx
