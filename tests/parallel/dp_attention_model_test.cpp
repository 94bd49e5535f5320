// Data-parallel attention through the serving group's leader
// (model/group_model.h, model/dp_attention_batch.h): rank 0's leader gets a
// step whose sequences' pages lie in different ranks' ranges, sends each
// rank its own sequences, and gathers the outputs back in the batch's order.
// Steps with rows spread over 2 and 4 ranks (a rank with none, the leader
// itself with none, ragged shares, prefill chunks and decode rows mixed,
// logits of every row of a chunk) give the single-process model's logits,
// hidden states and routed experts on the same batch; a sequence whose pages
// span two ranks is refused before anything is sent, and the group stays in
// step. MTP runs through the leader's MTP layer (each rank its own
// sequences' rows, a rank with none still in every run, greedy draft chains
// of different lengths on the two ranks) give the single-process layer's
// logits, hand-offs, selections and drafts. With the live host tier's
// offload pages (a range per rank after every rank's device pages), each
// rank moves its own sequences' pages to its own offload pages and decodes
// from them as one process does; a move across ranks is refused. Two
// replicas of two tensor-parallel ranks each (SGLang's --dp-size below
// --tp-size) run the same steps and MTP runs as one process. The gathered
// MoE dispatch (every rank's rows padded and gathered, no all-to-all of
// routed pairs) gives the same steps as one process over 2 and 4 ranks.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../model/hf_fixture.h"
#include "../mtp/mtp_golden_check.h"
#include "core/error.h"
#include "dp_mtp_check.h"
#include "forked_group.h"
#include "model/group_model.h"
#include "model/model_loader.h"
#include "model/mtp_layer.h"
#include "parallel/communicator.h"

namespace megactx::testing {
namespace {

// One sequence of the test: its tokens, its rank's pages and how far the
// caches hold it.
struct Sequence {
  std::vector<int32_t> tokens;
  std::vector<int32_t> pages;
  int64_t computed = 0;
};

struct Chunk {
  size_t sequence = 0;
  int64_t count = 0;
  int64_t logits_from = -1;
};

// A step of `chunks` through the leader and through one process; false
// (printed) when their outputs differ.
bool same_step(LanguageModel& leader, PagedKvCache& group_cache, LanguageModel& whole,
               PagedKvCache& whole_cache, std::vector<Sequence>& sequences,
               const std::vector<Chunk>& chunks, bool extras, const std::string& label) {
  ForwardBatch batch;
  batch.want_hidden_states = batch.want_routed_experts = extras;
  for (const Chunk& chunk : chunks) {
    Sequence& s = sequences[chunk.sequence];
    SequenceInput in;
    in.tokens = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(s.computed),
                                                           static_cast<size_t>(chunk.count));
    in.start_position = s.computed;
    in.page_table = s.pages;
    in.logits_from = chunk.logits_from;
    batch.sequences.push_back(in);
  }
  const ForwardOutput group = leader.forward(batch, group_cache);
  const ForwardOutput one = whole.forward(batch, whole_cache);
  for (const Chunk& chunk : chunks) sequences[chunk.sequence].computed += chunk.count;
  bool ok = group.logits.shape() == one.logits.shape();
  double error = 1.0;
  if (ok) {
    error = relative_error(group.logits.data<float>(), one.logits.data<float>(),
                           static_cast<size_t>(one.logits.numel()));
    ok = error <= 1e-5;
  }
  double hidden_error = 0.0;
  if (ok && extras) {
    ok = group.hidden_states.shape() == one.hidden_states.shape() &&
         group.routed_experts.shape() == one.routed_experts.shape();
    if (ok) {
      hidden_error =
          relative_error(group.hidden_states.data<float>(), one.hidden_states.data<float>(),
                         static_cast<size_t>(one.hidden_states.numel()));
      ok = hidden_error <= 1e-5 &&
           std::equal(one.routed_experts.data<int32_t>(),
                      one.routed_experts.data<int32_t>() + one.routed_experts.numel(),
                      group.routed_experts.data<int32_t>());
    }
  }
  std::printf(
      "%s: %lld logits rows, max relative difference %.3g%s%s\n", label.c_str(),
      static_cast<long long>(one.logits.dim(0)), error,
      extras ? fmt::format(", hidden states {:.3g}, routed experts compared", hidden_error).c_str()
             : "",
      ok ? "" : "  <-- differs from one process");
  return ok;
}

// `length` prompt ids of a fixture from `offset` on (its 64 ids, repeated).
std::vector<int32_t> fixture_tokens(const HfFixture& f, size_t offset, size_t length) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < length; ++i) out.push_back(f.input_ids[(offset + i) % 64]);
  return out;
}

bool dp_steps_match_one_process(const std::string& name, parallel::Communicator& group,
                                int replicas = 0, bool layer_split = false,
                                MoeDispatch dispatch = MoeDispatch::automatic) {
  const HfFixture f = load_fixture(name);
  auto models = load_dp_models(f.dir, group, replicas, layer_split, dispatch);
  if (!models) return true;
  auto& [leader, whole] = *models;
  const int size = replicas > 0 ? replicas : group.size();  // the replicas ("ranks" below)
  if (leader->data_parallel_ranks() != size) {
    std::printf("the leader reports %d data-parallel ranks\n", leader->data_parallel_ranks());
    return false;
  }
  const KvCacheSpec spec = make_kv_cache_spec(whole->config(), size * kPagesPerRank, KvDType::F32,
                                              kPageSize, /*with_mtp_layer=*/false);
  auto group_cache = leader->make_kv_cache(spec);
  auto whole_cache = whole->make_kv_cache(spec);
  if (group_cache->spec().num_pages != kPagesPerRank) {  // rank 0's share only
    std::printf("rank 0's cache holds %lld pages\n",
                static_cast<long long>(group_cache->spec().num_pages));
    return false;
  }

  // Sequences of different lengths on ranks 1, 0 and size - 1 (and 2 with 4
  // ranks): rank 1 holds two with 2 ranks, rank 0 none in the first step.
  const auto tokens = [&](size_t offset, size_t length) {
    return fixture_tokens(f, offset, length);
  };
  const auto pages = [](int rank, int32_t first) {
    return std::vector<int32_t>{static_cast<int32_t>(rank * kPagesPerRank) + first,
                                static_cast<int32_t>(rank * kPagesPerRank) + first + 1};
  };
  std::vector<Sequence> s = {{tokens(0, 90), pages(1, 0)},
                             {tokens(7, 40), pages(0, 0)},
                             {tokens(13, 100), pages(size - 1, 2)},
                             {tokens(29, 70), pages(size > 2 ? 2 : 0, 2)}};
  const std::string label =
      (replicas > 0 ? fmt::format("{}, {} replicas of {} ranks{}", name, size, group.size() / size,
                                  layer_split ? " (LayerSplit)" : "")
                    : fmt::format("{}, {} ranks", name, size)) +
      (dispatch == MoeDispatch::gathered ? " (gathered MoE dispatch)" : "");
  bool ok = true;
  // Only rank 1 has rows: the leader forwards none.
  ok &= same_step(*leader, *group_cache, *whole, *whole_cache, s, {{0, 64}}, false,
                  label + ", step 1 (rank 1's prefill only)");
  // Prefill, a chunk with every row's logits and a decode row, ragged.
  ok &= same_step(*leader, *group_cache, *whole, *whole_cache, s, {{1, 23}, {2, 30, 0}, {0, 1}},
                  true, label + ", step 2 (prefill, chunk, decode)");
  ok &= same_step(*leader, *group_cache, *whole, *whole_cache, s,
                  {{2, 50, 10}, {3, 64}, {0, 1}, {1, 1}}, false,
                  label + ", step 3 (chunk, prefill, two decodes)");
  for (int step = 0; step < 4; ++step)
    ok &=
        same_step(*leader, *group_cache, *whole, *whole_cache, s, {{0, 1}, {1, 1}, {2, 1}, {3, 1}},
                  step == 3, label + fmt::format(", decode step {}", step + 1));
  // Only rank 0's rows: every other rank forwards none.
  ok &= same_step(*leader, *group_cache, *whole, *whole_cache, s, {{1, 1}}, false,
                  label + ", rank 0's decode only");
  // Pages of two ranks in one sequence: refused before any rank starts.
  Sequence broken{tokens(3, 8), {0, static_cast<int32_t>(kPagesPerRank)}};
  ForwardBatch bad;
  bad.sequences.push_back({broken.tokens, 0, broken.pages, -1});
  bool refused = false;
  try {
    leader->forward(bad, *group_cache);
  } catch (const megactx::Error& error) {
    refused = std::string(error.what()).find("different ranks") != std::string::npos;
  }
  std::printf("%s: a sequence with pages of two ranks %s\n", label.c_str(),
              refused ? "is refused" : "was NOT refused");
  ok &= refused;
  ok &= same_step(*leader, *group_cache, *whole, *whole_cache, s, {{0, 1}, {3, 1}}, false,
                  label + ", a step after the refusal");
  return ok;
}

// The live host tier over the group: 2 ranks of kPagesPerRank device pages
// (0-3, 4-7) and 2 offload pages each (8-9 for rank 0, 10-11 for rank 1),
// one process numbering the same pages in one cache.
bool dp_offload_pages_match_one_process(const std::string& name, parallel::Communicator& group) {
  const HfFixture f = load_fixture(name);
  auto models = load_dp_models(f.dir, group);
  if (!models) return true;
  auto& [leader, whole] = *models;
  constexpr int64_t kOffloadPerRank = 2;
  const int size = group.size();
  KvCacheSpec spec = make_kv_cache_spec(whole->config(), size * kPagesPerRank, KvDType::F32,
                                        kPageSize, /*with_mtp_layer=*/false);
  spec.offload_pages = size * kOffloadPerRank;
  auto group_cache = leader->make_kv_cache(spec);
  auto whole_cache = whole->make_kv_cache(spec);
  if (group_cache->spec().offload_pages != kOffloadPerRank) {  // rank 0's share only
    std::printf("rank 0's cache holds %lld offload pages\n",
                static_cast<long long>(group_cache->spec().offload_pages));
    return false;
  }
  const auto tokens = [&](size_t offset, size_t length) {
    return fixture_tokens(f, offset, length);
  };
  // Sequence 0 on rank 1 (device pages 4, 5), sequence 1 on rank 0 (0, 1).
  std::vector<Sequence> s = {{tokens(0, 100), {4, 5}}, {tokens(11, 80), {0, 1}}};
  const std::string label = fmt::format("{}, {} ranks, offload pages", name, size);
  bool ok = same_step(*leader, *group_cache, *whole, *whole_cache, s, {{0, 90}, {1, 70}}, false,
                      label + ", prefill");
  // Each sequence's full first page moves to its own rank's first offload
  // page, in one copy for both ranks (rank 1's done by the worker).
  const std::vector<int32_t> device = {4, 0}, offload = {10, 8};
  leader->kv_page_copy()(*group_cache, device, *group_cache, offload);
  whole->kv_page_copy()(*whole_cache, device, *whole_cache, offload);
  s[0].pages[0] = 10;
  s[1].pages[0] = 8;
  for (int step = 0; step < 3; ++step)
    ok &= same_step(*leader, *group_cache, *whole, *whole_cache, s, {{0, 1}, {1, 1}}, false,
                    label + fmt::format(", decode step {} from offload pages", step + 1));
  // Rank 0's device page to rank 1's offload page: refused before any rank copies.
  bool refused = false;
  try {
    const std::vector<int32_t> from = {2}, to = {11};
    leader->kv_page_copy()(*group_cache, from, *group_cache, to);
  } catch (const megactx::Error& error) {
    refused = std::string(error.what()).find("crosses ranks") != std::string::npos;
  }
  std::printf("%s: a move across ranks %s\n", label.c_str(),
              refused ? "is refused" : "was NOT refused");
  ok &= refused;
  ok &= same_step(*leader, *group_cache, *whole, *whole_cache, s, {{0, 1}, {1, 1}}, false,
                  label + ", a step after the refusal");
  return ok;
}

// A step whose command does not fit the group's command header (four
// 128-token prefills: its tokens alone are more than the header's 510
// inline words) goes out in a second broadcast; the decode steps after it
// fit the header. Both against one process.
bool large_step_matches_one_process(parallel::Communicator& group) {
  const HfFixture f = load_fixture("glm_schedule");
  auto models = load_dp_models(f.dir, group);
  if (!models) return true;
  auto& [leader, whole] = *models;
  const KvCacheSpec spec = make_kv_cache_spec(whole->config(), 2 * kPagesPerRank, KvDType::F32,
                                              kPageSize, /*with_mtp_layer=*/false);
  auto group_cache = leader->make_kv_cache(spec);
  auto whole_cache = whole->make_kv_cache(spec);
  std::vector<Sequence> s;
  for (int32_t i = 0; i < 4; ++i) {
    const int32_t first = (i / 2) * static_cast<int32_t>(kPagesPerRank) + (i % 2) * 2;
    s.push_back({fixture_tokens(f, static_cast<size_t>(5 * i), 2 * kPageSize), {first, first + 1}});
  }
  const int64_t prompt = 2 * kPageSize - 2;  // room for two decode steps
  bool ok = same_step(*leader, *group_cache, *whole, *whole_cache, s,
                      {{0, prompt}, {1, prompt}, {2, prompt}, {3, prompt}}, false,
                      "glm_schedule, 2 ranks, a 504-token step (two broadcasts)");
  for (int step = 0; step < 2; ++step)
    ok &= same_step(*leader, *group_cache, *whole, *whole_cache, s,
                    {{0, 1}, {1, 1}, {2, 1}, {3, 1}}, false,
                    fmt::format("glm_schedule, 2 ranks, decode step {} (one broadcast)", step + 1));
  return ok;
}

TEST(DataParallelAttentionGroup, AStepLargerThanTheCommandHeaderMatchesOneProcess) {
  parallel::run_forked_group(2, large_step_matches_one_process);
}

TEST(DataParallelAttentionGroup, OffloadPagesOfEachRankMatchOneProcess) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    return dp_offload_pages_match_one_process("glm_schedule", group);
  });
}

// The shape of a group MTP run every rank's share carries
// (MtpLayer::run_share): the most sequences of a rank, their common row
// count (0 when they differ), and the run's kind.
TEST(DataParallelAttentionGroup, MtpGroupRunShapeIsTheWholeRuns) {
  std::vector<MtpLayer::Rows> rows(4);
  for (MtpLayer::Rows& r : rows) r.count = 4;  // verification refills of k + 1 = 4 rows
  MtpLayer::GroupRun shape = group_run_shape(rows, {1, 0, 1, 1});
  EXPECT_EQ(shape.max_sequences, 3);
  EXPECT_EQ(shape.rows_per_sequence, 4);
  EXPECT_FALSE(shape.shared);
  EXPECT_TRUE(shape.target_hidden);
  for (MtpLayer::Rows& r : rows) {
    r.count = 1;
    r.shared = true;
    r.target_hidden = false;
  }
  rows[2].count = 2;
  shape = group_run_shape(rows, {0, 2, 2, 0});
  EXPECT_EQ(shape.max_sequences, 2);
  EXPECT_EQ(shape.rows_per_sequence, 0);
  EXPECT_TRUE(shape.shared);
  EXPECT_FALSE(shape.target_hidden);
  EXPECT_THROW(group_run_shape(rows, {0, 1}), Error);
}

TEST(DataParallelAttentionGroup, MtpRunsMatchOneProcess) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(
        2, [&](parallel::Communicator& group) { return dp_mtp_matches_one_process(name, group); });
}

TEST(DataParallelAttentionGroup, TwoRanksMatchOneProcess) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(
        2, [&](parallel::Communicator& group) { return dp_steps_match_one_process(name, group); });
}

TEST(DataParallelAttentionGroup, ReplicasOfTensorRanksMatchOneProcess) {
  // Four ranks as two replicas of two tensor-parallel ranks: steps and MTP runs.
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(4, [&](parallel::Communicator& group) {
      return dp_steps_match_one_process(name, group, /*replicas=*/2);
    });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return dp_mtp_matches_one_process("glm_schedule", group, /*replicas=*/2);
  });
  // LayerSplit inside each replica: its two ranks hold the layers' caches alternately.
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return dp_steps_match_one_process("glm_schedule", group, /*replicas=*/2,
                                      /*layer_split=*/true);
  });
}

TEST(DataParallelAttentionGroup, FourRanksMatchOneProcess) {
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return dp_steps_match_one_process("glm_pattern", group);
  });
}

// The gathered MoE dispatch (model/expert_dispatch.h): every rank's rows
// padded to the step's longest share and gathered by every rank, the same
// steps (a rank with no rows, ragged prefill and decode shares), also over
// replicas of tensor ranks.
TEST(DataParallelAttentionGroup, GatheredDispatchMatchesOneProcess) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(2, [&](parallel::Communicator& group) {
      return dp_steps_match_one_process(name, group, 0, false, MoeDispatch::gathered);
    });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return dp_steps_match_one_process("glm_pattern", group, 0, false, MoeDispatch::gathered);
  });
  // Two replicas of two tensor ranks: each rank's slice of its replica's
  // rows, padded to the longest slice.
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return dp_steps_match_one_process("glm_schedule", group, 2, false, MoeDispatch::gathered);
  });
}

}  // namespace
}  // namespace megactx::testing
