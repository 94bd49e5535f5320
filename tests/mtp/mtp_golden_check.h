// The MTP golden scenario (tools/mtp_reference/mtp_reference.py,
// tests/fixtures/mtp/<name>) on any MtpLayer: step 0 at every row (row by row
// and as one batched run), the step-0 top-k, and chained draft steps with
// IndexShare + KVShare and without sharing, each within 1e-4 of the PyTorch
// reference. Used by tests/mtp (CPU) and tests/cuda_engine (CUDA).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../model/hf_fixture.h"
#include "cache/kv_cache.h"
#include "model/mtp_layer.h"

namespace megactx::testing {

inline std::string mtp_fixture(const std::string& name) {
  return std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/mtp/" + name;
}

inline void expect_close(const float* got, const float* want, int64_t n, const std::string& what) {
  double scale = 0.0, worst = 0.0;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, double(std::fabs(want[i])));
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, double(std::fabs(got[i] - want[i])));
  EXPECT_LT(worst, 1e-4 * scale + 1e-5)
      << what << ": max |megactx - reference| = " << worst << " (max |reference| " << scale << ")";
}

// The golden scenario on `mtp` (the layer of the checkpoint in `dir`, on any
// device); `fresh_cache` makes an empty cache with the MTP layer's pools and
// at least 4 pages of 64.
inline void check_mtp_goldens(const std::string& dir, MtpLayer& mtp,
                              const std::function<std::unique_ptr<PagedKvCache>()>& fresh_cache) {
  const nlohmann::json golden = nlohmann::json::parse(std::ifstream(dir + "/golden.json"));
  const auto ids = golden["ids"].get<std::vector<int32_t>>();
  const auto drafts = golden["drafts"].get<std::vector<int32_t>>();
  const int64_t T = golden["rows"], S = golden["steps"], H = golden["hidden_size"],
                V = golden["vocab_size"];
  const auto hidden = read_f32(dir + "/hidden.f32", T * H);
  const auto step0 = read_f32(dir + "/step0_logits.f32", T * V);
  const auto shared = read_f32(dir + "/shared_logits.f32", S * V);
  const auto unshared = read_f32(dir + "/unshared_logits.f32", S * V);

  EXPECT_EQ(mtp.hand_off(),
            golden["hand_off"] == "normed" ? MtpHandOff::NormedOutput : MtpHandOff::RawOutput);
  // Pages out of order so the page table matters.
  const std::vector<int32_t> pages{3, 1};

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
      last = mtp.run(rows, cache);
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
    const MtpLayer::Output out = mtp.run(rows, *batched);
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
      const MtpLayer::Output out = mtp.run(rows, c);
      expect_close(out.logits.data<float>(), expected.data() + (j - 1) * V, V,
                   std::string(share ? "shared" : "unshared") + " step " + std::to_string(j));
      hand.assign(out.hand_off.data<float>(), out.hand_off.data<float>() + H);
    }
  };
  chain(*cache, true, shared);
  chain(*cache, false, unshared);  // the shared chain wrote nothing, so the cache is step 0's
}

// A verification's refill on any MtpLayer: step 0 over 4 rows of which the
// last 2 are placeholders (Rows::output_row), with greedy drafts chained
// after it (Rows::greedy_drafts), for three sequences at once (a device
// layer pads them to a batch bucket and replays a CUDA Graph in the second
// round). The output row's logits match the reference's row; the drafts
// and the selection equal the same layer's step 0 over the 2 real rows
// followed by its draft steps one run at a time (the host loop).
inline void check_greedy_draft_chain(
    const std::string& dir, MtpLayer& mtp,
    const std::function<std::unique_ptr<PagedKvCache>()>& fresh_cache) {
  const nlohmann::json golden = nlohmann::json::parse(std::ifstream(dir + "/golden.json"));
  const auto ids = golden["ids"].get<std::vector<int32_t>>();
  const int64_t T = golden["rows"], H = golden["hidden_size"], V = golden["vocab_size"];
  const auto hidden = read_f32(dir + "/hidden.f32", T * H);
  const auto step0 = read_f32(dir + "/step0_logits.f32", T * V);
  ASSERT_LE(T, 64) << "one page of 64 per sequence";
  constexpr int64_t kSequences = 3, kDrafts = 3;
  const int64_t P = T - 4;  // rows [0, P) written before
  const std::vector<std::vector<int32_t>> pages{{2}, {0}, {3}};
  const auto prefix = [&](PagedKvCache& cache, int64_t sequences) {
    std::vector<MtpLayer::Rows> rows;
    for (int64_t i = 0; i < sequences; ++i) {
      MtpLayer::Rows r;
      r.count = P;
      r.pages = pages[static_cast<size_t>(i)];
      r.next_tokens = std::span<const int32_t>(ids.data() + 1, P);
      r.hidden = hidden.data();
      rows.push_back(r);
    }
    mtp.run(rows, cache);
  };
  const auto argmax_of = [V](const float* row) {
    return static_cast<int32_t>(std::max_element(row, row + V) - row);
  };

  // The reference: step 0 over the real rows P, P + 1, then the draft steps
  // one run at a time with the argmax of each.
  auto single = fresh_cache();
  prefix(*single, 1);
  MtpLayer::Rows real;
  real.start = P;
  real.count = 2;
  real.pages = pages[0];
  real.next_tokens = std::span<const int32_t>(ids.data() + P + 1, 2);
  real.hidden = hidden.data() + P * H;
  const MtpLayer::Output first = mtp.run(std::vector<MtpLayer::Rows>{real}, *single);
  std::vector<int32_t> want{argmax_of(first.logits.data<float>())};
  std::vector<float> hand(first.hand_off.data<float>(), first.hand_off.data<float>() + H);
  for (int64_t j = 1; j < kDrafts; ++j) {
    MtpLayer::Rows r;
    r.start = P + 1 + j;
    r.count = 1;
    r.pages = pages[0];
    r.next_tokens = std::span<const int32_t>(&want.back(), 1);
    r.hidden = hand.data();
    r.target_hidden = false;
    r.shared = true;
    r.shared_context = P + 2;
    r.shared_topk = first.last_topk[0];
    r.shared_count = first.last_count[0];
    const MtpLayer::Output out = mtp.run(std::vector<MtpLayer::Rows>{r}, *single);
    want.push_back(argmax_of(out.logits.data<float>()));
    hand.assign(out.hand_off.data<float>(), out.hand_off.data<float>() + H);
  }

  auto cache = fresh_cache();
  prefix(*cache, kSequences);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<MtpLayer::Rows> rows;
    for (int64_t i = 0; i < kSequences; ++i) {
      MtpLayer::Rows r;
      r.start = P;
      r.count = 4;
      r.output_row = 1;
      r.greedy_drafts = kDrafts;
      r.pages = pages[static_cast<size_t>(i)];
      r.next_tokens = std::span<const int32_t>(ids.data() + P + 1, 4);
      r.hidden = hidden.data() + P * H;
      rows.push_back(r);
    }
    const MtpLayer::Output out = mtp.run(rows, *cache);
    ASSERT_EQ(out.drafts.size(), static_cast<size_t>(kSequences));
    for (int64_t i = 0; i < kSequences; ++i) {
      expect_close(out.logits.data<float>() + i * V, step0.data() + (P + 1) * V, V,
                   "output row of sequence " + std::to_string(i));
      EXPECT_EQ(out.drafts[static_cast<size_t>(i)], want) << "sequence " << i;
      EXPECT_EQ(out.last_count[static_cast<size_t>(i)], first.last_count[0]);
      EXPECT_EQ(out.last_topk[static_cast<size_t>(i)], first.last_topk[0]);
      expect_close(out.hand_off.data<float>() + i * H, first.hand_off.data<float>(), H,
                   "hand-off of sequence " + std::to_string(i));
    }
  }
}

}  // namespace megactx::testing
