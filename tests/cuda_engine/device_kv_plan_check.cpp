// Host-only checks of the CUDA engine's start-up arithmetic: the device KV
// plan (engine/kv_capacity.h plan_device_kv) from a fraction of the device
// memory or an explicit KV budget, its Errors, and which sampling rows the
// device kernel may take (engine/cuda_sampler.h device_samples_row).
#include <gtest/gtest.h>

#include <string>
#include <unordered_map>

#include "core/error.h"
#include "engine/cuda_sampler.h"
#include "engine/kv_capacity.h"
#include "io/model_config.h"
#include "model/cuda_memory_plan.h"

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

  const KvCacheSpec spec = kv_cache_spec(config, KvDType::BF16, 64, false);
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
  const int64_t page = kv_cache_spec(config, KvDType::BF16, 64, false).bytes_per_page();
  request.kv_memory_bytes = 9 * page + page / 2;
  const DeviceKvPlan plan = plan_device_kv(config, engine, request);
  EXPECT_EQ(plan.memory.kv_pages, 9);
  EXPECT_EQ(plan.context, 200);
  // Three pages cannot hold one sequence of the full context.
  request.kv_memory_bytes = 3 * page;
  EXPECT_NE(error_of(config, engine, request).find("needs 4"), std::string::npos)
      << error_of(config, engine, request);
  request.kv_memory_bytes = 4 * page;
  EXPECT_EQ(plan_device_kv(config, engine, request).memory.kv_pages, 4);
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

TEST(DeviceKvPlan, KvSpecIsThePlannersSpec) {
  const ModelConfig config = fixture_config();
  for (const bool mtp : {false, true}) {
    if (mtp && config.num_nextn_predict_layers == 0) continue;
    const KvCacheSpec spec = kv_cache_spec(config, KvDType::FP8, 64, mtp);
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
