// Helpers of the GPU indexer and top-k tests: random indexer problems (paged
// fp8 key caches, queries, causal rows), their device buffers, the fp32
// reference score of one key, and the check that a selection is a valid top-k.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_set>

#include "dsa_test_support.h"
#include "kernels/cuda/indexer/indexer.h"
#include "kernels/cuda/topk/topk.h"

namespace megactx::test {

using reference::kIndexerDim;

// Scores are compared relative to the row's largest |score|: fp8 tensor-core
// dot products accumulate with reduced internal precision (about 2^-14 of the
// magnitude on Hopper), far below the O(1) error of a wrong key or head.
constexpr float kScoreTolerance = 2e-3f;

// One indexer problem: requests of given lengths, rows_per_group causal rows each.
struct IndexerProblem {
  int heads = 32, rows_per_group = 1, top_k = 2048;
  std::vector<int64_t> lengths;
  PagedLayout layout;
  std::vector<uint8_t> pool, queries;
  std::vector<float> query_values, weights;
  std::vector<int32_t> row_request, row_visible;
  int rows = 0, max_visible = 0;
  int64_t score_stride = 0;

  void build(std::mt19937& rng, bool fast_pool = false) {
    layout = make_paged_layout(lengths, rng);
    if (fast_pool) {  // random e4m3 bytes (never the NaN codes) with small scales
      pool.resize(static_cast<size_t>(layout.num_pages) * 64 * reference::kIndexerEntryBytes);
      for (int64_t slot = 0; slot < layout.num_pages * 64; ++slot) {
        uint8_t* entry = pool.data() + slot * reference::kIndexerEntryBytes;
        for (int i = 0; i < kIndexerDim; i += 4) {
          uint32_t word = rng();
          for (int b = 0; b < 4; ++b) {
            uint8_t byte = static_cast<uint8_t>(word >> (8 * b));
            if ((byte & 0x7f) == 0x7f) byte ^= 1;
            entry[i + b] = byte;
          }
        }
        const float scale = 1e-3f * (1 + rng() % 10);
        std::memcpy(entry + kIndexerDim, &scale, 4);
      }
    } else {
      pool = random_indexer_pool(layout.num_pages, rng);
    }
    for (size_t r = 0; r < lengths.size(); ++r)
      for (int t = 0; t < rows_per_group; ++t) {
        row_request.push_back(static_cast<int32_t>(r));
        const int64_t visible = std::max<int64_t>(0, lengths[r] - rows_per_group + 1 + t);
        row_visible.push_back(static_cast<int32_t>(visible));
        max_visible = std::max<int>(max_visible, static_cast<int>(visible));
      }
    rows = static_cast<int>(row_request.size());
    score_stride = max_visible + 5;
    random_fp8_queries(static_cast<size_t>(rows) * heads * kIndexerDim, rng, queries, query_values);
    std::normal_distribution<float> normal(0.f, 1e-3f);
    weights.resize(static_cast<size_t>(rows) * heads);
    for (float& w : weights) w = normal(rng);
  }
  const int32_t* table(int row) const {
    return layout.block_table.data() + row_request[row] * layout.block_table_stride;
  }
};

struct DeviceIndexer {
  DeviceBuffer<uint8_t> pool, queries;
  DeviceBuffer<float> weights, scores;
  DeviceBuffer<int32_t> table, request, visible, slots, state;
  DeviceBuffer<uint32_t> histogram;

  explicit DeviceIndexer(const IndexerProblem& problem)
      : pool(problem.pool),
        queries(problem.queries),
        weights(problem.weights),
        scores(static_cast<size_t>(problem.rows) * problem.score_stride),
        table(problem.layout.block_table),
        request(problem.row_request),
        visible(problem.row_visible),
        slots(static_cast<size_t>(problem.rows) * problem.top_k),
        state(static_cast<size_t>(problem.rows) * cuda::kTopkRowState),
        histogram(static_cast<size_t>(problem.rows) * cuda::kTopkHistogramBins) {
    scores.fill_bytes(0xff);  // NaN: entries the kernel must not write stay NaN
    slots.fill_bytes(0x5a);
    state.fill_bytes(0);
    histogram.fill_bytes(0);
  }

  cuda::IndexerScoreParams score_params(const IndexerProblem& problem) const {
    cuda::IndexerScoreParams params;
    params.queries = queries.get();
    params.weights = weights.get();
    params.key_pool = pool.get();
    params.block_table = table.get();
    params.block_table_stride = problem.layout.block_table_stride;
    params.row_request = request.get();
    params.row_visible = visible.get();
    params.scores = scores.get();
    params.score_stride = problem.score_stride;
    params.rows = problem.rows;
    params.heads = problem.heads;
    params.rows_per_group = problem.rows_per_group;
    params.max_visible = problem.max_visible;
    return params;
  }
  cuda::TopkParams topk_params(const IndexerProblem& problem,
                               cuda::TopkPath path = cuda::TopkPath::Auto) const {
    cuda::TopkParams params;
    params.path = path;
    params.scores = scores.get();
    params.score_stride = problem.score_stride;
    params.row_visible = visible.get();
    params.row_request = request.get();
    params.block_table = table.get();
    params.block_table_stride = problem.layout.block_table_stride;
    params.rows = problem.rows;
    params.top_k = problem.top_k;
    params.max_visible = problem.max_visible;
    params.out_slots = slots.get();
    params.histogram = histogram.get();
    params.row_state = state.get();
    return params;
  }
};

inline float reference_score(const IndexerProblem& problem, int row, int64_t position) {
  float score = 0.f;
  // One position directly (the reference function walks positions from 0).
  std::vector<float> key(kIndexerDim);
  const int64_t slot = reference::position_to_slot(problem.table(row), position);
  reference::decode_indexer_key_fp8(problem.pool.data() + slot * reference::kIndexerEntryBytes,
                                    key.data());
  for (int h = 0; h < problem.heads; ++h) {
    float dot = 0.f;
    for (int i = 0; i < kIndexerDim; ++i)
      dot +=
          problem.query_values[(static_cast<size_t>(row) * problem.heads + h) * kIndexerDim + i] *
          key[i];
    score += problem.weights[static_cast<size_t>(row) * problem.heads + h] * std::max(dot, 0.f);
  }
  return score;
}

// Checks that `slots` [top_k] is a valid top-k of `scores` [visible]: right
// count, distinct visible positions, every score above the k-th taken, -1 after.
inline void expect_valid_topk(const float* scores, int64_t visible, int top_k, const int32_t* table,
                              int64_t num_pages, const int32_t* slots, const std::string& what) {
  const int64_t taken = std::min<int64_t>(top_k, visible);
  std::vector<int64_t> logical_page(static_cast<size_t>(num_pages), -1);
  for (int64_t p = 0; p < (visible + 63) / 64; ++p) logical_page[table[p]] = p;
  std::unordered_set<int64_t> seen;
  std::vector<float> chosen;
  for (int64_t i = 0; i < taken; ++i) {
    const int32_t slot = slots[i];
    ASSERT_GE(slot, 0) << what << " entry " << i;
    ASSERT_LT(slot / 64, num_pages) << what;
    const int64_t page = logical_page[slot / 64];
    ASSERT_GE(page, 0) << what << " slot " << slot << " is not in this request";
    const int64_t position = page * 64 + slot % 64;
    ASSERT_LT(position, visible) << what << " slot " << slot << " is not visible";
    ASSERT_TRUE(seen.insert(position).second) << what << " position " << position << " twice";
    chosen.push_back(scores[position]);
  }
  for (int i = static_cast<int>(taken); i < top_k; ++i)
    ASSERT_EQ(slots[i], -1) << what << " padding " << i;
  if (taken == 0 || taken == visible) return;
  std::vector<float> all(scores, scores + visible);
  std::nth_element(all.begin(), all.begin() + (taken - 1), all.end(), std::greater<float>());
  const float kth = all[taken - 1];
  const int64_t above = std::count_if(scores, scores + visible, [&](float s) { return s > kth; });
  int64_t chosen_above = 0;
  for (float s : chosen) {
    ASSERT_GE(s, kth) << what;
    chosen_above += s > kth;
  }
  EXPECT_EQ(chosen_above, above) << what;
}

}  // namespace megactx::test
