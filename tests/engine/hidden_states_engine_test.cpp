// return_hidden_states through the Engine on the CPU (models/default, its MTP
// layer for speculation): the final update carries the final-normed hidden
// state of every token but the last, equal to the model's own forward of the
// whole sequence followed by its final norm; the same with a prompt found in
// the prefix cache (such requests recompute it), with 16-token prefill chunks
// and with MTP speculation (rejected drafts' rows overwritten); asking without
// the switch is an error, and requests that do not ask get nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "cache/kv_cache.h"
#include "engine/engine_config.h"
#include "engine_harness.h"
#include "model/model_loader.h"

namespace megactx::testing {
namespace {

std::string default_model() {
  return std::string(MEGACTX_SOURCE_DIR) + "/models/default";
}

std::unique_ptr<Engine> make_engine(bool record, int64_t chunk = 4096, int64_t speculative = 0,
                                    int64_t hidden_bytes = int64_t{256} << 20) {
  auto model = load_language_model(default_model(), ModelLoadOptions{});
  EngineConfig config;
  config.run_thread = false;
  config.check_integrity_every_step = true;
  config.kv_dtype = KvDType::F32;
  config.kv_memory_bytes = int64_t{64} << 20;
  config.max_prefill_tokens = chunk;
  config.record_hidden_states = record;
  config.max_hidden_states_bytes = hidden_bytes;
  config.speculative_steps = speculative;
  config.model_dir = default_model();
  GenerationDefaults defaults =
      load_generation_defaults(default_model(), model->config().eos_token_ids);
  const int64_t vocab = model->config().vocab_size;
  return Engine::create(config, std::move(model), std::make_shared<FakeTokenizer>(vocab), defaults);
}

std::vector<int32_t> prompt_ids(int64_t length) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < length; ++i) ids.push_back(static_cast<int32_t>(100 + (i * 37) % 7000));
  return ids;
}

GenerationRequest asking(std::string rid, const std::vector<int32_t>& prompt) {
  GenerationRequest request = greedy_request(std::move(rid), prompt, 12, true);
  request.return_hidden_states = true;
  return request;
}

// The model's forward over `tokens` in one prefill, then its final norm.
std::vector<float> reference_hidden(const std::vector<int32_t>& tokens) {
  auto model = load_language_model(default_model(), ModelLoadOptions{});
  KvCacheSpec spec = make_kv_cache_spec(model->config(), 8, KvDType::F32, 64, false);
  auto cache = model->make_kv_cache(spec);
  std::vector<int32_t> pages(8);
  for (int32_t p = 0; p < 8; ++p) pages[p] = p;
  ForwardBatch batch;
  batch.want_hidden_states = true;
  batch.sequences.push_back({tokens, 0, pages, -1});
  const ForwardOutput output = model->forward(batch, *cache);
  const int64_t H = model->config().hidden_size;
  std::vector<float> out(tokens.size() * static_cast<size_t>(H));
  model->final_norm(output.hidden_states.data<float>(), static_cast<int64_t>(tokens.size()),
                    out.data());
  return out;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

TEST(EngineHiddenStates, EqualTheModelsFinalNormedForward) {
  const std::vector<int32_t> prompt = prompt_ids(150);  // two full pages + 22
  Harness harness(test_config(), nullptr, 32);
  harness.engine = make_engine(true);
  harness.submit(asking("cold", prompt));
  harness.submit(greedy_request("plain", prompt, 4, true));
  harness.run();
  harness.submit(asking("warm", prompt));  // its prompt's pages are in the prefix cache
  harness.run();
  const Collected& cold = harness.results["cold"];
  ASSERT_EQ(cold.finish, FinishReason::Length) << cold.finish_detail;
  const int64_t H = harness.engine->model_config().hidden_size;
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), cold.tokens.begin(), cold.tokens.end() - 1);
  ASSERT_EQ(cold.hidden_states.size(), tokens.size() * static_cast<size_t>(H));
  const double vs_forward = max_abs_difference(cold.hidden_states, reference_hidden(tokens));
  std::printf("hidden states vs one prefill of the sequence + final norm: max |diff| %.3g\n",
              vs_forward);
  EXPECT_LT(vs_forward, 1e-4);
  EXPECT_TRUE(harness.results["plain"].hidden_states.empty());
  // The warm request recomputed its prompt (alone; the cold one shared its
  // batch with "plain", so the GEMMs summed in another order).
  EXPECT_EQ(harness.results["warm"].cached_tokens, 0);
  EXPECT_LT(max_abs_difference(harness.results["warm"].hidden_states, cold.hidden_states), 1e-4);

  // 16-token prefill chunks, and MTP speculation (k = 3).
  for (const auto& [chunk, speculative] : {std::pair<int64_t, int64_t>{16, 0}, {4096, 3}}) {
    Harness other(test_config(), nullptr, 32);
    other.engine = make_engine(true, chunk, speculative);
    other.submit(asking("again", prompt));
    other.run();
    const Collected& again = other.results["again"];
    EXPECT_EQ(again.tokens, cold.tokens) << "chunk " << chunk << " k " << speculative;
    const double d = max_abs_difference(again.hidden_states, cold.hidden_states);
    std::printf("chunk %lld, k = %lld: max |diff| %.3g\n", static_cast<long long>(chunk),
                static_cast<long long>(speculative), d);
    EXPECT_LT(d, 1e-4) << "chunk " << chunk << " k " << speculative;
  }
}

TEST(EngineHiddenStates, AskingWithoutTheSwitchIsAnError) {
  Harness harness(test_config(), nullptr, 32);
  harness.engine = make_engine(false);
  harness.submit(asking("no", prompt_ids(10)));
  harness.run();
  EXPECT_EQ(harness.results["no"].finish, FinishReason::Error);
  EXPECT_NE(harness.results["no"].finish_detail.find("--enable-return-hidden-states"),
            std::string::npos);
  // More rows than a request may hold (here 1 MiB: 1024 rows of 256 floats):
  // an error naming the size.
  Harness big(test_config(), nullptr, 32);
  big.engine = make_engine(true, 4096, 0, int64_t{1} << 20);
  GenerationRequest request = asking("big", prompt_ids(10));
  request.sampling.max_new_tokens = 1024;
  big.submit(std::move(request));
  big.run();
  EXPECT_EQ(big.results["big"].finish, FinishReason::Error);
  EXPECT_NE(big.results["big"].finish_detail.find("MiB"), std::string::npos)
      << big.results["big"].finish_detail;
}

}  // namespace
}  // namespace megactx::testing
