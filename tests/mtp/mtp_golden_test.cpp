// The MTP layer's draft logits against the PyTorch reference
// (tools/mtp_reference/mtp_reference.py, tests/fixtures/mtp/<name>): step 0
// at every row (row by row and as one batched run), the step-0 top-k, and
// chained draft steps with IndexShare + KVShare and without sharing; for a
// GLM fixture (shared embedding/head, normed hand-off) and a DeepSeek-V3.2
// fixture (own embedding/head copies, raw hand-off, YaRN, half-split indexer
// RoPE). Greedy speculation on those checkpoints equals plain decoding in
// tests/engine_speculative (through the Engine).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

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
        make_kv_cache_spec(m.dsa->config(), 4, KvDType::F32, 64, /*with_mtp_layer=*/true));
  });
}

TEST_P(MtpGolden, GreedyDraftChainAfterPlaceholderRows) {
  const std::string dir = mtp_fixture(GetParam());
  LoadedModel m = load_with_mtp(dir);
  check_greedy_draft_chain(dir, *m.mtp, [&] {
    return std::make_unique<PagedKvCache>(
        make_kv_cache_spec(m.dsa->config(), 4, KvDType::F32, 64, /*with_mtp_layer=*/true));
  });
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpGolden, ::testing::Values("glm_schedule", "dsv32_yarn"));

}  // namespace
}  // namespace megactx::testing
