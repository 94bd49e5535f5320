// The CUDA model's memory plan (model/cuda_memory_plan.h), host only: what is
// planned fits the budget and one more page would not, the indexer scores
// grow with tokens x context, and models that do not fit are clear Errors.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "io/model_config.h"
#include "model/cuda_memory_plan.h"
#include "model/model_loader.h"

namespace megactx {
namespace {

ModelConfig fixture_config() {
  return load_model_config(std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/hf/glm_bf16");
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
  // Nonsense requests.
  CudaMemoryRequest zero = request_for(config, 0);
  EXPECT_THROW(plan_cuda_memory(config, zero), Error);
}

}  // namespace
}  // namespace megactx
