// The host side of CUDA-graph decode (model/cuda/decode_graph_plan.h), on any
// machine: the buckets, and the packed inputs checked word by word against
// an independent re-derivation from the batch (what each row of the graph
// must see), padding included; batches that do not fit the key are Errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "model/cuda/decode_graph_plan.h"

namespace megactx {
namespace {

TEST(DecodeGraphPlan, BatchBuckets) {
  EXPECT_EQ(decode_batch_buckets(256),
            (std::vector<int64_t>{1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256}));
  // The largest bucket is the configured maximum, whatever it is.
  EXPECT_EQ(decode_batch_buckets(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(decode_batch_buckets(20), (std::vector<int64_t>{1, 2, 4, 8, 16, 20}));
  EXPECT_THROW(decode_batch_buckets(0), Error);
  const std::vector<int64_t> buckets = decode_batch_buckets(64);
  const std::vector<std::pair<int64_t, int64_t>> cases = {{1, 1},   {2, 2},   {3, 4},   {5, 8},
                                                          {9, 16},  {17, 24}, {24, 24}, {25, 32},
                                                          {33, 48}, {64, 64}, {65, 0}};
  for (const auto& [sequences, bucket] : cases)
    EXPECT_EQ(batch_bucket(buckets, sequences), bucket) << sequences << " sequences";
}

TEST(DecodeGraphPlan, ContextBuckets) {
  EXPECT_EQ(context_bucket(1), 256);
  EXPECT_EQ(context_bucket(256), 256);
  EXPECT_EQ(context_bucket(257), 512);
  EXPECT_EQ(context_bucket(1000), 1024);
  EXPECT_EQ(context_bucket(1 << 20), 1 << 20);
  EXPECT_EQ(context_bucket((1 << 20) + 1), 1 << 21);
}

TEST(DecodeGraphPlan, LayoutIsContiguousAndSized) {
  DecodeGraphKey key;
  key.sequences = 8;
  key.tokens_per_sequence = 3;
  key.context = 512;
  const DecodeInputLayout layout(key, 32, 64);
  EXPECT_EQ(layout.rows, 24);
  EXPECT_EQ(layout.max_pages, 8);
  EXPECT_EQ(layout.ids, 0);
  EXPECT_EQ(layout.positions, 24);
  EXPECT_EQ(layout.table_offset, 48);
  EXPECT_EQ(layout.logit_rows, 72);
  EXPECT_EQ(layout.cos, 96);
  EXPECT_EQ(layout.sin, 96 + 24 * 32);
  EXPECT_EQ(layout.page_tables, 96 + 2 * 24 * 32);
  EXPECT_EQ(layout.capacity_words, layout.page_tables + 8 * 8);
}

struct Packed {
  std::vector<int32_t> words;
  std::vector<int64_t> rope;
  PackedDecodeInputs info;
};

Packed pack(const ForwardBatch& batch, const DecodeGraphKey& key) {
  const DecodeInputLayout layout(key, 4, 64);
  Packed out;
  out.words.assign(static_cast<size_t>(layout.capacity_words), 12345);  // poison
  out.rope.assign(static_cast<size_t>(layout.rows), 777);
  out.info = pack_decode_inputs(batch, key, layout, 64, out.words.data(), out.rope.data());
  return out;
}

TEST(DecodeGraphPlan, PacksRealRowsThenPadding) {
  // Three sequences of 2 new tokens (a verification-shaped step) in a bucket
  // of 4: contexts 70, 2 and 130 (2, 1 and 3 pages).
  const std::vector<int32_t> t0 = {11, 12}, t1 = {21, 22}, t2 = {31, 32};
  const std::vector<int32_t> p0 = {7, 3, 99}, p1 = {5}, p2 = {0, 8, 4, 6};
  ForwardBatch batch;
  batch.sequences.push_back({t0, 68, p0, -1});  // last row's logits
  batch.sequences.push_back({t1, 0, p1, 0});    // every row's logits
  batch.sequences.push_back({t2, 128, p2, 1});  // row 1 only
  DecodeGraphKey key;
  key.sequences = 4;
  key.tokens_per_sequence = 2;
  key.context = 256;
  const DecodeInputLayout layout(key, 4, 64);
  const Packed p = pack(batch, key);
  const auto word = [&](int64_t offset, int64_t i) {
    return p.words[static_cast<size_t>(offset + i)];
  };

  EXPECT_EQ(p.info.real_rows, 6);
  EXPECT_EQ(p.info.logit_count, 4);
  // Pages per sequence: ceil(70 / 64) = 2, ceil(2 / 64) = 1, ceil(130 / 64) = 3.
  EXPECT_EQ(p.info.upload_words, layout.page_tables + 6);
  const std::vector<int32_t> tables = {7, 3, 5, 0, 8, 4};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(word(layout.page_tables, i), tables[i]) << i;

  const std::vector<int32_t> ids = {11, 12, 21, 22, 31, 32, 0, 0};
  const std::vector<int32_t> positions = {68, 69, 0, 1, 128, 129, -1, -1};
  const std::vector<int32_t> offsets = {0, 0, 2, 2, 3, 3, 0, 0};
  const std::vector<int64_t> rope = {68, 69, 0, 1, 128, 129, 0, 0};
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(word(layout.ids, r), ids[r]) << "row " << r;
    EXPECT_EQ(word(layout.positions, r), positions[r]) << "row " << r;
    EXPECT_EQ(word(layout.table_offset, r), offsets[r]) << "row " << r;
    EXPECT_EQ(p.rope[static_cast<size_t>(r)], rope[r]) << "row " << r;
  }
  // Each real row's table offset addresses its own sequence's pages.
  for (int64_t r = 0; r < 6; ++r) {
    const int64_t position = positions[r];
    const int32_t page = word(layout.page_tables, offsets[r] + position / 64);
    const std::vector<int32_t>& own = r < 2 ? p0 : (r < 4 ? p1 : p2);
    EXPECT_EQ(page, own[static_cast<size_t>(position / 64)]) << "row " << r;
  }
  const std::vector<int32_t> logit_rows = {1, 2, 3, 5, 0, 0, 0, 0};
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(word(layout.logit_rows, i), logit_rows[i]) << i;
  // cos / sin are left to the caller (RoPE of the rope positions).
  EXPECT_EQ(word(layout.cos, 0), 12345);
}

TEST(DecodeGraphPlan, BatchesThatDoNotFitAreErrors) {
  const std::vector<int32_t> one = {1}, two = {1, 2}, pages = {0, 1, 2, 3, 4, 5};
  DecodeGraphKey key;
  key.sequences = 2;
  key.tokens_per_sequence = 1;
  key.context = 256;
  ForwardBatch batch;
  for (int i = 0; i < 3; ++i) batch.sequences.push_back({one, 10, pages, -1});
  EXPECT_THROW(pack(batch, key), Error);  // 3 sequences, bucket of 2
  batch.sequences.resize(1);
  batch.sequences[0] = {two, 10, pages, -1};
  EXPECT_THROW(pack(batch, key), Error);  // 2 tokens, key of 1
  batch.sequences[0] = {one, 256, pages, -1};
  EXPECT_THROW(pack(batch, key), Error);  // context 257 > 256
  const std::vector<int32_t> short_table = {0};
  batch.sequences[0] = {one, 64, short_table, -1};
  EXPECT_THROW(pack(batch, key), Error);  // position 64 needs a second page
  batch.sequences[0] = {one, 255, pages, -1};
  EXPECT_NO_THROW(pack(batch, key));
}

}  // namespace
}  // namespace megactx
