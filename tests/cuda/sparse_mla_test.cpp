// GPU sparse MLA (decode and prefill shapes) against the fp32 reference on
// fresh random fp8 latent caches, with padded, holed and empty rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.h"
#include "dsa_test_support.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/dsa_glue/dsa_fast_inputs.h"
#include "kernels/cuda/sparse_mla/sparse_mla.h"

namespace megactx::test {
namespace {

constexpr int kQueryDim = reference::kLatentRankDim + reference::kLatentRopeDim;
constexpr int kRank = reference::kLatentRankDim;

struct MlaCase {
  int rows = 6, heads = 64, top_k = 2048, num_splits = 1;
  int64_t num_slots = 5000;
  uint32_t seed = 1;
  bool cluster = false;  // SparseMlaParams::cluster_merge
  int active_heads = 0;  // SparseMlaParams::active_heads (the others are not checked)
  // Only the selected slots hold random entries (the rest zero bytes): a pool
  // of a million-token context without encoding a million entries.
  bool sparse_pool = false;
  bool wgmma = false;  // the wgmma prefill kernel's f16-ring layout, whatever the policy picks
  // The pool's second half addressed as a host tier's offload pool (slots past
  // pool_slots): the kernels' tiered addressing, with the same entries.
  bool split_pool = false;
  bool fp8ring = false;  // the fp8-ring layout of the wgmma prefill kernel
  // Keys per row, spread over its later slots, whose entries are head 0's own
  // query times a growing factor: each scores ~18 log2 units above the last
  // (random keys stay within ~5 of each other), so the running max moves in
  // the middle of a row, in one consumer's block and not the other's, after
  // output has accumulated (random rows move it only in their first bunch).
  int hot_keys = 0;
};

// The launch parameters of a case (out and lse set by the caller).
cuda::SparseMlaParams make_params(const DeviceBuffer<uint16_t>& q,
                                  const DeviceBuffer<int32_t>& slots,
                                  const DeviceBuffer<uint8_t>& pool,
                                  const DeviceBuffer<float>& partial_out,
                                  const DeviceBuffer<float>& partial_lse, const MlaCase& c) {
  cuda::SparseMlaParams params;
  params.q = q.get();
  params.slots = slots.get();
  params.kv_pool = pool.get();
  params.partial_out = partial_out.get();
  params.partial_lse = partial_lse.get();
  params.rows = c.rows;
  params.heads = c.heads;
  params.top_k = c.top_k;
  params.num_splits = c.num_splits;
  params.cluster_merge = c.cluster;
  params.active_heads = c.active_heads;
  params.softmax_scale = 1.f / std::sqrt(256.f);
  return params;
}

void run_case(const MlaCase& c) {
  SCOPED_TRACE("rows " + std::to_string(c.rows) + " heads " + std::to_string(c.heads) + " top_k " +
               std::to_string(c.top_k) + " splits " + std::to_string(c.num_splits) +
               (c.cluster ? " (cluster)" : "") + (c.wgmma ? " (wgmma prefill)" : "") +
               (c.fp8ring ? " (fp8 ring)" : "") + (c.split_pool ? " (offload pool)" : ""));
  std::mt19937 rng(c.seed);
  std::vector<uint8_t> pool =
      c.sparse_pool
          ? std::vector<uint8_t>(static_cast<size_t>(c.num_slots) * reference::kLatentEntryBytes, 0)
          : random_latent_pool(c.num_slots, rng);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> q(static_cast<size_t>(c.rows) * c.heads * kQueryDim);
  std::vector<float> q_values(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = float_to_bf16(normal(rng));
    q_values[i] = bf16_to_float(q[i]);
  }
  std::vector<int32_t> slots(static_cast<size_t>(c.rows) * c.top_k);
  for (int row = 0; row < c.rows; ++row) {
    int valid = c.top_k;
    if (row % 3 == 1) valid = 1 + static_cast<int>(rng() % c.top_k);  // fewer visible than k
    if (c.rows > 1 && row == c.rows - 1) valid = 0;                   // an empty row
    for (int j = 0; j < c.top_k; ++j)
      slots[static_cast<size_t>(row) * c.top_k + j] =
          j < valid ? static_cast<int32_t>(rng() % c.num_slots) : -1;
    if (row % 3 == 2)  // holes in the middle
      for (int j = 5; j < c.top_k; j += 11) slots[static_cast<size_t>(row) * c.top_k + j] = -1;
  }
  if (c.sparse_pool) {
    for (const int32_t slot : slots) {
      if (slot < 0) continue;
      const std::vector<uint8_t> fresh = random_latent_pool(1, rng);
      std::memcpy(pool.data() + static_cast<size_t>(slot) * reference::kLatentEntryBytes,
                  fresh.data(), reference::kLatentEntryBytes);
    }
  }
  if (c.hot_keys > 0) {
    // Appended after the pool's slots, c.hot_keys per row.
    std::vector<float> c_kv(reference::kLatentRankDim), k_rope(reference::kLatentRopeDim);
    for (int row = 0; row < c.rows; ++row) {
      int32_t* row_slots = slots.data() + static_cast<size_t>(row) * c.top_k;
      int valid = c.top_k;  // past the row's last visible slot (holes before it are kept)
      while (valid > 0 && row_slots[valid - 1] < 0) --valid;
      const float* head0 = q_values.data() + static_cast<size_t>(row) * c.heads * kQueryDim;
      for (int h = 0; h < c.hot_keys; ++h) {
        const int j = std::min(valid - 1, c.top_k * (h + 1) / (c.hot_keys + 1) + row % 7);
        if (j < 0) continue;
        const float factor = 0.35f * static_cast<float>(h + 1);
        for (int i = 0; i < reference::kLatentRankDim; ++i) c_kv[i] = factor * head0[i];
        for (int i = 0; i < reference::kLatentRopeDim; ++i)
          k_rope[i] = factor * head0[reference::kLatentRankDim + i];
        const size_t slot = pool.size() / reference::kLatentEntryBytes;
        pool.resize(pool.size() + reference::kLatentEntryBytes);
        reference::encode_latent_fp8(c_kv.data(), k_rope.data(),
                                     pool.data() + slot * reference::kLatentEntryBytes);
        row_slots[j] = static_cast<int32_t>(slot);
      }
    }
  }
  DeviceBuffer<uint8_t> device_pool(pool);
  DeviceBuffer<uint16_t> device_q(q), device_out(static_cast<size_t>(c.rows) * c.heads * kRank);
  DeviceBuffer<int32_t> device_slots(slots);
  DeviceBuffer<float> device_lse(static_cast<size_t>(c.rows) * c.heads);
  DeviceBuffer<float> partial_out(static_cast<size_t>(c.rows) * c.num_splits * c.heads * kRank);
  DeviceBuffer<float> partial_lse(static_cast<size_t>(c.rows) * c.num_splits * c.heads);
  device_out.fill_bytes(0xff);  // NaN until written
  device_lse.fill_bytes(0xff);
  cuda::SparseMlaParams params =
      make_params(device_q, device_slots, device_pool, partial_out, partial_lse, c);
  params.out = device_out.get();
  params.lse = device_lse.get();
  if (c.split_pool) {
    params.pool_slots = c.num_slots / 2;
    params.offload_pool =
        device_pool.get() + static_cast<size_t>(params.pool_slots) * reference::kLatentEntryBytes;
  }
  if (c.fp8ring)
    cuda::detail::launch_sparse_mla_prefill_fp8ring(params, nullptr);
  else if (c.wgmma)
    cuda::detail::launch_sparse_mla_prefill_f16ring(params, nullptr);
  else
    cuda::sparse_mla_attention(params, nullptr);
  MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = device_out.download();
  const auto lse = device_lse.download();

  std::vector<float> expected_out(static_cast<size_t>(c.heads) * kRank), expected_lse(c.heads);
  double worst = 0;
  for (int row = 0; row < c.rows; ++row) {
    reference::sparse_mla_reference(
        q_values.data() + static_cast<size_t>(row) * c.heads * kQueryDim, c.heads,
        slots.data() + static_cast<size_t>(row) * c.top_k, c.top_k, pool.data(),
        params.softmax_scale, expected_out.data(), expected_lse.data());
    for (int h = 0; h < (c.active_heads > 0 ? c.active_heads : c.heads); ++h) {
      const size_t base = (static_cast<size_t>(row) * c.heads + h) * kRank;
      const float got_lse = lse[static_cast<size_t>(row) * c.heads + h];
      if (std::isinf(expected_lse[h])) {
        ASSERT_TRUE(std::isinf(got_lse) && got_lse < 0) << "row " << row << " head " << h;
        for (int i = 0; i < kRank; ++i) ASSERT_EQ(bf16_to_float(out[base + i]), 0.f);
        continue;
      }
      ASSERT_NEAR(got_lse, expected_lse[h], 2e-2) << "row " << row << " head " << h;
      double error = 0, norm = 0;
      for (int i = 0; i < kRank; ++i) {
        const double got = bf16_to_float(out[base + i]);
        ASSERT_FALSE(std::isnan(got)) << "row " << row << " head " << h << " dim " << i;
        const double want = expected_out[static_cast<size_t>(h) * kRank + i];
        error += (got - want) * (got - want);
        norm += want * want;
      }
      const double relative = std::sqrt(error / std::max(norm, 1e-30));
      worst = std::max(worst, relative);
      ASSERT_LT(relative, 2e-2) << "row " << row << " head " << h;
    }
  }
  ::testing::Test::RecordProperty("worst_relative_error", std::to_string(worst));

  if (c.cluster) {
    // The early-input kernel (slots and entries loaded before the grid-
    // dependency wait) gives the same bits: only the load order differs.
    DeviceBuffer<uint16_t> early_out(static_cast<size_t>(c.rows) * c.heads * kRank);
    DeviceBuffer<float> early_lse(static_cast<size_t>(c.rows) * c.heads);
    early_out.fill_bytes(0xff);
    early_lse.fill_bytes(0xff);
    params.out = early_out.get();
    params.lse = early_lse.get();
    params.inputs_ready_at_launch = true;
    cuda::sparse_mla_attention(params, nullptr);
    MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = early_out.download();
    const std::vector<float> got_lse = early_lse.download();
    for (int row = 0; row < c.rows; ++row)
      for (int h = 0; h < (c.active_heads > 0 ? c.active_heads : c.heads); ++h) {
        const size_t at = static_cast<size_t>(row) * c.heads + h;
        ASSERT_TRUE(std::equal(got.begin() + at * kRank, got.begin() + (at + 1) * kRank,
                               out.begin() + at * kRank))
            << "early inputs: row " << row << " head " << h;
        ASSERT_EQ(std::memcmp(&got_lse[at], &lse[at], sizeof(float)), 0)
            << "early inputs: lse of row " << row << " head " << h;
      }
  }
}

TEST(SparseMla, DecodeBatchTwoTokensSixtyFourHeads) {
  run_case({6, 64, 2048, 1, 5000, 1});
}
TEST(SparseMla, DecodeOneHundredTwentyEightHeadsSplit) {
  run_case({4, 128, 2048, 7, 9000, 2});
}
TEST(SparseMla, DecodeManySplitsSingleRow) {
  run_case({2, 64, 2048, 64, 3000, 3});
}
TEST(SparseMla, DefaultSplitsFillTheGpu) {
  const int splits = cuda::sparse_mla_default_splits(3, 64, 2048, 132);
  EXPECT_GE(splits, 2);
  run_case({3, 64, 2048, splits, 4000, 4});
}
// The wgmma kernel's decode split counts (sparse_mla_splits' sweep on the
// H200): the SMs filled once, at least 4 stages per split from 8 CTAs on.
TEST(SparseMla, DecodeSplitsFollowTheWgmmaFit) {
  if (!cuda::sparse_mla_prefill_enabled() || !cuda::sparse_mla_prefill_decode_enabled())
    GTEST_SKIP() << "the wgmma decode path is switched off by the environment";
  const std::vector<std::pair<int, int>> expected = {{1, 16}, {4, 16}, {8, 8},   {16, 8},
                                                     {32, 4}, {64, 2}, {128, 1}, {512, 1}};
  for (auto [rows, splits] : expected)
    EXPECT_EQ(cuda::sparse_mla_splits(rows, 64, 2048, 132), splits) << rows << " rows";
  EXPECT_EQ(cuda::sparse_mla_splits(2, 128, 2048, 132), 16);  // 4 CTAs
  EXPECT_EQ(cuda::sparse_mla_splits(4, 128, 2048, 132), 8);   // 8 CTAs
  EXPECT_EQ(cuda::sparse_mla_splits(64, 128, 2048, 132), 1);
  // Never more splits than 64-key stages.
  EXPECT_EQ(cuda::sparse_mla_splits(1, 64, 100, 132), 2);
  run_case({4, 64, 2048, cuda::sparse_mla_splits(4, 64, 2048, 132), 4100, 4});
}
TEST(SparseMla, PrefillRowsWithTheirOwnSlotsAndOddK) {
  run_case({40, 64, 500, 1, 2000, 5});
}
TEST(SparseMla, PrefillSplitOddK) {
  run_case({7, 64, 1000, 3, 2000, 6});
}

// The wgmma prefill kernel in its layouts (the f16-ring layout, decode's
// splits: two K blocks of 32 per stage; the fp8-ring layout, one split's:
// bunches of two 64-key blocks): full,
// partial, holed and empty rows; top_k not a multiple of a stage or bunch
// (the last one partly or wholly past top_k), a single block, 128 heads (two
// head blocks), an offload pool and a million-token pool.
enum class Prefill { kF16Ring, kFp8Ring };
void run_prefill_case(MlaCase c, Prefill layout) {
  c.wgmma = layout == Prefill::kF16Ring;
  c.fp8ring = layout == Prefill::kFp8Ring;
  run_case(c);
}
void prefill_matches_the_reference(Prefill layout) {
  run_prefill_case({12, 64, 2048, 1, 20000, 21}, layout);
}
void prefill_odd_top_k(Prefill layout) {
  for (const int top_k : {1000, 200, 97, 64, 40, 33, 7})
    run_prefill_case({7, 64, top_k, 1, 3000, static_cast<uint32_t>(22 + top_k)}, layout);
}
void prefill_one_hundred_twenty_eight_heads(Prefill layout) {
  run_prefill_case({5, 128, 1024, 1, 9000, 23}, layout);
}
void prefill_with_an_offload_pool(Prefill layout) {
  MlaCase c{7, 64, 2048, 1, 20000, 25};
  c.split_pool = true;
  run_prefill_case(c, layout);
}
void prefill_over_a_million_token_pool(Prefill layout) {
  MlaCase c{6, 64, 2048, 1, int64_t{1} << 20, 24};
  c.sparse_pool = true;
  run_prefill_case(c, layout);
}
TEST(SparseMla, WgmmaPrefillMatchesTheReference) {
  prefill_matches_the_reference(Prefill::kF16Ring);
}
TEST(SparseMla, WgmmaPrefillOddTopK) {
  prefill_odd_top_k(Prefill::kF16Ring);
}
TEST(SparseMla, WgmmaPrefillOneHundredTwentyEightHeads) {
  prefill_one_hundred_twenty_eight_heads(Prefill::kF16Ring);
}
TEST(SparseMla, WgmmaPrefillWithAnOffloadPool) {
  prefill_with_an_offload_pool(Prefill::kF16Ring);
}
TEST(SparseMla, WgmmaPrefillOverAMillionTokenPool) {
  prefill_over_a_million_token_pool(Prefill::kF16Ring);
}
// Decode and MTP batches on the wgmma kernel: the slots split in whole 64-key
// stages and merged. Even and uneven splits (7 asked over 32 stages runs 7 of
// 5 stages, the last 2; 5 over 2 stages runs 2), top_k off the stage, rows
// with holes, fewer slots than the split's range or none, 128 heads, an
// offload pool and a million-token pool.
void decode_splits_match_the_reference(Prefill layout) {
  run_prefill_case({16, 64, 2048, 8, 20000, 31}, layout);
  run_prefill_case({3, 64, 2048, 7, 5000, 32}, layout);
  run_prefill_case({5, 64, 97, 5, 3000, 33}, layout);
  run_prefill_case({4, 64, 1000, 3, 3000, 34}, layout);
  run_prefill_case({4, 128, 2048, 16, 9000, 35}, layout);
  MlaCase pool{6, 64, 2048, 4, 20000, 36};
  pool.split_pool = true;
  run_prefill_case(pool, layout);
  MlaCase million{3, 64, 2048, 8, int64_t{1} << 20, 37};
  million.sparse_pool = true;
  run_prefill_case(million, layout);
  // glm_1b's 16 heads of a 64-head layout: the merge combines those only.
  MlaCase few_heads{16, 64, 2048, 8, 20000, 38};
  few_heads.active_heads = 16;
  run_prefill_case(few_heads, layout);
  few_heads.active_heads = 48;
  few_heads.seed = 39;
  run_prefill_case(few_heads, layout);
}
TEST(SparseMla, WgmmaDecodeSplitsMatchTheReference) {
  decode_splits_match_the_reference(Prefill::kF16Ring);
}
// The fp8-ring layout: bunches of 128 keys (its splits: 8 asked over 16
// bunches runs 8, 7 runs 6 of 3 (the last 1), 5 over one bunch (top_k 97)
// runs 1), fragments in permuted k orders, the running max vote, the epilogue.
TEST(SparseMla, Fp8RingPrefillMatchesTheReference) {
  prefill_matches_the_reference(Prefill::kFp8Ring);
}
TEST(SparseMla, Fp8RingPrefillOddTopK) {
  prefill_odd_top_k(Prefill::kFp8Ring);
}
TEST(SparseMla, Fp8RingPrefillOneHundredTwentyEightHeads) {
  prefill_one_hundred_twenty_eight_heads(Prefill::kFp8Ring);
}
TEST(SparseMla, Fp8RingPrefillWithAnOffloadPool) {
  prefill_with_an_offload_pool(Prefill::kFp8Ring);
}
TEST(SparseMla, Fp8RingPrefillOverAMillionTokenPool) {
  prefill_over_a_million_token_pool(Prefill::kFp8Ring);
}
// The running max moving mid-row (hot keys), and rows with more heads than a
// head block, for both layouts (the fp8 ring's ping-pong consumers hand the
// max between them only then).
void prefill_with_a_rising_max(Prefill layout) {
  MlaCase c{12, 64, 2048, 1, 20000, 31};
  c.hot_keys = 3;
  run_prefill_case(c, layout);
  MlaCase wide{5, 128, 1000, 1, 9000, 32};
  wide.hot_keys = 2;
  run_prefill_case(wide, layout);
}
TEST(SparseMla, Fp8RingPrefillWithARisingMax) {
  prefill_with_a_rising_max(Prefill::kFp8Ring);
}
TEST(SparseMla, WgmmaPrefillWithARisingMax) {
  prefill_with_a_rising_max(Prefill::kF16Ring);
}
TEST(SparseMla, Fp8RingDecodeSplitsMatchTheReference) {
  decode_splits_match_the_reference(Prefill::kFp8Ring);
}
// More (row, head block) items than an H100 or H200 has SMs (132): the
// persistent launch (the default for one split) runs two or three rows per
// CTA, its ring streaming on from one row into the next.
TEST(SparseMla, Fp8RingPrefillMoreRowsThanMultiprocessors) {
  run_prefill_case({270, 64, 200, 1, 3000, 41}, Prefill::kFp8Ring);
  run_prefill_case({140, 128, 130, 1, 3000, 42}, Prefill::kFp8Ring);
}
TEST(SparseMla, WgmmaSplitsNeverEmpty) {
  EXPECT_EQ(cuda::sparse_mla_prefill_splits(8, 2048), 8);    // 32 stages, 4 each
  EXPECT_EQ(cuda::sparse_mla_prefill_splits(7, 2048), 7);    // 5 each, the last 2
  EXPECT_EQ(cuda::sparse_mla_prefill_splits(12, 2048), 11);  // 3 each: 11 splits
  EXPECT_EQ(cuda::sparse_mla_prefill_splits(5, 97), 2);      // 2 stages
  EXPECT_EQ(cuda::sparse_mla_prefill_splits(1, 7), 1);
  // The fp8-ring layout's 128-key bunches.
  EXPECT_EQ(cuda::detail::sparse_mla_bunch_splits(8, 2048), 8);   // 16 bunches, 2 each
  EXPECT_EQ(cuda::detail::sparse_mla_bunch_splits(7, 2048), 6);   // 3 each, the last 1
  EXPECT_EQ(cuda::detail::sparse_mla_bunch_splits(12, 2048), 8);  // 2 each
  EXPECT_EQ(cuda::detail::sparse_mla_bunch_splits(20, 2048), 16);
  EXPECT_EQ(cuda::detail::sparse_mla_bunch_splits(5, 97), 1);
  EXPECT_EQ(cuda::detail::sparse_mla_bunch_splits(1, 7), 1);
}

// The policy sends many one-split rows to the wgmma kernel, and the few rows
// of decode with their splits too; sparse_mla_attention routes them there
// (small top_k keeps the reference quick).
TEST(SparseMla, PrefillRowsTakeTheWgmmaKernel) {
  const bool enabled = cuda::sparse_mla_prefill_enabled();
  const bool decode = enabled && cuda::sparse_mla_prefill_decode_enabled();
  cuda::SparseMlaParams params;
  params.rows = 140;
  params.heads = 64;
  params.num_splits = 1;
  EXPECT_EQ(cuda::sparse_mla_prefill_selected(params), enabled);
  params.rows = 4;
  EXPECT_EQ(cuda::sparse_mla_prefill_selected(params), decode);
  params.num_splits = 2;
  EXPECT_EQ(cuda::sparse_mla_prefill_selected(params), decode);
  params.fixed_kernel = true;  // the batch-invariant mode: one split, whatever the row count
  EXPECT_FALSE(cuda::sparse_mla_prefill_selected(params));
  params.num_splits = 1;
  EXPECT_EQ(cuda::sparse_mla_prefill_selected(params), enabled);
  params.fixed_kernel = false;
  params.cluster_merge = true;
  EXPECT_FALSE(cuda::sparse_mla_prefill_selected(params));
  run_case({140, 64, 96, 1, 4000, 25});
  run_case({6, 64, 2048, 4, 5000, 26});  // through sparse_mla_attention's policy
}

// The cluster kernel (splits merged in distributed shared memory): one row,
// MTP-like rows, 128 heads, top_k not a multiple of its 64-slot chunks (some
// splits get no slot at all), holed, partial and empty rows.
TEST(SparseMla, ClusterMergeSingleDecodeRow) {
  run_case({1, 64, 1024, 8, 5000, 11, true});
}
TEST(SparseMla, ClusterMergeSixteenSplits) {
  if (cuda::detail::sparse_mla_cluster_max_splits() < 16)
    GTEST_SKIP() << "this GPU cannot hold a 16-CTA cluster of the kernel";
  run_case({1, 64, 2048, 16, 5000, 12, true});
  run_case({4, 64, 2048, 16, 7000, 13, true});
}
TEST(SparseMla, ClusterMergeRaggedRowsAndHeads) {
  run_case({6, 128, 1024, 8, 9000, 14, true});
  run_case({5, 64, 700, 8, 3000, 15, true});
  run_case({3, 64, 512, 8, 3000, 16, true});
}
// Slots anywhere in the 688 MB of entries of a 1M-token context.
TEST(SparseMla, ClusterMergeOverAMillionTokenPool) {
  if (cuda::detail::sparse_mla_cluster_max_splits() < 16)
    GTEST_SKIP() << "this GPU cannot hold a 16-CTA cluster of the kernel";
  MlaCase c{3, 64, 2048, 16, int64_t{1} << 20, 20, true};
  c.sparse_pool = true;
  run_case(c);
}
TEST(SparseMla, ClusterMergeComputesOnlyTheActiveHeads) {
  run_case({3, 64, 2048, 16, 5000, 18, true, 16});
  run_case({2, 128, 1000, 8, 5000, 19, true, 48});
}
TEST(SparseMla, ClusterMergeMatchesTheGeneralKernelsPlan) {
  // The plan picks the cluster kernel for a decode row of GLM-5.2's 64 heads
  // (16 splits) and leaves more rows and heads to the general kernel.
  if (cuda::detail::sparse_mla_cluster_max_splits() < 16)
    GTEST_SKIP() << "this GPU cannot hold a 16-CTA cluster of the kernel";
  EXPECT_EQ(cuda::sparse_mla_cluster_splits(1, 64, 2048), 16);
  EXPECT_EQ(cuda::sparse_mla_cluster_splits(128, 64, 2048), 0);
  EXPECT_EQ(cuda::sparse_mla_cluster_splits(1, 64, 256), 0);
  EXPECT_EQ(cuda::sparse_mla_cluster_splits(2, 64, 2048), 0);       // 128 CTAs, or 4 chunks each
  EXPECT_EQ(cuda::sparse_mla_cluster_splits(2, 64, 1024), 8);       // 64 CTAs of 2 chunks
  const int splits = cuda::sparse_mla_cluster_splits(4, 16, 2048);  // glm_1b's 16 heads
  EXPECT_EQ(splits, 16);
  run_case({4, 64, 2048, splits, 4000, 17, true, 16});
}

// The cluster kernel turning Q's rope columns itself (q_rope_bf16, the decode
// path without a query pack) gives the bits of the pack followed by the
// kernel, with and without early inputs; the packed buffer's own rope
// columns are NaN, so a read of them shows.
TEST(SparseMla, ClusterRotatesTheRopeColumnsAsThePackDoes) {
  const int rows = 3, heads = 64, top_k = 1024, splits = 8, nope = 192, qk = nope + 64;
  std::mt19937 rng(61);
  const int64_t num_slots = 4000;
  const std::vector<uint8_t> pool = random_latent_pool(num_slots, rng);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> angle(-3.1f, 3.1f);
  std::vector<uint16_t> source(static_cast<size_t>(rows) * heads * qk);  // q_b's bf16 output
  for (uint16_t& v : source) v = float_to_bf16(normal(rng));
  std::vector<uint16_t> packed(static_cast<size_t>(rows) * heads * kQueryDim);
  for (uint16_t& v : packed) v = float_to_bf16(normal(rng));  // W_UK's latent columns
  std::vector<float> cos(static_cast<size_t>(rows) * 32), sin(cos.size());
  for (size_t i = 0; i < cos.size(); ++i) {
    const float a = angle(rng);
    cos[i] = std::cos(a);
    sin[i] = std::sin(a);
  }
  std::vector<int32_t> slots(static_cast<size_t>(rows) * top_k);
  for (size_t i = 0; i < slots.size(); ++i)
    slots[i] = i % 13 == 5 ? -1 : static_cast<int32_t>(rng() % num_slots);
  DeviceBuffer<uint8_t> device_pool(pool);
  DeviceBuffer<uint16_t> device_source(source), device_packed(packed);
  DeviceBuffer<float> device_cos(cos), device_sin(sin);
  DeviceBuffer<int32_t> device_slots(slots);
  DeviceBuffer<float> unused(1);

  cuda::MlaQueryPackParams pack;
  pack.q_rope_bf16 = device_source.get() + nope;
  pack.cos = device_cos.get();
  pack.sin = device_sin.get();
  pack.interleaved = true;
  pack.rope_row_stride = heads * qk;
  pack.rope_head_stride = qk;
  pack.tokens = rows;
  pack.heads = heads;
  pack.padded_heads = heads;
  pack.lora = kRank;
  pack.rope = 64;
  pack.q = device_packed.get();
  cuda::pack_mla_queries(pack, nullptr);
  const std::vector<uint16_t> rotated = device_packed.download();

  auto attend = [&](const DeviceBuffer<uint16_t>& q, bool rope_in_kernel, bool early) {
    DeviceBuffer<uint16_t> out(static_cast<size_t>(rows) * heads * kRank);
    DeviceBuffer<float> lse(static_cast<size_t>(rows) * heads);
    cuda::SparseMlaParams params =
        make_params(q, device_slots, device_pool, unused, unused,
                    {rows, heads, top_k, splits, num_slots, 0, /*cluster=*/true});
    params.out = out.get();
    params.lse = lse.get();
    params.inputs_ready_at_launch = early;
    if (rope_in_kernel) {
      params.q_rope_bf16 = pack.q_rope_bf16;
      params.rope_row_stride = pack.rope_row_stride;
      params.rope_head_stride = pack.rope_head_stride;
      params.rope_cos = pack.cos;
      params.rope_sin = pack.sin;
    }
    cuda::sparse_mla_attention(params, nullptr);
    MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
    return std::make_pair(out.download(), lse.download());
  };
  const auto expected = attend(device_packed, false, false);
  // The latent columns as W_UK left them, the rope columns NaN.
  std::vector<uint16_t> unrotated = rotated;
  for (size_t i = 0; i < unrotated.size(); ++i)
    if (static_cast<int>(i % kQueryDim) >= kRank) unrotated[i] = 0x7fc0;
  const DeviceBuffer<uint16_t> device_unrotated(unrotated);
  for (const bool early : {false, true}) {
    SCOPED_TRACE(early ? "early inputs" : "inputs after the wait");
    const auto got = attend(device_unrotated, true, early);
    EXPECT_EQ(got.first, expected.first);
    ASSERT_EQ(got.second.size(), expected.second.size());
    EXPECT_EQ(
        std::memcmp(got.second.data(), expected.second.data(), got.second.size() * sizeof(float)),
        0);
  }
  // Rope columns without the cluster kernel, or misaligned, are refused.
  cuda::SparseMlaParams bad = make_params(device_unrotated, device_slots, device_pool, unused,
                                          unused, {rows, heads, top_k, 1, num_slots, 0});
  bad.out = device_packed.get();
  bad.lse = unused.get();
  bad.q_rope_bf16 = pack.q_rope_bf16;
  bad.rope_cos = pack.cos;
  bad.rope_sin = pack.sin;
  EXPECT_THROW(cuda::sparse_mla_attention(bad, nullptr), Error);
  bad.cluster_merge = true;
  bad.num_splits = splits;
  bad.rope_row_stride = heads * qk + 1;
  EXPECT_THROW(cuda::sparse_mla_attention(bad, nullptr), Error);
}

TEST(SparseMla, PrefetchMergeEqualsThePlainMergeBitForBit) {
  // The two split merges on the same partial states: the same outputs and
  // lse, bit for bit, at 2..64 splits, with empty and padded rows.
  for (const int splits : {2, 7, 32, 64}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    const int rows = 3, heads = 64, top_k = 2048;
    std::mt19937 rng(static_cast<uint32_t>(40 + splits));
    const std::vector<uint8_t> pool = random_latent_pool(3000, rng);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<uint16_t> q(static_cast<size_t>(rows) * heads * kQueryDim);
    for (uint16_t& v : q) v = float_to_bf16(normal(rng));
    std::vector<int32_t> slots(static_cast<size_t>(rows) * top_k);
    for (int row = 0; row < rows; ++row)
      for (int j = 0; j < top_k; ++j)
        slots[static_cast<size_t>(row) * top_k + j] =
            row == 2 || (row == 1 && j >= 100) ? -1 : static_cast<int32_t>(rng() % 3000);
    DeviceBuffer<uint8_t> device_pool(pool);
    DeviceBuffer<uint16_t> device_q(q), plain_out(static_cast<size_t>(rows) * heads * kRank),
        prefetch_out(static_cast<size_t>(rows) * heads * kRank);
    DeviceBuffer<int32_t> device_slots(slots);
    DeviceBuffer<float> plain_lse(static_cast<size_t>(rows) * heads),
        prefetch_lse(static_cast<size_t>(rows) * heads);
    DeviceBuffer<float> partial_out(static_cast<size_t>(rows) * splits * heads * kRank);
    DeviceBuffer<float> partial_lse(static_cast<size_t>(rows) * splits * heads);
    cuda::SparseMlaParams params = make_params(device_q, device_slots, device_pool, partial_out,
                                               partial_lse, {rows, heads, top_k, splits});
    params.out = plain_out.get();
    params.lse = plain_lse.get();
    cuda::detail::launch_sparse_mla(params, /*prefetch_merge=*/false, nullptr);
    params.out = prefetch_out.get();
    params.lse = prefetch_lse.get();
    cuda::detail::launch_sparse_mla(params, /*prefetch_merge=*/true, nullptr);
    EXPECT_EQ(plain_out.download(), prefetch_out.download());
    const std::vector<float> a = plain_lse.download(), b = prefetch_lse.download();
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
}

TEST(SparseMla, RejectsBadShapes) {
  cuda::SparseMlaParams params;
  params.heads = 48;
  params.top_k = 64;
  params.softmax_scale = 1;
  EXPECT_THROW(cuda::sparse_mla_attention(params, nullptr), Error);
  params.heads = 64;
  params.num_splits = 3;  // 64 slots are 2 blocks
  EXPECT_THROW(cuda::sparse_mla_attention(params, nullptr), Error);
  params.cluster_merge = true;  // a cluster is 8 or 16 splits
  params.num_splits = 4;
  EXPECT_THROW(cuda::sparse_mla_attention(params, nullptr), Error);
  params.num_splits = 8;
  params.active_heads = 24;  // not a multiple of 16
  EXPECT_THROW(cuda::sparse_mla_attention(params, nullptr), Error);
  params.active_heads = 0;
  params.top_k = 2048;  // 256 slots per split: more than a CTA takes
  EXPECT_THROW(cuda::sparse_mla_attention(params, nullptr), Error);
}

}  // namespace
}  // namespace megactx::test
