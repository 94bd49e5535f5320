// The CUDA model's fast attention path (the fp8 DSA indexer, radix top-k
// and sparse MLA kernels; model/cuda/dsa_fast_attention.cpp) against its own
// fp32 fallback (CudaModelOptions::fast_attention = false), both on the GPU
// over FP8 caches, on small random GLM-shaped models with the kernels' shapes
// (kv_lora 512, rope 64, index dim 128; 4 layers: full, shared, full, shared
// indexers; dense MLPs so that no expert routing flip hides or adds error).
//
// Each run is a prefill of two sequences of different lengths on shuffled
// pages (logits of every token), then decode steps of both sequences together
// (teacher-forced random tokens). The fused indexer + top-k (taken for steps
// past the scores cap) is compared with the two-kernel indexer it replaces. Attention heads 16
// (padded to 64 for sparse MLA, indexer heads 8 padded to 32), 64 (indexer 32: no padding) and 128
// (indexer 64: two MLA head blocks, the 64-head indexer kernel).
#include <gtest/gtest.h>

#include <cstring>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <unordered_set>

#include "../model/hf_fixture.h"
#include "glm_shaped_model.h"
#include "model/cuda/cuda_dsa_model.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/fast_attention_plan.h"
#include "model/model_loader.h"

namespace megactx::testing {
namespace {

std::unique_ptr<LanguageModel> cuda_model(const LanguageModel& host, bool fast,
                                          int64_t row_block = 1024, bool batch_invariant = false) {
  CudaModelOptions options;
  options.fast_attention = fast;
  options.row_block = row_block;
  options.batch_invariant = batch_invariant;
  return make_cuda_dsa_model(static_cast<const DsaModel&>(host), options);
}

// Everything one run produced: logits rows of every forward, concatenated
// [rows, vocab], and the prefill's selection (the latest full layer: 2).
struct Outcome {
  std::vector<float> logits;
  int64_t rows = 0;
  cuda::CudaDsaModel::Selection prefill_selection;
  std::vector<int64_t> prefill_positions;  // position of each prefill token
};

constexpr int64_t kPromptA = 300, kPromptB = 170, kDecodeSteps = 6;

Outcome run(LanguageModel& model, KvDType dtype) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> token(2,
                                               static_cast<int32_t>(model.config().vocab_size) - 1);
  std::vector<int32_t> prompt_a(kPromptA), prompt_b(kPromptB);
  for (int32_t& id : prompt_a) id = token(rng);
  for (int32_t& id : prompt_b) id = token(rng);
  // Shuffled pages: A needs 5 (306 tokens), B 3 (176).
  const std::vector<int32_t> pages_a = {7, 2, 9, 0, 4}, pages_b = {5, 8, 1};
  auto cache = make_cuda_kv_cache(make_kv_cache_spec(model.config(), 10, dtype));
  Outcome out;
  auto append = [&](const ForwardOutput& output) {
    const Tensor logits = to_host(output.logits);
    out.logits.insert(out.logits.end(), logits.data<float>(),
                      logits.data<float>() + logits.numel());
    out.rows += logits.dim(0);
  };
  ForwardBatch prefill;
  prefill.sequences.push_back({prompt_a, 0, pages_a, 0});
  prefill.sequences.push_back({prompt_b, 0, pages_b, 0});
  append(model.forward(prefill, *cache));
  out.prefill_selection =
      dynamic_cast<cuda::CudaDsaModel&>(model).last_selection(kPromptA + kPromptB);
  for (int64_t p = 0; p < kPromptA; ++p) out.prefill_positions.push_back(p);
  for (int64_t p = 0; p < kPromptB; ++p) out.prefill_positions.push_back(p);
  for (int64_t step = 0; step < kDecodeSteps; ++step) {
    const std::vector<int32_t> next_a = {token(rng)}, next_b = {token(rng)};
    ForwardBatch decode;
    decode.sequences.push_back({next_a, kPromptA + step, pages_a, -1});
    decode.sequences.push_back({next_b, kPromptB + step, pages_b, -1});
    append(model.forward(decode, *cache));
  }
  return out;
}

// Checks that row t of `selection` holds min(top_k, position_t + 1) distinct
// positions in [0, position_t], then -1 (a test failure names the first bad entry).
void expect_valid_selection(const Outcome& run, const char* what) {
  const auto& s = run.prefill_selection;
  for (int64_t t = 0; t < s.tokens; ++t) {
    const int64_t position = run.prefill_positions[static_cast<size_t>(t)];
    const int64_t count = std::min<int64_t>(s.top_k, position + 1);
    ASSERT_EQ(s.counts[static_cast<size_t>(t)], count) << what << " token " << t;
    std::unordered_set<int32_t> seen;
    for (int64_t i = 0; i < s.top_k; ++i) {
      const int32_t p = s.positions[static_cast<size_t>(t * s.top_k + i)];
      if (i >= count) {
        ASSERT_EQ(p, -1) << what << " token " << t << " entry " << i;
        continue;
      }
      ASSERT_GE(p, 0) << what << " token " << t << " entry " << i;
      ASSERT_LE(p, position) << what << " token " << t << " sees the future";
      ASSERT_TRUE(seen.insert(p).second) << what << " token " << t << " position " << p << " twice";
    }
  }
}

// Mean over tokens with more visible keys than top_k of |fast ∩ fallback| / top_k.
double selection_overlap(const Outcome& fast, const Outcome& fallback) {
  const auto& a = fast.prefill_selection;
  const auto& b = fallback.prefill_selection;
  double sum = 0.0;
  int64_t rows = 0;
  for (int64_t t = 0; t < a.tokens; ++t) {
    if (fast.prefill_positions[static_cast<size_t>(t)] + 1 <= a.top_k) continue;
    const auto row_a = a.positions.begin() + t * a.top_k;
    const auto row_b = b.positions.begin() + t * b.top_k;
    const std::unordered_set<int32_t> set_b(row_b, row_b + b.top_k);
    int64_t common = 0;
    for (auto it = row_a; it != row_a + a.top_k; ++it) common += set_b.count(*it);
    sum += static_cast<double>(common) / static_cast<double>(a.top_k);
    ++rows;
  }
  return rows > 0 ? sum / static_cast<double>(rows) : 1.0;
}

// The memory planner's bound (cuda_fast_attention_scratch_bytes) covers what
// the fast path allocated: steps of at most 470 rows over contexts of at most
// 512 (the decode graphs' power-of-two bucket of 306; 1024 leaves room, and
// only the small per-token page list and slot columns grow with it).
void expect_scratch_within_plan(const LanguageModel& model, int64_t index_topk) {
  int device = 0, multiprocessors = 0;
  MEGACTX_CUDA_CHECK(cudaGetDevice(&device));
  MEGACTX_CUDA_CHECK(
      cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  const int64_t used = dynamic_cast<const cuda::CudaDsaModel&>(model).fast_scratch_bytes();
  const int64_t bound = cuda_fast_attention_scratch_bytes(model.config(), kPromptA + kPromptB, 1024,
                                                          index_topk, multiprocessors);
  std::printf("fast path scratch: %lld bytes allocated, planner bound %lld\n",
              static_cast<long long>(used), static_cast<long long>(bound));
  EXPECT_GT(used, 0);
  EXPECT_LE(used, bound);
}

const Shape kShapes[] = {{16, 8}, {64, 32}, {128, 64}};

TEST(CudaFastAttention, DenseSelectionMatchesFallbackWithinBf16Rounding) {
  // index_topk 4096 >= every context: both paths attend to every position, so
  // the only differences are the fast path's roundings: q = [q_latent | q_pe]
  // to bf16 (2^-9 relative), the fp8 latents dequantised to bf16 inside the
  // tensor-core products, softmax weights and the output in bf16. Each is
  // ~2^-9 of an attention output; through four layers with random weights the
  // logits move by a few 1e-3 of their largest value. 2e-2 is the bf16 bound
  // of the bf16 GEMM mode against fp32. The indexer still runs (its
  // scores are not used for dense selection); its selection must be exact:
  // every visible position once.
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE(shape_name(shape));
    auto host = host_model(shape, 4096);
    auto fast = cuda_model(*host, true);
    auto fallback = cuda_model(*host, false);
    const Outcome got = run(*fast, KvDType::FP8);
    const Outcome want = run(*fallback, KvDType::FP8);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    const int64_t vocab = host->config().vocab_size;
    const double error = relative_error(got.logits.data(), want.logits.data(), want.logits.size());
    const double agreement =
        argmax_agreement(got.logits.data(), want.logits.data(), want.rows, vocab);
    std::printf(
        "fast vs fallback attention, %s, dense selection, FP8 cache: relative logit error %.3g, "
        "argmax agreement %.4f over %lld rows\n",
        shape_name(shape).c_str(), error, agreement, static_cast<long long>(want.rows));
    EXPECT_GT(error, 0.0) << "the fast path is not in use";
    EXPECT_LE(error, 2e-2);
    EXPECT_GE(agreement, 0.95);
    expect_valid_selection(got, "fast path");
    expect_valid_selection(want, "fallback");
    expect_scratch_within_plan(*fast, 4096);
  }
}

TEST(CudaFastAttention, Bf16AbsorbedProductsMatchTheTf32Ones) {
  // The bf16 mode's absorbed products in bf16 (here from blocks of one row
  // on: W_UK into the packed bf16 queries, W_UV from the sparse MLA's bf16
  // output) against the float32 TF32 products with the pack / unpack copies:
  // the weights and q_nope rounded to bf16 instead of TF32 (2^-9 against
  // 2^-11 relative per term); the packed queries and the attention output
  // were bf16 in both. Dense selection (index_topk 4096 >= every context), as
  // in DenseSelectionMatchesFallbackWithinBf16Rounding: with a top-64 the
  // rounding moves near-ties of later layers' selections on these random
  // models (measured on the H200: 0.058-0.065 relative logit error, argmax
  // 0.94-0.95), which says nothing about the products.
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE(shape_name(shape));
    auto host = host_model(shape, 4096);
    auto model = [&](int64_t min_rows, bool activations) {
      CudaModelOptions options;
      options.bf16_weights = true;
      options.bf16_absorbed_min_rows = min_rows;
      options.bf16_activations = activations;
      return make_cuda_dsa_model(static_cast<const DsaModel&>(*host), options);
    };
    auto tf32 = model(std::numeric_limits<int64_t>::max(), true);
    const Outcome want = run(*tf32, KvDType::FP8);
    // With and without the bf16 activations of the same blocks (q from q_b,
    // the dense MLP's gate / up: CudaModelOptions::bf16_activations).
    double errors[2] = {0, 0};
    for (const bool activations : {false, true}) {
      auto bf16 = model(1, activations);
      const Outcome got = run(*bf16, KvDType::FP8);
      ASSERT_EQ(got.logits.size(), want.logits.size());
      const double error =
          relative_error(got.logits.data(), want.logits.data(), want.logits.size());
      const double agreement = argmax_agreement(got.logits.data(), want.logits.data(), want.rows,
                                                host->config().vocab_size);
      std::printf(
          "bf16 vs TF32 absorbed products%s, %s: relative logit error %.3g, argmax agreement "
          "%.4f\n",
          activations ? " and bf16 activations" : "", shape_name(shape).c_str(), error, agreement);
      EXPECT_GT(error, 0.0) << "the bf16 products are not in use";
      EXPECT_LE(error, 2e-2);
      EXPECT_GE(agreement, 0.95);
      errors[activations] = error;
    }
    EXPECT_NE(errors[0], errors[1]) << "the bf16 activations are not in use";
  }
}

TEST(CudaFastAttention, RowBlocksMatchTheWholeStep) {
  // The 470-row prefill in blocks of 64 rows (the last one 22) through the
  // attention core and the feed-forward, against one block of the whole
  // step. In the batch-invariant mode (sparse MLA unsplit, GEMMs whose
  // results do not depend on the rows of a call) the two are bit-identical:
  // a block needs nothing of the others. Otherwise only rounding differs
  // (sparse MLA's split-K and cuBLAS's kernels follow the rows of a launch),
  // but on these random FP8 models a rounding difference in an early layer
  // moves near-ties of a later layer's top-64 (measured on the H200: 0.04-0.05
  // relative logit error, as the fused-indexer comparison below), so that
  // comparison is bounded loosely. Also the plan's bound for blocks.
  for (const Shape& shape : {kShapes[0], kShapes[2]}) {
    SCOPED_TRACE(shape_name(shape));
    auto host = host_model(shape, 64);
    {
      auto whole = cuda_model(*host, true, 1024, /*batch_invariant=*/true);
      auto blocked = cuda_model(*host, true, /*row_block=*/64, /*batch_invariant=*/true);
      const Outcome want = run(*whole, KvDType::FP8);
      const Outcome got = run(*blocked, KvDType::FP8);
      ASSERT_EQ(got.logits.size(), want.logits.size());
      EXPECT_EQ(got.prefill_selection.positions, want.prefill_selection.positions);
      EXPECT_EQ(
          std::memcmp(got.logits.data(), want.logits.data(), want.logits.size() * sizeof(float)), 0)
          << "batch-invariant row blocks differ from the whole step";
    }
    auto whole = cuda_model(*host, true);
    auto blocked = cuda_model(*host, true, /*row_block=*/64);
    const Outcome want = run(*whole, KvDType::FP8);
    const Outcome got = run(*blocked, KvDType::FP8);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    const double error = relative_error(got.logits.data(), want.logits.data(), want.logits.size());
    std::printf("fast path, %s, row blocks of 64 vs one block: relative logit error %.3g\n",
                shape_name(shape).c_str(), error);
    EXPECT_LE(error, 0.1);
    expect_scratch_within_plan(*blocked, 64);
    int device = 0, multiprocessors = 0;
    MEGACTX_CUDA_CHECK(cudaGetDevice(&device));
    MEGACTX_CUDA_CHECK(
        cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
    EXPECT_LE(dynamic_cast<const cuda::CudaDsaModel&>(*blocked).fast_scratch_bytes(),
              cuda_fast_attention_scratch_bytes(host->config(), kPromptA + kPromptB, 1024, 64,
                                                multiprocessors, /*row_block=*/64));
  }
}

TEST(CudaFastAttention, SparseSelectionAgreesWithFallback) {
  // index_topk 64 of up to 306 keys: selection matters. The fast indexer
  // quantises its queries to e4m3 per (token, head) (up to 2^-4 relative per
  // element; the fallback keeps fp32 queries), so keys whose scores sit
  // within a few percent of the 64th are swapped; the keys themselves are the
  // same fp8 bytes. Measured on the latest full layer (2) of the prefill: the
  // mean fraction of the 64 positions both paths chose, and the argmax of
  // every logits row (a swapped key moves an attention output by O(1/64) of
  // it, more than bf16 rounding, so the logit bound is on the argmax).
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE(shape_name(shape));
    auto host = host_model(shape, 64);
    auto fast = cuda_model(*host, true);
    auto fallback = cuda_model(*host, false);
    const Outcome got = run(*fast, KvDType::FP8);
    const Outcome want = run(*fallback, KvDType::FP8);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    expect_valid_selection(got, "fast path");
    expect_valid_selection(want, "fallback");
    const int64_t vocab = host->config().vocab_size;
    const double overlap = selection_overlap(got, want);
    const double error = relative_error(got.logits.data(), want.logits.data(), want.logits.size());
    const double agreement =
        argmax_agreement(got.logits.data(), want.logits.data(), want.rows, vocab);
    std::printf(
        "fast vs fallback attention, %s, top-64 of <= 306 keys, FP8 cache: selected-set "
        "agreement %.4f, relative logit error %.3g, argmax agreement %.4f over %lld rows\n",
        shape_name(shape).c_str(), overlap, error, agreement, static_cast<long long>(want.rows));
    EXPECT_GE(overlap, 0.85);
    EXPECT_GE(agreement, 0.85);
    EXPECT_GT(error, 0.0) << "the fast path is not in use";
    expect_scratch_within_plan(*fast, 64);
  }
}

// MEGACTX_CUDA_FUSED_INDEXER=1 for one scope: every step the fused indexer +
// top-k serves takes it (by default only steps past kCudaIndexerScoresCap,
// far larger than these).
struct ForceFusedIndexer {
  ForceFusedIndexer() { setenv("MEGACTX_CUDA_FUSED_INDEXER", "1", 1); }
  ~ForceFusedIndexer() { unsetenv("MEGACTX_CUDA_FUSED_INDEXER"); }
};

TEST(CudaFastAttention, FusedIndexerMatchesTheTwoKernelPath) {
  // The same fast path twice: the prefill (two sequences, 470 rows) and the
  // decode steps scored and selected by the fused indexer + top-k, against
  // indexer_scores + radix_topk. Both read the same e4m3 queries and keys;
  // only the fp32 order of the tensor-core sums differs, so only keys tied
  // within rounding at the threshold may swap. top_k 64: a sparse selection;
  // top_k 2048: every visible key (the same set, in another order).
  EXPECT_TRUE(cuda_fused_indexer_serves(host_model(kShapes[0], 64)->config(), 64));
  for (int64_t top_k : {64, 2048}) {
    for (const Shape& shape : kShapes) {
      SCOPED_TRACE(shape_name(shape) + ", top-" + std::to_string(top_k));
      auto host = host_model(shape, top_k);
      auto two_kernel = cuda_model(*host, true);
      const Outcome want = run(*two_kernel, KvDType::FP8);
      Outcome got;
      {
        ForceFusedIndexer force;
        auto fused = cuda_model(*host, true);
        got = run(*fused, KvDType::FP8);
        EXPECT_GT(dynamic_cast<const cuda::CudaDsaModel&>(*fused).fast_scratch_bytes(),
                  dynamic_cast<const cuda::CudaDsaModel&>(*two_kernel).fast_scratch_bytes())
            << "the fused workspace was not allocated";
        expect_scratch_within_plan(*fused, top_k);
      }
      ASSERT_EQ(got.logits.size(), want.logits.size());
      expect_valid_selection(got, "fused path");
      const int64_t vocab = host->config().vocab_size;
      const double overlap = selection_overlap(got, want);
      const double error =
          relative_error(got.logits.data(), want.logits.data(), want.logits.size());
      const double agreement =
          argmax_agreement(got.logits.data(), want.logits.data(), want.rows, vocab);
      std::printf(
          "fused vs two-kernel indexer, %s, top-%lld: selected-set agreement %.4f, relative logit "
          "error %.3g, argmax agreement %.4f over %lld rows\n",
          shape_name(shape).c_str(), static_cast<long long>(top_k), overlap, error, agreement,
          static_cast<long long>(want.rows));
      // Tighter than the fast-vs-fallback bounds above (overlap and argmax 0.85):
      // a few keys tied within rounding swap, and through four layers with
      // random weights each moves the logits by O(1/64) (measured: overlap
      // 0.994, argmax 0.98, logit error 0.06 at top-64). With every key
      // selected only the order of the sums differs: the bf16 bound 2e-2.
      EXPECT_GE(overlap, 0.95);
      EXPECT_GE(agreement, 0.95);
      if (top_k == 2048) {
        EXPECT_LE(error, 2e-2);
      }
    }
  }
}

TEST(CudaFastAttention, OtherCachesAndTheSwitchKeepTheFallback) {
  // A BF16 cache is not the fast path's layout: fast_attention true and false
  // run the same fallback kernels and give the same logits.
  const Shape shape{16, 8};
  auto host = host_model(shape, 64);
  auto fast = cuda_model(*host, true);
  auto fallback = cuda_model(*host, false);
  const Outcome got = run(*fast, KvDType::BF16);
  const Outcome want = run(*fallback, KvDType::BF16);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  EXPECT_LE(relative_error(got.logits.data(), want.logits.data(), want.logits.size()), 1e-6);
  EXPECT_EQ(got.prefill_selection.positions, want.prefill_selection.positions);
  EXPECT_EQ(dynamic_cast<const cuda::CudaDsaModel&>(*fast).fast_scratch_bytes(), 0);
  EXPECT_FALSE(cuda_fast_attention_used(fast->config(), KvDType::BF16, 64, true));
  EXPECT_TRUE(cuda_fast_attention_used(fast->config(), KvDType::FP8, 64, true));
  EXPECT_FALSE(cuda_fast_attention_used(fast->config(), KvDType::FP8, 64, false));
}

TEST(CudaFastAttention, PrefillAndDecodeReadTheCacheTheSameWay) {
  // The fast path alone: scoring one sequence by one prefill and by decode
  // (one token per forward) attends over the same fp8 entries with the same
  // kernels; only the order of cuBLAS reductions over different row counts
  // differs. Dense selection, so no near-tied key can flip.
  const Shape shape{16, 8};
  auto host = host_model(shape, 4096);
  auto fast = cuda_model(*host, true);
  std::mt19937 rng(23);
  std::vector<int32_t> ids(150);
  for (int32_t& id : ids) id = static_cast<int32_t>(2 + rng() % 500);
  const std::vector<int32_t> pages = {2, 0, 1};
  auto logits_of = [&](int64_t chunk) {
    auto cache = make_cuda_kv_cache(make_kv_cache_spec(fast->config(), 3, KvDType::FP8));
    std::vector<float> out;
    for (int64_t start = 0; start < static_cast<int64_t>(ids.size()); start += chunk) {
      const int64_t count = std::min<int64_t>(chunk, static_cast<int64_t>(ids.size()) - start);
      ForwardBatch batch;
      batch.sequences.push_back(
          {std::span<const int32_t>(ids.data() + start, static_cast<size_t>(count)), start, pages,
           0});
      const Tensor logits = to_host(fast->forward(batch, *cache).logits);
      out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
    }
    return out;
  };
  const std::vector<float> whole = logits_of(static_cast<int64_t>(ids.size()));
  const std::vector<float> decode = logits_of(1);
  const double error = relative_error(decode.data(), whole.data(), whole.size());
  std::printf("fast path, prefill vs decode of 150 tokens: relative logit error %.3g\n", error);
  // Different GEMM row counts round differently in fp32, which can flip one
  // e4m3 step of a cached value or one bf16 step of q: the bound of the FP8
  // cache checks in cuda_model_test.
  EXPECT_LE(error, 2e-2);
  EXPECT_GE(argmax_agreement(decode.data(), whole.data(), static_cast<int64_t>(ids.size()),
                             fast->config().vocab_size),
            0.95);
}

// The live host tier: full pages moved to offload pages (latents in pinned
// host memory, indexer keys in the device pools past the device pages) are
// read by the sparse MLA kernels, staged into device memory by one copy
// kernel per layer or straight over the bus. The same prefill, then decode
// steps of the two sequences with their full pages on offload pages (decode
// rows of 1, the general and cluster kernels) and a 15-row chunk: every logit
// equals the all-device run's bit for bit (the same bytes are read).
TEST(CudaFastAttention, OffloadPagesAreReadFromHostMemoryBitForBit) {
  const Shape shape{64, 32};
  auto host = host_model(shape, 2048);
  auto fast = cuda_model(*host, true);
  std::mt19937 rng(31);
  std::vector<int32_t> prompt_a(kPromptA), prompt_b(kPromptB), chunk(15);
  for (int32_t& id : prompt_a) id = static_cast<int32_t>(2 + rng() % 500);
  for (int32_t& id : prompt_b) id = static_cast<int32_t>(2 + rng() % 500);
  for (int32_t& id : chunk) id = static_cast<int32_t>(2 + rng() % 500);
  const std::vector<int32_t> pages_a = {7, 2, 9, 0, 4}, pages_b = {5, 8, 1};
  auto logits_of = [&](bool offloaded) {
    KvCacheSpec spec = make_kv_cache_spec(fast->config(), 10, KvDType::FP8);
    spec.offload_pages = offloaded ? 6 : 0;
    auto cache = fast->make_kv_cache(spec);
    std::vector<float> out;
    auto append = [&](const ForwardOutput& output) {
      const Tensor logits = to_host(output.logits);
      out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
    };
    ForwardBatch prefill;
    prefill.sequences.push_back({prompt_a, 0, pages_a, -1});
    prefill.sequences.push_back({prompt_b, 0, pages_b, -1});
    append(fast->forward(prefill, *cache));
    // Full pages (A: 4 of 5, B: 2 of 3) -> offload pages 10..15, as the engine moves them.
    std::vector<int32_t> table_a = pages_a, table_b = pages_b;
    if (offloaded) {
      const std::vector<int32_t> from = {7, 2, 9, 0, 5, 8}, to = {10, 11, 12, 13, 14, 15};
      fast->kv_page_copy()(*cache, from, *cache, to);
      table_a = {10, 11, 12, 13, 4};
      table_b = {14, 15, 1};
      // The device copies of the moved pages are overwritten: only the host ones hold them.
      MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());  // the copy ran on the model's stream
      for (const int32_t page : from) {
        for (const int64_t layer : spec.latent_layers) {
          const Tensor& pool = cache->latent_pool(layer);
          const int64_t page_bytes = spec.page_size * spec.latent_bytes_per_token();
          MEGACTX_CUDA_CHECK(cudaMemset(pool.data<std::byte>() + page * page_bytes, 0x7f,
                                        static_cast<size_t>(page_bytes)));
        }
      }
    }
    for (int64_t step = 0; step < 3; ++step) {
      const std::vector<int32_t> next_a = {static_cast<int32_t>(3 + step)},
                                 next_b = {static_cast<int32_t>(9 + step)};
      ForwardBatch one;  // one row: the cluster kernel
      one.sequences.push_back({next_a, kPromptA + step, table_a, -1});
      append(fast->forward(one, *cache));
      ForwardBatch decode;  // B, then both
      decode.sequences.push_back({next_b, kPromptB + step, table_b, -1});
      append(fast->forward(decode, *cache));
    }
    ForwardBatch tail;  // a 15-row chunk of B (a parked request's recompute)
    tail.sequences.push_back({chunk, kPromptB + 3, table_b, 0});
    append(fast->forward(tail, *cache));
    return out;
  };
  const std::vector<float> device = logits_of(false);
  // Staged into device memory first (the default), and read by the attention
  // kernels straight from host memory (steps larger than the staging).
  for (const char* staging : {"1", "0"}) {
    setenv("MEGACTX_OFFLOAD_STAGING", staging, 1);
    const std::vector<float> offloaded = logits_of(true);
    ASSERT_EQ(device.size(), offloaded.size());
    int64_t differ = 0;
    for (size_t i = 0; i < device.size(); ++i) differ += device[i] != offloaded[i];
    EXPECT_EQ(differ, 0) << "of " << device.size()
                         << " logits, MEGACTX_OFFLOAD_STAGING=" << staging;
  }
  unsetenv("MEGACTX_OFFLOAD_STAGING");
}
}  // namespace
}  // namespace megactx::testing
