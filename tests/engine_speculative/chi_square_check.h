// The chi-square check of sampled MTP speculation through the Engine
// (speculative_sampled_engine_test.cpp explains it), shared by the CPU test
// and tests/cuda_engine (device = CUDA).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "engine/cpu_sampler.h"
#include "spec_engine_util.h"

namespace megactx::testing {

// Regularized upper incomplete gamma Q(a, x) (series for x < a + 1, else
// Lentz's continued fraction): the chi-square p-value is Q(df / 2, chi2 / 2).
inline double upper_gamma_q(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_front = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && term > sum * 1e-16; ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - sum * std::exp(log_front);
  }
  constexpr double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(log_front) * h;
}

inline constexpr int64_t kNewTokens = 5;

inline SamplingParams top2_params(uint64_t seed) {
  SamplingParams params;
  params.temperature = 1.0;
  params.top_k = 2;
  params.max_new_tokens = kNewTokens;
  params.ignore_eos = true;
  params.seed = seed;
  return params;
}

// Exact target probabilities of every continuation of `prompt`, by
// enumerating the (at most 2) tokens each step can take.
inline void enumerate(LanguageModel& model, std::vector<int32_t> tokens, int64_t depth, double mass,
                      std::vector<int32_t>& path, std::map<std::vector<int32_t>, double>& out) {
  if (depth == kNewTokens) {
    out[path] += mass;
    return;
  }
  SequenceRunner runner(model, KvDType::F32, static_cast<int64_t>(tokens.size()) + 1);
  const Tensor logits = runner.feed(tokens, false);
  const std::span<const float> row(logits.data<float>(), static_cast<size_t>(logits.dim(1)));
  const std::vector<float> p = sampling_distribution(top2_params(0), row);
  for (size_t v = 0; v < p.size(); ++v) {
    if (p[v] <= 0.0f) continue;
    tokens.push_back(static_cast<int32_t>(v));
    path.push_back(static_cast<int32_t>(v));
    enumerate(model, tokens, depth + 1, mass * p[v], path, out);
    tokens.pop_back();
    path.pop_back();
  }
}

struct ChiSquare {
  double chi2 = 0.0;
  int64_t cells = 0;
  double p_value = 1.0;
};

// Pearson's chi-square of `observed` continuation counts against the exact
// distribution `expected` over `requests` samples, cells expected below 5
// pooled into one. Observed continuations outside `expected` are a failure.
inline ChiSquare chi_square(const std::map<std::vector<int32_t>, double>& expected,
                            std::map<std::vector<int32_t>, int64_t> observed, int64_t requests) {
  double chi2 = 0.0, pooled_expected = 0.0;
  int64_t pooled_observed = 0, cells = 0;
  for (const auto& [continuation, probability] : expected) {
    const double e = probability * static_cast<double>(requests);
    const int64_t o = observed.contains(continuation) ? observed.at(continuation) : 0;
    observed.erase(continuation);
    if (e < 5.0) {
      pooled_expected += e;
      pooled_observed += o;
      continue;
    }
    chi2 += (o - e) * (o - e) / e;
    ++cells;
  }
  EXPECT_TRUE(observed.empty()) << "continuations outside the expected support";
  if (pooled_expected >= 5.0) {
    chi2 +=
        (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++cells;
  }
  EXPECT_GE(cells, 16);  // most of the 32 continuations are likely enough
  return {chi2, cells, upper_gamma_q(static_cast<double>(cells - 1) / 2.0, chi2 / 2.0)};
}

// `device`: where the Engine (target, MTP layer, sampler) runs; the exact
// distribution always comes from the CPU model.
inline double p_value_of_engine_samples(VerifyMode mode, int64_t requests,
                                        Device device = Device::CPU) {
  const std::string dir = source_path("tests/fixtures/mtp/glm_schedule");
  SpecEngineOptions options;
  options.steps = 3;
  options.sampled_mode = mode;
  options.max_running_requests = 256;
  options.pages = 512;
  options.device = device;
  SpecEngine spec(dir, options);
  const std::vector<int32_t> prompt = hashed_prompt(42, 10, spec.vocab);

  auto model = load_language_model(dir, ModelLoadOptions{});
  std::map<std::vector<int32_t>, double> expected;
  std::vector<int32_t> path;
  enumerate(*model, prompt, 0, 1.0, path, expected);

  for (int64_t i = 0; i < requests; ++i) {
    GenerationRequest request = make_request("s" + std::to_string(i), prompt, kNewTokens);
    request.sampling = top2_params(static_cast<uint64_t>(i) * 7 + 1);
    spec.submit(std::move(request));
  }
  spec.run();
  std::map<std::vector<int32_t>, int64_t> observed;
  int64_t verifications = 0, rejections = 0, accepted = 0;
  for (const auto& [rid, r] : spec.results) {
    EXPECT_EQ(static_cast<int64_t>(r.tokens.size()), kNewTokens) << rid;
    ++observed[r.tokens];
    verifications += r.verify_ct;
    rejections += r.draft_tokens - r.accepted_tokens;
    accepted += r.accepted_tokens;
  }
  // The engine speculated; drafts were accepted and rejected (residual draws).
  EXPECT_GT(verifications, requests);
  EXPECT_GT(rejections, requests / 4);
  EXPECT_GT(accepted, requests / 20);

  const ChiSquare test = chi_square(expected, std::move(observed), requests);
  std::printf(
      "chi2 %.2f over %ld cells, p-value %.3g; %ld verifications, %ld drafts accepted, "
      "%ld rejected\n",
      test.chi2, static_cast<long>(test.cells), test.p_value, static_cast<long>(verifications),
      static_cast<long>(accepted), static_cast<long>(rejections));
  return test.p_value;
}

}  // namespace megactx::testing
