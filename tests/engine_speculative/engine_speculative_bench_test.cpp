// Measurements for docs/benchmarks.md ("MTP in the serving engine (CPU)"),
// not a test: disabled by default.
//   MEGACTX_THREADS=1 OPENBLAS_NUM_THREADS=1
//       build-spec/tests/engine_speculative/engine_speculative_bench_test
//       --gtest_also_run_disabled_tests
// Through the Engine (continuous batching, prefix cache on, bf16 KV as
// `megactx serve` defaults to) on models/default: B requests submitted
// together (B = 1 or 8), each a distinct 256-token cut of the passkey filler
// text, 64 new tokens, ignore_eos; k = 0 (no speculation), 1, 3, 7; T = 0
// and T = 1 (seeded). Reports the accepted length (tokens per verification,
// bonus included), decode tokens (all but each request's first) per
// wall-clock second and per second of process CPU time of the steps after
// the first (the machine is shared: single-threaded, the CPU-time figure is
// the stable one), and all tokens per second from submission on (the
// 256-token prefill included). Best of 3 interleaved repetitions.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include <fmt/format.h>

#include "spec_engine_util.h"

namespace megactx::testing {
namespace {

struct Measured {
  double accepted_length = 0;
  double decode_per_s = 0, decode_per_cpu_s = 0;  // tokens after the first, decode steps only
  double tokens_per_s = 0;                        // all tokens, prefill included
};

Measured measure(int64_t k, int64_t batch, double temperature) {
  const std::string dir = source_path("models/default");
  const std::vector<int32_t> text = default_text_tokens();
  SpecEngineOptions options;
  options.steps = k;
  options.pages = 128;
  options.kv_dtype = KvDType::BF16;
  SpecEngine spec(dir, options);
  const auto wall_start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < batch; ++i) {
    const auto offset = static_cast<std::ptrdiff_t>(300 + 700 * i);
    GenerationRequest request = make_request(
        std::to_string(i), std::vector<int32_t>(text.begin() + offset, text.begin() + offset + 256),
        64, temperature);
    request.sampling.seed = 1000 + static_cast<uint64_t>(i);
    spec.submit(std::move(request));
  }
  // Every prompt fits the prefill budget: the first step prefills them all
  // and samples each request's first token.
  spec.engine->step();
  const auto decode_start = std::chrono::steady_clock::now();
  const std::clock_t decode_cpu_start = std::clock();
  spec.run();
  const auto end = std::chrono::steady_clock::now();
  const std::clock_t cpu_end = std::clock();
  const double wall = std::chrono::duration<double>(end - wall_start).count();
  const double decode_wall = std::chrono::duration<double>(end - decode_start).count();
  const double decode_cpu = static_cast<double>(cpu_end - decode_cpu_start) / CLOCKS_PER_SEC;
  int64_t tokens = 0, verify = 0, accepted = 0;
  for (const auto& [rid, r] : spec.results) {
    tokens += static_cast<int64_t>(r.tokens.size());
    verify += r.verify_ct;
    accepted += r.accepted_tokens;
  }
  Measured m;
  m.accepted_length = verify ? 1.0 + static_cast<double>(accepted) / verify : 0.0;
  m.tokens_per_s = tokens / wall;
  m.decode_per_s = (tokens - batch) / decode_wall;
  m.decode_per_cpu_s = (tokens - batch) / decode_cpu;
  return m;
}

TEST(EngineSpeculativeBench, DISABLED_DefaultModel) {
  std::printf(
      "| T | batch | k | accepted length | decode tokens/s | decode tokens per CPU-s | "
      "tokens/s with prefill |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const double temperature : {0.0, 1.0}) {
    for (const int64_t batch : {1, 8}) {
      const int64_t ks[] = {0, 1, 3, 7};
      Measured best[4];
      for (int repeat = 0; repeat < 3; ++repeat) {
        for (size_t i = 0; i < std::size(ks); ++i) {
          const Measured m = measure(ks[i], batch, temperature);
          best[i].accepted_length = m.accepted_length;
          best[i].tokens_per_s = std::max(best[i].tokens_per_s, m.tokens_per_s);
          best[i].decode_per_s = std::max(best[i].decode_per_s, m.decode_per_s);
          best[i].decode_per_cpu_s = std::max(best[i].decode_per_cpu_s, m.decode_per_cpu_s);
        }
      }
      for (size_t i = 0; i < std::size(ks); ++i) {
        const std::string accepted =
            ks[i] == 0 ? std::string("-") : fmt::format("{:.2f}", best[i].accepted_length);
        std::printf("| %.0f | %ld | %ld | %s | %.1f | %.1f | %.1f |\n", temperature,
                    static_cast<long>(batch), static_cast<long>(ks[i]), accepted.c_str(),
                    best[i].decode_per_s, best[i].decode_per_cpu_s, best[i].tokens_per_s);
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace
}  // namespace megactx::testing
