// Host-only checks of the CUDA engine's start-up arithmetic: the device KV
// plan (engine/kv_capacity.h plan_device_kv) from a fraction of the device
// memory or an explicit KV budget, its Errors, the scratch of the model's
// options (fast attention, device MoE, CUDA-graph buckets) in it, and which
// sampling rows the device kernel may take (engine/cuda_sampler.h
// device_samples_row).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "engine/cuda_sampler.h"
#include "engine/kv_capacity.h"
#include "io/model_config.h"
#include "model/cuda/fast_attention_plan.h"
#include "model/cuda/memory_plan.h"
#include "model/model_loader.h"

namespace megactx {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

ModelConfig fixture_config() {
  return load_model_config(std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/hf/glm_bf16");
}

EngineConfig engine_config() {
  EngineConfig engine;
  engine.kv_dtype = KvDType::BF16;
  engine.max_prefill_tokens = 128;
  engine.max_running_requests = 8;
  return engine;
}

DeviceKvRequest device_request(int64_t total, int64_t free, int64_t model) {
  DeviceKvRequest request;
  request.memory = {free, total};
  request.model_bytes = model;
  // The step scratch alone (the options' parts are checked from
  // ModelOptionsScratchIsPlannedAndNamed on).
  request.options.fast_attention = false;
  request.options.device_moe = false;
  request.options.cuda_graphs = false;
  return request;
}

std::string error_of(const ModelConfig& config, const EngineConfig& engine,
                     const DeviceKvRequest& request) {
  try {
    plan_device_kv(config, engine, request);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(DeviceKvPlan, FractionOfTotalMinusModelScratchAndReserve) {
  const ModelConfig config = fixture_config();
  const EngineConfig engine = engine_config();
  DeviceKvRequest request = device_request(1024 * kMiB, 1000 * kMiB, 10 * kMiB);
  request.gpu_memory_utilization = 0.5;
  const DeviceKvPlan plan = plan_device_kv(config, engine, request);

  const KvCacheSpec spec = make_kv_cache_spec(config, 0, KvDType::BF16, 64, false);
  const int64_t tokens = 128 + 8;  // prefill budget + one decode token per request
  const int64_t context = config.max_position_embeddings;
  const int64_t scratch =
      cuda_step_scratch_bytes(config, tokens, context, tokens, config.index_topk);
  const int64_t reserve = device_reserve_bytes(spec);
  const int64_t pools =
      static_cast<int64_t>(spec.latent_layers.size() + spec.indexer_layers.size());
  EXPECT_EQ(reserve, 256 * kMiB + pools * 2 * kMiB);
  EXPECT_EQ(plan.max_step_tokens, tokens);
  EXPECT_EQ(plan.context, context);
  EXPECT_EQ(plan.memory.scratch_bytes, scratch);
  EXPECT_EQ(plan.memory.kv_bytes_per_page, spec.bytes_per_page());
  EXPECT_EQ(plan.memory.kv_pages,
            (512 * kMiB - reserve - 10 * kMiB - scratch) / spec.bytes_per_page());
  EXPECT_LE(plan.budget_bytes, 512 * kMiB);
  EXPECT_GT(plan.budget_bytes + plan.memory.kv_bytes_per_page, 512 * kMiB);
  // The engine's own planner turns the plan's KV bytes into the same pages.
  const KvCapacityPlan capacity =
      plan_kv_capacity(config, KvDType::BF16, plan.kv_bytes(), 64, false);
  EXPECT_EQ(capacity.spec.num_pages, plan.memory.kv_pages);
  EXPECT_NE(plan.summary().find(std::to_string(plan.memory.kv_pages) + " pages"),
            std::string::npos);
}

TEST(DeviceKvPlan, ExplicitKvBudgetGivesExactlyItsPages) {
  const ModelConfig config = fixture_config();
  EngineConfig engine = engine_config();
  engine.context_length = 200;  // 4 pages of 64
  DeviceKvRequest request = device_request(1024 * kMiB, 1000 * kMiB, 10 * kMiB);
  const int64_t page = make_kv_cache_spec(config, 0, KvDType::BF16, 64, false).bytes_per_page();
  request.kv_memory_bytes = 9 * page + page / 2;
  const DeviceKvPlan plan = plan_device_kv(config, engine, request);
  EXPECT_EQ(plan.memory.kv_pages, 9);
  EXPECT_EQ(plan.context, 200);
  // Three pages cannot hold one sequence of the full context.
  request.kv_memory_bytes = 3 * page;
  EXPECT_NE(error_of(config, engine, request).find("needs 4"), std::string::npos)
      << error_of(config, engine, request);
  // ... and says what would fit it.
  EXPECT_NE(error_of(config, engine, request).find("lower --context-length"), std::string::npos)
      << error_of(config, engine, request);
  request.kv_memory_bytes = 4 * page;
  EXPECT_EQ(plan_device_kv(config, engine, request).memory.kv_pages, 4);
}

TEST(DeviceKvPlan, TheModelsDefaultContextShrinksToWhatTheKvHolds) {
  const ModelConfig config = fixture_config();  // max_position_embeddings 256: 4 pages of 64
  EngineConfig engine = engine_config();
  DeviceKvRequest request = device_request(1024 * kMiB, 1000 * kMiB, 10 * kMiB);
  const int64_t page = make_kv_cache_spec(config, 0, KvDType::BF16, 64, false).bytes_per_page();
  // Room for 2.5 pages: no --context-length, so the context becomes the 2
  // pages' 128 tokens.
  request.kv_memory_bytes = 2 * page + page / 2;
  DeviceKvPlan plan = plan_device_kv(config, engine, request);
  EXPECT_TRUE(plan.context_fitted);
  EXPECT_EQ(plan.context, 128);
  EXPECT_EQ(plan.memory.kv_pages, 2);
  EXPECT_NE(plan.summary().find("context 128"), std::string::npos) << plan.summary();
  // Room for the whole context: the model's.
  request.kv_memory_bytes = 5 * page;
  plan = plan_device_kv(config, engine, request);
  EXPECT_FALSE(plan.context_fitted);
  EXPECT_EQ(plan.context, config.max_position_embeddings);
  // The same room with the context asked for explicitly: an error, as before.
  engine.context_length = config.max_position_embeddings;
  request.kv_memory_bytes = 2 * page + page / 2;
  EXPECT_NE(error_of(config, engine, request).find("needs 4"), std::string::npos)
      << error_of(config, engine, request);
}

TEST(DeviceKvPlan, WhatDoesNotFitIsAnErrorNamingTheNumbers) {
  const ModelConfig config = fixture_config();
  const EngineConfig engine = engine_config();
  // The model alone exceeds the fraction.
  DeviceKvRequest request = device_request(1024 * kMiB, 1000 * kMiB, 900 * kMiB);
  request.gpu_memory_utilization = 0.5;
  EXPECT_NE(error_of(config, engine, request).find("does not fit"), std::string::npos)
      << error_of(config, engine, request);
  // Other processes hold most of the device: the fraction's plan is not free.
  request = device_request(1024 * kMiB, 300 * kMiB, 10 * kMiB);
  request.gpu_memory_utilization = 0.9;
  EXPECT_NE(error_of(config, engine, request).find("MiB free"), std::string::npos)
      << error_of(config, engine, request);
  // A fraction smaller than the reserve.
  request = device_request(1024 * kMiB, 1000 * kMiB, 10 * kMiB);
  request.gpu_memory_utilization = 0.1;
  EXPECT_NE(error_of(config, engine, request).find("reserve"), std::string::npos)
      << error_of(config, engine, request);
  // Out-of-range options.
  for (const double fraction : {0.0, -0.5, 1.5}) {
    request.gpu_memory_utilization = fraction;
    EXPECT_NE(error_of(config, engine, request).find("--gpu-memory-utilization"),
              std::string::npos);
  }
  request.gpu_memory_utilization = 0.9;
  request.kv_memory_bytes = -1;
  EXPECT_FALSE(error_of(config, engine, request).empty());
  // A long context's indexer scores make the step scratch too large.
  request.kv_memory_bytes = 0;
  EngineConfig long_context = engine;
  long_context.context_length = 1 << 20;
  long_context.max_prefill_tokens = 8192;
  EXPECT_NE(error_of(config, long_context, request).find("step scratch"), std::string::npos)
      << error_of(config, long_context, request);
}

ModelConfig config_named(const std::string& name) {
  std::ifstream file(std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/configs/" + name + ".json");
  std::stringstream text;
  text << file.rdbuf();
  return parse_model_config(text.str());
}

// The fixture's plan with the CUDA model's default options: the device MoE
// and the graph bucket of the 8 running requests are planned, the cuBLAS
// workspace is not counted twice (the load's measurement holds it), and the
// log line names every part.
TEST(DeviceKvPlan, ModelOptionsScratchIsPlannedAndNamed) {
  const ModelConfig config = fixture_config();
  const EngineConfig engine = engine_config();
  DeviceKvRequest request = device_request(1024 * kMiB, 1000 * kMiB, 10 * kMiB);
  request.options = CudaScratchOptions{};
  request.gpu_memory_utilization = 0.5;
  const DeviceKvPlan plan = plan_device_kv(config, engine, request);
  const CudaScratchBreakdown& parts = plan.memory.scratch;
  const int64_t tokens = 128 + 8;
  const int64_t context = config.max_position_embeddings;
  EXPECT_EQ(parts.graph_rows, 8);  // 8 running requests: the bucket of 8
  EXPECT_EQ(parts.graph_context, 256);
  EXPECT_EQ(parts.step,
            cuda_step_scratch_bytes(config, tokens, context, tokens, config.index_topk));
  EXPECT_EQ(parts.device_moe, cuda_device_moe_scratch_bytes(config, tokens));
  EXPECT_GT(parts.device_moe, 0);
  EXPECT_EQ(parts.fast_attention, 0);  // the fixture's shapes are not the fast path's
  EXPECT_GT(parts.graph_inputs, 0);
  EXPECT_EQ(parts.cublas_workspace, 0);
  EXPECT_EQ(plan.memory.scratch_bytes, parts.device_total());
  const KvCacheSpec spec = make_kv_cache_spec(config, 0, KvDType::BF16, 64, false);
  EXPECT_EQ(
      plan.memory.kv_pages,
      (512 * kMiB - plan.reserve_bytes - 10 * kMiB - parts.device_total()) / spec.bytes_per_page());
  const std::string summary = plan.summary();
  std::printf("%s\n", summary.c_str());
  for (const char* part :
       {"device MoE", "graph inputs", "pinned host", "cuBLAS workspace", "fallback kernels"}) {
    EXPECT_NE(summary.find(part), std::string::npos) << part << " missing in: " << summary;
  }
  // Speculative decoding verifies 1 + k tokens per sequence in a graph.
  ModelConfig with_mtp = config;
  with_mtp.num_nextn_predict_layers = 1;
  EngineConfig speculative = engine;
  speculative.speculative_steps = 3;
  EXPECT_EQ(plan_device_kv(with_mtp, speculative, request).memory.scratch.graph_rows, 32);
  // The gathered MoE dispatch over 8 ranks (data-parallel attention): its
  // graph steps' grouped calls take every rank's rows, and its buffers count.
  DeviceKvRequest gathered = request;
  gathered.options.gathered_dispatch_ranks = 8;
  const DeviceKvPlan over_ranks = plan_device_kv(config, engine, gathered);
  EXPECT_EQ(over_ranks.memory.scratch.device_moe,
            std::max(cuda_device_moe_scratch_bytes(config, tokens),
                     cuda_device_moe_scratch_bytes(config, 8 * 8)) +
                cuda_gathered_dispatch_bytes(config));
  EXPECT_GT(cuda_gathered_dispatch_bytes(config), 0);
  EXPECT_GT(cuda_gathered_dispatch_bytes(config, /*pair_outputs=*/true),
            cuda_gathered_dispatch_bytes(config));
  EXPECT_LT(over_ranks.memory.kv_pages, plan.memory.kv_pages);
  // --no-cuda-graphs / --cuda-host-moe: no bucket, no grouped MoE workspace.
  request.options.cuda_graphs = false;
  EXPECT_EQ(plan_device_kv(config, engine, request).memory.scratch.graph_rows, 0);
  request.options.cuda_graphs = true;
  request.options.device_moe = false;
  const DeviceKvPlan host_moe = plan_device_kv(config, engine, request);
  EXPECT_EQ(host_moe.memory.scratch.device_moe, 0);
  EXPECT_EQ(host_moe.memory.scratch.graph_rows, 0);  // MoE layers are not capturable
  EXPECT_GT(host_moe.memory.kv_pages, plan.memory.kv_pages);
}

// GLM-5.2's shapes with an FP8 cache: the fast attention path's scratch is
// planned (and not with --cuda-fallback-attention), and what the device has
// free decides whether it fits.
TEST(DeviceKvPlan, FastAttentionScratchDecidesFit) {
  const ModelConfig config = config_named("glm5_2");
  EngineConfig engine;
  engine.kv_dtype = KvDType::FP8;
  engine.max_prefill_tokens = 1024;
  engine.max_running_requests = 64;
  engine.context_length = 4096;
  const int64_t page = make_kv_cache_spec(config, 0, KvDType::FP8, 64, false).bytes_per_page();
  DeviceKvRequest request = device_request(int64_t{140} << 30, int64_t{100} << 30, 1 << 30);
  request.options = CudaScratchOptions{};  // the CUDA model's defaults
  request.kv_memory_bytes = 64 * page;     // one 4096-token sequence
  const DeviceKvPlan fast = plan_device_kv(config, engine, request);
  EXPECT_EQ(fast.memory.scratch.fast_attention,
            cuda_fast_attention_scratch_bytes(config, 1024 + 64, 4096, config.index_topk, 132));
  EXPECT_EQ(fast.memory.scratch.graph_rows, 64);
  EXPECT_EQ(fast.memory.kv_pages, 64);
  request.options.fast_attention = false;
  const DeviceKvPlan fallback = plan_device_kv(config, engine, request);
  EXPECT_EQ(fallback.memory.scratch.fast_attention, 0);
  EXPECT_EQ(fallback.memory.scratch_bytes + fast.memory.scratch.fast_attention,
            fast.memory.scratch_bytes);
  // Exactly what the fallback plan needs is free: it fits, the fast plan not.
  request.memory.free_bytes =
      fallback.memory.scratch_bytes + fallback.reserve_bytes + fallback.kv_bytes();
  EXPECT_EQ(plan_device_kv(config, engine, request).memory.kv_pages, 64);
  request.options.fast_attention = true;
  EXPECT_NE(error_of(config, engine, request).find("MiB free"), std::string::npos)
      << error_of(config, engine, request);
}

TEST(DeviceKvPlan, KvSpecIsThePlannersSpec) {
  const ModelConfig config = fixture_config();
  for (const bool mtp : {false, true}) {
    if (mtp && config.num_nextn_predict_layers == 0) continue;
    const KvCacheSpec spec = make_kv_cache_spec(config, 0, KvDType::FP8, 64, mtp);
    const KvCapacityPlan plan = plan_kv_capacity(config, KvDType::FP8, 100 * kMiB, 64, mtp);
    EXPECT_EQ(spec.latent_layers, plan.spec.latent_layers);
    EXPECT_EQ(spec.indexer_layers, plan.spec.indexer_layers);
    EXPECT_EQ(spec.bytes_per_page(), plan.bytes_per_page);
    EXPECT_EQ(spec.num_pages, 0);
  }
}

TEST(DeviceSamplesRow, OnlyRowsTheKernelDoesExactly) {
  SamplingParams params;
  SamplingRow row;
  row.params = &params;
  const int64_t vocab = 1000;
  EXPECT_TRUE(device_samples_row(row, vocab));
  row.top_logprobs = kDeviceMaxTopLogprobs;
  EXPECT_TRUE(device_samples_row(row, vocab));
  row.top_logprobs = kDeviceMaxTopLogprobs + 1;
  EXPECT_FALSE(device_samples_row(row, vocab));
  row.top_logprobs = 10;
  EXPECT_FALSE(device_samples_row(row, 8));  // more alternatives than the vocabulary
  row.top_logprobs = 0;

  // Penalties count only when they would change a logit.
  std::unordered_map<int32_t, int32_t> none, some = {{4, 2}};
  const std::vector<int32_t> prompt = {1, 2, 3};
  params.frequency_penalty = 0.5;
  EXPECT_TRUE(device_samples_row(row, vocab));
  row.output_counts = &none;
  EXPECT_TRUE(device_samples_row(row, vocab));
  row.output_counts = &some;
  EXPECT_FALSE(device_samples_row(row, vocab));
  params.frequency_penalty = 0.0;
  params.presence_penalty = -0.3;
  EXPECT_FALSE(device_samples_row(row, vocab));
  params.presence_penalty = 0.0;
  EXPECT_TRUE(device_samples_row(row, vocab));
  params.repetition_penalty = 1.1;
  EXPECT_FALSE(device_samples_row(row, vocab));  // output counts
  row.output_counts = nullptr;
  EXPECT_TRUE(device_samples_row(row, vocab));
  row.prompt_tokens = prompt;
  EXPECT_FALSE(device_samples_row(row, vocab));  // prompt tokens
  params.repetition_penalty = 1.0;
  EXPECT_TRUE(device_samples_row(row, vocab));

  // The min_new_tokens mask.
  const std::vector<int32_t> masked = {7};
  row.masked_tokens = masked;
  EXPECT_FALSE(device_samples_row(row, vocab));
  row.masked_tokens = {};

  // top_p just below 1 would read as 1.0f (off) on the device.
  params.top_p = 1.0 - 1e-12;
  EXPECT_FALSE(device_samples_row(row, vocab));
  params.top_p = 0.95;
  EXPECT_TRUE(device_samples_row(row, vocab));
  params.min_p = 1e-60;  // 0.0f on the device
  EXPECT_FALSE(device_samples_row(row, vocab));
}

}  // namespace
}  // namespace megactx
