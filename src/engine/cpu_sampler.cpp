#include "engine/cpu_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"

namespace megactx {

namespace {

constexpr double kGreedyTemperature = 1e-5;  // SGLang/vLLM treat smaller as greedy

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Order of "better" tokens: higher value first, lower id on ties.
struct BetterFirst {
  const float* values;
  bool operator()(int32_t a, int32_t b) const {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  }
};

}  // namespace

double sampling_uniform(uint64_t seed, uint64_t draw_index) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ (draw_index * 0xD1B54A32D192ED03ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

bool is_greedy(const SamplingParams& params) {
  return params.temperature < kGreedyTemperature || params.top_k == 1;
}

int32_t argmax(std::span<const float> values) {
  int32_t best = 0;
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i] > values[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

void log_softmax(std::span<const float> logits, std::span<float> out) {
  float max_value = -std::numeric_limits<float>::infinity();
  for (const float x : logits) max_value = std::max(max_value, x);
  double sum = 0.0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x - max_value));
  const float log_sum = static_cast<float>(std::log(sum)) + max_value;
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - log_sum;
}

std::vector<std::pair<int32_t, float>> top_entries(std::span<const float> values, int64_t n) {
  const size_t count = std::min(static_cast<size_t>(std::max<int64_t>(n, 0)), values.size());
  std::vector<int32_t> ids(values.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(count), ids.end(),
                    BetterFirst{values.data()});
  std::vector<std::pair<int32_t, float>> top;
  top.reserve(count);
  for (size_t i = 0; i < count; ++i) top.emplace_back(ids[i], values[static_cast<size_t>(ids[i])]);
  return top;
}

void apply_penalties(const SamplingRow& row, std::span<float> logits) {
  const SamplingParams& params = *row.params;
  const auto vocab = static_cast<int32_t>(logits.size());
  for (const auto& [token, bias] : params.logit_bias)
    if (token >= 0 && token < vocab) logits[static_cast<size_t>(token)] += bias;
  auto penalize_repetition = [&](int32_t token) {
    float& x = logits[static_cast<size_t>(token)];
    x = x > 0.0f ? x / static_cast<float>(params.repetition_penalty)
                 : x * static_cast<float>(params.repetition_penalty);
  };
  if (params.repetition_penalty != 1.0) {
    // A token in both prompt and output is penalized once.
    for (const int32_t token : row.prompt_tokens) {
      if (token >= 0 && token < vocab) penalize_repetition(token);
    }
    if (row.output_counts != nullptr) {
      for (const auto& [token, count] : *row.output_counts) {
        if (token < 0 || token >= vocab) continue;
        if (!std::binary_search(row.prompt_tokens.begin(), row.prompt_tokens.end(), token)) {
          penalize_repetition(token);
        }
      }
    }
  }
  if ((params.frequency_penalty != 0.0 || params.presence_penalty != 0.0) &&
      row.output_counts != nullptr) {
    for (const auto& [token, count] : *row.output_counts) {
      if (token < 0 || token >= vocab || count <= 0) continue;
      logits[static_cast<size_t>(token)] -=
          static_cast<float>(params.frequency_penalty * count + params.presence_penalty);
    }
  }
  for (const int32_t token : row.masked_tokens) {
    if (token >= 0 && token < vocab) {
      logits[static_cast<size_t>(token)] = -std::numeric_limits<float>::infinity();
    }
  }
  if (!row.allowed.empty()) apply_token_mask(row.allowed, logits);
}

void apply_token_mask(std::span<const uint32_t> allowed, std::span<float> logits) {
  MEGACTX_CHECK(allowed.size() * 32 >= logits.size(), "sampler: a mask of {} words for {} logits",
                allowed.size(), logits.size());
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (size_t word = 0; word * 32 < logits.size(); ++word) {
    const uint32_t bits = allowed[word];
    if (bits == 0xFFFFFFFFu) continue;
    const size_t end = std::min(logits.size(), word * 32 + 32);
    for (size_t i = word * 32; i < end; ++i)
      if (((bits >> (i & 31)) & 1u) == 0) logits[i] = kMasked;
  }
}

std::vector<float> sampling_distribution(const SamplingParams& params,
                                         std::span<const float> logits) {
  const size_t vocab = logits.size();
  std::vector<float> probs(vocab);
  const auto inverse_temperature = static_cast<float>(1.0 / params.temperature);
  float max_value = -std::numeric_limits<float>::infinity();
  for (const float x : logits) max_value = std::max(max_value, x);
  double sum = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    probs[i] = std::exp((logits[i] - max_value) * inverse_temperature);
    sum += probs[i];
  }
  const auto normalize = [&](double total) {
    const auto scale = static_cast<float>(1.0 / total);
    for (float& p : probs) p *= scale;
  };
  normalize(sum);

  // Candidates in (probability desc, id asc) order, only as far as needed.
  std::vector<int32_t> order;
  const bool use_top_k = params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab;
  const bool use_top_p = params.top_p < 1.0;
  if (use_top_k || use_top_p) {
    order.resize(vocab);
    std::iota(order.begin(), order.end(), 0);
    size_t keep = vocab;
    if (use_top_k) {
      keep = static_cast<size_t>(params.top_k);
      std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep - 1),
                       order.end(), BetterFirst{probs.data()});
      for (size_t i = keep; i < vocab; ++i) probs[static_cast<size_t>(order[i])] = 0.0f;
      order.resize(keep);
      double kept = 0.0;
      for (const int32_t id : order) kept += probs[static_cast<size_t>(id)];
      normalize(kept);
    }
    if (use_top_p) {
      // Keep tokens in order while the mass before them is at most top_p.
      // Only the kept prefix needs sorting: the best `sorted` candidates are
      // selected and sorted (O(V + m log m)), four times more until their
      // mass passes top_p, instead of sorting the whole vocabulary per row
      // (an 8K-vocabulary sort per draft and verified position was a quarter
      // of a sampled MTP step on the CPU). Same order, same sums: the same
      // distribution as a full sort.
      const BetterFirst better{probs.data()};
      size_t sorted = 0;
      size_t cut = order.size();  // first candidate dropped
      double before = 0.0;
      while (sorted < order.size()) {
        const size_t next = std::min(order.size(), std::max<size_t>(256, sorted * 4));
        const auto first = order.begin() + static_cast<std::ptrdiff_t>(sorted);
        const auto last = order.begin() + static_cast<std::ptrdiff_t>(next);
        if (next < order.size()) std::nth_element(first, last - 1, order.end(), better);
        std::sort(first, last, better);
        for (; sorted < next; ++sorted) {
          if (before > params.top_p) break;
          before += probs[static_cast<size_t>(order[sorted])];
        }
        if (before > params.top_p) {
          cut = sorted;
          break;
        }
      }
      for (size_t i = cut; i < order.size(); ++i) probs[static_cast<size_t>(order[i])] = 0.0f;
      normalize(before);
    }
  }
  if (params.min_p > 0.0) {
    float max_prob = 0.0f;
    for (const float p : probs) max_prob = std::max(max_prob, p);
    const auto threshold = static_cast<float>(params.min_p) * max_prob;
    double kept = 0.0;
    for (float& p : probs) {
      if (p < threshold) p = 0.0f;
      kept += p;
    }
    normalize(kept);
  }
  return probs;
}

namespace {

// log_softmax(raw / temperature) into `out` (temperature 1: of the raw logits).
void logprobs_of(std::span<const float> raw, double temperature, std::span<float> out) {
  if (temperature == 1.0) return log_softmax(raw, out);
  const auto inverse = static_cast<float>(1.0 / temperature);
  for (size_t i = 0; i < raw.size(); ++i) out[i] = raw[i] * inverse;
  log_softmax(out, out);  // reads every value before it writes any
}

// One row: penalties, the draw (or argmax) and the logprobs. `work` and
// `log_probs` are scratch of the vocabulary's size.
void sample_row(const SamplingRow& row, std::span<const float> raw, std::vector<float>& work,
                std::vector<float>& log_probs, SampleResult& result) {
  const SamplingParams& params = *row.params;
  std::copy(raw.begin(), raw.end(), work.begin());
  apply_penalties(row, work);
  if (is_greedy(params)) {
    result.token = argmax(work);
  } else {
    const std::vector<float> probs = sampling_distribution(params, work);
    const double u = sampling_uniform(row.seed, row.draw_index);
    double total = 0.0;
    for (const float p : probs) total += p;
    const double target = u * total;
    double cumulative = 0.0;
    int32_t chosen = -1;
    int32_t last_nonzero = 0;
    for (size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] <= 0.0f) continue;
      last_nonzero = static_cast<int32_t>(i);
      cumulative += probs[i];
      if (cumulative > target) {
        chosen = static_cast<int32_t>(i);
        break;
      }
    }
    // Rounding can leave target == total; the last kept token then wins.
    result.token = chosen >= 0 ? chosen : last_nonzero;
  }
  result.top.clear();
  result.token_ids.clear();
  if (row.want_logprob || row.top_logprobs > 0) {
    logprobs_of(raw, row.logprob_temperature, log_probs);
    result.logprob = log_probs[static_cast<size_t>(result.token)];
    if (row.top_logprobs > 0) result.top = top_entries(log_probs, row.top_logprobs);
    for (const int32_t id : row.logprob_token_ids)
      result.token_ids.emplace_back(id, log_probs[static_cast<size_t>(id)]);
  }
}

}  // namespace

void CpuSampler::sample(const Tensor& logits, std::span<const SamplingRow> rows,
                        std::span<SampleResult> results) {
  MEGACTX_CHECK(
      logits.device() == Device::CPU && logits.dtype() == DType::F32 && logits.rank() == 2,
      "CPU sampler needs host float32 logits [rows, vocab], got {}", shape_string(logits.shape()));
  MEGACTX_CHECK(results.size() >= rows.size(), "sampler: {} results for {} rows", results.size(),
                rows.size());
  const auto vocab = static_cast<size_t>(logits.dim(1));
  for (const SamplingRow& row : rows) {
    MEGACTX_CHECK(row.logits_row >= 0 && row.logits_row < logits.dim(0),
                  "sampler: logits row {} of {}", row.logits_row, logits.dim(0));
  }
  // Rows are independent (each has its own seed and draw index), so any split
  // over threads gives the same tokens.
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> work(vocab);
    std::vector<float> log_probs(vocab);
    for (int64_t r = begin; r < end; ++r) {
      const SamplingRow& row = rows[static_cast<size_t>(r)];
      std::span<const float> raw(logits.data<float>() + static_cast<size_t>(row.logits_row) * vocab,
                                 vocab);
      sample_row(row, raw, work, log_probs, results[static_cast<size_t>(r)]);
    }
  };
  const auto count = static_cast<int64_t>(rows.size());
  if (count > 1 && static_cast<int64_t>(vocab) * count >= (int64_t{1} << 18)) {
    ThreadPool::global().parallel_for(count, run);
  } else {
    run(0, count);
  }
}

void Sampler::score(const Tensor&, std::span<const LogprobQuery>, std::span<TokenLogprob>) {
  fail("this sampler cannot score input tokens (logprob_start_len)");
}

void CpuSampler::score(const Tensor& logits, std::span<const LogprobQuery> queries,
                       std::span<TokenLogprob> results) {
  MEGACTX_CHECK(
      logits.device() == Device::CPU && logits.dtype() == DType::F32 && logits.rank() == 2,
      "CPU sampler needs host float32 logits [rows, vocab], got {}", shape_string(logits.shape()));
  MEGACTX_CHECK(results.size() >= queries.size(), "sampler: {} results for {} queries",
                results.size(), queries.size());
  const auto vocab = static_cast<size_t>(logits.dim(1));
  for (const LogprobQuery& query : queries) {
    MEGACTX_CHECK(query.logits_row >= 0 && query.logits_row < logits.dim(0) && query.token >= 0 &&
                      static_cast<size_t>(query.token) < vocab,
                  "sampler: logprob query for row {} token {} of [{}, {}]", query.logits_row,
                  query.token, logits.dim(0), vocab);
  }
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> log_probs(vocab);
    for (int64_t i = begin; i < end; ++i) {
      const LogprobQuery& query = queries[static_cast<size_t>(i)];
      std::span<const float> raw(
          logits.data<float>() + static_cast<size_t>(query.logits_row) * vocab, vocab);
      logprobs_of(raw, query.temperature, log_probs);
      TokenLogprob& result = results[static_cast<size_t>(i)];
      result.token_id = query.token;
      result.logprob = log_probs[static_cast<size_t>(query.token)];
      result.top.clear();
      if (query.top_logprobs > 0) result.top = top_entries(log_probs, query.top_logprobs);
      result.token_ids.clear();
      for (const int32_t id : query.token_ids)
        result.token_ids.emplace_back(id, log_probs[static_cast<size_t>(id)]);
    }
  };
  const auto count = static_cast<int64_t>(queries.size());
  if (count > 1 && static_cast<int64_t>(vocab) * count >= (int64_t{1} << 18)) {
    ThreadPool::global().parallel_for(count, run);
  } else {
    run(0, count);
  }
}

}  // namespace megactx
