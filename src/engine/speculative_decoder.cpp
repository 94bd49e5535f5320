#include "engine/speculative_decoder.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "engine/cpu_sampler.h"
#include "model/model_loader.h"

namespace megactx {
namespace {

std::span<const float> row_of(const Tensor& t, int64_t row) {
  const int64_t width = t.shape().back();
  return {t.data<float>() + row * width, static_cast<size_t>(width)};
}

}  // namespace

SpeculativeDecoder::SpeculativeDecoder(DsaModel& target, MtpLayer* mtp, SpeculativeOptions options)
    : target_(target), mtp_(mtp), options_(options), allocator_(options.num_pages) {
  MEGACTX_CHECK(options_.steps >= 0 && options_.steps <= 7,
                "--speculative-steps must be in [0, 7], got {}", options_.steps);
  MEGACTX_CHECK(options_.steps == 0 || mtp_ != nullptr,
                "speculative decoding needs the model's MTP layer");
  MEGACTX_CHECK(options_.num_pages > 0, "SpeculativeDecoder: num_pages must be positive");
  MEGACTX_CHECK(options_.sampled_mode != VerifyMode::Greedy,
                "sampled_mode must be RejectionSampling or TargetOnly");
  const ModelConfig& config = target_.config();
  KvCacheSpec spec = mtp_ ? make_mtp_kv_cache_spec(config, options_.num_pages, options_.kv_dtype)
                          : make_kv_cache_spec(config, options_.num_pages, options_.kv_dtype);
  cache_ = std::make_unique<PagedKvCache>(spec);
}

bool SpeculativeDecoder::greedy(const Sequence& s) const {
  return is_greedy(s.params);
}

double SpeculativeDecoder::uniform(Sequence& s) {
  return std::generate_canonical<double, 53>(s.rng);
}

std::vector<float> SpeculativeDecoder::distribution(const Sequence& s,
                                                    std::span<const float> logits) const {
  return sampling_distribution(s.params, logits);
}

int32_t SpeculativeDecoder::sample(Sequence& s, std::span<const float> logits) {
  if (greedy(s)) return argmax(logits);
  return draw_from(distribution(s, logits), uniform(s));
}

void SpeculativeDecoder::ensure_pages(Sequence& s, int64_t positions) {
  const int64_t page_size = cache_->spec().page_size;
  const int64_t needed = (positions + page_size - 1) / page_size;
  while (static_cast<int64_t>(s.pages.size()) < needed) {
    const std::optional<int32_t> page = allocator_.allocate();
    MEGACTX_CHECK(page.has_value(), "KV cache full: {} pages in use", allocator_.num_used());
    s.pages.push_back(*page);
  }
}

void SpeculativeDecoder::trim_pages(Sequence& s, int64_t positions) {
  const int64_t page_size = cache_->spec().page_size;
  const int64_t needed = (positions + page_size - 1) / page_size;
  while (static_cast<int64_t>(s.pages.size()) > needed) {
    allocator_.release(s.pages.back());
    s.pages.pop_back();
  }
}

void SpeculativeDecoder::emit(Sequence& s, std::span<const int32_t> tokens) {
  for (const int32_t token : tokens) {
    if (s.finished) return;
    s.tokens.push_back(token);
    s.output.push_back(token);
    const bool eos =
        !s.params.ignore_eos && std::find(s.eos.begin(), s.eos.end(), token) != s.eos.end();
    if (eos || static_cast<int64_t>(s.output.size()) >= s.params.max_new_tokens) {
      s.finished = true;
    }
  }
}

int64_t SpeculativeDecoder::add(std::span<const int32_t> prompt, const SamplingParams& params,
                                std::span<const int32_t> eos) {
  MEGACTX_CHECK(!prompt.empty(), "empty prompt");
  MEGACTX_CHECK(params.max_new_tokens > 0, "max_new_tokens must be positive");
  MEGACTX_CHECK(params.presence_penalty == 0.0 && params.frequency_penalty == 0.0 &&
                    params.repetition_penalty == 1.0 && params.min_new_tokens == 0,
                "speculative decoding does not support penalties or min_new_tokens");
  Sequence s;
  s.tokens.assign(prompt.begin(), prompt.end());
  s.params = params;
  s.eos.assign(eos.begin(), eos.end());
  s.rng.seed(params.seed.value_or(0));
  const int64_t n = static_cast<int64_t>(prompt.size());
  ensure_pages(s, n + 1);

  ForwardBatch batch;
  batch.want_hidden_states = mtp_ != nullptr && options_.steps > 0;
  batch.sequences.push_back(SequenceInput{prompt, 0, s.pages, -1});
  const ForwardOutput out = target_.forward(batch, *cache_);
  s.cached = n;
  const int32_t first = sample(s, row_of(out.logits, 0));
  const int64_t id = static_cast<int64_t>(sequences_.size());
  sequences_.push_back(std::move(s));
  Sequence& added = sequences_.back();
  if (batch.want_hidden_states) {
    // MTP prefill: rows 0..n-1 read (token_{t+1}, h_t).
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    next.push_back(first);
    const int64_t H = target_.config().hidden_size;
    std::vector<float> hidden(out.hidden_states.data<float>(),
                              out.hidden_states.data<float>() + n * H);
    const std::vector<int64_t> ids{id}, starts{0};
    refill(ids, std::span<const std::vector<float>>(&hidden, 1), starts,
           std::span<const std::vector<int32_t>>(&next, 1));
  }
  emit(added, std::span<const int32_t>(&first, 1));
  return id;
}

void SpeculativeDecoder::refill(std::span<const int64_t> ids,
                                std::span<const std::vector<float>> hidden,
                                std::span<const int64_t> starts,
                                std::span<const std::vector<int32_t>> next) {
  std::vector<MtpLayer::Rows> rows(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    Sequence& s = sequences_[ids[i]];
    rows[i].start = starts[i];
    rows[i].count = static_cast<int64_t>(next[i].size());
    rows[i].pages = s.pages;
    rows[i].next_tokens = next[i];
    rows[i].hidden = hidden[i].data();
    rows[i].target_hidden = true;
  }
  const MtpLayer::Output out = mtp_->run(rows, *cache_);
  for (size_t i = 0; i < ids.size(); ++i) {
    Sequence& s = sequences_[ids[i]];
    const auto logits = row_of(out.logits, static_cast<int64_t>(i));
    const auto hand = row_of(out.hand_off, static_cast<int64_t>(i));
    s.draft_logits.assign(logits.begin(), logits.end());
    s.hand_off.assign(hand.begin(), hand.end());
    s.topk = out.last_topk[i];
    s.topk_count = out.last_count[i];
  }
}

bool SpeculativeDecoder::plain_step(std::span<const int64_t> ids) {
  ForwardBatch batch;
  for (const int64_t id : ids) {
    Sequence& s = sequences_[id];
    ensure_pages(s, s.cached + 1);
    batch.sequences.push_back(
        SequenceInput{std::span<const int32_t>(&s.tokens.back(), 1), s.cached, s.pages, -1});
  }
  const ForwardOutput out = target_.forward(batch, *cache_);
  for (size_t i = 0; i < ids.size(); ++i) {
    Sequence& s = sequences_[ids[i]];
    s.cached += 1;
    const int32_t token = sample(s, row_of(out.logits, static_cast<int64_t>(i)));
    emit(s, std::span<const int32_t>(&token, 1));
  }
  return true;
}

bool SpeculativeDecoder::step() {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < sequences_.size(); ++i) {
    if (!sequences_[i].finished) ids.push_back(static_cast<int64_t>(i));
  }
  if (ids.empty()) return false;
  if (options_.steps == 0) return plain_step(ids);

  const int64_t k = options_.steps;
  const int64_t H = target_.config().hidden_size;
  const size_t n = ids.size();
  // drafts[i]: [k] tokens; q[i]: [k] distributions (empty when greedy).
  std::vector<std::vector<int32_t>> drafts(n);
  std::vector<std::vector<std::vector<float>>> q(n);
  std::vector<std::vector<float>> hand(n);
  for (size_t i = 0; i < n; ++i) {
    Sequence& s = sequences_[ids[i]];
    ensure_pages(s, s.cached + k + 1);
    std::vector<float> qi = greedy(s) ? std::vector<float>{} : distribution(s, s.draft_logits);
    drafts[i].push_back(greedy(s) ? argmax(s.draft_logits) : draw_from(qi, uniform(s)));
    q[i].push_back(std::move(qi));
    hand[i] = s.hand_off;
  }
  // Draft steps 1..k-1, one row per sequence at position cached - 1 + j.
  for (int64_t j = 1; j < k; ++j) {
    std::vector<MtpLayer::Rows> rows(n);
    for (size_t i = 0; i < n; ++i) {
      const Sequence& s = sequences_[ids[i]];
      MtpLayer::Rows& r = rows[i];
      r.start = s.cached - 1 + j;
      r.count = 1;
      r.pages = s.pages;
      r.next_tokens = std::span<const int32_t>(&drafts[i].back(), 1);
      r.hidden = hand[i].data();
      r.target_hidden = false;
      if (options_.share) {
        r.shared = true;
        r.shared_context = s.cached;
        r.shared_topk = s.topk;
        r.shared_count = s.topk_count;
      }
    }
    const MtpLayer::Output out = mtp_->run(rows, *cache_);
    for (size_t i = 0; i < n; ++i) {
      Sequence& s = sequences_[ids[i]];
      const auto logits = row_of(out.logits, static_cast<int64_t>(i));
      const auto h = row_of(out.hand_off, static_cast<int64_t>(i));
      hand[i].assign(h.begin(), h.end());
      std::vector<float> qi = greedy(s) ? std::vector<float>{} : distribution(s, logits);
      drafts[i].push_back(greedy(s) ? argmax(logits) : draw_from(qi, uniform(s)));
      q[i].push_back(std::move(qi));
    }
  }

  // Verification: one target forward over [x_m, d_1..d_k] per sequence.
  std::vector<std::vector<int32_t>> verify_tokens(n);
  ForwardBatch batch;
  batch.want_hidden_states = true;
  for (size_t i = 0; i < n; ++i) {
    const Sequence& s = sequences_[ids[i]];
    verify_tokens[i].push_back(s.tokens.back());
    verify_tokens[i].insert(verify_tokens[i].end(), drafts[i].begin(), drafts[i].end());
    batch.sequences.push_back(SequenceInput{verify_tokens[i], s.cached, s.pages, 0});
  }
  const ForwardOutput out = target_.forward(batch, *cache_);

  std::vector<int64_t> refill_ids, starts;
  std::vector<std::vector<float>> hidden;
  std::vector<std::vector<int32_t>> next;
  for (size_t i = 0; i < n; ++i) {
    Sequence& s = sequences_[ids[i]];
    const int64_t base = static_cast<int64_t>(i) * (k + 1);  // rows of this sequence
    VerifyResult result;
    if (greedy(s)) {
      std::vector<std::span<const float>> logits;
      for (int64_t r = 0; r <= k; ++r) logits.push_back(row_of(out.logits, base + r));
      result = verify_greedy(logits, drafts[i]);
    } else {
      std::vector<std::vector<float>> p;
      for (int64_t r = 0; r <= k; ++r) p.push_back(distribution(s, row_of(out.logits, base + r)));
      const auto u = [&s, this] { return uniform(s); };
      result = options_.sampled_mode == VerifyMode::TargetOnly
                   ? verify_target_only(p, drafts[i], u)
                   : verify_rejection(p, q[i], drafts[i], u);
    }
    const int64_t a = result.accepted;
    s.stats.verify_count += 1;
    s.stats.draft_tokens += k;
    s.stats.accepted_tokens += a;
    // Rollback: positions m..m+a stay (x_m, d_1..d_a); m+a+1..m+k are stale.
    const int64_t start = s.cached;
    s.cached = start + a + 1;
    trim_pages(s, s.cached + 1);
    emit(s, result.tokens);
    if (s.finished) continue;
    // Refill rows m..m+a of the MTP cache from the target's hidden states.
    refill_ids.push_back(ids[i]);
    starts.push_back(start);
    next.push_back(result.tokens);  // [d_1..d_a, x']
    const float* h = out.hidden_states.data<float>() + base * H;
    hidden.emplace_back(h, h + (a + 1) * H);
  }
  if (!refill_ids.empty()) refill(refill_ids, hidden, starts, next);
  return true;
}

void SpeculativeDecoder::release(int64_t id) {
  Sequence& s = sequences_.at(id);
  MEGACTX_CHECK(s.finished, "release: sequence {} is still running", id);
  if (s.released) return;
  for (const int32_t page : s.pages) allocator_.release(page);
  s.pages.clear();
  s.released = true;
}

void SpeculativeDecoder::check_integrity() const {
  std::vector<int32_t> expected(static_cast<size_t>(allocator_.num_pages()), 0);
  const int64_t page_size = cache_->spec().page_size;
  for (size_t i = 0; i < sequences_.size(); ++i) {
    const Sequence& s = sequences_[i];
    if (s.released) {
      MEGACTX_CHECK(s.pages.empty(), "sequence {}: released but holds pages", i);
      continue;
    }
    for (const int32_t page : s.pages) ++expected.at(static_cast<size_t>(page));
    MEGACTX_CHECK(static_cast<int64_t>(s.pages.size()) * page_size >= s.cached,
                  "sequence {}: {} pages do not cover {} cached positions", i, s.pages.size(),
                  s.cached);
    MEGACTX_CHECK(
        static_cast<int64_t>(s.pages.size()) <= (s.cached + 1 + page_size - 1) / page_size,
        "sequence {}: {} pages kept past the rollback ({} cached)", i, s.pages.size(), s.cached);
    if (!s.finished) {
      MEGACTX_CHECK(s.cached == static_cast<int64_t>(s.tokens.size()) - 1,
                    "sequence {}: {} cached positions for {} tokens (the last is not cached)", i,
                    s.cached, s.tokens.size());
      if (mtp_ && options_.steps > 0) {
        MEGACTX_CHECK(static_cast<int64_t>(s.topk.size()) == target_.index_topk() &&
                          s.topk_count > 0 && s.topk_count <= s.cached,
                      "sequence {}: MTP step-0 top-k has {} valid of {} cached", i, s.topk_count,
                      s.cached);
        for (int64_t j = 0; j < s.topk_count; ++j) {
          MEGACTX_CHECK(s.topk[j] >= 0 && s.topk[j] < s.cached,
                        "sequence {}: MTP top-k position {} outside the {} cached", i, s.topk[j],
                        s.cached);
        }
      }
    }
  }
  allocator_.check_integrity(expected);
}

}  // namespace megactx
