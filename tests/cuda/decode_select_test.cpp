// The decode scoring-and-selection kernel against the two-kernel path it
// replaces: its scores equal indexer_scores' bit for bit, and its selection is
// a valid top-k of them (right count, distinct visible keys, nothing below the
// k-th left out), in slots and positions mode, with causal MTP rows, ragged
// batches, 32 and 64 heads, heavy ties and the longest rows it serves.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "core/error.h"
#include "indexer_test_support.h"
#include "kernels/cuda/indexer_topk/decode_select.h"

namespace megactx::test {
namespace {

enum class Keys { Random, FastRandom, ThreeDistinct, ZeroWeights };

struct Outputs {
  std::vector<float> scores;              // the kernel's own [rows, score_stride]
  std::vector<int32_t> slots, positions;  // [rows, top_k]
};

Outputs run_select(const IndexerProblem& problem, const DeviceIndexer& device) {
  cuda::DecodeSelectParams params;
  params.queries = device.queries.get();
  params.weights = device.weights.get();
  params.key_pool = device.pool.get();
  params.block_table = device.table.get();
  params.block_table_stride = problem.layout.block_table_stride;
  params.row_request = device.request.get();
  params.row_visible = device.visible.get();
  params.rows = problem.rows;
  params.heads = problem.heads;
  params.top_k = problem.top_k;
  params.max_visible = problem.max_visible;
  DeviceBuffer<float> scores(static_cast<size_t>(problem.rows) * problem.score_stride);
  DeviceBuffer<int32_t> out(static_cast<size_t>(problem.rows) * problem.top_k);
  scores.fill_bytes(0xff);
  out.fill_bytes(0x5a);
  params.scores = scores.get();
  params.score_stride = problem.score_stride;
  params.out = out.get();
  params.write_slots = true;
  cuda::decode_indexer_select(params, nullptr);
  Outputs outputs;
  outputs.scores = scores.download();
  outputs.slots = out.download();
  out.fill_bytes(0x5a);
  params.write_slots = false;
  params.scores = nullptr;  // the selection does not depend on the score output
  cuda::decode_indexer_select(params, nullptr);
  outputs.positions = out.download();
  cuda::decode_indexer_select(params, nullptr);
  EXPECT_EQ(out.download(), outputs.positions) << "the same input gave another selection";
  return outputs;
}

void check(IndexerProblem& problem, Keys keys, uint32_t seed) {
  std::mt19937 rng(seed);
  problem.build(rng, keys == Keys::FastRandom);
  if (keys == Keys::ThreeDistinct) {  // every slot holds one of three keys: ties everywhere
    const size_t bytes = reference::kIndexerEntryBytes;
    for (size_t slot = 3; slot < problem.pool.size() / bytes; ++slot)
      std::memcpy(problem.pool.data() + slot * bytes, problem.pool.data() + (rng() % 3) * bytes,
                  bytes);
  }
  if (keys == Keys::ZeroWeights) std::fill(problem.weights.begin(), problem.weights.end(), 0.f);
  DeviceIndexer device(problem);
  cuda::indexer_scores(device.score_params(problem), nullptr);
  const std::vector<float> expected = device.scores.download();
  const Outputs got = run_select(problem, device);
  std::vector<int32_t> identity((problem.max_visible + 63) / 64 + 1);
  std::iota(identity.begin(), identity.end(), 0);
  for (int row = 0; row < problem.rows; ++row) {
    const std::string what = "row " + std::to_string(row);
    const int64_t visible = problem.row_visible[row];
    const float* row_expected = expected.data() + static_cast<size_t>(row) * problem.score_stride;
    if (visible > problem.top_k) {
      const float* row_scores = got.scores.data() + static_cast<size_t>(row) * problem.score_stride;
      ASSERT_EQ(std::memcmp(row_scores, row_expected, visible * sizeof(float)), 0)
          << what << ": the scores differ from indexer_scores'";
      for (int64_t p = visible; p < problem.score_stride; ++p)
        ASSERT_TRUE(std::isnan(row_scores[p])) << what << " wrote a score past its keys at " << p;
    }
    expect_valid_topk(row_expected, visible, problem.top_k, problem.table(row),
                      problem.layout.num_pages,
                      got.slots.data() + static_cast<size_t>(row) * problem.top_k, what + " slots");
    expect_valid_topk(row_expected, visible, problem.top_k, identity.data(),
                      static_cast<int64_t>(identity.size()),
                      got.positions.data() + static_cast<size_t>(row) * problem.top_k,
                      what + " positions");
    // Both modes make the same choice: slots mode mapped back gives the positions.
    for (int i = 0; i < problem.top_k; ++i) {
      const int32_t position = got.positions[static_cast<size_t>(row) * problem.top_k + i];
      const int32_t slot = got.slots[static_cast<size_t>(row) * problem.top_k + i];
      const int32_t mapped =
          position < 0 ? -1 : problem.table(row)[position / 64] * 64 + position % 64;
      ASSERT_EQ(slot, mapped) << what << " entry " << i;
    }
  }
}

TEST(DecodeSelect, RaggedDecodeBatch) {
  if (!cuda::decode_select_serves(1, 32, 1)) GTEST_SKIP() << "no cluster of 16 CTAs fits here";
  IndexerProblem problem;
  problem.lengths = {1, 63, 64, 65, 2047, 2048, 2049, 2113, 5000, 8192, 9001};
  check(problem, Keys::Random, 101);
}

TEST(DecodeSelect, CausalMtpRows) {
  if (!cuda::decode_select_serves(1, 32, 1)) GTEST_SKIP() << "no cluster of 16 CTAs fits here";
  for (int tokens : {2, 4, 8}) {
    IndexerProblem problem;
    problem.rows_per_group = tokens;
    problem.lengths = {tokens, 2050, 6001};
    check(problem, Keys::Random, 110 + tokens);
  }
}

TEST(DecodeSelect, SixtyFourHeadsAndSmallK) {
  if (!cuda::decode_select_serves(1, 64, 1)) GTEST_SKIP() << "no cluster of 16 CTAs fits here";
  IndexerProblem problem;
  problem.heads = 64;
  problem.top_k = 100;
  problem.rows_per_group = 2;
  problem.lengths = {99, 101, 3333, 12000};
  check(problem, Keys::Random, 121);
}

TEST(DecodeSelect, HeavyTies) {
  if (!cuda::decode_select_serves(1, 32, 1)) GTEST_SKIP() << "no cluster of 16 CTAs fits here";
  IndexerProblem three;
  three.lengths = {2049, 4097, 8192, 16384};
  check(three, Keys::ThreeDistinct, 131);
  IndexerProblem zeros;  // every score exactly 0
  zeros.lengths = {2049, 10000};
  check(zeros, Keys::ZeroWeights, 132);
}

TEST(DecodeSelect, LongestRowsAndMostRows) {
  if (!cuda::decode_select_serves(cuda::kDecodeSelectMaxRows, 32, cuda::kDecodeSelectMaxVisible))
    GTEST_SKIP() << "no cluster of 16 CTAs fits here";
  IndexerProblem longest;  // every page share in use, rows ending mid-page
  longest.lengths = {cuda::kDecodeSelectMaxVisible, cuda::kDecodeSelectMaxVisible - 37, 16000};
  check(longest, Keys::FastRandom, 141);
  IndexerProblem most;  // more clusters than the GPU holds at once
  std::mt19937 rng(142);
  for (int r = 0; r < cuda::kDecodeSelectMaxRows; ++r)
    most.lengths.push_back(1 + static_cast<int64_t>(rng() % cuda::kDecodeSelectMaxVisible));
  check(most, Keys::FastRandom, 143);
}

TEST(DecodeSelect, RejectsShapesItDoesNotServe) {
  EXPECT_FALSE(cuda::decode_select_serves(cuda::kDecodeSelectMaxRows + 1, 32, 100));
  EXPECT_FALSE(cuda::decode_select_serves(1, 48, 100));
  EXPECT_FALSE(cuda::decode_select_serves(1, 32, cuda::kDecodeSelectMaxVisible + 1));
  cuda::DecodeSelectParams params;
  params.heads = 48;
  params.top_k = 4;
  EXPECT_THROW(cuda::decode_indexer_select(params, nullptr), Error);
  params.heads = 32;
  params.top_k = 0;
  EXPECT_THROW(cuda::decode_indexer_select(params, nullptr), Error);
  params.top_k = 4;
  params.max_visible = cuda::kDecodeSelectMaxVisible + 1;
  params.block_table_stride = params.max_visible / 64 + 1;
  EXPECT_THROW(cuda::decode_indexer_select(params, nullptr), Error);
  params.max_visible = 64;
  params.block_table_stride = 0;  // a table too short for the keys
  EXPECT_THROW(cuda::decode_indexer_select(params, nullptr), Error);
}

}  // namespace
}  // namespace megactx::test
