// Measurements for docs/benchmarks.md (MTP section), not a test: disabled by default.
//   build-mtp/tests/mtp/mtp_bench_test --gtest_also_run_disabled_tests
// Accepted length (tokens emitted per target verification, bonus included)
// for k = 1, 3, 7 at temperature 0 and 1 on models/default, and batch-1 CPU
// tokens/s with and without MTP. Prompts: 8 cuts of 256 tokens of the
// passkey filler text, 64 new tokens each, ignore_eos.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include "mtp_test_util.h"

namespace megactx::testing {
namespace {

// Wall-clock tokens/s, and tokens per second of process CPU time: the machine
// is shared, so under contention the CPU-time figure (run with
// MEGACTX_THREADS=1) is the one that means something.
struct Result {
  double accepted_length = 0, tokens_per_s = 0, tokens_per_cpu_s = 0;
};

Result measure(LoadedModel& m, const std::vector<std::vector<int32_t>>& prompts, int64_t k,
               bool share, double temperature, VerifyMode mode) {
  int64_t tokens = 0, verifies = 0, accepted = 0;
  double seconds = 0, cpu_seconds = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SpeculativeOptions options;
    options.steps = k;
    options.share = share;
    options.sampled_mode = mode;
    options.num_pages = 16;
    SpeculativeDecoder decoder(*m.dsa, k ? m.mtp.get() : nullptr, options);
    SamplingParams params;
    params.temperature = temperature;
    params.max_new_tokens = 64;
    params.ignore_eos = true;
    params.seed = 1000 + i;
    const int64_t id = decoder.add(prompts[i], params);  // prefill not timed
    const auto start = std::chrono::steady_clock::now();
    const std::clock_t cpu_start = std::clock();
    decoder.run_to_completion();
    cpu_seconds += double(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    tokens += static_cast<int64_t>(decoder.output(id).size()) - 1;
    verifies += decoder.stats(id).verify_count;
    accepted += decoder.stats(id).accepted_tokens;
  }
  Result r;
  r.accepted_length = verifies ? 1.0 + double(accepted) / double(verifies) : 1.0;
  r.tokens_per_s = double(tokens) / seconds;
  r.tokens_per_cpu_s = double(tokens) / cpu_seconds;
  return r;
}

TEST(MtpBench, DISABLED_DefaultModel) {
  LoadedModel m = load_with_mtp(default_model_dir());
  const std::vector<int32_t> text = text_tokens();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    const auto begin = text.begin() + 700 * i;
    prompts.emplace_back(begin, begin + 256);
  }
  // Warm-up (first-touch of the model and cache pages, BLAS start-up).
  measure(m, {prompts[0]}, 0, true, 0.0, VerifyMode::RejectionSampling);
  measure(m, {prompts[0]}, 3, true, 0.0, VerifyMode::RejectionSampling);
  const Result plain = measure(m, prompts, 0, true, 0.0, VerifyMode::RejectionSampling);
  std::printf("| no MTP | - | T=0 | 1.00 | %.1f | %.1f |\n", plain.tokens_per_s,
              plain.tokens_per_cpu_s);
  const Result plain1 = measure(m, prompts, 0, true, 1.0, VerifyMode::RejectionSampling);
  std::printf("| no MTP | - | T=1 | 1.00 | %.1f | %.1f |\n", plain1.tokens_per_s,
              plain1.tokens_per_cpu_s);
  std::fflush(stdout);
  for (const int64_t k : {1, 3, 7}) {
    for (const double t : {0.0, 1.0}) {
      const Result r = measure(m, prompts, k, true, t, VerifyMode::RejectionSampling);
      std::printf("| k=%ld | shared | T=%.0f%s | %.2f | %.1f | %.1f |\n", k, t,
                  t > 0 ? " rejection sampling" : "", r.accepted_length, r.tokens_per_s,
                  r.tokens_per_cpu_s);
    }
    const Result target_only = measure(m, prompts, k, true, 1.0, VerifyMode::TargetOnly);
    std::printf("| k=%ld | shared | T=1 target-only | %.2f | %.1f | %.1f |\n", k,
                target_only.accepted_length, target_only.tokens_per_s,
                target_only.tokens_per_cpu_s);
    for (const double t : {0.0, 1.0}) {
      const Result r = measure(m, prompts, k, false, t, VerifyMode::RejectionSampling);
      std::printf("| k=%ld | unshared | T=%.0f%s | %.2f | %.1f | %.1f |\n", k, t,
                  t > 0 ? " rejection sampling" : "", r.accepted_length, r.tokens_per_s,
                  r.tokens_per_cpu_s);
    }
    std::fflush(stdout);
  }
}

// Batch-1 throughput only, interleaved and best of 3 per configuration, to
// damp the noise of a shared machine: greedy, IndexShare + KVShare.
TEST(MtpBench, DISABLED_Throughput) {
  LoadedModel m = load_with_mtp(default_model_dir());
  const std::vector<int32_t> text = text_tokens();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    const auto begin = text.begin() + 700 * i;
    prompts.emplace_back(begin, begin + 256);
  }
  measure(m, {prompts[0]}, 3, true, 0.0, VerifyMode::RejectionSampling);  // warm-up
  const int64_t ks[] = {0, 1, 3, 7};
  Result best[4];
  for (int rep = 0; rep < 3; ++rep) {
    for (int i = 0; i < 4; ++i) {
      const Result r = measure(m, prompts, ks[i], true, 0.0, VerifyMode::RejectionSampling);
      best[i].accepted_length = r.accepted_length;
      best[i].tokens_per_s = std::max(best[i].tokens_per_s, r.tokens_per_s);
      best[i].tokens_per_cpu_s = std::max(best[i].tokens_per_cpu_s, r.tokens_per_cpu_s);
    }
  }
  for (int i = 0; i < 4; ++i) {
    std::printf("| k=%ld | %.2f | %.1f | %.1f |\n", ks[i], best[i].accepted_length,
                best[i].tokens_per_s, best[i].tokens_per_cpu_s);
  }
}

}  // namespace
}  // namespace megactx::testing
