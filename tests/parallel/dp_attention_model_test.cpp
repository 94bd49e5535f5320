// Data-parallel attention through the serving group's leader
// (model/group_model.h, model/dp_attention_batch.h): rank 0's leader gets a
// step whose sequences' pages lie in different ranks' ranges, sends each
// rank its own sequences, and gathers the outputs back in the batch's order.
// Steps with rows spread over 2 and 4 ranks (a rank with none, the leader
// itself with none, ragged shares, prefill chunks and decode rows mixed,
// logits of every row of a chunk) give the single-process model's logits,
// hidden states and routed experts on the same batch; a sequence whose pages
// span two ranks is refused before anything is sent, and the group stays in
// step.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../model/hf_fixture.h"
#include "core/error.h"
#include "forked_group.h"
#include "model/group_model.h"
#include "model/model_loader.h"
#include "parallel/communicator.h"

namespace megactx::testing {
namespace {

constexpr int64_t kPagesPerRank = 4;
constexpr int64_t kPageSize = 64;

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

bool dp_steps_match_one_process(const std::string& name, parallel::Communicator& group) {
  const HfFixture f = load_fixture(name);
  ModelLoadOptions options;
  options.group = &group;
  options.expert_parallel = options.data_parallel_attention = true;
  auto model = load_language_model(f.dir, options);
  if (group.rank() != 0) {
    run_group_worker(*model, group);
    return true;
  }
  const int size = group.size();
  auto leader = make_group_leader(std::move(model), group, {}, /*data_parallel_attention=*/true);
  auto whole = load_language_model(f.dir, {});
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
    std::vector<int32_t> out;
    for (size_t i = 0; i < length; ++i) out.push_back(f.input_ids[(offset + i) % 64]);
    return out;
  };
  const auto pages = [](int rank, int32_t first) {
    return std::vector<int32_t>{static_cast<int32_t>(rank * kPagesPerRank) + first,
                                static_cast<int32_t>(rank * kPagesPerRank) + first + 1};
  };
  std::vector<Sequence> s = {{tokens(0, 90), pages(1, 0)},
                             {tokens(7, 40), pages(0, 0)},
                             {tokens(13, 100), pages(size - 1, 2)},
                             {tokens(29, 70), pages(size > 2 ? 2 : 0, 2)}};
  const std::string label = fmt::format("{}, {} ranks", name, size);
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

TEST(DataParallelAttentionGroup, TwoRanksMatchOneProcess) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(
        2, [&](parallel::Communicator& group) { return dp_steps_match_one_process(name, group); });
}

TEST(DataParallelAttentionGroup, FourRanksMatchOneProcess) {
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return dp_steps_match_one_process("glm_pattern", group);
  });
}

}  // namespace
}  // namespace megactx::testing
