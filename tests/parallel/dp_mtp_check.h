// Data-parallel attention through the serving group's leader, shared by the
// CPU tests (dp_attention_model_test.cpp) and their CUDA twin
// (tests/cuda_parallel/cuda_dp_mtp_test.cpp): the leader and one process of
// the same checkpoint, and the MTP layer's runs through both compared.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../model/hf_fixture.h"
#include "../mtp/mtp_golden_check.h"
#include "core/error.h"
#include "model/group_model.h"
#include "model/model_loader.h"
#include "model/mtp_layer.h"
#include "parallel/communicator.h"

namespace megactx::testing {

inline constexpr int64_t kPagesPerRank = 4;
inline constexpr int64_t kPageSize = 64;

// Checkpoint `dir` over the group with data-parallel attention and expert
// parallelism. Ranks past 0 serve the leader's runs here and get nothing
// back; rank 0 gets the group's leader and the same checkpoint in one process.
struct DpModels {
  std::unique_ptr<LanguageModel> leader, whole;
};
// `replicas` below the group's size: replicas of tensor-parallel ranks.
inline std::optional<DpModels> load_dp_models(const std::string& dir, parallel::Communicator& group,
                                              int replicas = 0, bool layer_split = false,
                                              MoeDispatch dispatch = MoeDispatch::automatic,
                                              const ModelLoadOptions& base = {}) {
  ModelLoadOptions options = base;
  options.group = &group;
  options.expert_parallel = options.data_parallel_attention = true;
  options.data_parallel_size = replicas;
  options.layer_split = layer_split;
  options.moe_dispatch = dispatch;
  auto model = load_language_model(dir, options);
  if (group.rank() != 0) {
    run_group_worker(*model, group, replicas);
    return std::nullopt;
  }
  return DpModels{
      make_group_leader(std::move(model), group, {}, /*data_parallel_attention=*/true, replicas),
      load_language_model(dir, base)};
}

// The MTP outputs of one run through the group and through one process;
// false (printed) when they differ.
inline bool same_mtp_run(MtpLayer& group_mtp, PagedKvCache& group_cache, MtpLayer& whole_mtp,
                         PagedKvCache& whole_cache, const std::vector<MtpLayer::Rows>& rows,
                         const std::string& label, double bound = 1e-5) {
  const MtpLayer::Output group = group_mtp.run(rows, group_cache);
  const MtpLayer::Output one = whole_mtp.run(rows, whole_cache);
  const auto n = static_cast<int64_t>(rows.size());
  const int64_t vocab = whole_mtp.vocab_size(), hidden = whole_mtp.hidden_size();
  // Logits of the sequences that want them (the group's rows are in run order).
  double logits_error = 0.0;
  bool ok = group.hand_off.shape() == one.hand_off.shape();
  for (int64_t s = 0; ok && s < n; ++s) {
    if (!rows[static_cast<size_t>(s)].want_logits) continue;
    ok = group.logits.defined() && group.logits.dim(0) == n;
    if (ok)
      logits_error = std::max(logits_error, relative_error(group.logits.data<float>() + s * vocab,
                                                           one.logits.data<float>() + s * vocab,
                                                           static_cast<size_t>(vocab)));
  }
  const double hand_error =
      ok ? relative_error(group.hand_off.data<float>(), one.hand_off.data<float>(),
                          static_cast<size_t>(n * hidden))
         : 1.0;
  ok = ok && logits_error <= bound && hand_error <= bound && group.last_count == one.last_count &&
       group.last_topk == one.last_topk && group.drafts.size() == one.drafts.size();
  for (size_t s = 0; ok && s < one.drafts.size(); ++s) ok = group.drafts[s] == one.drafts[s];
  std::string drafts;
  for (const auto& d : group.drafts) drafts += fmt::format(" [{}]", fmt::join(d, " "));
  std::printf("%s: logits %.3g, hand-offs %.3g, selections %s, drafts%s%s\n", label.c_str(),
              logits_error, hand_error, group.last_topk == one.last_topk ? "equal" : "DIFFERENT",
              drafts.empty() ? " none" : drafts.c_str(),
              ok ? "" : "  <-- differs from one process");
  return ok;
}

inline bool dp_mtp_matches_one_process(const std::string& name, parallel::Communicator& group,
                                       int replicas = 0, const ModelLoadOptions& base = {},
                                       double bound = 1e-5) {
  const std::string dir = mtp_fixture(name);
  auto models = load_dp_models(dir, group, replicas, false, MoeDispatch::automatic, base);
  if (!models) return true;
  auto& [leader, whole] = *models;
  const auto group_mtp = leader->load_mtp_layer(dir);
  const auto whole_mtp = whole->load_mtp_layer(dir);
  const int shares = replicas > 0 ? replicas : group.size();
  const KvCacheSpec spec = make_kv_cache_spec(whole->config(), shares * kPagesPerRank, KvDType::F32,
                                              kPageSize, /*with_mtp_layer=*/true);
  auto group_cache = leader->make_kv_cache(spec);
  auto whole_cache = whole->make_kv_cache(spec);

  const nlohmann::json golden = nlohmann::json::parse(std::ifstream(dir + "/golden.json"));
  const auto ids = golden["ids"].get<std::vector<int32_t>>();
  const int64_t T = golden["rows"], H = golden["hidden_size"];
  const auto hidden = read_f32(dir + "/hidden.f32", static_cast<size_t>(T * H));
  if (T > kPageSize) {
    std::printf("%s: %lld golden rows do not fit one page\n", name.c_str(),
                static_cast<long long>(T));
    return false;
  }
  // Sequence a on rank 1, b on rank 0, one page each; rows [0, P) first.
  const int64_t P = T - 4;
  const std::vector<int32_t> pages_a{static_cast<int32_t>(kPagesPerRank + 2)}, pages_b{1};
  const auto step0 = [&](const std::vector<int32_t>& pages, int64_t start, int64_t count) {
    MtpLayer::Rows r;
    r.start = start;
    r.count = count;
    r.pages = pages;
    r.next_tokens = std::span<const int32_t>(ids.data() + start + 1, static_cast<size_t>(count));
    r.hidden = hidden.data() + start * H;
    return r;
  };
  const std::string label = name + (replicas > 0 ? fmt::format(", {} replicas of {} ranks, MTP",
                                                               shares, group.size() / shares)
                                                 : std::string(", 2 ranks, MTP"));
  bool ok = true;
  // Rank 1's rows only (the leader runs none), then rank 0's only.
  ok &= same_mtp_run(*group_mtp, *group_cache, *whole_mtp, *whole_cache, {step0(pages_a, 0, P)},
                     label + " step 0 of rank 1's sequence", bound);
  ok &= same_mtp_run(*group_mtp, *group_cache, *whole_mtp, *whole_cache, {step0(pages_b, 0, P)},
                     label + " step 0 of rank 0's sequence", bound);
  // A verification's refill on both ranks (4 rows, the output row 1), with
  // greedy chains of 3 and 1 drafts: rank 1 runs two draft steps, rank 0
  // none of its own (it still runs them, with no rows).
  MtpLayer::Rows a = step0(pages_a, P, 4), b = step0(pages_b, P, 4);
  a.output_row = b.output_row = 1;
  a.greedy_drafts = 3;
  a.want_logits = false;
  b.greedy_drafts = 1;
  ok &= same_mtp_run(*group_mtp, *group_cache, *whole_mtp, *whole_cache, {b, a},
                     label + " refill with draft chains of 1 and 3", bound);
  // The same with no sequence reading its logits: the drafts come from each
  // row's argmax taken on its rank (Rows::want_argmax), and no [rows, vocab]
  // logits reach rank 0. (The refill rewrites the same entries.)
  MtpLayer::Rows b_ids = b;
  b_ids.want_logits = false;
  ok &= same_mtp_run(*group_mtp, *group_cache, *whole_mtp, *whole_cache, {b_ids, a},
                     label + " refill with draft chains, no logits read", bound);
  {
    const MtpLayer::Output ids_only =
        group_mtp->run(std::vector<MtpLayer::Rows>{b_ids, a}, *group_cache);
    const bool no_logits = !ids_only.logits.defined() && ids_only.drafts.size() == 2 &&
                           ids_only.drafts[0].size() == 1 && ids_only.drafts[1].size() == 3;
    std::printf("%s: draft chains without logits read: %s\n", label.c_str(),
                no_logits ? "no logits gathered" : "LOGITS GATHERED (or drafts missing)");
    ok &= no_logits;
  }
  // Draft steps one run at a time: unshared on rank 1 only, then shared (its
  // step-0 selection) on both.
  const MtpLayer::Output refill = whole_mtp->run(std::vector<MtpLayer::Rows>{a}, *whole_cache);
  group_mtp->run(std::vector<MtpLayer::Rows>{a}, *group_cache);
  std::vector<float> hand(refill.hand_off.data<float>(), refill.hand_off.data<float>() + H);
  const int32_t draft = refill.drafts[0][0];
  MtpLayer::Rows unshared;
  unshared.start = P + 2;
  unshared.count = 1;
  unshared.pages = pages_a;
  unshared.next_tokens = std::span<const int32_t>(&draft, 1);
  unshared.hidden = hand.data();
  unshared.target_hidden = false;
  ok &= same_mtp_run(*group_mtp, *group_cache, *whole_mtp, *whole_cache, {unshared},
                     label + " unshared draft step of rank 1's sequence", bound);
  MtpLayer::Rows shared_a = unshared, shared_b = unshared;
  for (MtpLayer::Rows* r : {&shared_a, &shared_b}) {
    r->shared = true;
    r->shared_context = P + 2;
    r->shared_topk = refill.last_topk[0];
    r->shared_count = refill.last_count[0];
  }
  shared_b.pages = pages_b;
  ok &= same_mtp_run(*group_mtp, *group_cache, *whole_mtp, *whole_cache, {shared_a, shared_b},
                     label + " shared draft step on both ranks", bound);
  // Pages of two ranks in one sequence: refused before any rank starts.
  const std::vector<int32_t> broken_pages{0, static_cast<int32_t>(kPagesPerRank)};
  bool refused = false;
  try {
    group_mtp->run(std::vector<MtpLayer::Rows>{step0(broken_pages, 0, 2)}, *group_cache);
  } catch (const megactx::Error& error) {
    refused = std::string(error.what()).find("different ranks") != std::string::npos;
  }
  std::printf("%s: a sequence with pages of two ranks %s\n", label.c_str(),
              refused ? "is refused" : "was NOT refused");
  ok &= refused;
  ok &= same_mtp_run(*group_mtp, *group_cache, *whole_mtp, *whole_cache, {shared_b},
                     label + " a run after the refusal", bound);
  return ok;
}

}  // namespace megactx::testing
