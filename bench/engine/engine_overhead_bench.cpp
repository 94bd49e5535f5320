// Host overhead of one engine step at batch 1..256: every
// request decodes one token per step through a NullModel and a NullSampler,
// so the time is scheduling + batch building + output processing
// (detokenization, stop-string checks, update callbacks, prefix-cache
// insertion every 64 tokens, integrity checks off). Sampling math and the
// forward pass are excluded by construction.
//
//   build/bench/engine/engine_overhead_bench [--steps N] [--stop] [--logprobs]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "null_model.h"

using namespace megactx;

namespace {

struct Result {
  double us_per_step = 0;
  double us_per_token = 0;
};

Result measure(int64_t batch, int64_t steps, bool with_stop_strings, bool with_logprobs) {
  const int64_t vocab = 1024;
  const int64_t prompt_len = 64;
  const int64_t warmup = 8;
  const int64_t max_new = warmup + steps + 8;
  EngineConfig config;
  config.run_thread = false;
  config.max_running_requests = batch;
  config.max_prefill_tokens = batch * prompt_len;
  const int64_t pages_per_request = (prompt_len + max_new + 63) / 64 + 1;
  auto model = std::make_unique<bench::NullModel>(vocab, batch * prompt_len);
  // bytes per page of the null config: 64 * (2 latent x 32 bf16 + 1 indexer x 16 bf16)
  config.kv_memory_bytes = batch * pages_per_request * 64 * (2 * 32 * 2 + 16 * 2);
  GenerationDefaults defaults;
  defaults.eos_token_ids = {static_cast<int32_t>(vocab - 1)};
  auto engine = Engine::create(config, std::move(model),
                               std::make_shared<bench::LetterTokenizer>(vocab), defaults);
  engine->set_sampler(std::make_unique<bench::NullSampler>());
  int64_t delivered = 0;
  for (int64_t i = 0; i < batch; ++i) {
    GenerationRequest request;
    request.rid = "r" + std::to_string(i);
    for (int64_t t = 0; t < prompt_len; ++t) {
      request.input_ids.push_back(static_cast<int32_t>((i * 131 + t * 7) % (vocab - 1)));
    }
    request.sampling.temperature = 0.0;
    request.sampling.max_new_tokens = max_new;
    request.sampling.ignore_eos = true;
    request.sampling.seed = static_cast<uint64_t>(i);
    if (with_stop_strings) request.sampling.stop = {"</stop>", "zzzz"};
    request.return_logprob = with_logprobs;
    engine->submit(std::move(request), [&delivered](const RequestUpdate& update) {
      delivered += static_cast<int64_t>(update.new_token_ids.size());
    });
  }
  for (int64_t i = 0; i < warmup; ++i) engine->step();
  const int64_t before = delivered;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) engine->step();
  const auto end = std::chrono::steady_clock::now();
  const double us = std::chrono::duration<double, std::micro>(end - start).count();
  const int64_t tokens = delivered - before;
  if (tokens != batch * steps) {
    std::fprintf(stderr, "batch %lld: expected %lld tokens, got %lld\n",
                 static_cast<long long>(batch), static_cast<long long>(batch * steps),
                 static_cast<long long>(tokens));
  }
  engine->abort_all();
  engine->run_until_idle();
  return Result{us / static_cast<double>(steps), us / static_cast<double>(tokens)};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 2000;
  bool stop = false;
  bool logprobs = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = std::stoll(argv[++i]);
    if (std::strcmp(argv[i], "--stop") == 0) stop = true;
    if (std::strcmp(argv[i], "--logprobs") == 0) logprobs = true;
  }
  spdlog::set_level(spdlog::level::warn);
  std::printf("engine host overhead per decode step (null model, null sampler%s%s), %lld steps\n",
              stop ? ", 2 stop strings" : "", logprobs ? ", logprobs" : "",
              static_cast<long long>(steps));
  // The machine is shared: each point is the best and the median of 5 runs.
  std::printf("%6s %14s %14s %16s\n", "batch", "us/step best", "us/step median", "us/request best");
  for (const int64_t batch : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
    std::vector<Result> runs;
    for (int run = 0; run < 5; ++run) runs.push_back(measure(batch, steps, stop, logprobs));
    std::sort(runs.begin(), runs.end(),
              [](const Result& a, const Result& b) { return a.us_per_step < b.us_per_step; });
    std::printf("%6lld %14.2f %14.2f %16.3f\n", static_cast<long long>(batch), runs[0].us_per_step,
                runs[2].us_per_step, runs[0].us_per_token);
  }
  return 0;
}
