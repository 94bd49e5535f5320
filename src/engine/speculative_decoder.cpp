#include "engine/speculative_decoder.h"

#include <algorithm>

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

int32_t SpeculativeDecoder::sample(Sequence& s, std::span<const float> logits) {
  if (greedy(s)) return argmax(logits);
  return draw_from(sampling_distribution(s.params, logits), uniform(s));
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
    const MtpRefill refill{&added.draft, 0, added.pages, next, out.hidden_states.data<float>()};
    run_mtp_refill(*mtp_, *cache_, std::span<const MtpRefill>(&refill, 1));
  }
  emit(added, std::span<const int32_t>(&first, 1));
  return id;
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
  std::vector<MtpDraftRequest> drafts(n);
  for (size_t i = 0; i < n; ++i) {
    Sequence& s = sequences_[ids[i]];
    ensure_pages(s, s.cached + k + 1);
    MtpDraftRequest& d = drafts[i];
    d.state = &s.draft;
    d.pages = s.pages;
    d.cached = s.cached;
    d.steps = k;
    d.params = &s.params;
    d.uniform = [&s, this] { return uniform(s); };
  }
  run_mtp_drafts(*mtp_, *cache_, options_.share, drafts);

  // Verification: one target forward over [x_m, d_1..d_k] per sequence.
  std::vector<std::vector<int32_t>> verify_tokens(n);
  ForwardBatch batch;
  batch.want_hidden_states = true;
  for (size_t i = 0; i < n; ++i) {
    const Sequence& s = sequences_[ids[i]];
    verify_tokens[i].push_back(s.tokens.back());
    verify_tokens[i].insert(verify_tokens[i].end(), drafts[i].drafts.begin(),
                            drafts[i].drafts.end());
    batch.sequences.push_back(SequenceInput{verify_tokens[i], s.cached, s.pages, 0});
  }
  const ForwardOutput out = target_.forward(batch, *cache_);

  std::vector<MtpRefill> refills;
  std::vector<std::vector<int32_t>> next(n);
  for (size_t i = 0; i < n; ++i) {
    Sequence& s = sequences_[ids[i]];
    const int64_t base = static_cast<int64_t>(i) * (k + 1);  // rows of this sequence
    std::vector<std::span<const float>> logits;
    for (int64_t r = 0; r <= k; ++r) logits.push_back(row_of(out.logits, base + r));
    const VerifyResult result =
        verify_drafts(s.params, options_.sampled_mode, logits, drafts[i].drafts, drafts[i].q,
                      [&s, this] { return uniform(s); });
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
    next[i] = result.tokens;  // [d_1..d_a, x']
    refills.push_back(
        MtpRefill{&s.draft, start, s.pages, next[i], out.hidden_states.data<float>() + base * H});
  }
  run_mtp_refill(*mtp_, *cache_, refills);
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
        const MtpDraftState& d = s.draft;
        MEGACTX_CHECK(d.row == s.cached - 1 &&
                          static_cast<int64_t>(d.topk.size()) == target_.index_topk() &&
                          d.topk_count > 0 && d.topk_count <= s.cached,
                      "sequence {}: MTP step 0 of row {} has {} valid top-k of {} cached", i, d.row,
                      d.topk_count, s.cached);
        for (int64_t j = 0; j < d.topk_count; ++j) {
          MEGACTX_CHECK(d.topk[j] >= 0 && d.topk[j] < s.cached,
                        "sequence {}: MTP top-k position {} outside the {} cached", i, d.topk[j],
                        s.cached);
        }
      }
    }
  }
  allocator_.check_integrity(expected);
}

}  // namespace megactx
