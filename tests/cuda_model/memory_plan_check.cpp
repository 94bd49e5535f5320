// The CUDA model's memory plan (model/cuda/memory_plan.h), host only: what is
// planned fits the budget and one more page would not, the indexer scores
// grow with tokens x context (on the fallback kernels; the fast path caps
// them and runs larger steps through the fused indexer + top-k), the scratch
// parts of the fast attention path,
// the device MoE and CUDA-graph decode follow the model options and decide
// fit / no fit, and models that do not fit are clear Errors. In CUDA builds
// the device MoE part is checked against grouped_moe_layout itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine_config.h"
#include "io/model_config.h"
#include "model/cuda/fast_attention_plan.h"
#include "model/cuda/memory_plan.h"
#include "model/model_loader.h"

#if MEGACTX_HAVE_CUDA
#include "kernels/cuda/indexer_topk/fused_indexer_topk.h"
#include "kernels/cuda/moe/grouped_moe.h"
#endif

namespace megactx {
namespace {

ModelConfig fixture_config() {
  return load_model_config(std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/hf/glm_bf16");
}

ModelConfig config_named(const std::string& name) {
  std::ifstream file(std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/configs/" + name + ".json");
  std::stringstream text;
  text << file.rdbuf();
  return parse_model_config(text.str());
}

// Every option that adds scratch off: the plan is the step scratch alone.
CudaScratchOptions plain_options() {
  CudaScratchOptions options;
  options.fast_attention = false;
  options.device_moe = false;
  options.cuda_graphs = false;
  return options;
}

CudaMemoryRequest request_for(const ModelConfig& config, int64_t budget) {
  CudaMemoryRequest request;
  request.budget_bytes = budget;
  request.weight_bytes = 10 << 20;
  request.max_step_tokens = 256;
  request.max_context = 1024;
  request.max_logit_rows = 16;
  request.index_topk = 16;
  request.kv = make_kv_cache_spec(config, 0, KvDType::FP8);
  request.options = plain_options();
  request.weights_include_workspace = true;
  return request;
}

// GLM-5.2's shapes (the fast path's), a serving-sized step.
CudaMemoryRequest glm_request(const ModelConfig& config) {
  CudaMemoryRequest request;
  request.budget_bytes = int64_t{1} << 40;
  request.weight_bytes = int64_t{1} << 30;
  request.max_step_tokens = 1024;
  request.max_context = 5000;
  request.max_logit_rows = 16;
  request.index_topk = config.index_topk;
  request.kv = make_kv_cache_spec(config, 0, KvDType::FP8, 64);
  request.options.decode_sequences = 20;
  request.options.fp8_gemm_inputs = true;  // an fp8 checkpoint, native
  return request;
}

TEST(CudaMemoryPlan, PagesFillWhatIsLeftAndNoMore) {
  const ModelConfig config = fixture_config();
  const int64_t budget = int64_t{64} << 20;
  const CudaMemoryPlan plan = plan_cuda_memory(config, request_for(config, budget));
  EXPECT_EQ(plan.kv_bytes_per_page, make_kv_cache_spec(config, 1, KvDType::FP8).bytes_per_page());
  const int64_t used =
      plan.weight_bytes + plan.scratch_bytes + plan.kv_pages * plan.kv_bytes_per_page;
  EXPECT_LE(used, budget);
  EXPECT_GT(used + plan.kv_bytes_per_page, budget);
  // FP8 pages are smaller than F32 ones, so more of them fit.
  CudaMemoryRequest f32 = request_for(config, budget);
  f32.kv = make_kv_cache_spec(config, 0, KvDType::F32);
  EXPECT_GT(plan.kv_pages, plan_cuda_memory(config, f32).kv_pages);
}

TEST(CudaMemoryPlan, ScratchCountsIndexerScoresPerTokenAndContext) {
  const ModelConfig config = fixture_config();
  // One more context position costs one fp32 score per new token.
  for (int64_t tokens : {1, 7, 512}) {
    EXPECT_EQ(cuda_step_scratch_bytes(config, tokens, 101, 1, 16) -
                  cuda_step_scratch_bytes(config, tokens, 100, 1, 16),
              tokens * 4);
  }
  // One more logits row costs a normed hidden row and a vocab row.
  EXPECT_EQ(cuda_step_scratch_bytes(config, 8, 100, 2, 16) -
                cuda_step_scratch_bytes(config, 8, 100, 1, 16),
            (config.hidden_size + config.vocab_size) * 4);
}

TEST(CudaMemoryPlan, ModelsThatDoNotFitAreErrors) {
  const ModelConfig config = fixture_config();
  // Weights alone above the budget.
  CudaMemoryRequest big = request_for(config, int64_t{64} << 20);
  big.weight_bytes = int64_t{65} << 20;
  EXPECT_THROW(plan_cuda_memory(config, big), Error);
  // Room for weights and scratch but not for one sequence's pages.
  CudaMemoryRequest tight = request_for(config, 0);
  const int64_t fixed = tight.weight_bytes + cuda_step_scratch_bytes(config, 256, 1024, 16, 16);
  tight.budget_bytes = fixed + tight.kv.bytes_per_page();  // one page; 1024 tokens need 16
  EXPECT_THROW(plan_cuda_memory(config, tight), Error);
  tight.budget_bytes = fixed + 16 * tight.kv.bytes_per_page();
  EXPECT_EQ(plan_cuda_memory(config, tight).kv_pages, 16);
  // With a live host tier of 14 pages the device holds the other 2 and the
  // engine's 2 more: 4 pages (and never fewer than 4).
  CudaMemoryRequest tier = request_for(config, 0);
  tier.options.offload_tokens = 14 * tier.kv.page_size;
  const int64_t tier_fixed =
      tier.weight_bytes + cuda_scratch_breakdown(config, tier).device_total();
  tier.budget_bytes = tier_fixed + 3 * tier.kv.bytes_per_page();
  EXPECT_THROW(plan_cuda_memory(config, tier), Error);
  tier.budget_bytes = tier_fixed + 4 * tier.kv.bytes_per_page();
  EXPECT_EQ(plan_cuda_memory(config, tier).kv_pages, 4);
  tier.options.offload_tokens = 100 * tier.kv.page_size;
  tier.budget_bytes = tier.weight_bytes + cuda_scratch_breakdown(config, tier).device_total() +
                      3 * tier.kv.bytes_per_page();
  EXPECT_THROW(plan_cuda_memory(config, tier), Error);
  // Nonsense requests.
  CudaMemoryRequest zero = request_for(config, 0);
  EXPECT_THROW(plan_cuda_memory(config, zero), Error);
}

TEST(CudaMemoryPlan, ScratchPartsFollowTheModelOptions) {
  const ModelConfig config = config_named("glm5_2");  // 256 experts, top-8, H 6144, I 2048
  const CudaMemoryRequest request = glm_request(config);
  const CudaScratchBreakdown parts = cuda_scratch_breakdown(config, request);
  // 20 decode sequences pad to the bucket of 24; context 5000 to 8192.
  EXPECT_EQ(parts.graph_rows, 24);
  EXPECT_EQ(parts.graph_context, 8192);
  // The eager step has the most tokens and the larger scores; the graph's 24
  // logits rows exceed the step's 16.
  EXPECT_EQ(parts.step, cuda_step_scratch_bytes(config, 1024, 5000, 24, config.index_topk));
  EXPECT_EQ(parts.fast_attention,
            cuda_fast_attention_scratch_bytes(config, 1024, 8192, config.index_topk, 132));
  // The grouped MoE at its largest call, 256 rows = 2048 (row, slot) pairs,
  // fp8 experts (tiles of 32 rows): plan ints (tile count, (256 + 2048 / 32)
  // tiles x 3, pair_of, counts, offsets), [pairs, I] activations, [pairs, H]
  // outputs, and the e4m3 inputs [256, H] / activations [pairs, I] with
  // float32 scales per 128.
  const int64_t pairs = 256 * 8;
  const int64_t float_moe =
      4 * ((1 + 3 * (256 + pairs / 16) + pairs + 256 + 257) + pairs * 2048 + pairs * 6144);
  EXPECT_EQ(parts.device_moe,
            4 * ((1 + 3 * (256 + pairs / 32) + pairs + 256 + 257) + pairs * 2048 + pairs * 6144) +
                256 * 6144 + 4 * 256 * 48 + pairs * 2048 + 4 * pairs * 16);
  // float32 / bf16 experts: tiles of 16 (or 32) rows, no e4m3 copies.
  EXPECT_EQ(cuda_device_moe_scratch_bytes(config, 1024, false), float_moe);
  // Packed inputs of 24 rows: ids, positions, table offsets, logit rows,
  // cos and sin [24, 32], page tables [24, 8192 / 64].
  EXPECT_EQ(parts.graph_inputs, 4 * (4 * 24 + 2 * 24 * 32 + 24 * 128));
  EXPECT_EQ(parts.pinned_host, parts.graph_inputs);
  // fp8 GEMM inputs of 1024 rows: the widest input is o_proj's 64 heads x 256
  // (e4m3 bytes + one float32 scale per 128).
  EXPECT_EQ(parts.gemm_inputs, 1024 * 16384 + 1024 * 128 * 4);
  EXPECT_EQ(parts.cublas_workspace, int64_t{32} << 20);
  EXPECT_EQ(parts.device_total(), parts.step + parts.fast_attention + parts.device_moe +
                                      parts.graph_inputs + parts.gemm_inputs +
                                      parts.cublas_workspace);
  const std::string summary = parts.summary();
  std::printf("GLM-5.2, 1024-token steps, context 5000, 20 decode sequences: %s\n",
              summary.c_str());
  for (const char* part : {"step", "fast attention", "device MoE", "graph inputs", "pinned host",
                           "GEMM inputs", "cuBLAS workspace", "24 rows"}) {
    EXPECT_NE(summary.find(part), std::string::npos) << part << " missing in: " << summary;
  }
  const CudaMemoryPlan plan = plan_cuda_memory(config, request);
  EXPECT_EQ(plan.scratch_bytes, parts.device_total());

  // The fast path's part only where it runs.
  CudaMemoryRequest other = request;
  other.options.fast_attention = false;
  EXPECT_EQ(cuda_scratch_breakdown(config, other).fast_attention, 0);
  other = request;
  other.kv = make_kv_cache_spec(config, 0, KvDType::BF16, 64);
  EXPECT_EQ(cuda_scratch_breakdown(config, other).fast_attention, 0);
  other.kv = make_kv_cache_spec(config, 0, KvDType::FP8, 32);
  EXPECT_EQ(cuda_scratch_breakdown(config, other).fast_attention, 0);
  // Host MoE: no device workspace, and MoE layers cannot be captured.
  other = request;
  other.options.device_moe = false;
  CudaScratchBreakdown host_moe = cuda_scratch_breakdown(config, other);
  EXPECT_EQ(host_moe.device_moe, 0);
  EXPECT_EQ(host_moe.graph_rows, 0);
  EXPECT_EQ(host_moe.graph_inputs, 0);
  EXPECT_EQ(host_moe.pinned_host, 0);
  EXPECT_EQ(host_moe.step, cuda_step_scratch_bytes(config, 1024, 5000, 16, config.index_topk));
  EXPECT_NE(host_moe.summary().find("no CUDA graphs"), std::string::npos) << host_moe.summary();
  // A dense model captures without the device MoE.
  ModelConfig dense = config;
  dense.n_routed_experts = 0;
  EXPECT_EQ(cuda_scratch_breakdown(dense, other).graph_rows, 24);
  EXPECT_EQ(cuda_scratch_breakdown(dense, request).device_moe, 0);
  // Graphs off.
  other = request;
  other.options.cuda_graphs = false;
  EXPECT_EQ(cuda_scratch_breakdown(config, other).graph_rows, 0);
  // bf16 weights: a bf16 copy of the inputs beside (fp8 checkpoints in the
  // bf16 mode) or instead of the e4m3 one, and the copies the model writes
  // beside h, q_resid and the MLP activations; the fp32 mode has none.
  const int64_t bf16_copies =
      1024 * (16384 + config.hidden_size + *config.q_lora_rank + config.intermediate_size) * 2;
  EXPECT_EQ(cuda_gemm_input_bytes(config, 1024, true, false), bf16_copies);
  EXPECT_EQ(cuda_gemm_input_bytes(config, 1024, true, true), bf16_copies + parts.gemm_inputs);
  EXPECT_EQ(cuda_gemm_input_bytes(config, 1024, false, false), 0);
  // The cuBLAS workspace is not counted twice when the weights were measured.
  other = request;
  other.weights_include_workspace = true;
  EXPECT_EQ(cuda_scratch_breakdown(config, other).cublas_workspace, 0);
}

TEST(CudaMemoryPlan, TheLiveHostTierCountsTheUnionStagingOfLargeSteps) {
  const ModelConfig config = config_named("glm5_2");
  CudaMemoryRequest request = glm_request(config);
  auto fast_attention_at = [&](int64_t offload_pages) {
    request.options.offload_tokens = offload_pages * 64;
    return cuda_scratch_breakdown(config, request).fast_attention;
  };
  // Steps past the per-step staging (64 rows) stage the union of their
  // selections: a 656-byte row (and marks) per offload slot, all within the
  // 1M-row cap, whatever the row blocks (here 40 rows, fewer than 64).
  request.options.row_block = 40;
  EXPECT_GE(fast_attention_at(4096) - fast_attention_at(1024), 3072 * 64 * 656);
  // Decode-sized steps only: the per-step staging and the hot cache, which
  // do not grow with the tier.
  request.max_step_tokens = kOffloadStagingRows;
  EXPECT_EQ(fast_attention_at(4096), fast_attention_at(1024));
  EXPECT_GT(fast_attention_at(1024), fast_attention_at(0));
}

TEST(CudaMemoryPlan, GraphBucketsPadTheDecodeStep) {
  const ModelConfig config = config_named("glm5_2");
  // MTP verification of 7 drafts: 8 tokens per sequence; the grouped MoE
  // takes at most 256 rows, so the largest capturable bucket is 32 x 8.
  CudaMemoryRequest request = glm_request(config);
  request.options.decode_sequences = 64;
  request.options.decode_tokens_per_sequence = 8;
  EXPECT_EQ(cuda_scratch_breakdown(config, request).graph_rows, 256);
  request.options.decode_tokens_per_sequence = 9;  // prefill-like: never a graph
  EXPECT_EQ(cuda_scratch_breakdown(config, request).graph_rows, 0);
  // More running requests than the largest bucket: the largest bucket.
  request.options.decode_tokens_per_sequence = 1;
  request.options.decode_sequences = 1000;
  EXPECT_EQ(cuda_scratch_breakdown(config, request).graph_rows, 256);
  request.options.cuda_graph_max_batch = 64;
  EXPECT_EQ(cuda_scratch_breakdown(config, request).graph_rows, 64);
  // A small eager step and a full decode bucket: the bucket's rows, logits
  // and scores over the context bucket decide the step scratch.
  request = glm_request(config);
  request.max_step_tokens = 16;
  request.options.decode_sequences = 256;
  const CudaScratchBreakdown parts = cuda_scratch_breakdown(config, request);
  EXPECT_EQ(parts.graph_rows, 256);
  EXPECT_EQ(parts.step, cuda_step_scratch_bytes(config, 256, 8192, 256, config.index_topk));
  EXPECT_EQ(parts.fast_attention,
            cuda_fast_attention_scratch_bytes(config, 256, 8192, config.index_topk, 132));
  request.options.cuda_graphs = false;
  EXPECT_EQ(cuda_scratch_breakdown(config, request).step,
            cuda_step_scratch_bytes(config, 16, 5000, 16, config.index_topk));
}

// Each part alone decides fit: a budget that holds the model without the
// part and exactly one full-context sequence of pages fails with it.
TEST(CudaMemoryPlan, EachScratchPartDecidesFit) {
  const ModelConfig config = config_named("glm5_2");
  const CudaMemoryRequest base = glm_request(config);
  const int64_t pages_needed = (base.max_context + 63) / 64;
  struct Case {
    const char* part;
    void (*switch_off)(CudaMemoryRequest&);
  };
  const Case cases[] = {
      {"fast attention", [](CudaMemoryRequest& r) { r.options.fast_attention = false; }},
      {"device MoE", [](CudaMemoryRequest& r) { r.options.device_moe = false; }},
      {"CUDA graphs", [](CudaMemoryRequest& r) { r.options.cuda_graphs = false; }},
      {"cuBLAS workspace", [](CudaMemoryRequest& r) { r.weights_include_workspace = true; }},
      {"GEMM inputs", [](CudaMemoryRequest& r) { r.options.fp8_gemm_inputs = false; }},
  };
  for (const Case& c : cases) {
    CudaMemoryRequest without = base;
    c.switch_off(without);
    const int64_t with_bytes = cuda_scratch_breakdown(config, base).device_total();
    const int64_t without_bytes = cuda_scratch_breakdown(config, without).device_total();
    EXPECT_GT(with_bytes, without_bytes) << c.part;
    without.budget_bytes =
        base.weight_bytes + without_bytes + pages_needed * base.kv.bytes_per_page();
    EXPECT_EQ(plan_cuda_memory(config, without).kv_pages, pages_needed) << c.part;
    CudaMemoryRequest with = base;
    with.budget_bytes = without.budget_bytes;
    EXPECT_THROW(plan_cuda_memory(config, with), Error) << c.part;
    with.budget_bytes += with_bytes - without_bytes;
    EXPECT_EQ(plan_cuda_memory(config, with).kv_pages, pages_needed) << c.part;
  }
}

// A serving plan as the engine asks it (kv_capacity.cpp: 16384 prefill tokens
// + 256 running requests per step, logits for step_logit_rows() rows) at a
// 1,052,672-token context: on the fast path the step scratch no longer holds
// the chunk's indexer scores against the whole context (the fused indexer +
// top-k runs such steps), so it is the same at 128K and at 1M; only the
// decode graphs' page tables (the KV's own bookkeeping) grow.
// A plan for 16K-token prefill chunks (+ 256 decode rows) at `context`, FP8 KV,
// an unbounded budget: what the long-context tests below vary.
CudaMemoryRequest long_prefill_request(const ModelConfig& config, int64_t context,
                                       int64_t logit_rows) {
  CudaMemoryRequest request;
  request.budget_bytes = int64_t{1} << 50;
  request.weight_bytes = int64_t{1} << 30;
  request.max_step_tokens = 16384 + 256;
  request.max_context = context;
  request.max_logit_rows = logit_rows;
  request.index_topk = config.index_topk;
  request.kv = make_kv_cache_spec(config, 0, KvDType::FP8, 64);
  request.options.decode_sequences = 256;
  request.weights_include_workspace = true;
  return request;
}

TEST(CudaMemoryPlan, MillionTokenContextScratchDoesNotGrowWithTheContext) {
  const ModelConfig config = config_named("glm5_2");
  EngineConfig engine;
  engine.max_prefill_tokens = 16384;
  engine.max_running_requests = 256;
  const int64_t logit_rows = step_logit_rows(engine);
  EXPECT_EQ(logit_rows, kDefaultMaxLogitRows);
  auto request_at = [&](int64_t context) {
    CudaMemoryRequest request = long_prefill_request(config, context, logit_rows);
    request.options.fp8_gemm_inputs = true;
    return request;
  };
  const CudaScratchBreakdown at_128k = cuda_scratch_breakdown(config, request_at(131072));
  const CudaScratchBreakdown at_1m = cuda_scratch_breakdown(config, request_at(1052672));
  EXPECT_EQ(at_1m.step, at_128k.step);
  EXPECT_LE(at_1m.fast_attention, at_128k.fast_attention);
  EXPECT_EQ(at_1m.device_moe, at_128k.device_moe);
  EXPECT_EQ(at_1m.gemm_inputs, at_128k.gemm_inputs);
  // Graph inputs: page tables [256 rows, context bucket / 64] of int32.
  EXPECT_EQ(at_1m.graph_inputs - at_128k.graph_inputs,
            4 * 256 * ((at_1m.graph_context - at_128k.graph_context) / 64));
  // The step's indexer scores are the capped two-kernel buffer, not 16640 x 1M.
  const int64_t without_scores =
      cuda_step_scratch_bytes(config, 16640, 0, logit_rows, config.index_topk);
  EXPECT_EQ(at_1m.step, without_scores + 4 * kCudaIndexerScoresCap);
  // The fallback kernels still score the whole context.
  CudaMemoryRequest fallback = request_at(1052672);
  fallback.options.fast_attention = false;
  const CudaScratchBreakdown old = cuda_scratch_breakdown(config, fallback);
  EXPECT_EQ(old.step, without_scores + int64_t{4} * 16640 * 1052672);
  // Row blocks of 1024 (CudaModelOptions::row_block): the attention core's and
  // the feed-forward's activations are 1024 rows instead of 16640; with 1024
  // logits rows (--max-logit-rows 1024) as well.
  CudaMemoryRequest blocked = request_at(1052672);
  blocked.options.row_block = 1024;
  const CudaScratchBreakdown rows_1024 = cuda_scratch_breakdown(config, blocked);
  EXPECT_LT(rows_1024.step, at_1m.step);
  EXPECT_LT(rows_1024.fast_attention, at_1m.fast_attention);
  blocked.max_logit_rows = 1024;
  const CudaScratchBreakdown small_logits = cuda_scratch_breakdown(config, blocked);
  EXPECT_EQ(cuda_step_scratch_bytes(config, 512, 0, 1, config.index_topk, 512),
            cuda_step_scratch_bytes(config, 512, 0, 1, config.index_topk, 0))
      << "a step no longer than a block is one block";
  const double mib = 1048576.0;
  std::printf(
      "GLM-5.2 at 1M context, 16640-token steps: total scratch %.0f MiB in one block, %.0f MiB in "
      "row blocks of 1024, %.0f MiB with 1024 logits rows as well\n",
      at_1m.device_total() / mib, rows_1024.device_total() / mib,
      small_logits.device_total() / mib);
  const double logits = double(logit_rows) * (config.hidden_size + config.vocab_size) * 4;
  std::printf(
      "GLM-5.2, 16640-token steps, context 1052672: step scratch %.0f MiB (fallback kernels %.0f "
      "MiB): indexer scores %.0f MiB, logits rows %.0f MiB (%lld rows), per-token activations "
      "%.0f MiB; fast "
      "attention %.0f MiB; total scratch %.0f MiB (128K: %.0f MiB)\n",
      at_1m.step / mib, old.step / mib, 4.0 * kCudaIndexerScoresCap / mib, logits / mib,
      static_cast<long long>(logit_rows), (without_scores - logits) / mib,
      at_1m.fast_attention / mib, at_1m.device_total() / mib, at_128k.device_total() / mib);
}

// The prefill issue's benchmark config (GLM-5.2's attention and indexer in 8
// layers, vocab 8192): at 1M context, with 16K-token prefill chunks and the
// default row blocks of 1024 (CudaModelOptions::row_block), the whole device
// scratch stays under 4 GiB, and it does not grow with the context.
TEST(CudaMemoryPlan, BenchmarkConfigAtOneMillionTokensFitsFourGiB) {
  std::ifstream file(std::string(MEGACTX_SOURCE_DIR) + "/bench/cuda/configs/glm52_attention.json");
  std::stringstream text;
  text << file.rdbuf();
  const ModelConfig config = parse_model_config(text.str());
  EngineConfig engine;
  engine.max_prefill_tokens = 16384;
  auto request_at = [&](int64_t context) {
    CudaMemoryRequest request = long_prefill_request(config, context, step_logit_rows(engine));
    request.options.row_block = CudaModelOptions{}.row_block;
    return request;
  };
  EXPECT_EQ(CudaModelOptions{}.row_block, 1024);
  const CudaScratchBreakdown at_1m = cuda_scratch_breakdown(config, request_at(1052672));
  const CudaScratchBreakdown at_128k = cuda_scratch_breakdown(config, request_at(131072));
  std::printf(
      "benchmark config (glm52_attention), 16640-token steps, row blocks of 1024: total "
      "scratch %.0f MiB at 1M context, %.0f MiB at 128K\n",
      at_1m.device_total() / 1048576.0, at_128k.device_total() / 1048576.0);
  EXPECT_LE(at_1m.device_total(), int64_t{4} << 30);
  EXPECT_EQ(at_1m.step, at_128k.step);
}

#if MEGACTX_HAVE_CUDA
// The plan's bound of the fused indexer + top-k workspace covers the kernel's own.
TEST(CudaMemoryPlan, FusedIndexerWorkspaceBoundCoversTheKernel) {
  for (int64_t rows : {1, 7, 16, 1000, 16640})
    for (int ctas : {1, 132, 264})
      EXPECT_GE(cuda_fused_indexer_workspace_bytes(rows, ctas),
                static_cast<int64_t>(cuda::fused_indexer_topk_workspace_bytes(rows, ctas)))
          << rows << " rows, " << ctas << " CTAs";
}

// The plain-C++ device MoE part against the grouped kernels' own layout at
// the largest call they serve: float32 experts (bf16 tiles of 32 rows need
// no more) and fp8 experts (tiles of 32, the e4m3 copies).
TEST(CudaMemoryPlan, DeviceMoePartIsTheGroupedLayout) {
  std::vector<ModelConfig> configs = {config_named("glm5_2"), config_named("deepseek_v32"),
                                      fixture_config()};
  for (const ModelConfig& config : configs) {
    for (const int64_t rows : {1, 7, 24, 255, 256, 1000}) {
      cuda::GroupedMoeShape shape{std::min<int64_t>(rows, cuda::kGroupedMoeMaxRows),
                                  config.hidden_size, config.moe_intermediate_size,
                                  config.n_routed_experts, config.num_experts_per_tok};
      while (shape.rows > 0 && !cuda::grouped_moe_supported(shape)) --shape.rows;
      ASSERT_GT(shape.rows, 0) << config.model_type_name;
      const cuda::GroupedMoeLayout layout = cuda::grouped_moe_layout(shape);
      const int64_t want = 4 * (layout.plan_ints + layout.act_floats + layout.pair_out_floats);
      EXPECT_EQ(cuda_device_moe_scratch_bytes(config, rows), want)
          << config.model_type_name << " rows " << rows;
      shape.bf16 = true;
      const cuda::GroupedMoeLayout bf16 = cuda::grouped_moe_layout(shape);
      EXPECT_LE(4 * (bf16.plan_ints + bf16.act_floats + bf16.pair_out_floats), want);
      shape.bf16 = false;
      shape.fp8 = true;
      const cuda::GroupedMoeLayout fp8 = cuda::grouped_moe_layout(shape);
      EXPECT_EQ(cuda_device_moe_scratch_bytes(config, rows, /*fp8_experts=*/true),
                4 * (fp8.plan_ints + fp8.act_floats + fp8.pair_out_floats) +
                    static_cast<int64_t>(fp8.fp8_bytes))
          << config.model_type_name << " rows " << rows << " (fp8 experts)";
    }
  }
}
#endif

}  // namespace
}  // namespace megactx
