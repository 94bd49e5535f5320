// Requests over the HF fixtures for the engine tests of the KV tiers: prompts
// cut from a fixture's own prompt stream, greedy with logprobs, and the
// comparison of two runs' results.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../model/hf_fixture.h"
#include "engine_harness.h"

namespace megactx::testing {

inline std::vector<int32_t> fixture_prompt(const std::string& dir) {
  std::ifstream file(dir + "/reference.json");
  return nlohmann::json::parse(file)["input_ids"].get<std::vector<int32_t>>();
}

// `length` prompt tokens cut from the fixture's prompt stream, rotated by `seed`.
inline std::vector<int32_t> prompt_of(const std::vector<int32_t>& stream, int64_t length,
                                      int64_t seed) {
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < length; ++i) {
    prompt.push_back(stream[static_cast<size_t>((i * 7 + seed * 13) % stream.size())] ^
                     static_cast<int32_t>(seed & 7));
  }
  return prompt;
}

// Greedy, ignore_eos, with the sampled tokens' logprobs and two alternatives.
inline GenerationRequest scored(std::string rid, std::vector<int32_t> prompt, int64_t new_tokens) {
  GenerationRequest request = greedy_request(std::move(rid), std::move(prompt), new_tokens, true);
  request.return_logprob = true;
  request.top_logprobs_num = 2;
  return request;
}

using Results = std::map<std::string, Collected>;

// Same finish, tokens and logprobs per request: bit for bit at tolerance 0.
inline void expect_same(const Results& got, const Results& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [rid, expected] : want) {
    const Collected& actual = got.at(rid);
    EXPECT_EQ(actual.finish, expected.finish) << rid;
    EXPECT_EQ(actual.tokens, expected.tokens) << rid;
    ASSERT_EQ(actual.logprobs.size(), expected.logprobs.size()) << rid;
    for (size_t i = 0; i < expected.logprobs.size(); ++i) {
      if (tolerance == 0) {
        EXPECT_EQ(actual.logprobs[i].logprob, expected.logprobs[i].logprob) << rid << " " << i;
      } else {
        EXPECT_NEAR(actual.logprobs[i].logprob, expected.logprobs[i].logprob, tolerance)
            << rid << " " << i;
      }
    }
  }
}

}  // namespace megactx::testing
