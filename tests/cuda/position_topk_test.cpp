// The fallback indexer's top-k (kernels/cuda/dsa_fallback/position_topk.h) against a
// host implementation of its contract: the top-k positions by score, ties to
// the lower position, in increasing position order, -1 after
// counts = min(topk, visible). Scores with many exact ties (few distinct
// values, +0/-0, values one ulp apart that differ only in the last radix
// digit), rows of different lengths in one launch, padding rows, both launch
// plans (keys in shared memory and streamed), aligned and unaligned rows,
// a CUDA-graph replay, and the former quadratic kernel on the same inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "dsa_test_support.h"
#include "kernels/cuda/dsa_fallback/dsa_fallback.h"
#include "bench/cuda/support/position_topk_quadratic.h"
#include "kernels/cuda/dsa_fallback/position_topk.h"

namespace megactx::test {
namespace {

// How the scores of a row are drawn.
enum class Scores {
  Normal,         // continuous, practically no ties
  FewValues,      // 4 distinct values: huge tie groups at the threshold
  ManyValues,     // 200 distinct values
  AllEqual,       // one value: the k lowest positions win
  SignedZeros,    // +0, -0 and a few negatives/positives (0 == -0 ties)
  UlpNeighbours,  // 1.0f + a few ulps: only the last digit tells them apart
  Mixed,          // each row picks one of the above
};

float draw(Scores kind, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  switch (kind) {
    case Scores::Normal:
      return normal(rng);
    case Scores::FewValues:
      return static_cast<float>(rng() % 4) * 0.5f - 0.5f;
    case Scores::ManyValues:
      return static_cast<float>(static_cast<int>(rng() % 200) - 100) * 0.125f;
    case Scores::AllEqual:
      return 0.25f;
    case Scores::SignedZeros: {
      const uint32_t r = rng() % 5;
      return r == 0 ? 0.f : r == 1 ? -0.f : r == 2 ? -1.f : r == 3 ? 1e-30f : -1e-30f;
    }
    case Scores::UlpNeighbours: {
      uint32_t bits;
      const float one = 1.f;
      std::memcpy(&bits, &one, 4);
      bits += rng() % 6;
      float value;
      std::memcpy(&value, &bits, 4);
      return value;
    }
    case Scores::Mixed:
      break;
  }
  return 0.f;
}

// The contract, on the host: [topk] positions, -1 padded.
std::vector<int32_t> reference_row(const float* scores, int64_t visible, int64_t topk) {
  const int64_t taken = std::min(topk, visible);
  std::vector<int32_t> order(static_cast<size_t>(visible));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + taken, order.end(), [&](int32_t a, int32_t b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
  });
  std::vector<int32_t> row(order.begin(), order.begin() + taken);
  std::sort(row.begin(), row.end());
  row.resize(static_cast<size_t>(topk), -1);
  return row;
}

struct Problem {
  std::vector<int32_t> positions;  // [rows] last visible position, -1 padding
  int64_t topk = 1, max_context = 1, stride = 1;
  std::vector<float> scores;  // [rows, stride]
  std::vector<std::string> kinds;

  int64_t rows() const { return static_cast<int64_t>(positions.size()); }
  int64_t visible(int64_t t) const {
    return positions[t] < 0 ? 0 : std::min<int64_t>(positions[t] + 1, max_context);
  }

  // Visible lengths given; stride = max_context + stride_pad.
  Problem(const std::vector<int64_t>& visibles, int64_t topk_, int64_t max_context_,
          int64_t stride_pad, Scores kind, uint32_t seed)
      : topk(topk_), max_context(max_context_), stride(max_context_ + stride_pad) {
    std::mt19937 rng(seed);
    for (int64_t v : visibles) positions.push_back(static_cast<int32_t>(v - 1));
    // NaN outside the visible part: a kernel reading past visible_t would
    // rank it first and fail the comparison.
    scores.assign(static_cast<size_t>(rows() * stride), std::nanf(""));
    const Scores cycle[] = {Scores::Normal,   Scores::FewValues,   Scores::ManyValues,
                            Scores::AllEqual, Scores::SignedZeros, Scores::UlpNeighbours};
    for (int64_t t = 0; t < rows(); ++t) {
      const Scores row_kind = kind == Scores::Mixed ? cycle[rng() % 6] : kind;
      kinds.push_back(std::to_string(static_cast<int>(row_kind)));
      for (int64_t p = 0; p < visible(t); ++p) scores[t * stride + p] = draw(row_kind, rng);
    }
  }
};

struct Result {
  std::vector<int32_t> indices, counts;
};

Result run(const Problem& problem, bool quadratic = false) {
  DeviceBuffer<float> scores(problem.scores);
  DeviceBuffer<int32_t> positions(problem.positions);
  DeviceBuffer<int32_t> indices(static_cast<size_t>(problem.rows() * problem.topk));
  DeviceBuffer<int32_t> counts(static_cast<size_t>(problem.rows()));
  indices.fill_bytes(0x5a);  // stale contents that a missed write would leave
  counts.fill_bytes(0x5a);
  cuda::PositionTopkParams p;
  p.scores = scores.get();
  p.score_stride = problem.stride;
  p.positions = positions.get();
  p.rows = problem.rows();
  p.topk = problem.topk;
  p.max_context = problem.max_context;
  p.indices = indices.get();
  p.counts = counts.get();
  if (quadratic) {
    cuda::position_topk_quadratic(p, nullptr);
  } else {
    cuda::position_topk(p, nullptr);
  }
  MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
  return {indices.download(), counts.download()};
}

// Every row against the host contract; on failure names the rows (visible,
// score kind), the first differing entry and the agreement rate.
void expect_matches_contract(const Problem& problem, const Result& result) {
  int64_t bad_rows = 0, bad_entries = 0, entries = 0;
  std::string report;
  for (int64_t t = 0; t < problem.rows(); ++t) {
    const int64_t visible = problem.visible(t);
    const auto expected =
        reference_row(problem.scores.data() + t * problem.stride, visible, problem.topk);
    const int64_t count = std::min(problem.topk, visible);
    int64_t row_bad = 0, first = -1;
    for (int64_t i = 0; i < problem.topk; ++i) {
      const int32_t got = result.indices[t * problem.topk + i];
      if (got != expected[i]) {
        ++row_bad;
        if (first < 0) first = i;
      }
    }
    entries += problem.topk;
    const bool count_ok = result.counts[t] == count;
    if (row_bad > 0 || !count_ok) {
      ++bad_rows;
      bad_entries += row_bad;
      if (bad_rows <= 5) {
        report += "\n  row " + std::to_string(t) + " (visible " + std::to_string(visible) +
                  ", score kind " + problem.kinds[t] + "): count " +
                  std::to_string(result.counts[t]) + " expected " + std::to_string(count) + ", " +
                  std::to_string(row_bad) + " entries differ";
        if (first >= 0)
          report += ", first at " + std::to_string(first) + ": got " +
                    std::to_string(result.indices[t * problem.topk + first]) + " expected " +
                    std::to_string(expected[first]);
      }
    }
  }
  EXPECT_EQ(bad_rows, 0) << bad_rows << " of " << problem.rows() << " rows wrong (topk "
                         << problem.topk << ", max_context " << problem.max_context
                         << "); entries agreeing "
                         << 100.0 * static_cast<double>(entries - bad_entries) /
                                static_cast<double>(std::max<int64_t>(1, entries))
                         << "%" << report;
}

void check(const Problem& problem) {
  const auto plan = cuda::plan_position_topk(problem.max_context);
  SCOPED_TRACE("topk " + std::to_string(problem.topk) + ", max_context " +
               std::to_string(problem.max_context) + ", stride " + std::to_string(problem.stride) +
               (plan.keys_in_shared ? ", keys in shared memory" : ", streamed"));
  expect_matches_contract(problem, run(problem));
}

TEST(PositionTopk, SmallRowsEveryScoreKind) {
  for (const Scores kind : {Scores::Normal, Scores::FewValues, Scores::ManyValues, Scores::AllEqual,
                            Scores::SignedZeros, Scores::UlpNeighbours}) {
    SCOPED_TRACE("score kind " + std::to_string(static_cast<int>(kind)));
    std::vector<int64_t> visibles;
    for (int64_t v = 1; v <= 70; ++v) visibles.push_back(v);
    for (const int64_t topk : {1, 2, 3, 7, 16, 64}) {
      check(Problem(visibles, topk, 70, 0, kind, 11 + static_cast<uint32_t>(topk)));
    }
  }
}

TEST(PositionTopk, RaggedBatchWithPaddingRows) {
  // Lengths around the tile (2048) and the kItems (4) boundaries, padding rows
  // (visible 0) in between, topk from 1 to 2048.
  const std::vector<int64_t> visibles = {0,    1,    5,    2047, 2048, 2049, 0,    3000,
                                         4095, 4096, 4097, 8191, 8192, 0,    1000, 6001};
  for (const int64_t topk : {1, 5, 128, 1000, 2047, 2048}) {
    for (const int64_t pad : {0, 1, 3}) {  // aligned (float4) and unaligned rows
      check(Problem(visibles, topk, 8192, pad, Scores::Mixed, 100 + static_cast<uint32_t>(topk)));
    }
  }
}

TEST(PositionTopk, TiesAtTheThresholdLongRows) {
  for (const Scores kind : {Scores::FewValues, Scores::AllEqual, Scores::UlpNeighbours,
                            Scores::SignedZeros, Scores::ManyValues}) {
    SCOPED_TRACE("score kind " + std::to_string(static_cast<int>(kind)));
    check(Problem({20000, 32768, 1}, 2048, 32768, 0, kind, 7));
    check(Problem({20000, 12345}, 777, 32768, 5, kind, 8));
  }
}

TEST(PositionTopk, SharedMemoryLimitAndStreamedPlan) {
  const int64_t limit = cuda::kPositionTopkSharedRow;
  EXPECT_TRUE(cuda::plan_position_topk(limit).keys_in_shared);
  EXPECT_FALSE(cuda::plan_position_topk(limit + 1).keys_in_shared);
  // Largest shared row, then the same lengths one past the limit (streamed).
  check(Problem({limit, limit - 1, 17, 0}, 2048, limit, 0, Scores::Mixed, 21));
  check(Problem({limit + 1, limit - 1, 17, 0}, 2048, limit + 1, 0, Scores::Mixed, 22));
  // Short rows on the streamed plan (a long context bucket, short sequences).
  check(Problem({1, 100, 2500, 4100}, 64, limit + 1000, 3, Scores::Mixed, 23));
}

TEST(PositionTopk, LongRowsPast64K) {
  for (const Scores kind : {Scores::Normal, Scores::FewValues, Scores::UlpNeighbours}) {
    SCOPED_TRACE("score kind " + std::to_string(static_cast<int>(kind)));
    check(Problem({70001}, 2048, 70001, 0, kind, 31));
    check(Problem({131072, 65537, 0, 100000}, 2048, 131072, 0, kind, 32));
    check(Problem({131072}, 1, 131072, 2, kind, 33));
  }
}

TEST(PositionTopk, OneMillionKeys) {
  check(Problem({1 << 20, 3}, 2048, 1 << 20, 0, Scores::ManyValues, 41));
}

TEST(PositionTopk, ManyRowsOf8K) {
  // A prefill chunk: 128 rows, visible growing as causal rows do.
  std::vector<int64_t> visibles;
  for (int64_t t = 0; t < 128; ++t) visibles.push_back(8192 - 127 + t);
  check(Problem(visibles, 2048, 8192, 0, Scores::Mixed, 51));
  check(Problem(visibles, 128, 8192, 0, Scores::Normal, 52));
}

TEST(PositionTopk, VisibleClampedToMaxContext) {
  // A position past max_context selects among the max_context scores only.
  Problem problem({10, 10}, 4, 10, 0, Scores::Normal, 61);
  problem.positions[1] = 1000;
  check(problem);
}

TEST(PositionTopk, AgreesWithTheQuadraticKernel) {
  std::vector<int64_t> visibles;
  // Small: the quadratic kernel also runs under compute-sanitizer.
  for (int64_t v = 0; v <= 1500; v += 113) visibles.push_back(v);
  for (const int64_t topk : {1, 50, 1000}) {
    const Problem problem(visibles, topk, 1500, 1, Scores::Mixed, 71);
    const Result fast = run(problem), quadratic = run(problem, true);
    expect_matches_contract(problem, quadratic);
    int64_t differ = 0;
    for (size_t i = 0; i < fast.indices.size(); ++i)
      differ += fast.indices[i] != quadratic.indices[i];
    EXPECT_EQ(differ, 0) << "of " << fast.indices.size() << " entries (topk " << topk << ")";
    EXPECT_EQ(fast.counts, quadratic.counts);
  }
}

TEST(PositionTopk, FallbackIndexerSelectsFromItsScores) {
  // indexer_topk_fallback end to end on an F32 key pool: its top-k against
  // the contract applied to the scores it wrote (downloaded from the
  // scratch), so no rounding difference between host and device scoring can
  // flip a near tie. Keys repeat every 500 positions: exact score ties.
  const int64_t heads = 4, dim = 32, page = 64, max_context = 9000;
  const std::vector<int32_t> positions = {8999, 4000, -1, 0, 2047, 127};
  const int64_t tokens = static_cast<int64_t>(positions.size());
  const int64_t pages = (max_context + page - 1) / page;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<float> distinct(500 * dim), pool(static_cast<size_t>(pages * page * dim), 0.f);
  for (float& v : distinct) v = normal(rng);
  for (int64_t p = 0; p < max_context; ++p) {
    const int64_t slot = table[p / page] * page + p % page;
    std::copy_n(distinct.begin() + (p % 500) * dim, dim, pool.begin() + slot * dim);
  }
  std::vector<float> q(static_cast<size_t>(tokens * heads * dim)),
      w(static_cast<size_t>(tokens * heads));
  for (float& v : q) v = normal(rng);
  for (float& v : w) v = normal(rng);
  DeviceBuffer<float> d_pool(pool), d_q(q), d_w(w), d_scores(tokens * max_context);
  DeviceBuffer<int32_t> d_table(table), d_offsets(std::vector<int32_t>(positions.size(), 0)),
      d_positions(positions);
  for (const int64_t topk : {128, 2048}) {
    SCOPED_TRACE("topk " + std::to_string(topk));
    DeviceBuffer<int32_t> d_indices(tokens * topk), d_counts(tokens);
    d_scores.fill_bytes(0xff);  // NaN where nothing is written
    cuda::IndexerFallbackParams f;
    f.q = d_q.get();
    f.weights = d_w.get();
    f.pool = d_pool.get();
    f.layout = {cuda::CacheDType::F32, dim, 0};
    f.rows = {d_table.get(), d_offsets.get(), d_positions.get(), page};
    f.tokens = tokens;
    f.heads = heads;
    f.dim = dim;
    f.topk = topk;
    f.max_context = max_context;
    f.scale = 1.f / std::sqrt(static_cast<float>(dim));
    f.scores = d_scores.get();
    f.indices = d_indices.get();
    f.counts = d_counts.get();
    cuda::indexer_topk_fallback(f, nullptr);
    Problem problem({1}, topk, max_context, 0, Scores::Normal, 1);
    problem.positions = positions;
    problem.scores = d_scores.download();
    problem.kinds.assign(positions.size(), "indexer");
    // The scores are where the contract expects them (row t, position p):
    // within fp32 rounding of a double-precision host score.
    double worst = 0.0;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t p = 0; p < problem.visible(t); p += 37) {
        double score = 0.0, magnitude = 0.0;
        for (int64_t h = 0; h < heads; ++h) {
          double dot = 0.0;
          for (int64_t d = 0; d < dim; ++d)
            dot +=
                static_cast<double>(q[(t * heads + h) * dim + d]) * distinct[(p % 500) * dim + d];
          dot *= f.scale;
          if (dot > 0.0) score += w[t * heads + h] * dot;
          magnitude += std::fabs(w[t * heads + h] * dot);
        }
        worst = std::max(worst, std::fabs(problem.scores[t * max_context + p] - score) /
                                    std::max(1.0, magnitude));
      }
    EXPECT_LT(worst, 1e-4) << "largest score error (relative to the score's magnitude)";
    expect_matches_contract(problem, {d_indices.download(), d_counts.download()});
  }
}

TEST(PositionTopk, ReplaysInACudaGraph) {
  // Captured once for a context bucket; new scores and positions each replay.
  const int64_t rows = 6, topk = 300, bucket = 4096;
  Problem first({4096, 1, 0, 2000, 299, 301}, topk, bucket, 0, Scores::Mixed, 81);
  DeviceBuffer<float> scores(first.scores);
  DeviceBuffer<int32_t> positions(first.positions), indices(rows * topk), counts(rows);
  cuda::PositionTopkParams p;
  p.scores = scores.get();
  p.score_stride = bucket;
  p.positions = positions.get();
  p.rows = rows;
  p.topk = topk;
  p.max_context = bucket;
  p.indices = indices.get();
  p.counts = counts.get();
  cudaStream_t stream;
  MEGACTX_CUDA_CHECK(cudaStreamCreate(&stream));
  cuda::position_topk(p, stream);  // outside capture: one-time function attributes
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MEGACTX_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cuda::position_topk(p, stream);
  MEGACTX_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  MEGACTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint32_t replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    const Problem problem({static_cast<int64_t>(100 + 1000 * replay), 4096, 0, 17,
                           static_cast<int64_t>(3000 - replay), 1},
                          topk, bucket, 0, Scores::Mixed, 90 + replay);
    scores.upload(problem.scores);
    positions.upload(problem.positions);
    MEGACTX_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream));
    expect_matches_contract(problem, {indices.download(), counts.download()});
  }
  MEGACTX_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MEGACTX_CUDA_CHECK(cudaGraphDestroy(graph));
  MEGACTX_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(PositionTopk, RejectsBadParameters) {
  DeviceBuffer<float> scores(16);
  DeviceBuffer<int32_t> positions(2), indices(8), counts(2);
  cuda::PositionTopkParams good;
  good.scores = scores.get();
  good.score_stride = 8;
  good.positions = positions.get();
  good.rows = 2;
  good.topk = 4;
  good.max_context = 8;
  good.indices = indices.get();
  good.counts = counts.get();
  auto bad = good;
  bad.topk = 0;
  EXPECT_THROW(cuda::position_topk(bad, nullptr), Error);
  bad = good;
  bad.score_stride = 7;
  EXPECT_THROW(cuda::position_topk(bad, nullptr), Error);
  bad = good;
  bad.indices = nullptr;
  EXPECT_THROW(cuda::position_topk(bad, nullptr), Error);
  bad = good;
  bad.rows = -1;
  EXPECT_THROW(cuda::position_topk(bad, nullptr), Error);
  bad = good;
  bad.topk = 100000;
  EXPECT_THROW(cuda::position_topk_quadratic(bad, nullptr), Error);
  bad = good;
  bad.rows = 0;  // nothing to do: no launch, no error
  bad.scores = nullptr;
  EXPECT_NO_THROW(cuda::position_topk(bad, nullptr));
}

}  // namespace
}  // namespace megactx::test
