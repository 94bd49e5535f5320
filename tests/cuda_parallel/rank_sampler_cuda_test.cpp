// Each rank samples its own rows on its device (engine/rank_sampler.h with
// the CudaSampler, as data-parallel attention on GPUs does): 2 forked ranks
// on one GPU, each holding its rows' logits in device memory, sample rows the
// kernel takes (greedy, temperature with top-k / top-p / min-p, seeds,
// logprobs with top alternatives, a grammar mask) and rows it leaves to the
// host (penalties, logit_bias, asked-for ids), and score input logprobs.
// Rank 0 must get exactly what one CudaSampler gives over every row in one
// device tensor (a row's result does not depend on the rows beside it). And
// the rejection-sampling checks of requests whose rows are on one rank each.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <unordered_map>
#include <vector>

#include "../parallel/forked_group.h"
#include "../parallel/test_rank_rows.h"
#include "core/error.h"
#include "cuda_group_helpers.h"
#include "engine/cpu_sampler.h"
#include "engine/cuda_sampler.h"
#include "engine/rank_sampler.h"
#include "kernels/cuda/common/cuda_check.h"

namespace megactx::testing {
namespace {

constexpr int64_t kVocab = 4096;
constexpr int64_t kRows = 10;  // logits rows; row g on data-parallel rank g % 2

std::vector<float> row_logits(int64_t row) {
  std::mt19937 rng(static_cast<uint32_t>(row + 7));
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> out(kVocab);
  for (float& x : out) x = normal(rng);
  return out;
}

// `rows` logits rows in device memory (freed with the tensor).
Tensor device_logits(const std::vector<int64_t>& rows) {
  std::vector<float> host;
  for (const int64_t g : rows) {
    const std::vector<float> values = row_logits(g);
    host.insert(host.end(), values.begin(), values.end());
  }
  void* data = nullptr;
  const size_t bytes = std::max<size_t>(host.size() * sizeof(float), 4);
  MEGACTX_CUDA_CHECK(cudaMalloc(&data, bytes));
  if (!host.empty())
    MEGACTX_CUDA_CHECK(
        cudaMemcpy(data, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  return Tensor::adopt(data, {static_cast<int64_t>(rows.size()), kVocab}, DType::F32, Device::CUDA,
                       [](void* p) { cudaFree(p); });
}

std::vector<int64_t> rows_of_rank(int rank) {
  std::vector<int64_t> out;
  for (int64_t g = 0; g < kRows; ++g)
    if (g % 2 == rank) out.push_back(g);
  return out;
}

struct Specs {
  std::vector<SamplingParams> params;
  std::unordered_map<int32_t, int32_t> counts = {{3, 2}, {40, 1}};
  std::vector<int32_t> ids = {1, 2, 4000};
  std::vector<uint32_t> allowed;
};

std::vector<SamplingRow> sampling_rows(Specs& s) {
  s.params.assign(kRows, SamplingParams{});
  s.allowed.assign(kVocab / 32, 0);
  for (int32_t t = 0; t < kVocab; t += 5) s.allowed[t / 32] |= 1u << (t % 32);
  std::vector<SamplingRow> rows;
  for (int64_t g = kRows - 1; g >= 0; --g) {  // out of order
    SamplingParams& p = s.params[static_cast<size_t>(g)];
    SamplingRow row;
    row.logits_row = g;
    row.params = &p;
    row.seed = 11 + static_cast<uint64_t>(g);
    row.draw_index = static_cast<uint64_t>(g);
    row.want_logprob = true;
    row.top_logprobs = g % 3;
    switch (g % 5) {
      case 0:
        p.temperature = 0.0;
        break;
      case 1:
        p.temperature = 0.9;
        p.top_k = 50;
        p.top_p = 0.9;
        break;
      case 2:
        p.temperature = 1.1;
        p.min_p = 0.02;
        row.allowed = s.allowed;
        break;
      case 3:  // the host's: penalties and asked-for ids
        p.frequency_penalty = 0.5;
        p.repetition_penalty = 1.2;
        row.output_counts = &s.counts;
        row.logprob_token_ids = s.ids;
        break;
      default:  // the host's: logit_bias
        p.logit_bias = {{9, 4.0f}};
        break;
    }
    rows.push_back(row);
  }
  return rows;
}

bool same(const SampleResult& a, const SampleResult& b) {
  const auto pairs = [](const auto& x, const auto& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].first != y[i].first || std::memcmp(&x[i].second, &y[i].second, 4) != 0) return false;
    return true;
  };
  return a.token == b.token && std::memcmp(&a.logprob, &b.logprob, 4) == 0 && pairs(a.top, b.top) &&
         pairs(a.token_ids, b.token_ids);
}

bool leader(parallel::Communicator& group) {
  CudaSampler local(0);
  TestRankRows rank_rows(group, 1);
  RankSampler sampler(rank_rows);
  Specs specs;
  const std::vector<SamplingRow> rows = sampling_rows(specs);
  std::vector<int> row_ranks;
  std::vector<int64_t> all;
  for (int64_t g = 0; g < kRows; ++g) {
    row_ranks.push_back(static_cast<int>(g % 2));
    all.push_back(g);
  }
  const Tensor whole = device_logits(all);
  const Tensor own = device_logits(rows_of_rank(0));
  std::vector<SampleResult> want(rows.size()), got(rows.size());
  CudaSampler reference(0);
  reference.sample(whole, rows, want);
  std::vector<int64_t> per_rank;
  rank_rows.round = 0;
  sampler.sample(local, own, row_ranks, rows, got, per_rank);
  bool ok = per_rank.size() == 2 && per_rank[0] == kRows / 2 && per_rank[1] == kRows / 2;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (same(got[i], want[i])) continue;
    std::printf("row %zu (logits row %lld): token %d logprob %g, one sampler %d %g\n", i,
                static_cast<long long>(rows[i].logits_row), got[i].token, got[i].logprob,
                want[i].token, want[i].logprob);
    ok = false;
  }
  // Input logprobs of every row.
  std::vector<LogprobQuery> queries;
  for (int64_t g = 0; g < kRows; ++g)
    queries.push_back({g, static_cast<int32_t>(g * 13), g % 4,
                       g % 2 ? std::span<const int32_t>(specs.ids) : std::span<const int32_t>(),
                       g % 3 == 0 ? 0.8 : 1.0});
  std::vector<TokenLogprob> want_scores(queries.size()), got_scores(queries.size());
  reference.score(whole, queries, want_scores);
  rank_rows.round = 1;
  sampler.score(local, own, row_ranks, queries, got_scores);
  for (size_t i = 0; i < queries.size(); ++i) {
    const SampleResult a{got_scores[i].token_id, got_scores[i].logprob, got_scores[i].top,
                         got_scores[i].token_ids};
    const SampleResult b{want_scores[i].token_id, want_scores[i].logprob, want_scores[i].top,
                         want_scores[i].token_ids};
    if (same(a, b)) continue;
    std::printf("query %zu: logprob %g, one sampler %g\n", i, a.logprob, b.logprob);
    ok = false;
  }
  rank_rows.stop();
  std::printf("2 ranks on one GPU, each sampling its rows with the CudaSampler: %s\n",
              ok ? "equal to one sampler" : "DIFFERENT");
  return ok;
}

bool worker(parallel::Communicator& group) {
  CudaSampler local(0);
  const Tensor own = device_logits(rows_of_rank(group.rank()));
  serve_test_commands(group, [&](int64_t, std::span<const int64_t> payload) {
    serve_own_rows(own, payload, local, group);
  });
  return true;
}

// Rejection-sampling checks where the rows are (Sampler::check_drafts and
// distributions through CudaSampler::rows_on_host): two requests of 4 rows,
// rows 0-3 on rank 0 and 4-7 on rank 1, with and without a grammar mask;
// verdicts and the rejecting rows' distributions bit-equal to the
// CpuSampler's over the same rows on the host.
constexpr int64_t kCheckRows = 8;

std::vector<int64_t> check_rows_of_rank(int rank) {
  std::vector<int64_t> out;
  for (int64_t g = 4 * rank; g < 4 * rank + 4; ++g) out.push_back(g);
  return out;
}

bool check_leader(parallel::Communicator& group) {
  CudaSampler local(0);
  TestRankRows rank_rows(group, 1);
  RankSampler sampler(rank_rows);
  const std::vector<int> row_ranks = {0, 0, 0, 0, 1, 1, 1, 1};
  Tensor whole = Tensor::empty({kCheckRows, kVocab}, DType::F32);
  for (int64_t g = 0; g < kCheckRows; ++g) {
    const std::vector<float> values = row_logits(g);
    std::memcpy(whole.data<float>() + g * kVocab, values.data(), kVocab * sizeof(float));
  }
  const Tensor own = device_logits(check_rows_of_rank(0));
  SamplingParams params;
  params.temperature = 0.7;
  params.top_k = 64;
  const int64_t words = (kVocab + 31) / 32;
  std::vector<uint32_t> mask(static_cast<size_t>(4 * words), 0xffffffffu);
  for (int64_t r = 0; r < 4; ++r) mask[static_cast<size_t>(r * words)] = 0xfffffff0u;
  bool ok = true;
  for (int round = 0; round < 4; ++round) {
    // Each request's drafts: its rows' argmax (likely accepted), or another token.
    std::vector<std::vector<int32_t>> drafts(2);
    std::vector<std::vector<float>> q(2);
    for (int c = 0; c < 2; ++c)
      for (int64_t i = 0; i < 3; ++i) {
        const int64_t g = 4 * c + i;
        const bool favourite = (round + i) % 3 != 2;
        const std::vector<float> logits = row_logits(g);
        drafts[c].push_back(favourite ? megactx::argmax(std::span<const float>(logits))
                                      : static_cast<int32_t>((97 * g + 13 * round) % kVocab));
        q[c].push_back(favourite ? 0.02f : 0.4f);
      }
    std::vector<DraftCheck> checks(2);
    for (int c = 0; c < 2; ++c) {
      checks[c].logits_row = 4 * c;
      checks[c].params = &params;
      checks[c].drafts = drafts[c];
      checks[c].q_at_draft = q[c];
      if ((round + c) % 2) checks[c].allowed = mask;
      checks[c].seed = 1234 + static_cast<uint64_t>(c);
      checks[c].first_draw = static_cast<uint64_t>(round) * 8;
    }
    CpuSampler reference;
    std::vector<DraftVerdict> want(2), got(2);
    reference.check_drafts(whole, checks, want);
    rank_rows.round = 2 * round;
    sampler.check_drafts(local, own, row_ranks, checks, got);
    std::vector<DistributionQuery> rejecting;
    for (int c = 0; c < 2; ++c) {
      if (got[c].accepted != want[c].accepted || got[c].bonus != want[c].bonus) {
        std::printf("round %d request %d: %lld accepted, bonus %d; one sampler %lld, %d\n", round,
                    c, static_cast<long long>(got[c].accepted), got[c].bonus,
                    static_cast<long long>(want[c].accepted), want[c].bonus);
        ok = false;
      }
      if (want[c].accepted < 3) {
        DistributionQuery query;
        query.logits_row = 4 * c + want[c].accepted;
        query.params = &params;
        if (!checks[c].allowed.empty())
          query.allowed = std::span<const uint32_t>(mask).subspan(
              static_cast<size_t>(want[c].accepted * words), static_cast<size_t>(words));
        rejecting.push_back(query);
      }
    }
    std::vector<std::vector<float>> want_rows(rejecting.size()), got_rows(rejecting.size());
    reference.distributions(whole, rejecting, want_rows);
    rank_rows.round = 2 * round + 1;
    sampler.distributions(local, own, row_ranks, rejecting, got_rows);
    for (size_t r = 0; r < rejecting.size(); ++r)
      if (got_rows[r] != want_rows[r]) {
        std::printf("round %d: the distribution of row %lld differs\n", round,
                    static_cast<long long>(rejecting[r].logits_row));
        ok = false;
      }
  }
  rank_rows.stop();
  std::printf("2 ranks on one GPU, each checking its requests' drafts: %s\n",
              ok ? "equal to one sampler" : "DIFFERENT");
  return ok;
}

bool check_worker(parallel::Communicator& group) {
  CudaSampler local(0);
  const Tensor own = device_logits(check_rows_of_rank(group.rank()));
  serve_test_commands(group, [&](int64_t, std::span<const int64_t> payload) {
    serve_own_rows(own, payload, local, group);
  });
  return true;
}

TEST(RankSamplerCuda, RanksCheckTheirRequestsDraftsAsOneSampler) {
  if (gpus_by_nvidia_smi() < 1) GTEST_SKIP() << "no GPU (nvidia-smi lists none)";
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    return group.rank() == 0 ? check_leader(group) : check_worker(group);
  });
}

TEST(RankSamplerCuda, RanksSampleTheirDeviceRowsAsOneSampler) {
  if (gpus_by_nvidia_smi() < 1) GTEST_SKIP() << "no GPU (nvidia-smi lists none)";
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    return group.rank() == 0 ? leader(group) : worker(group);
  });
}

}  // namespace
}  // namespace megactx::testing
