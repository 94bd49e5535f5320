// GPU indexer scoring and radix top-k against the fp32 references, on fresh
// random paged fp8 caches: lengths that are not multiples of 64, causal MTP
// rows, batches of requests with different lengths, ties, and 1M keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <unordered_set>

#include "core/error.h"
#include "dsa_test_support.h"
#include "kernels/cuda/indexer/indexer.h"
#include "kernels/cuda/topk/topk.h"

namespace megactx::test {
namespace {

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

float reference_score(const IndexerProblem& problem, int row, int64_t position) {
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

// The kernel families that serve a problem's selection: the one-CTA kernel or
// the multi-CTA passes always, the cluster kernels where they fit.
std::vector<cuda::TopkPath> topk_paths(const cuda::TopkParams& params) {
  std::vector<cuda::TopkPath> paths = {cuda::TopkPath::Passes};
  if (cuda::topk_cluster_serves(params)) paths.push_back(cuda::TopkPath::Cluster);
  return paths;
}

const char* path_name(cuda::TopkPath path) {
  return path == cuda::TopkPath::Cluster ? "cluster kernel" : "passes";
}

// Checks that `slots` [top_k] is a valid top-k of `scores` [visible]: right
// count, distinct visible positions, every score above the k-th taken, -1 after.
void expect_valid_topk(const float* scores, int64_t visible, int top_k, const int32_t* table,
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

void check_engine(IndexerProblem& problem, DeviceIndexer& device, bool bulk_copies,
                  bool check_all_scores);

// Scores and selects with both page-copy engines (TMA bulk copies, cp.async).
void run_and_check(IndexerProblem& problem, uint32_t seed, bool check_all_scores = true) {
  std::mt19937 rng(seed);
  problem.build(rng);
  DeviceIndexer device(problem);
  for (bool bulk_copies : {true, false}) {
    SCOPED_TRACE(bulk_copies ? "bulk copies" : "cp.async");
    device.scores.fill_bytes(0xff);
    device.slots.fill_bytes(0x5a);
    check_engine(problem, device, bulk_copies, check_all_scores);
  }
}

void check_engine(IndexerProblem& problem, DeviceIndexer& device, bool bulk_copies,
                  bool check_all_scores) {
  cuda::IndexerScoreParams params = device.score_params(problem);
  params.bulk_copies = bulk_copies;
  cuda::indexer_scores(params, nullptr);
  const std::vector<float> scores = device.scores.download();
  std::vector<std::vector<float>> expected(static_cast<size_t>(problem.rows));
  std::vector<float> largest(static_cast<size_t>(problem.rows), 1e-30f);
  for (int row = 0; row < problem.rows; ++row) {
    const float* row_scores = scores.data() + static_cast<size_t>(row) * problem.score_stride;
    const int64_t visible = problem.row_visible[row];
    expected[row].resize(static_cast<size_t>(visible));
    reference::indexer_scores_reference(
        problem.query_values.data() + static_cast<size_t>(row) * problem.heads * kIndexerDim,
        problem.weights.data() + static_cast<size_t>(row) * problem.heads, problem.heads,
        problem.pool.data(), problem.table(row), visible, expected[row].data());
    for (float e : expected[row]) largest[row] = std::max(largest[row], std::fabs(e));
    for (int64_t p = 0; p < visible && check_all_scores; ++p)
      ASSERT_NEAR(row_scores[p], expected[row][p], kScoreTolerance * largest[row])
          << "row " << row << " position " << p;
    for (int64_t p = visible; p < problem.score_stride; ++p)
      ASSERT_TRUE(std::isnan(row_scores[p]))
          << "row " << row << " wrote past its visible keys at " << p;
  }
  for (cuda::TopkPath path : topk_paths(device.topk_params(problem))) {
    SCOPED_TRACE(path_name(path));
    device.slots.fill_bytes(0x5a);
    cuda::radix_topk(device.topk_params(problem, path), nullptr);
    const std::vector<int32_t> slots = device.slots.download();
    for (int row = 0; row < problem.rows; ++row) {
      const float* row_scores = scores.data() + static_cast<size_t>(row) * problem.score_stride;
      const int64_t visible = problem.row_visible[row];
      expect_valid_topk(
          row_scores, visible, problem.top_k, problem.table(row), problem.layout.num_pages,
          slots.data() + static_cast<size_t>(row) * problem.top_k, "row " + std::to_string(row));
      // The selection is also a top-k of the reference scores, up to rounding at the threshold.
      if (visible > problem.top_k) {
        std::vector<float> sorted = expected[row];
        std::nth_element(sorted.begin(), sorted.begin() + (problem.top_k - 1), sorted.end(),
                         std::greater<float>());
        const float kth = sorted[problem.top_k - 1];
        std::vector<int64_t> logical(static_cast<size_t>(problem.layout.num_pages), -1);
        for (int64_t p = 0; p < (visible + 63) / 64; ++p) logical[problem.table(row)[p]] = p;
        for (int i = 0; i < problem.top_k; ++i) {
          const int32_t slot = slots[static_cast<size_t>(row) * problem.top_k + i];
          const int64_t position = logical[slot / 64] * 64 + slot % 64;
          ASSERT_GE(expected[row][position], kth - 2 * kScoreTolerance * largest[row])
              << "row " << row;
        }
      }
    }
  }
}

TEST(IndexerTopk, QueryQuantisationMatchesReference) {
  std::mt19937 rng(11);
  const int rows = 5, heads = 32;
  std::vector<uint16_t> queries(rows * heads * kIndexerDim);
  std::normal_distribution<float> normal(0.f, 2.f);
  for (uint16_t& q : queries) q = float_to_bf16(normal(rng));
  for (int i = 0; i < kIndexerDim; ++i)
    queries[2 * kIndexerDim + i] = 0;  // an all-zero head: scale 1
  std::vector<float> head_weights(rows * heads);
  for (float& w : head_weights) w = normal(rng);
  DeviceBuffer<uint16_t> device_queries(queries);
  DeviceBuffer<float> device_head_weights(head_weights), device_weights(rows * heads);
  DeviceBuffer<uint8_t> device_q8(queries.size());
  cuda::QuantizeIndexerParams params;
  params.queries = device_queries.get();
  params.head_weights = device_head_weights.get();
  params.queries_fp8 = device_q8.get();
  params.weights = device_weights.get();
  params.rows = rows;
  params.heads = heads;
  params.softmax_scale = 1.f / std::sqrt(128.f);
  cuda::quantize_indexer_queries(params, nullptr);
  const auto q8 = device_q8.download();
  const auto weights = device_weights.download();
  std::vector<float> query(kIndexerDim);
  std::vector<uint8_t> expected_q8(kIndexerDim);
  for (int item = 0; item < rows * heads; ++item) {
    for (int i = 0; i < kIndexerDim; ++i) query[i] = bf16_to_float(queries[item * kIndexerDim + i]);
    float expected_weight = 0.f;
    reference::quantize_indexer_query(query.data(), head_weights[item], params.softmax_scale,
                                      expected_q8.data(), &expected_weight);
    EXPECT_FLOAT_EQ(weights[item], expected_weight) << item;
    for (int i = 0; i < kIndexerDim; ++i)
      ASSERT_EQ(q8[item * kIndexerDim + i], expected_q8[i]) << item << " " << i;
  }
}

TEST(IndexerTopk, DecodeBatchOfUnevenLengths) {
  IndexerProblem problem;
  problem.lengths = {1, 63, 64, 65, 2047, 2048, 2049, 5000, 9001};
  run_and_check(problem, 21);
}

TEST(IndexerTopk, MtpVerificationRowsAreCausal) {
  for (int tokens : {2, 3, 4, 8}) {
    IndexerProblem problem;
    problem.rows_per_group = tokens;
    problem.lengths = {tokens, 700, 2050, 6001};
    run_and_check(problem, 30 + tokens);
  }
}

TEST(IndexerTopk, SixtyFourHeadsAndSmallK) {
  IndexerProblem problem;
  problem.heads = 64;
  problem.top_k = 100;
  problem.rows_per_group = 2;
  problem.lengths = {99, 101, 3333};
  run_and_check(problem, 41);
}

TEST(IndexerTopk, PrefillRowsEachWithTheirOwnLength) {
  // Groups of 8 consecutive prompt tokens, each row with its own causal length.
  IndexerProblem prefill;
  prefill.rows_per_group = 8;
  prefill.top_k = 256;
  prefill.lengths = {300, 308, 316};  // three groups of prompt rows
  run_and_check(prefill, 52);
}

// Rows of at most kTopkSmallRow keys use the one-CTA select, longer batches the
// multi-CTA passes: ties are checked on both.
void check_ties(const std::vector<int64_t>& lengths, uint32_t seed) {
  std::mt19937 rng(seed);
  IndexerProblem problem;
  problem.top_k = 2048;
  problem.lengths = lengths;
  problem.build(rng);
  DeviceIndexer device(problem);
  // Scores from a tiny set of values: thousands of ties at the threshold.
  std::vector<float> scores(static_cast<size_t>(problem.rows) * problem.score_stride, 0.f);
  const float values[] = {-3.f, -0.5f, 0.f, 1.f, 1.f, 2.5f, 7.f};
  for (int row = 0; row < problem.rows; ++row)
    for (int64_t p = 0; p < problem.row_visible[row]; ++p)
      scores[row * problem.score_stride + p] = row == 1 ? 4.f : values[rng() % 7];
  device.scores.upload(scores);
  for (cuda::TopkPath path : topk_paths(device.topk_params(problem))) {
    SCOPED_TRACE(path_name(path));
    cuda::radix_topk(device.topk_params(problem, path), nullptr);
    cuda::radix_topk(device.topk_params(problem, path), nullptr);  // the workspace is reusable
    const auto slots = device.slots.download();
    for (int row = 0; row < problem.rows; ++row)
      expect_valid_topk(scores.data() + row * problem.score_stride, problem.row_visible[row],
                        problem.top_k, problem.table(row), problem.layout.num_pages,
                        slots.data() + row * problem.top_k, "tie row " + std::to_string(row));
  }
}

TEST(IndexerTopk, TiesAndNegativeScoresSelectAValidSet) {
  check_ties({10000, 4097, 300000}, 61);  // multi-CTA passes; the cluster kernel
  check_ties({10000, 4097, 30000}, 62);   // one CTA per row; the cluster kernel
}

TEST(IndexerTopk, LongBatchUsesTheMultiBlockSelectForEveryRow) {
  IndexerProblem problem;
  problem.rows_per_group = 2;
  problem.lengths = {2, 2047, 2049, 40000, 70001};
  run_and_check(problem, 63);
}

TEST(IndexerTopk, OneMillionKeys) {
  IndexerProblem problem;
  problem.lengths = {1048576, 1048576 - 37};
  std::mt19937 rng(71);
  problem.build(rng, /*fast_pool=*/true);
  DeviceIndexer device(problem);
  for (bool bulk_copies : {true, false}) {
    SCOPED_TRACE(bulk_copies ? "bulk copies" : "cp.async");
    device.scores.fill_bytes(0xff);
    cuda::IndexerScoreParams params = device.score_params(problem);
    params.bulk_copies = bulk_copies;
    cuda::indexer_scores(params, nullptr);
    const auto scores = device.scores.download();
    for (int row = 0; row < problem.rows; ++row) {
      const float* row_scores = scores.data() + static_cast<size_t>(row) * problem.score_stride;
      const int64_t visible = problem.row_visible[row];
      // Scores at random positions and at both ends (index arithmetic past 2^20 * 132 bytes).
      std::vector<int64_t> positions = {0, 1, 63, 64, visible - 65, visible - 2, visible - 1};
      for (int i = 0; i < 3000; ++i) positions.push_back(static_cast<int64_t>(rng() % visible));
      std::vector<float> expected;
      float largest = 1e-30f;
      for (int64_t p : positions) {
        expected.push_back(reference_score(problem, row, p));
        largest = std::max(largest, std::fabs(expected.back()));
      }
      for (size_t i = 0; i < positions.size(); ++i)
        ASSERT_NEAR(row_scores[positions[i]], expected[i], kScoreTolerance * largest)
            << "row " << row << " position " << positions[i];
      for (int64_t p = visible; p < problem.score_stride; ++p)
        ASSERT_TRUE(std::isnan(row_scores[p]));
    }
    for (cuda::TopkPath path : topk_paths(device.topk_params(problem))) {
      SCOPED_TRACE(path_name(path));
      device.slots.fill_bytes(0x5a);
      cuda::radix_topk(device.topk_params(problem, path), nullptr);
      const auto slots = device.slots.download();
      for (int row = 0; row < problem.rows; ++row)
        expect_valid_topk(scores.data() + static_cast<size_t>(row) * problem.score_stride,
                          problem.row_visible[row], problem.top_k, problem.table(row),
                          problem.layout.num_pages,
                          slots.data() + static_cast<size_t>(row) * problem.top_k,
                          "1M row " + std::to_string(row));
    }
  }
}

// Positions mode (block_table == nullptr, no row_request): the same selection
// as slots mode, written as positions. Both the one-CTA rows and the
// multi-CTA passes; random scores (no ties: the two sets must be equal) and
// heavy ties (any valid set).
void check_positions_mode_path(const IndexerProblem& problem, DeviceIndexer& device,
                               const std::vector<float>& scores, bool ties, cuda::TopkPath path);

void check_positions_mode(const std::vector<int64_t>& lengths, bool ties, uint32_t seed) {
  std::mt19937 rng(seed);
  IndexerProblem problem;
  problem.top_k = 2048;
  problem.lengths = lengths;
  problem.build(rng);
  DeviceIndexer device(problem);
  std::vector<float> scores(static_cast<size_t>(problem.rows) * problem.score_stride, 0.f);
  std::normal_distribution<float> normal(0.f, 1.f);
  const float values[] = {-1.f, 0.f, 0.f, 2.f};
  for (int row = 0; row < problem.rows; ++row)
    for (int64_t p = 0; p < problem.row_visible[row]; ++p)
      scores[row * problem.score_stride + p] = ties ? values[rng() % 4] : normal(rng);
  device.scores.upload(scores);
  for (cuda::TopkPath path : topk_paths(device.topk_params(problem))) {
    SCOPED_TRACE(path_name(path));
    check_positions_mode_path(problem, device, scores, ties, path);
  }
}

void check_positions_mode_path(const IndexerProblem& problem, DeviceIndexer& device,
                               const std::vector<float>& scores, bool ties, cuda::TopkPath path) {
  cuda::radix_topk(device.topk_params(problem, path), nullptr);
  const auto slots = device.slots.download();
  cuda::TopkParams positions_mode = device.topk_params(problem, path);
  positions_mode.block_table = nullptr;
  positions_mode.row_request = nullptr;
  positions_mode.block_table_stride = 0;
  DeviceBuffer<int32_t> positions(static_cast<size_t>(problem.rows) * problem.top_k);
  positions.fill_bytes(0x5a);
  positions_mode.out_slots = positions.get();
  cuda::radix_topk(positions_mode, nullptr);
  cuda::radix_topk(positions_mode, nullptr);  // the workspace is left reusable here too
  const auto got = positions.download();
  // Identity page table: a position is its own "slot" for expect_valid_topk.
  std::vector<int32_t> identity((problem.max_visible + 63) / 64 + 1);
  std::iota(identity.begin(), identity.end(), 0);
  for (int row = 0; row < problem.rows; ++row) {
    const std::string what = "positions-mode row " + std::to_string(row);
    const int32_t* row_positions = got.data() + static_cast<size_t>(row) * problem.top_k;
    expect_valid_topk(scores.data() + row * problem.score_stride, problem.row_visible[row],
                      problem.top_k, identity.data(), static_cast<int64_t>(identity.size()),
                      row_positions, what);
    if (ties) continue;
    // Slots mode mapped back to positions: the same set.
    std::vector<int64_t> logical(static_cast<size_t>(problem.layout.num_pages), -1);
    for (int64_t p = 0; p < (problem.row_visible[row] + 63) / 64; ++p)
      logical[problem.table(row)[p]] = p;
    std::vector<int64_t> from_slots, from_positions;
    for (int i = 0; i < problem.top_k; ++i) {
      const int32_t slot = slots[static_cast<size_t>(row) * problem.top_k + i];
      if (slot >= 0) from_slots.push_back(logical[slot / 64] * 64 + slot % 64);
      if (row_positions[i] >= 0) from_positions.push_back(row_positions[i]);
    }
    std::sort(from_slots.begin(), from_slots.end());
    std::sort(from_positions.begin(), from_positions.end());
    ASSERT_EQ(from_positions, from_slots) << what;
  }
}

TEST(IndexerTopk, PositionsModeSelectsTheSameSetAsSlots) {
  check_positions_mode({1, 64, 2047, 2048, 2049, 10000, 30000}, false, 81);  // one CTA per row
  check_positions_mode({5, 3000, 40000, 70001}, false, 82);                  // multi-CTA passes
  check_positions_mode({4097, 30000}, true, 83);
  check_positions_mode({4097, 300000}, true, 84);
}

TEST(IndexerTopk, ClusterKernelAtItsLongestRows) {
  // Rows of up to 48 keys per thread: every key slot of the shared-memory
  // array in use, rows ending mid-warp, one row with every key taken.
  check_positions_mode({cuda::kTopkClusterMaxVisible, 200001, 2048, 131072 + 17}, false, 85);
  check_positions_mode({cuda::kTopkClusterMaxVisible - 5, 65536}, true, 86);
}

TEST(IndexerTopk, RejectsBadShapes) {
  cuda::IndexerScoreParams params;
  params.heads = 48;
  EXPECT_THROW(cuda::indexer_scores(params, nullptr), Error);
  params.heads = 32;
  params.rows_per_group = 9;
  EXPECT_THROW(cuda::indexer_scores(params, nullptr), Error);
  cuda::TopkParams topk;
  topk.top_k = 0;
  EXPECT_THROW(cuda::radix_topk(topk, nullptr), Error);
  // A block table needs row_request; positions mode needs neither.
  DeviceBuffer<float> scores(64);
  DeviceBuffer<int32_t> visible(std::vector<int32_t>{0}), table(1), out(4), state(8);
  DeviceBuffer<uint32_t> histogram(cuda::kTopkHistogramBins);
  state.fill_bytes(0);
  histogram.fill_bytes(0);
  topk.top_k = 4;
  topk.rows = 1;
  topk.scores = scores.get();
  topk.score_stride = 64;
  topk.max_visible = 64;
  topk.row_visible = visible.get();
  topk.out_slots = out.get();
  topk.histogram = histogram.get();
  topk.row_state = state.get();
  topk.block_table = table.get();
  topk.block_table_stride = 1;
  EXPECT_THROW(cuda::radix_topk(topk, nullptr), Error);
  topk.block_table = nullptr;
  topk.block_table_stride = 0;
  EXPECT_NO_THROW(cuda::radix_topk(topk, nullptr));
  EXPECT_EQ(out.download(), (std::vector<int32_t>{-1, -1, -1, -1}));  // no visible key
  topk.path = cuda::TopkPath::Cluster;
  out.fill_bytes(0x5a);
  EXPECT_NO_THROW(cuda::radix_topk(topk, nullptr));
  EXPECT_EQ(out.download(), (std::vector<int32_t>{-1, -1, -1, -1}));
  topk.max_visible = cuda::kTopkClusterMaxVisible + 1;  // past what the cluster kernel holds
  topk.score_stride = topk.max_visible;
  EXPECT_THROW(cuda::radix_topk(topk, nullptr), Error);
}

}  // namespace
}  // namespace megactx::test
