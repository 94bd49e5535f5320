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

#include "mtp_test_util.h"

namespace megactx::testing {
namespace {

std::string mtp_fixture(const std::string& name) {
  return std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/mtp/" + name;
}

std::vector<float> read_floats(const std::string& path, size_t count) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << path;
  std::vector<float> values(count);
  file.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * 4));
  EXPECT_EQ(file.gcount(), static_cast<std::streamsize>(count * 4)) << path;
  return values;
}

void expect_close(const float* got, const float* want, int64_t n, const std::string& what) {
  double scale = 0.0, worst = 0.0;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, double(std::fabs(want[i])));
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, double(std::fabs(got[i] - want[i])));
  EXPECT_LT(worst, 1e-4 * scale + 1e-5)
      << what << ": max |megactx - reference| = " << worst << " (max |reference| " << scale << ")";
}

class MtpGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpGolden, DraftLogitsMatchReference) {
  const std::string dir = mtp_fixture(GetParam());
  const nlohmann::json golden = nlohmann::json::parse(std::ifstream(dir + "/golden.json"));
  const auto ids = golden["ids"].get<std::vector<int32_t>>();
  const auto drafts = golden["drafts"].get<std::vector<int32_t>>();
  const int64_t T = golden["rows"], S = golden["steps"], H = golden["hidden_size"],
                V = golden["vocab_size"];
  const auto hidden = read_floats(dir + "/hidden.f32", T * H);
  const auto step0 = read_floats(dir + "/step0_logits.f32", T * V);
  const auto shared = read_floats(dir + "/shared_logits.f32", S * V);
  const auto unshared = read_floats(dir + "/unshared_logits.f32", S * V);

  LoadedModel m = load_with_mtp(dir);
  EXPECT_EQ(m.mtp->hand_off(),
            golden["hand_off"] == "normed" ? MtpHandOff::NormedOutput : MtpHandOff::RawOutput);
  // Pages out of order so the page table matters.
  const std::vector<int32_t> pages{3, 1};
  auto fresh_cache = [&] {
    return std::make_unique<PagedKvCache>(
        make_mtp_kv_cache_spec(m.dsa->config(), 4, KvDType::F32, 64));
  };

  // Step 0 row by row (chunked prefill of the MTP cache).
  auto step0_rows = [&](PagedKvCache& cache) {
    MtpLayer::Output last;
    for (int64_t t = 0; t < T; ++t) {
      MtpLayer::Rows r;
      r.start = t;
      r.count = 1;
      r.pages = pages;
      r.next_tokens = std::span<const int32_t>(&ids[t + 1], 1);
      r.hidden = hidden.data() + t * H;
      const std::vector<MtpLayer::Rows> rows{r};
      last = m.mtp->run(rows, cache);
      expect_close(last.logits.data<float>(), step0.data() + t * V, V,
                   "step 0 row " + std::to_string(t));
    }
    return last;
  };
  auto cache = fresh_cache();
  const MtpLayer::Output last = step0_rows(*cache);
  EXPECT_EQ(std::vector<int32_t>(last.last_topk[0].begin(),
                                 last.last_topk[0].begin() + last.last_count[0]),
            golden["step0_topk_last_row"].get<std::vector<int32_t>>());

  // Step 0 as one batched run over all rows: the last row is the same.
  {
    auto batched = fresh_cache();
    MtpLayer::Rows r;
    r.count = T;
    r.pages = pages;
    r.next_tokens = std::span<const int32_t>(ids.data() + 1, T);
    r.hidden = hidden.data();
    const std::vector<MtpLayer::Rows> rows{r};
    const MtpLayer::Output out = m.mtp->run(rows, *batched);
    expect_close(out.logits.data<float>(), step0.data() + (T - 1) * V, V, "batched step 0");
  }

  // Chained steps with IndexShare + KVShare: nothing written, step 0's top-k.
  auto chain = [&](PagedKvCache& c, bool share, const std::vector<float>& expected) {
    std::vector<float> hand(last.hand_off.data<float>(), last.hand_off.data<float>() + H);
    for (int64_t j = 1; j <= S; ++j) {
      MtpLayer::Rows r;
      r.start = T - 1 + j;
      r.count = 1;
      r.pages = pages;
      r.next_tokens = std::span<const int32_t>(&drafts[j - 1], 1);
      r.hidden = hand.data();
      r.target_hidden = false;
      r.shared = share;
      r.shared_context = T;
      r.shared_topk = last.last_topk[0];
      r.shared_count = last.last_count[0];
      const std::vector<MtpLayer::Rows> rows{r};
      const MtpLayer::Output out = m.mtp->run(rows, c);
      expect_close(out.logits.data<float>(), expected.data() + (j - 1) * V, V,
                   std::string(share ? "shared" : "unshared") + " step " + std::to_string(j));
      hand.assign(out.hand_off.data<float>(), out.hand_off.data<float>() + H);
    }
  };
  chain(*cache, true, shared);
  chain(*cache, false, unshared);  // the shared chain wrote nothing, so the cache is step 0's
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
