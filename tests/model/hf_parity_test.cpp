// The forward pass against Hugging Face transformers (tests/fixtures/hf/):
// prefill logits at every position within 1e-4 of max |HF|, and the greedy
// continuation decoded token by token through the cache equal to HF's.
#include <gtest/gtest.h>

#include "hf_fixture.h"

namespace megactx::testing {
namespace {

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, PrefillLogitsMatchHf) {
  const HfFixture f = load_fixture(GetParam());
  Session session(f.dir, KvDType::F32);
  const std::vector<float> logits = session.feed(f.input_ids);
  ASSERT_EQ(logits.size(), f.prefill_logits.size());
  const double error = relative_error(logits.data(), f.prefill_logits.data(), logits.size());
  EXPECT_LE(error, 1e-4) << GetParam();
}

TEST_P(HfParity, GreedyContinuationMatchesHf) {
  const HfFixture f = load_fixture(GetParam());
  Session session(f.dir, KvDType::F32);
  std::vector<float> logits = session.feed(f.input_ids);
  const int64_t v = f.vocab;
  std::vector<float> last(logits.end() - v, logits.end());
  std::vector<int32_t> greedy;
  for (size_t step = 0; step < f.greedy_ids.size(); ++step) {
    // HF's decode logits at this step (before feeding greedy[step]).
    EXPECT_LE(relative_error(last.data(), f.decode_logits.data() + step * v, v), 1e-4)
        << GetParam() << " step " << step;
    const int32_t next = argmax(last.data(), v);
    greedy.push_back(next);
    last = session.feed({next});
  }
  EXPECT_EQ(greedy, f.greedy_ids) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity,
                         ::testing::Values("glm_schedule", "glm_pattern", "dsv32_yarn", "glm_bf16",
                                           "glm_fp8"));

}  // namespace
}  // namespace megactx::testing
