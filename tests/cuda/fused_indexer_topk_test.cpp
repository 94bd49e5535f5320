// The fused indexer + top-k (kernels/cuda/indexer_topk) against the fp32
// reference and against the two-kernel path it replaces for prefill
// (indexer_scores + radix_topk), on fresh random paged fp8 caches: ragged
// batches of prefill chunks (rows that are not tile multiples, lengths that are
// not page multiples, segments of 1..3 rows), 32 and 64 heads, small k, exact
// ties (copied keys, all-zero and negative scores), scores that rise or fall
// with the position (every key enters the candidate buffers: many
// compactions), few persistent CTAs (each takes many tiles), repeated calls
// on one workspace, both scoring engines (wgmma, mma.sync), both head sums
// (bf16 on the tensor cores, fp32 on the CUDA cores) and 1M keys.
//
// The selection is checked as a set against oracle scores: right count,
// distinct visible positions, -1 after; every chosen score within rounding of
// the k-th largest, every score clearly above it chosen.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <unordered_set>

#include "core/error.h"
#include "dsa_test_support.h"
#include "kernels/cuda/indexer/indexer.h"
#include "kernels/cuda/indexer_topk/fused_indexer_topk.h"
#include "kernels/cuda/topk/topk.h"

namespace megactx::test {
namespace {

using reference::kIndexerDim;

// Relative to the row's largest |score| (as indexer_topk_test): fp8 tensor-core
// products are exact, their fp32 sums differ by order and internal precision.
constexpr float kScoreTolerance = 2e-3f;
// The tensor-core head sum rounds each relu(q . k) to bf16 (the weights are
// split into two bf16 parts, exact to 2^-17): a score may move by up to
// 2^-9 * key_scale * sum_h |w_h| relu(q_h . k), on top of the fp32 tolerance.
constexpr float kBf16HeadSumRounding = 1.f / 512;

// One prefill chunk of a request: rows for positions start .. start + rows - 1.
struct Chunk {
  int64_t start = 0;
  int rows = 1;
};

enum class Keys { Random, FastRandom, FewDistinct, Rising, Falling };

struct FusedProblem {
  int heads = 32, top_k = 2048;
  std::vector<Chunk> chunks;
  Keys keys = Keys::Random;
  float weight_mean = 0.f, weight_spread = 1e-3f;
  bool zero_weights = false;

  PagedLayout layout;
  std::vector<uint8_t> pool, queries;
  std::vector<float> query_values, weights;
  std::vector<int32_t> row_request, row_table, row_visible;
  int rows = 0, max_visible = 0;

  void build(std::mt19937& rng) {
    std::vector<int64_t> lengths;
    for (const Chunk& c : chunks) lengths.push_back(c.start + c.rows);
    layout = make_paged_layout(lengths, rng);
    const int64_t slots = layout.num_pages * 64;
    pool.assign(static_cast<size_t>(slots) * reference::kIndexerEntryBytes, 0);
    if (keys == Keys::Random) {
      pool = random_indexer_pool(layout.num_pages, rng);
    } else if (keys == Keys::FastRandom) {  // random e4m3 bytes (never NaN), small scales
      for (int64_t slot = 0; slot < slots; ++slot) {
        uint8_t* entry = pool.data() + slot * reference::kIndexerEntryBytes;
        for (int i = 0; i < kIndexerDim; i += 4) {
          const uint32_t word = rng();
          for (int b = 0; b < 4; ++b) {
            uint8_t byte = static_cast<uint8_t>(word >> (8 * b));
            if ((byte & 0x7f) == 0x7f) byte ^= 1;
            entry[i + b] = byte;
          }
        }
        const float scale = 1e-3f * (1 + rng() % 10);
        std::memcpy(entry + kIndexerDim, &scale, 4);
      }
    } else if (keys == Keys::FewDistinct) {  // 5 distinct keys: thousands of exact ties
      std::vector<uint8_t> distinct = random_indexer_pool(1, rng);
      for (int64_t slot = 0; slot < slots; ++slot)
        std::memcpy(pool.data() + slot * reference::kIndexerEntryBytes,
                    distinct.data() + (rng() % 5) * reference::kIndexerEntryBytes,
                    reference::kIndexerEntryBytes);
    } else {
      // Every key the same positive e4m3 bytes; the scale rises (or falls) with
      // the position, so with positive queries and weights the scores do too.
      for (size_t r = 0; r < lengths.size(); ++r)
        for (int64_t p = 0; p < lengths[r]; ++p) {
          const int64_t slot = reference::position_to_slot(
              layout.block_table.data() + r * layout.block_table_stride, p);
          uint8_t* entry = pool.data() + slot * reference::kIndexerEntryBytes;
          for (int i = 0; i < kIndexerDim; ++i) entry[i] = float_to_fp8_e4m3(0.5f + (i % 7) / 8.f);
          const float step = 1e-6f * static_cast<float>(p);
          const float scale = keys == Keys::Rising ? 1e-3f * (1.f + step) : 1e-3f * (2.f - step);
          std::memcpy(entry + kIndexerDim, &scale, 4);
        }
    }
    for (size_t r = 0; r < chunks.size(); ++r)
      for (int i = 0; i < chunks[r].rows; ++i) {
        row_request.push_back(static_cast<int32_t>(r));
        row_table.push_back(static_cast<int32_t>(r) * layout.block_table_stride);
        const int64_t visible = chunks[r].start + i + 1;
        row_visible.push_back(static_cast<int32_t>(visible));
        max_visible = std::max<int>(max_visible, static_cast<int>(visible));
      }
    rows = static_cast<int>(row_request.size());
    const size_t q_count = static_cast<size_t>(rows) * heads * kIndexerDim;
    if (keys == Keys::Rising || keys == Keys::Falling) {
      queries.resize(q_count);
      query_values.resize(q_count);
      for (size_t i = 0; i < q_count; ++i) {
        queries[i] = float_to_fp8_e4m3(1.f + static_cast<float>(rng() % 64));
        query_values[i] = fp8_e4m3_to_float(queries[i]);
      }
    } else {
      random_fp8_queries(q_count, rng, queries, query_values);
    }
    std::normal_distribution<float> normal(weight_mean, weight_spread > 0 ? weight_spread : 1.f);
    weights.resize(static_cast<size_t>(rows) * heads);
    for (float& w : weights)
      w = zero_weights ? 0.f : (weight_spread > 0 ? normal(rng) : weight_mean);
  }
  const int32_t* table(int row) const { return layout.block_table.data() + row_table[row]; }
};

struct DeviceProblem {
  DeviceBuffer<uint8_t> pool, queries;
  DeviceBuffer<float> weights;
  DeviceBuffer<int32_t> tables, row_request, row_table, row_visible, out, counts;
  explicit DeviceProblem(const FusedProblem& problem)
      : pool(problem.pool),
        queries(problem.queries),
        weights(problem.weights),
        tables(problem.layout.block_table),
        row_request(problem.row_request),
        row_table(problem.row_table),
        row_visible(problem.row_visible),
        out(static_cast<size_t>(problem.rows) * problem.top_k),
        counts(static_cast<size_t>(problem.rows)) {}
};

// Scores of every row from the tested two-kernel scorer (indexer_topk_test
// checks it against the fp32 reference): [rows, max_visible], NaN past visible.
std::vector<float> oracle_scores(const FusedProblem& problem, DeviceProblem& device) {
  DeviceBuffer<float> scores(static_cast<size_t>(problem.rows) * problem.max_visible);
  scores.fill_bytes(0xff);
  cuda::IndexerScoreParams params;
  params.queries = device.queries.get();
  params.weights = device.weights.get();
  params.key_pool = device.pool.get();
  params.block_table = device.tables.get();
  params.block_table_stride = problem.layout.block_table_stride;
  params.row_request = device.row_request.get();
  params.row_visible = device.row_visible.get();
  params.scores = scores.get();
  params.score_stride = problem.max_visible;
  params.rows = problem.rows;
  params.heads = problem.heads;
  params.rows_per_group = 1;
  params.max_visible = problem.max_visible;
  cuda::indexer_scores(params, nullptr);
  return scores.download();
}

// key_scale * sum_h |w_h| relu(q_h . k) of every row ([rows, max_visible]): the
// scale of the bf16 head sum's rounding (the oracle scorer with |weights|).
std::vector<float> magnitude_scores(const FusedProblem& problem, DeviceProblem& device) {
  std::vector<float> magnitudes(problem.weights);
  for (float& w : magnitudes) w = std::fabs(w);
  DeviceBuffer<float> signed_weights = std::move(device.weights);
  device.weights = DeviceBuffer<float>(magnitudes);
  std::vector<float> result = oracle_scores(problem, device);
  device.weights = std::move(signed_weights);
  return result;
}

// The selection of the two-kernel path (radix_topk in positions mode).
std::vector<int32_t> old_path_positions(const FusedProblem& problem, DeviceProblem& device,
                                        const std::vector<float>& scores) {
  DeviceBuffer<float> device_scores(scores);
  DeviceBuffer<int32_t> positions(static_cast<size_t>(problem.rows) * problem.top_k);
  DeviceBuffer<uint32_t> histogram(static_cast<size_t>(problem.rows) * cuda::kTopkHistogramBins);
  DeviceBuffer<int32_t> state(static_cast<size_t>(problem.rows) * cuda::kTopkRowState);
  histogram.fill_bytes(0);
  state.fill_bytes(0);
  cuda::TopkParams params;
  params.scores = device_scores.get();
  params.score_stride = problem.max_visible;
  params.row_visible = device.row_visible.get();
  params.rows = problem.rows;
  params.top_k = problem.top_k;
  params.max_visible = problem.max_visible;
  params.out_slots = positions.get();
  params.histogram = histogram.get();
  params.row_state = state.get();
  cuda::radix_topk(params, nullptr);
  return positions.download();
}

struct FusedRun {
  bool wgmma = true;
  int ctas = 0;  // 0: one per SM
  int repeats = 1;
  bool positions_input = false;  // rows given by positions instead of visible lengths
  bool ping_pong = false;        // wgmma, fp32 head sum: the warpgroups take turns issuing MMAs
  bool tensor_head_sum = true;   // wgmma: the head sum on the tensor cores (bf16)
  int consumer_warpgroups = 0;   // 0: the kernel's choice (4 with the bf16 head sum)
  bool newest_first = true;      // the order each tile streams its key pages in
  int check_pages = 0;           // pages between compaction checks (0: the default)
};

bool bf16_head_sum(const FusedRun& run) {
  return run.wgmma && run.tensor_head_sum;
}

// What the bf16 head sum may add to a selection's tolerance: both the chosen
// and the k-th score may move, each by at most kBf16HeadSumRounding of the
// row's largest magnitude.
float head_sum_allowance(const FusedRun& run, const std::vector<float>& magnitudes, int row,
                         const FusedProblem& problem) {
  if (!bf16_head_sum(run)) return 0.f;
  const float* m = magnitudes.data() + static_cast<size_t>(row) * problem.max_visible;
  float largest = 0.f;
  for (int64_t p = 0; p < problem.row_visible[row]; ++p) largest = std::max(largest, m[p]);
  return 2 * kBf16HeadSumRounding * largest;
}

std::string run_name(const FusedRun& run) {
  return std::string(run.wgmma ? (run.ping_pong ? "wgmma ping-pong" : "wgmma free-running")
                               : "mma.sync") +
         (bf16_head_sum(run) ? ", bf16 head sum" : ", fp32 head sum") +
         (run.consumer_warpgroups ? ", " + std::to_string(run.consumer_warpgroups) + " warpgroups"
                                  : "") +
         (run.newest_first ? "" : ", oldest page first") +
         (run.check_pages ? ", checks every " + std::to_string(run.check_pages) + " pages" : "") +
         ", ctas " + std::to_string(run.ctas);
}

// wgmma with the warpgroups taking turns (fp32 head sum), the default kernel
// (bf16 head sum on the tensor cores, four consumer warpgroups; twice on one
// workspace; once streaming pages oldest first; once checking for compactions
// every page instead of every 4), the same with two warpgroups, wgmma free-running with the
// fp32 head sum, mma.sync (fp32 head sum).
const std::vector<FusedRun> kBothEngines = {{true, 0, 1, false, true, false},
                                            {true, 0, 2, false, false},
                                            {true, 0, 1, false, false, true, 0, false},
                                            {true, 0, 1, false, false, true, 0, true, 1},
                                            {true, 0, 1, false, false, true, 2},
                                            {true, 0, 1, false, false, false},
                                            {false, 0, 1, false, false}};

std::vector<int32_t> run_fused(const FusedProblem& problem, DeviceProblem& device,
                               const FusedRun& run, std::vector<int32_t>* counts = nullptr) {
  const int ctas = run.ctas > 0 ? run.ctas : cuda::fused_indexer_topk_default_ctas();
  const size_t bytes = cuda::fused_indexer_topk_workspace_bytes(problem.rows, ctas);
  DeviceBuffer<uint8_t> workspace(bytes);
  workspace.fill_bytes(0xa7);  // the kernels must not read what they did not write
  std::vector<int32_t> positions;
  DeviceBuffer<int32_t> row_positions;
  if (run.positions_input) {
    std::vector<int32_t> host(problem.row_visible);
    for (int32_t& v : host) --v;
    row_positions = DeviceBuffer<int32_t>(host);
  }
  for (int repeat = 0; repeat < run.repeats; ++repeat) {
    device.out.fill_bytes(0x5a);
    device.counts.fill_bytes(0x5a);
    cuda::FusedIndexerTopkParams params;
    params.queries = device.queries.get();
    params.weights = device.weights.get();
    params.key_pool = device.pool.get();
    params.page_tables = device.tables.get();
    params.row_table = device.row_table.get();
    if (run.positions_input)
      params.row_positions = row_positions.get();
    else
      params.row_visible = device.row_visible.get();
    params.rows = problem.rows;
    params.heads = problem.heads;
    params.top_k = problem.top_k;
    params.max_visible = problem.max_visible;
    params.out = device.out.get();
    params.out_counts = device.counts.get();
    params.workspace = workspace.get();
    params.workspace_bytes = bytes;
    params.ctas = run.ctas;
    params.wgmma = run.wgmma;
    params.ping_pong = run.ping_pong;
    params.tensor_head_sum = run.tensor_head_sum;
    params.consumer_warpgroups = run.consumer_warpgroups;
    params.newest_first = run.newest_first;
    params.check_pages = run.check_pages;
    cuda::fused_indexer_topk(params, nullptr);
    MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> got = device.out.download();
    if (repeat > 0) {
      // Same inputs, same workspace: the same set per row (order may differ).
      for (int row = 0; row < problem.rows; ++row) {
        std::vector<int32_t> a(positions.begin() + static_cast<int64_t>(row) * problem.top_k,
                               positions.begin() + static_cast<int64_t>(row + 1) * problem.top_k);
        std::vector<int32_t> b(got.begin() + static_cast<int64_t>(row) * problem.top_k,
                               got.begin() + static_cast<int64_t>(row + 1) * problem.top_k);
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        EXPECT_EQ(a, b) << "repeat " << repeat << " row " << row;
      }
    }
    positions = std::move(got);
  }
  if (counts) *counts = device.counts.download();
  return positions;
}

// `positions` [top_k] is a valid top-k of `scores` [visible] up to `tolerance`.
void expect_valid_selection(const float* scores, int64_t visible, int top_k,
                            const int32_t* positions, float tolerance, const std::string& what) {
  const int64_t taken = std::min<int64_t>(top_k, visible);
  std::unordered_set<int32_t> seen;
  float lowest_chosen = INFINITY;
  for (int64_t i = 0; i < taken; ++i) {
    const int32_t p = positions[i];
    ASSERT_GE(p, 0) << what << " entry " << i;
    ASSERT_LT(p, visible) << what << " entry " << i << " is not visible";
    ASSERT_TRUE(seen.insert(p).second) << what << " position " << p << " twice";
    lowest_chosen = std::min(lowest_chosen, scores[p]);
  }
  for (int i = static_cast<int>(taken); i < top_k; ++i)
    ASSERT_EQ(positions[i], -1) << what << " padding " << i;
  if (taken == visible) return;
  std::vector<float> all(scores, scores + visible);
  std::nth_element(all.begin(), all.begin() + (taken - 1), all.end(), std::greater<float>());
  const float kth = all[taken - 1];
  ASSERT_GE(lowest_chosen, kth - tolerance) << what << ": a chosen score is below the k-th";
  for (int64_t p = 0; p < visible; ++p) {
    if (scores[p] > kth + tolerance) {
      ASSERT_TRUE(seen.count(static_cast<int32_t>(p)))
          << what << ": position " << p << " (score " << scores[p] << ", k-th " << kth
          << ") is missing";
    }
  }
}

float row_tolerance(const float* scores, int64_t visible) {
  float largest = 1e-30f;
  for (int64_t p = 0; p < visible; ++p) largest = std::max(largest, std::fabs(scores[p]));
  return 2 * kScoreTolerance * largest;
}

// Mean over rows with more than top_k keys of |a ∩ b| / top_k.
double overlap(const FusedProblem& problem, const std::vector<int32_t>& a,
               const std::vector<int32_t>& b) {
  double sum = 0;
  int counted = 0;
  for (int row = 0; row < problem.rows; ++row) {
    if (problem.row_visible[row] <= problem.top_k) continue;
    const auto first = b.begin() + static_cast<int64_t>(row) * problem.top_k;
    const std::unordered_set<int32_t> other(first, first + problem.top_k);
    int common = 0;
    for (int i = 0; i < problem.top_k; ++i)
      common += other.count(a[static_cast<size_t>(row) * problem.top_k + i]) ? 1 : 0;
    sum += static_cast<double>(common) / problem.top_k;
    ++counted;
  }
  return counted ? sum / counted : 1.0;
}

// Builds, runs the fused kernel (each run in `runs`) and checks every row
// against the oracle scores and the two-kernel path's selection.
void check_problem(FusedProblem& problem, uint32_t seed, const std::vector<FusedRun>& runs,
                   double min_overlap = 0.98) {
  std::mt19937 rng(seed);
  problem.build(rng);
  DeviceProblem device(problem);
  const std::vector<float> scores = oracle_scores(problem, device);
  const std::vector<int32_t> old_path = old_path_positions(problem, device, scores);
  const std::vector<float> magnitudes = magnitude_scores(problem, device);
  for (const FusedRun& run : runs) {
    SCOPED_TRACE(run_name(run));
    std::vector<int32_t> counts;
    const std::vector<int32_t> got = run_fused(problem, device, run, &counts);
    for (int row = 0; row < problem.rows; ++row) {
      const float* row_scores = scores.data() + static_cast<size_t>(row) * problem.max_visible;
      const int64_t visible = problem.row_visible[row];
      ASSERT_EQ(counts[row], std::min<int64_t>(problem.top_k, visible)) << "row " << row;
      expect_valid_selection(
          row_scores, visible, problem.top_k, got.data() + static_cast<size_t>(row) * problem.top_k,
          row_tolerance(row_scores, visible) + head_sum_allowance(run, magnitudes, row, problem),
          "row " + std::to_string(row));
      if (::testing::Test::HasFatalFailure()) return;
    }
    const double agreement = overlap(problem, got, old_path);
    std::printf("fused vs two-kernel selection (%s): agreement %.5f over %d rows\n",
                run_name(run).c_str(), agreement, problem.rows);
    EXPECT_GE(agreement, min_overlap);
  }
}

// The scores the fused kernel computed (its debug output) against the oracle:
// tells a scoring error (operand layouts) from a selection error. On a
// mismatch it names where the value it wrote belongs, if anywhere nearby.
void check_scores(int heads, uint32_t seed) {
  FusedProblem problem;
  problem.heads = heads;
  problem.top_k = 64;
  problem.chunks = {{100, 20}, {3000, 9}};
  std::mt19937 rng(seed);
  problem.build(rng);
  DeviceProblem device(problem);
  const std::vector<float> want = oracle_scores(problem, device);
  const std::vector<float> magnitudes = magnitude_scores(problem, device);
  for (const FusedRun& run : kBothEngines) {
    SCOPED_TRACE(run_name(run));
    DeviceBuffer<float> debug(static_cast<size_t>(problem.rows) * problem.max_visible);
    debug.fill_bytes(0xff);
    const int ctas = cuda::fused_indexer_topk_default_ctas();
    const size_t bytes = cuda::fused_indexer_topk_workspace_bytes(problem.rows, ctas);
    DeviceBuffer<uint8_t> workspace(bytes);
    cuda::FusedIndexerTopkParams params;
    params.queries = device.queries.get();
    params.weights = device.weights.get();
    params.key_pool = device.pool.get();
    params.page_tables = device.tables.get();
    params.row_table = device.row_table.get();
    params.row_visible = device.row_visible.get();
    params.rows = problem.rows;
    params.heads = problem.heads;
    params.top_k = problem.top_k;
    params.max_visible = problem.max_visible;
    params.out = device.out.get();
    params.workspace = workspace.get();
    params.workspace_bytes = bytes;
    params.wgmma = run.wgmma;
    params.ping_pong = run.ping_pong;
    params.tensor_head_sum = run.tensor_head_sum;
    params.consumer_warpgroups = run.consumer_warpgroups;
    params.newest_first = run.newest_first;
    params.debug_scores = debug.get();
    params.debug_stride = problem.max_visible;
    cuda::fused_indexer_topk(params, nullptr);
    const std::vector<float> got = debug.download();
    int bad = 0;
    for (int row = 0; row < problem.rows; ++row) {
      const float* w = want.data() + static_cast<size_t>(row) * problem.max_visible;
      const float* g = got.data() + static_cast<size_t>(row) * problem.max_visible;
      const int64_t visible = problem.row_visible[row];
      const float* m = magnitudes.data() + static_cast<size_t>(row) * problem.max_visible;
      const float fp32_tolerance = row_tolerance(w, visible) / 2;
      for (int64_t p = 0; p < visible; ++p) {
        const float tolerance =
            fp32_tolerance + (bf16_head_sum(run) ? kBf16HeadSumRounding * m[p] : 0.f);
        if (std::fabs(g[p] - w[p]) <= tolerance) continue;
        if (++bad > 8) continue;
        std::string where = "nowhere nearby";
        for (int other = 0; other < problem.rows; ++other)
          for (int64_t q = std::max<int64_t>(0, p - 70); q < std::min<int64_t>(visible, p + 70);
               ++q)
            if (q < problem.row_visible[other] &&
                std::fabs(want[static_cast<size_t>(other) * problem.max_visible + q] - g[p]) <=
                    tolerance / 100)
              where = "row " + std::to_string(other) + " position " + std::to_string(q);
        ADD_FAILURE() << "row " << row << " position " << p << ": fused " << g[p] << ", oracle "
                      << w[p] << " (the fused value belongs to " << where << ")";
      }
    }
    EXPECT_EQ(bad, 0) << "mismatching scores";
  }
}

TEST(FusedIndexerTopk, ScoresMatchTheOracle) {
  check_scores(32, 1);
  check_scores(64, 2);
}

TEST(FusedIndexerTopk, MatchesTheReferenceOnASmallChunk) {
  // The fp32 reference itself (no GPU oracle): 2 requests, 40 + 7 rows.
  FusedProblem problem;
  problem.top_k = 64;
  problem.chunks = {{100, 40}, {1000, 7}};
  std::mt19937 rng(3);
  problem.build(rng);
  DeviceProblem device(problem);
  for (const FusedRun& run : kBothEngines) {
    SCOPED_TRACE(run_name(run));
    const std::vector<int32_t> got = run_fused(problem, device, run);
    for (int row = 0; row < problem.rows; ++row) {
      const int64_t visible = problem.row_visible[row];
      std::vector<float> expected(static_cast<size_t>(visible));
      const float* q =
          problem.query_values.data() + static_cast<size_t>(row) * problem.heads * kIndexerDim;
      const float* w = problem.weights.data() + static_cast<size_t>(row) * problem.heads;
      reference::indexer_scores_reference(q, w, problem.heads, problem.pool.data(),
                                          problem.table(row), visible, expected.data());
      float allowance = 0.f;
      if (bf16_head_sum(run)) {
        std::vector<float> magnitude_weights(w, w + problem.heads);
        for (float& v : magnitude_weights) v = std::fabs(v);
        std::vector<float> magnitudes(static_cast<size_t>(visible));
        reference::indexer_scores_reference(q, magnitude_weights.data(), problem.heads,
                                            problem.pool.data(), problem.table(row), visible,
                                            magnitudes.data());
        allowance =
            2 * kBf16HeadSumRounding * *std::max_element(magnitudes.begin(), magnitudes.end());
      }
      expect_valid_selection(expected.data(), visible, problem.top_k,
                             got.data() + static_cast<size_t>(row) * problem.top_k,
                             row_tolerance(expected.data(), visible) + allowance,
                             "row " + std::to_string(row));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(FusedIndexerTopk, RaggedPrefillChunks) {
  // Chunks whose rows are not tile multiples, starting anywhere: all keys
  // taken (visible <= k), rows crossing k, lengths that are not page multiples.
  FusedProblem problem;
  problem.chunks = {{0, 37}, {2000, 50}, {5003, 100}, {9001, 23}, {63, 1}, {4095, 17}};
  check_problem(problem, 11, kBothEngines);
}

TEST(FusedIndexerTopk, DecodeLikeSegmentsOfOneToThreeRows) {
  FusedProblem problem;
  for (int i = 0; i < 40; ++i)
    problem.chunks.push_back({static_cast<int64_t>(1 + i * 311), 1 + i % 3});
  check_problem(problem, 12,
                {{true, 0, 1, false, true, false},
                 {true, 5, 1, true, true, false},
                 {true, 5, 1, true, false}});
}

TEST(FusedIndexerTopk, SixtyFourHeadsAndSmallK) {
  FusedProblem problem;
  problem.heads = 64;
  problem.top_k = 100;
  problem.chunks = {{99, 2}, {101, 9}, {3333, 21}, {7000, 8}};
  check_problem(problem, 13, kBothEngines);
}

TEST(FusedIndexerTopk, FewCtasTakeManyTiles) {
  // Three persistent CTAs for 30 tiles: the page ring and the candidate
  // buffers carry over from tile to tile.
  FusedProblem problem;
  problem.top_k = 256;
  problem.chunks = {{3000, 200}, {700, 90}, {12000, 190}};
  check_problem(
      problem, 14,
      {{true, 3, 2, false, true, false}, {true, 3, 1, false, false}, {false, 3, 1, false, false}});
}

TEST(FusedIndexerTopk, TiesZeroAndNegativeScores) {
  {
    SCOPED_TRACE("five distinct keys");
    FusedProblem problem;
    problem.keys = Keys::FewDistinct;
    problem.chunks = {{10000, 16}, {30000, 9}};
    check_problem(problem, 15, {{true, 0, 1, false}}, 0.0);  // any tie is valid
  }
  {
    SCOPED_TRACE("all scores zero");
    FusedProblem problem;
    problem.zero_weights = true;
    problem.chunks = {{9000, 16}};
    check_problem(problem, 16, {{true, 0, 1, false}}, 0.0);
  }
  {
    SCOPED_TRACE("negative weights");
    FusedProblem problem;
    problem.weight_mean = -2e-3f;
    problem.chunks = {{20000, 20}};
    check_problem(problem, 17, {{true, 0, 1, false}});
  }
}

TEST(FusedIndexerTopk, RisingAndFallingScoresCompactMany) {
  // Rising scores streamed oldest first, or falling ones streamed newest
  // first (the default): every key beats the threshold and the buffers
  // compact every ~6000 keys. The result: the last k positions when rising,
  // the first k when falling.
  for (Keys keys : {Keys::Rising, Keys::Falling}) {
    SCOPED_TRACE(keys == Keys::Rising ? "rising" : "falling");
    FusedProblem problem;
    problem.keys = keys;
    problem.weight_mean = 1e-2f;
    problem.weight_spread = 0.f;
    problem.chunks = {{40000, 16}, {25000, 5}};
    std::mt19937 rng(18);
    problem.build(rng);
    DeviceProblem device(problem);
    for (const FusedRun& run : kBothEngines) {
      const std::vector<int32_t> got = run_fused(problem, device, run);
      for (int row = 0; row < problem.rows; ++row) {
        std::vector<int32_t> chosen(got.begin() + static_cast<int64_t>(row) * problem.top_k,
                                    got.begin() + static_cast<int64_t>(row + 1) * problem.top_k);
        std::sort(chosen.begin(), chosen.end());
        const int32_t visible = problem.row_visible[row];
        std::vector<int32_t> expected(static_cast<size_t>(problem.top_k));
        std::iota(expected.begin(), expected.end(),
                  keys == Keys::Rising ? visible - problem.top_k : 0);
        ASSERT_EQ(chosen, expected) << run_name(run) << " row " << row;
      }
    }
  }
}

TEST(FusedIndexerTopk, OneMillionKeys) {
  // The last 16 rows of a 1,048,576-token prefill and 5 rows ending at
  // 1,048,539 (not a page multiple): positions and byte offsets past 2^31 / 132.
  FusedProblem problem;
  problem.keys = Keys::FastRandom;
  problem.chunks = {{1048576 - 16, 16}, {1048539 - 5, 5}};
  check_problem(problem, 19,
                {{true, 0, 1, false, true, false},
                 {true, 0, 1, false, false},
                 {true, 0, 1, false, false, true, 2}});
}

TEST(FusedIndexerTopk, RejectsBadShapes) {
  cuda::FusedIndexerTopkParams params;
  params.heads = 48;
  params.top_k = 16;
  EXPECT_THROW(cuda::fused_indexer_topk(params, nullptr), Error);
  params.heads = 32;
  params.top_k = 4096;
  EXPECT_THROW(cuda::fused_indexer_topk(params, nullptr), Error);
  params.top_k = 16;
  params.rows = 3;  // null pointers
  EXPECT_THROW(cuda::fused_indexer_topk(params, nullptr), Error);
  params.rows = 0;
  EXPECT_NO_THROW(cuda::fused_indexer_topk(params, nullptr));
  params.consumer_warpgroups = 3;
  EXPECT_THROW(cuda::fused_indexer_topk(params, nullptr), Error);
  params.consumer_warpgroups = 4;  // only with the tensor-core head sum
  params.tensor_head_sum = false;
  EXPECT_THROW(cuda::fused_indexer_topk(params, nullptr), Error);
  params.tensor_head_sum = true;
  EXPECT_NO_THROW(cuda::fused_indexer_topk(params, nullptr));
  params.check_pages = 2;  // 0, 1 or 4
  EXPECT_THROW(cuda::fused_indexer_topk(params, nullptr), Error);
  params.check_pages = 4;  // only with four warpgroups
  params.consumer_warpgroups = 2;
  EXPECT_THROW(cuda::fused_indexer_topk(params, nullptr), Error);
}

}  // namespace
}  // namespace megactx::test
