// The MTP layer's draft logits against the PyTorch reference
// (tools/mtp_reference/mtp_reference.py, tests/fixtures/mtp/<name>): step 0
// at every row (row by row and as one batched run), the step-0 top-k, and
// chained draft steps with IndexShare + KVShare and without sharing; for a
// GLM fixture (shared embedding/head, normed hand-off) and a DeepSeek-V3.2
// fixture (own embedding/head copies, raw hand-off, YaRN, half-split indexer
// RoPE). Then greedy speculative decoding on those checkpoints equals greedy
// decoding without speculation.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "mtp_golden_check.h"
#include "mtp_test_util.h"

namespace megactx::testing {
namespace {

class MtpGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpGolden, DraftLogitsMatchReference) {
  const std::string dir = mtp_fixture(GetParam());
  LoadedModel m = load_with_mtp(dir);
  check_mtp_goldens(dir, *m.mtp, [&] {
    return std::make_unique<PagedKvCache>(
        make_mtp_kv_cache_spec(m.dsa->config(), 4, KvDType::F32, 64));
  });
}

TEST_P(MtpGolden, GreedySpeculativeEqualsPlain) {
  LoadedModel m = load_with_mtp(mtp_fixture(GetParam()));
  const int64_t vocab = m.dsa->config().vocab_size;
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> expected;
  const int64_t lengths[] = {1, 3, 9, 20, 37, 50};
  for (const int64_t length : lengths) {
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < length; ++i) prompt.push_back(static_cast<int32_t>(rng() % vocab));
    prompts.push_back(prompt);
    expected.push_back(plain_greedy(*m.model, prompt, 16));
  }
  for (const int64_t k : {1, 3, 7}) {
    for (const bool share : {true, false}) {
      SpeculativeOptions options;
      options.steps = k;
      options.share = share;
      options.num_pages = 16;
      SpeculativeDecoder decoder(*m.dsa, m.mtp.get(), options);
      SamplingParams params;
      params.temperature = 0.0;
      params.max_new_tokens = 16;
      params.ignore_eos = true;
      std::vector<int64_t> ids;
      for (const auto& p : prompts) ids.push_back(decoder.add(p, params));
      while (decoder.step()) decoder.check_integrity();
      for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(decoder.output(ids[i]), expected[i])
            << "prompt " << i << " k=" << k << " share=" << share;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpGolden, ::testing::Values("glm_schedule", "dsv32_yarn"));

}  // namespace
}  // namespace megactx::testing
