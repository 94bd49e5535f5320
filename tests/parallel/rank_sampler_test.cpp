// Sampling where the rows are (engine/rank_sampler.h): groups of 2, 3 and 4
// forked ranks, each holding the logits of its own rows, sample rows with
// every option the samplers read (temperature, top-k / top-p / min-p, the
// three penalties with output counts and prompt tokens, logit_bias, masked
// eos ids, a grammar mask, seeds and draw indices, logprobs with top
// alternatives, asked-for ids and a logprob temperature). Rank 0 must get
// exactly what one CpuSampler gives over every row's logits in one tensor:
// the same tokens and bit-equal logprobs, in the rows' order (and the same
// for input logprobs, RankSampler::score: top alternatives, asked-for ids, a
// logprob temperature; and the rejection-sampling checks of requests over
// runs of rows on one rank, with and without grammar masks, and the
// distributions of their rejecting rows: Sampler::check_drafts and
// distributions, bit-equal verdicts and rows), with rows on
// rank 0 only (no exchange), a rank with no rows, rows of data-parallel
// replicas held by tensor rank 0 of each share (ranks 1 and 3 of 4 hold
// none), and many rounds in a row. Rows a worker cannot sample (it holds no
// logits rows) are an error on rank 0 naming the rank, and the group stays
// in step for the next round.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "engine/cpu_sampler.h"
#include "engine/rank_sampler.h"
#include "forked_group.h"
#include "model/group_model.h"
#include "test_rank_rows.h"

namespace megactx::testing {
namespace {

constexpr int64_t kVocab = 300;

// Deterministic logits of global row `row` of round `round` (every rank
// makes the same ones, so rank 0 has the whole tensor for the reference).
std::vector<float> row_logits(int round, int64_t row) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * round + row));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> out(kVocab);
  for (float& x : out) x = normal(rng);
  out[static_cast<size_t>(row % kVocab)] += 4.0f;  // a clear favourite, with ties elsewhere
  out[7] = out[8];
  return out;
}

// A row's options, varied by its index.
struct RowSpec {
  SamplingParams params;
  std::unordered_map<int32_t, int32_t> counts;
  std::vector<int32_t> prompt, masked, ids;
  std::vector<uint32_t> allowed;
};

RowSpec row_spec(int64_t i) {
  RowSpec s;
  SamplingParams& p = s.params;
  switch (i % 6) {
    case 0:
      p.temperature = 0.0;  // greedy
      break;
    case 1:
      p.temperature = 0.8;
      p.top_k = 20;
      p.top_p = 0.9;
      break;
    case 2:
      p.temperature = 1.3;
      p.min_p = 0.05;
      p.logit_bias = {{3, 5.0f}, {11, -100.0f}};
      break;
    case 3:
      p.temperature = 1.0;
      p.repetition_penalty = 1.3;
      p.frequency_penalty = 0.4;
      p.presence_penalty = 0.2;
      s.counts = {{5, 2}, {9, 1}, {250, 3}};
      s.prompt = {1, 5, 17, 42};
      break;
    case 4:
      p.temperature = 0.7;
      s.masked = {0, 2};
      s.allowed.assign((kVocab + 31) / 32, 0);
      for (int32_t t = 0; t < kVocab; t += 3) s.allowed[t / 32] |= 1u << (t % 32);
      break;
    default:
      p.temperature = 1.0;
      p.top_k = 1;
      break;
  }
  if (i % 2 == 0) s.ids = {4, 6, 299};
  return s;
}

SamplingRow sampling_row(const RowSpec& s, int64_t logits_row, int64_t i) {
  SamplingRow row;
  row.logits_row = logits_row;
  row.params = &s.params;
  if (!s.counts.empty()) row.output_counts = &s.counts;
  row.prompt_tokens = s.prompt;
  row.masked_tokens = s.masked;
  row.allowed = s.allowed;
  row.seed = 77 + static_cast<uint64_t>(i);
  row.draw_index = static_cast<uint64_t>(3 * i);
  row.want_logprob = i % 3 != 2;
  row.top_logprobs = i % 4;
  row.logprob_token_ids = s.ids;
  row.logprob_temperature = i % 5 == 1 ? 0.5 : 1.0;
  return row;
}

// One round: `row_ranks[g]` the data-parallel rank of global logits row g;
// the sampled rows are `sampled` (indices into the global rows, any order).
struct Round {
  std::vector<int> row_ranks;
  std::vector<int64_t> sampled;
  bool workers_lost_logits = false;  // the workers sample from no logits rows
};

std::vector<Round> rounds(int shares) {
  std::vector<Round> out;
  // Rows spread over every share, sampled out of order.
  Round spread;
  for (int64_t g = 0; g < 12; ++g) spread.row_ranks.push_back(static_cast<int>(g % shares));
  spread.sampled = {11, 0, 3, 5, 7, 1, 2, 4, 6, 8, 9, 10};
  out.push_back(spread);
  // Rank 0 only: no exchange.
  Round own;
  own.row_ranks = {0, 0, 0};
  own.sampled = {2, 0};
  out.push_back(own);
  // The last share has no rows; ragged counts on the others.
  Round ragged;
  for (int64_t g = 0; g < 9; ++g)
    ragged.row_ranks.push_back(static_cast<int>(g * g % (shares - 1)));
  for (int64_t g = 0; g < 9; ++g) ragged.sampled.push_back(g);
  out.push_back(ragged);
  // A row a worker cannot sample, then the same rows that it can.
  Round bad = spread;
  bad.workers_lost_logits = true;
  out.push_back(bad);
  out.push_back(spread);
  // Every row on the workers.
  Round workers;
  for (int64_t g = 0; g < 7; ++g)
    workers.row_ranks.push_back(shares == 1 ? 0 : 1 + static_cast<int>(g % (shares - 1)));
  for (int64_t g = 6; g >= 0; --g) workers.sampled.push_back(g);
  out.push_back(workers);
  return out;
}

// The logits a group rank holds in round `round`: its share's rows (tensor
// rank 0 of the share) in order; [0, vocab] otherwise.
Tensor held_logits(const Round& round, int index, int rank, int tensor) {
  std::vector<int64_t> rows;
  if (rank % tensor == 0)
    for (size_t g = 0; g < round.row_ranks.size(); ++g)
      if (round.row_ranks[g] == rank / tensor) rows.push_back(static_cast<int64_t>(g));
  Tensor out = Tensor::empty({static_cast<int64_t>(rows.size()), kVocab}, DType::F32);
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<float> values = row_logits(index, rows[r]);
    std::memcpy(out.data<float>() + r * kVocab, values.data(), kVocab * sizeof(float));
  }
  return out;
}

bool same(const SampleResult& a, const SampleResult& b) {
  auto bits = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    return u;
  };
  auto same_pairs = [&](const auto& x, const auto& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].first != y[i].first || bits(x[i].second) != bits(y[i].second)) return false;
    return true;
  };
  return a.token == b.token && bits(a.logprob) == bits(b.logprob) && same_pairs(a.top, b.top) &&
         same_pairs(a.token_ids, b.token_ids);
}

bool leader(parallel::Communicator& group, int tensor) {
  const int shares = group.size() / tensor;
  TestRankRows rank_rows(group, tensor);
  RankSampler sampler(rank_rows);
  CpuSampler local;
  bool ok = true;
  const std::vector<Round> all = rounds(shares);
  std::vector<int64_t> sampled_per_rank;
  int64_t checked = 0, rejected = 0;  // draft checks made, and rejecting rows among them
  for (size_t index = 0; index < all.size(); ++index) {
    const Round& round = all[index];
    rank_rows.round = static_cast<int64_t>(index);
    const int runs_before = rank_rows.runs;
    // The reference: every row in one tensor, one CpuSampler.
    const auto total = static_cast<int64_t>(round.row_ranks.size());
    Tensor whole = Tensor::empty({total, kVocab}, DType::F32);
    for (int64_t g = 0; g < total; ++g) {
      const std::vector<float> values = row_logits(static_cast<int>(index), g);
      std::memcpy(whole.data<float>() + g * kVocab, values.data(), kVocab * sizeof(float));
    }
    std::vector<RowSpec> specs;
    specs.reserve(round.sampled.size());
    for (const int64_t g : round.sampled) specs.push_back(row_spec(g));
    std::vector<SamplingRow> rows;
    for (size_t i = 0; i < round.sampled.size(); ++i)
      rows.push_back(sampling_row(specs[i], round.sampled[i], round.sampled[i]));
    std::vector<SampleResult> got(rows.size());
    const Tensor own = held_logits(round, static_cast<int>(index), 0, tensor);
    if (round.workers_lost_logits) {
      try {
        sampler.sample(local, own, round.row_ranks, rows, got, sampled_per_rank);
        std::printf("round %zu: a worker's bad row was not an error\n", index);
        ok = false;
      } catch (const Error& error) {
        const std::string what = error.what();
        if (what.find("could not sample its rows") == std::string::npos) {
          std::printf("round %zu: unexpected error: %s\n", index, what.c_str());
          ok = false;
        }
      }
      continue;
    }
    std::vector<SampleResult> want(rows.size());
    local.sample(whole, rows, want);
    sampler.sample(local, own, round.row_ranks, rows, got, sampled_per_rank);
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!same(got[i], want[i])) {
        std::printf("round %zu row %zu (logits row %lld): token %d logprob %g, want %d %g\n", index,
                    i, static_cast<long long>(round.sampled[i]), got[i].token, got[i].logprob,
                    want[i].token, want[i].logprob);
        ok = false;
      }
    }
    // Rejection-sampling verification where the rows are: a request per run
    // of consecutive rows on one rank (k = the run's length - 1, at most 3),
    // with and without a grammar mask; then each rejecting row's distribution.
    std::vector<DraftCheck> checks;
    std::vector<std::vector<int32_t>> drafts;
    std::vector<std::vector<float>> q_at;
    std::vector<std::vector<uint32_t>> masks;
    std::vector<SamplingParams> check_params;
    check_params.reserve(static_cast<size_t>(total));
    for (int64_t g = 0; g < total;) {
      int64_t end = g + 1;
      while (end < total && end - g < 4 && round.row_ranks[end] == round.row_ranks[g]) ++end;
      const int64_t k = end - g - 1;
      if (k >= 1) {
        SamplingParams& params = check_params.emplace_back();
        params.temperature = 0.6 + 0.2 * static_cast<double>(g % 3);
        params.top_k = g % 2 ? 40 : 0;
        params.top_p = g % 3 == 2 ? 0.9 : 1.0;
        std::vector<int32_t>& d = drafts.emplace_back();
        std::vector<float>& q = q_at.emplace_back();
        for (int64_t i = 0; i < k; ++i) {
          // The row's argmax with a small q (likely accepted: every draft of
          // a third of the requests), or another token (likely rejected).
          const bool favourite = g % 3 == 0 || i % 2 == 0;
          d.push_back(favourite ? argmax(row_logits(static_cast<int>(index), g + i))
                                : static_cast<int32_t>((3 * g + 11 * i) % kVocab));
          q.push_back(favourite ? 0.01f : 0.05f + 0.3f * static_cast<float>((g + i) % 3));
        }
        std::vector<uint32_t>& mask = masks.emplace_back();
        if (g % 2 == 0) {
          // Every token but those of t % 5 == 3 (the drafts may be among them).
          const int64_t words = (kVocab + 31) / 32;
          mask.assign(static_cast<size_t>((k + 1) * words), 0);
          for (int64_t r = 0; r <= k; ++r)
            for (int64_t t = 0; t < kVocab; ++t)
              if (t % 5 != 3) mask[static_cast<size_t>(r * words + t / 32)] |= 1u << (t % 32);
        }
        DraftCheck check;
        check.logits_row = g;
        check.params = &params;
        check.seed = 77 + static_cast<uint64_t>(g);
        check.first_draw = static_cast<uint64_t>(index) * 10;
        checks.push_back(check);
      }
      g = end;
    }
    for (size_t c = 0; c < checks.size(); ++c) {
      checks[c].drafts = drafts[c];
      checks[c].q_at_draft = q_at[c];
      checks[c].allowed = masks[c];
    }
    std::vector<DraftVerdict> verdicts(checks.size()), want_verdicts(checks.size());
    local.check_drafts(whole, checks, want_verdicts);
    sampler.check_drafts(local, own, round.row_ranks, checks, verdicts);
    std::vector<DistributionQuery> rejecting;
    for (size_t c = 0; c < checks.size(); ++c) {
      if (verdicts[c].accepted != want_verdicts[c].accepted ||
          verdicts[c].bonus != want_verdicts[c].bonus) {
        std::printf(
            "round %zu check %zu (rows from %lld): %lld accepted, bonus %d; want %lld, %d\n", index,
            c, static_cast<long long>(checks[c].logits_row),
            static_cast<long long>(verdicts[c].accepted), verdicts[c].bonus,
            static_cast<long long>(want_verdicts[c].accepted), want_verdicts[c].bonus);
        ok = false;
      }
      const auto k = static_cast<int64_t>(checks[c].drafts.size());
      if (want_verdicts[c].accepted < k) {
        DistributionQuery query;
        query.logits_row = checks[c].logits_row + want_verdicts[c].accepted;
        query.params = checks[c].params;
        if (!masks[c].empty()) {
          const size_t words = masks[c].size() / static_cast<size_t>(k + 1);
          query.allowed = std::span<const uint32_t>(masks[c]).subspan(
              static_cast<size_t>(want_verdicts[c].accepted) * words, words);
        }
        rejecting.push_back(query);
      }
    }
    std::vector<std::vector<float>> rows_got(rejecting.size()), rows_want(rejecting.size());
    local.distributions(whole, rejecting, rows_want);
    sampler.distributions(local, own, round.row_ranks, rejecting, rows_got);
    for (size_t q = 0; q < rejecting.size(); ++q)
      if (rows_got[q].size() != rows_want[q].size() ||
          std::memcmp(rows_got[q].data(), rows_want[q].data(), rows_want[q].size() * 4) != 0) {
        std::printf("round %zu: the distribution of row %lld differs\n", index,
                    static_cast<long long>(rejecting[q].logits_row));
        ok = false;
      }
    checked += static_cast<int64_t>(checks.size());
    rejected += static_cast<int64_t>(rejecting.size());
    bool others = false;
    for (const int64_t g : round.sampled) others |= round.row_ranks[g] != 0;
    // Input logprobs of every row (scoring), in reverse order, with top
    // alternatives, asked-for ids and a temperature on some.
    std::vector<LogprobQuery> queries;
    const std::vector<int32_t> ids = {0, 9, kVocab - 1};
    for (int64_t g = total - 1; g >= 0; --g)
      queries.push_back({g, static_cast<int32_t>((7 * g) % kVocab), g % 4,
                         g % 2 ? std::span<const int32_t>(ids) : std::span<const int32_t>(),
                         g % 3 == 1 ? 0.7 : 1.0});
    std::vector<TokenLogprob> scored(queries.size()), want_scored(queries.size());
    local.score(whole, queries, want_scored);
    const int runs_scored = rank_rows.runs;
    sampler.score(local, own, round.row_ranks, queries, scored);
    for (size_t i = 0; i < queries.size(); ++i) {
      const SampleResult a{scored[i].token_id, scored[i].logprob, scored[i].top,
                           scored[i].token_ids};
      const SampleResult b{want_scored[i].token_id, want_scored[i].logprob, want_scored[i].top,
                           want_scored[i].token_ids};
      if (!same(a, b)) {
        std::printf("round %zu query %zu (logits row %lld): logprob %g, want %g\n", index, i,
                    static_cast<long long>(queries[i].logits_row), a.logprob, b.logprob);
        ok = false;
      }
    }
    bool scored_on_workers = false;
    for (const int rank : round.row_ranks) scored_on_workers |= rank != 0;
    if ((rank_rows.runs > runs_scored) != scored_on_workers) {
      std::printf("round %zu: scoring made %d exchanges\n", index, rank_rows.runs - runs_scored);
      ok = false;
    }
    if ((runs_scored > runs_before) != others) {
      std::printf("round %zu: %d exchanges for rows %s on the workers\n", index,
                  runs_scored - runs_before, others ? "" : "not");
      ok = false;
    }
  }
  rank_rows.stop();
  // (Three ranks leave one run of rows on a rank: one check; the others
  // make both outcomes.)
  if (checked == 0 || (checked > 1 && (rejected == 0 || rejected == checked))) {
    std::printf("%lld draft checks, %lld rejecting: the rounds test too little\n",
                static_cast<long long>(checked), static_cast<long long>(rejected));
    ok = false;
  }
  // Every round's sampled rows counted on their ranks, the failed round's not.
  int64_t counted = 0;
  for (const int64_t n : sampled_per_rank) counted += n;
  int64_t sampled = 0;
  for (const Round& round : all)
    if (!round.workers_lost_logits) sampled += static_cast<int64_t>(round.sampled.size());
  if (counted != sampled) {
    std::printf("%lld rows counted on ranks, %lld sampled\n", static_cast<long long>(counted),
                static_cast<long long>(sampled));
    ok = false;
  }
  return ok;
}

bool worker(parallel::Communicator& group, int tensor) {
  CpuSampler local;
  const std::vector<Round> all = rounds(group.size() / tensor);
  bool ok = true;
  serve_test_commands(group, [&](int64_t round, std::span<const int64_t> payload) {
    const auto index = static_cast<size_t>(round);
    if (index >= all.size()) {
      ok = false;
      return;
    }
    const Tensor own = all[index].workers_lost_logits
                           ? Tensor::empty({0, kVocab}, DType::F32)
                           : held_logits(all[index], static_cast<int>(index), group.rank(), tensor);
    serve_own_rows(own, payload, local, group);
  });
  return ok;
}

void run_group(int size, int tensor) {
  parallel::run_forked_group(size, [tensor](parallel::Communicator& group) {
    return group.rank() == 0 ? leader(group, tensor) : worker(group, tensor);
  });
}

TEST(RankSampler, TwoRanksMatchOneSampler) {
  run_group(2, 1);
}
TEST(RankSampler, ThreeRanksMatchOneSampler) {
  run_group(3, 1);
}
TEST(RankSampler, ReplicasOfTwoTensorRanksMatchOneSampler) {
  run_group(4, 2);
}

}  // namespace
}  // namespace megactx::testing
