#include "engine/rank_sampler.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "core/error.h"
#include "model/group_model.h"

namespace megactx {
namespace {

// Rows and results travel as packed bytes: plain values in host order (every
// rank is the same build on one host's kind of CPU), lists as a count then
// their elements.
class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
  template <class T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &value, sizeof(T));
  }
  template <class T>
  void list(std::span<const T> values) {
    put<int64_t>(static_cast<int64_t>(values.size()));
    const size_t at = out_.size();
    out_.resize(at + values.size_bytes());
    if (!values.empty()) std::memcpy(out_.data() + at, values.data(), values.size_bytes());
  }

 private:
  std::vector<uint8_t>& out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    MEGACTX_CHECK(in_.size() - at_ >= sizeof(T), "rank sampling: a message cut short");
    T value;
    std::memcpy(&value, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  template <class T>
  std::vector<T> list() {
    const auto count = get<int64_t>();
    MEGACTX_CHECK(count >= 0 && static_cast<uint64_t>(count) <= (in_.size() - at_) / sizeof(T),
                  "rank sampling: a list of {} elements in {} bytes", count, in_.size() - at_);
    std::vector<T> out(static_cast<size_t>(count));
    if (count > 0) std::memcpy(out.data(), in_.data() + at_, out.size() * sizeof(T));
    at_ += out.size() * sizeof(T);
    return out;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  std::span<const uint8_t> in_;
  size_t at_ = 0;
};

using TokenPairs = std::vector<std::pair<int32_t, float>>;

void put_pairs(Writer& out, const TokenPairs& pairs) {
  out.put<int64_t>(static_cast<int64_t>(pairs.size()));
  for (const auto& [token, value] : pairs) {
    out.put<int32_t>(token);
    out.put<float>(value);
  }
}

TokenPairs get_pairs(Reader& in) {
  const auto count = in.get<int64_t>();
  MEGACTX_CHECK(count >= 0, "rank sampling: {} pairs", count);
  TokenPairs out;
  for (int64_t i = 0; i < count; ++i) {
    const auto token = in.get<int32_t>();
    out.emplace_back(token, in.get<float>());
  }
  return out;
}

// The parameters sampling_distribution reads (temperature, top-k / top-p /
// min-p), first in every row that carries a transform.
void put_transform(Writer& out, const SamplingParams& p) {
  out.put<double>(p.temperature);
  out.put<double>(p.top_p);
  out.put<int64_t>(p.top_k);
  out.put<double>(p.min_p);
}
void get_transform(Reader& in, SamplingParams& p) {
  p.temperature = in.get<double>();
  p.top_p = in.get<double>();
  p.top_k = in.get<int64_t>();
  p.min_p = in.get<double>();
}

// One row: what the samplers read of a SamplingRow and its parameters
// (engine/sampler.h). `logits_row` is the row's index among its rank's rows.
// The prompt's distinct tokens go only with a repetition penalty, the only
// thing that reads them.
void put_row(Writer& out, const SamplingRow& row, int64_t logits_row) {
  const SamplingParams& p = *row.params;
  out.put<int64_t>(logits_row);
  put_transform(out, p);
  out.put<double>(p.presence_penalty);
  out.put<double>(p.frequency_penalty);
  out.put<double>(p.repetition_penalty);
  put_pairs(out, p.logit_bias);
  out.put<uint8_t>(row.output_counts != nullptr);
  if (row.output_counts != nullptr) {
    out.put<int64_t>(static_cast<int64_t>(row.output_counts->size()));
    for (const auto& [token, count] : *row.output_counts) {
      out.put<int32_t>(token);
      out.put<int32_t>(count);
    }
  }
  out.list(p.repetition_penalty != 1.0 ? row.prompt_tokens : std::span<const int32_t>());
  out.list(row.masked_tokens);
  out.list(row.allowed);
  out.put<uint64_t>(row.seed);
  out.put<uint64_t>(row.draw_index);
  out.put<uint8_t>(row.want_logprob);
  out.put<int64_t>(row.top_logprobs);
  out.list(row.logprob_token_ids);
  out.put<double>(row.logprob_temperature);
}

// A decoded row: `row`'s plain fields, and the storage view() points it
// into (once every row is decoded: the rows' vector does not move then).
struct HeldRow {
  SamplingParams params;
  bool has_counts = false;
  std::unordered_map<int32_t, int32_t> counts;
  std::vector<int32_t> prompt_tokens, masked_tokens, logprob_token_ids;
  std::vector<uint32_t> allowed;
  SamplingRow row;

  SamplingRow view() const {
    SamplingRow out = row;
    out.params = &params;
    out.output_counts = has_counts ? &counts : nullptr;
    out.prompt_tokens = prompt_tokens;
    out.masked_tokens = masked_tokens;
    out.allowed = allowed;
    out.logprob_token_ids = logprob_token_ids;
    return out;
  }
};

void get_row(Reader& in, HeldRow& held) {
  SamplingParams& p = held.params;
  SamplingRow& row = held.row;
  row = SamplingRow{};
  row.logits_row = in.get<int64_t>();
  get_transform(in, p);
  p.presence_penalty = in.get<double>();
  p.frequency_penalty = in.get<double>();
  p.repetition_penalty = in.get<double>();
  p.logit_bias = get_pairs(in);
  held.counts.clear();
  held.has_counts = in.get<uint8_t>() != 0;
  if (held.has_counts) {
    const auto count = in.get<int64_t>();
    MEGACTX_CHECK(count >= 0, "rank sampling: {} output counts", count);
    for (int64_t i = 0; i < count; ++i) {
      const auto token = in.get<int32_t>();
      held.counts[token] = in.get<int32_t>();
    }
  }
  held.prompt_tokens = in.list<int32_t>();
  held.masked_tokens = in.list<int32_t>();
  held.allowed = in.list<uint32_t>();
  row.seed = in.get<uint64_t>();
  row.draw_index = in.get<uint64_t>();
  row.want_logprob = in.get<uint8_t>() != 0;
  row.top_logprobs = in.get<int64_t>();
  held.logprob_token_ids = in.list<int32_t>();
  row.logprob_temperature = in.get<double>();
}

// Answers (a sample or a score: the same four fields under other names):
// a status byte (0: answered; 1: an error message follows), then each one's
// token, logprob, top alternatives and asked-for ids.
void put_answer(Writer& out, int32_t token, float logprob, const TokenPairs& top,
                const TokenPairs& ids) {
  out.put<int32_t>(token);
  out.put<float>(logprob);
  put_pairs(out, top);
  put_pairs(out, ids);
}
void put_answer(Writer& out, const SampleResult& r) {
  put_answer(out, r.token, r.logprob, r.top, r.token_ids);
}
void put_answer(Writer& out, const TokenLogprob& s) {
  put_answer(out, s.token_id, s.logprob, s.top, s.token_ids);
}

template <class Answer>
void put_answers(Writer& out, const std::vector<Answer>& answers) {
  out.put<uint8_t>(0);
  for (const Answer& a : answers) put_answer(out, a);
}

void get_answer(Reader& in, int32_t& token, float& logprob, TokenPairs& top, TokenPairs& ids) {
  token = in.get<int32_t>();
  logprob = in.get<float>();
  top = get_pairs(in);
  ids = get_pairs(in);
}
void get_answer(Reader& in, SampleResult& r) {
  get_answer(in, r.token, r.logprob, r.top, r.token_ids);
}
void get_answer(Reader& in, TokenLogprob& s) {
  get_answer(in, s.token_id, s.logprob, s.top, s.token_ids);
}

// One logprob query (LogprobQuery), `logits_row` its rank's row.
void put_query(Writer& out, const LogprobQuery& query, int64_t logits_row) {
  out.put<int64_t>(logits_row);
  out.put<int32_t>(query.token);
  out.put<int64_t>(query.top_logprobs);
  out.list(query.token_ids);
  out.put<double>(query.temperature);
}

struct HeldQuery {
  LogprobQuery query;
  std::vector<int32_t> token_ids;
  LogprobQuery view() const {
    LogprobQuery out = query;
    out.token_ids = token_ids;
    return out;
  }
};

void get_query(Reader& in, HeldQuery& held) {
  held.query = LogprobQuery{};
  held.query.logits_row = in.get<int64_t>();
  held.query.token = in.get<int32_t>();
  held.query.top_logprobs = in.get<int64_t>();
  held.token_ids = in.list<int32_t>();
  held.query.temperature = in.get<double>();
}

// A draft check (DraftCheck) and a distribution query (DistributionQuery),
// `logits_row` their rank's row: the transform, then their lists.
void put_check(Writer& out, const DraftCheck& check, int64_t logits_row) {
  out.put<int64_t>(logits_row);
  put_transform(out, *check.params);
  out.list(check.drafts);
  out.list(check.q_at_draft);
  out.list(check.allowed);
  out.put<uint64_t>(check.seed);
  out.put<uint64_t>(check.first_draw);
}

struct HeldCheck {
  SamplingParams params;
  std::vector<int32_t> drafts;
  std::vector<float> q_at_draft;
  std::vector<uint32_t> allowed;
  DraftCheck check;
  DraftCheck view() const {
    DraftCheck out = check;
    out.params = &params;
    out.drafts = drafts;
    out.q_at_draft = q_at_draft;
    out.allowed = allowed;
    return out;
  }
};

void get_check(Reader& in, HeldCheck& held) {
  held.check = DraftCheck{};
  held.check.logits_row = in.get<int64_t>();
  get_transform(in, held.params);
  held.drafts = in.list<int32_t>();
  held.q_at_draft = in.list<float>();
  held.allowed = in.list<uint32_t>();
  held.check.seed = in.get<uint64_t>();
  held.check.first_draw = in.get<uint64_t>();
}

void put_distribution_query(Writer& out, const DistributionQuery& query, int64_t logits_row) {
  out.put<int64_t>(logits_row);
  put_transform(out, *query.params);
  out.list(query.allowed);
}

struct HeldDistributionQuery {
  SamplingParams params;
  std::vector<uint32_t> allowed;
  DistributionQuery query;
  DistributionQuery view() const {
    DistributionQuery out = query;
    out.params = &params;
    out.allowed = allowed;
    return out;
  }
};

void get_distribution_query(Reader& in, HeldDistributionQuery& held) {
  held.query = DistributionQuery{};
  held.query.logits_row = in.get<int64_t>();
  get_transform(in, held.params);
  held.allowed = in.list<uint32_t>();
}

void put_answer(Writer& out, const DraftVerdict& verdict) {
  out.put<int64_t>(verdict.accepted);
  out.put<int32_t>(verdict.bonus);
}
void get_answer(Reader& in, DraftVerdict& verdict) {
  verdict.accepted = in.get<int64_t>();
  verdict.bonus = in.get<int32_t>();
}
void put_answer(Writer& out, const std::vector<float>& distribution) {
  out.list(std::span<const float>(distribution));
}
void get_answer(Reader& in, std::vector<float>& distribution) {
  distribution = in.list<float>();
}

// The command's payload: the ranks named (n), the bytes of each one's
// rows, then every rank's rows in rank order, packed into int64 words.
std::vector<int64_t> encode_rows(const std::vector<std::vector<uint8_t>>& bytes) {
  std::vector<int64_t> words = {static_cast<int64_t>(bytes.size())};
  size_t total = 0;
  for (const std::vector<uint8_t>& b : bytes) {
    words.push_back(static_cast<int64_t>(b.size()));
    total += b.size();
  }
  const size_t head = words.size();
  words.resize(head + (total + sizeof(int64_t) - 1) / sizeof(int64_t), 0);
  auto* packed = reinterpret_cast<uint8_t*>(words.data() + head);
  for (const std::vector<uint8_t>& b : bytes) {
    if (!b.empty()) std::memcpy(packed, b.data(), b.size());
    packed += b.size();
  }
  return words;
}

// Group rank `rank`'s rows out of encode_rows' words (checked: the words
// come over the group).
std::vector<uint8_t> rows_of(std::span<const int64_t> words, int rank) {
  MEGACTX_CHECK(!words.empty(), "rank sampling: an empty command");
  const int64_t named = words[0];
  MEGACTX_CHECK(named >= 0 && static_cast<uint64_t>(named) < words.size(),
                "rank sampling: a command naming {} ranks in {} words", named, words.size());
  const auto head = static_cast<size_t>(1 + named);
  const auto room = static_cast<uint64_t>(words.size() - head) * sizeof(int64_t);
  uint64_t at = 0, mine = 0;
  for (int64_t r = 0; r < named; ++r) {
    const int64_t bytes = words[static_cast<size_t>(1 + r)];
    MEGACTX_CHECK(bytes >= 0 && static_cast<uint64_t>(bytes) <= room - at,
                  "rank sampling: {} bytes of rows for rank {} past the command's {}", bytes, r,
                  room);
    if (r < rank) at += static_cast<uint64_t>(bytes);
    if (r == rank) mine = static_cast<uint64_t>(bytes);
  }
  if (rank >= named) return {};
  const auto* packed = reinterpret_cast<const uint8_t*>(words.data() + head);
  return std::vector<uint8_t>(packed + at, packed + at + mine);
}

// Every rank's results to rank 0: rank 0 gets them in rank order with their
// sizes; the others send `mine`.
std::vector<uint8_t> exchange_results(parallel::Communicator& group,
                                      const std::vector<uint8_t>& mine,
                                      std::vector<int64_t>& result_bytes) {
  const auto size = static_cast<size_t>(group.size());
  const auto own = static_cast<int64_t>(mine.size());
  result_bytes.assign(size, 0);
  group.all_gather(&own, result_bytes.data(), sizeof(int64_t));
  const bool leader = group.rank() == 0;
  std::vector<int64_t> send(size, 0), receive(size, 0);
  if (!leader) send[0] = own;
  int64_t total = 0;
  if (leader) {
    receive = result_bytes;
    receive[0] = 0;
    for (const int64_t bytes : receive) {
      MEGACTX_CHECK(bytes >= 0, "rank sampling: {} bytes of results", bytes);
      total += bytes;
    }
  }
  std::vector<uint8_t> all(static_cast<size_t>(total));
  group.all_to_all(mine.data(), send, all.data(), receive);
  return all;
}

// What one command sends: each item's group rank and row among that rank's
// rows (the items are logits rows' samples or scores), rank r's items in
// order, and the bytes that carry them (a kind byte first).
struct Placed {
  std::vector<int> rank;
  std::vector<int64_t> local;
  std::vector<std::vector<size_t>> of_rank;
  std::vector<std::vector<uint8_t>> bytes;
  bool only_rank_0() const { return of_rank.size() <= 1; }
};

constexpr uint8_t kSample = 0, kScore = 1, kCheckDrafts = 2, kDistribution = 3;

// Places `count` items by their logits rows (row_of(i)) on the ranks holding
// those rows.
template <class RowOf>
Placed place(size_t count, std::span<const int> row_ranks, const RankRows& rank_rows, uint8_t kind,
             RowOf row_of) {
  // Each logits row's index among its data-parallel rank's rows.
  std::vector<int64_t> local_row(row_ranks.size());
  std::unordered_map<int, int64_t> held;
  for (size_t r = 0; r < row_ranks.size(); ++r) local_row[r] = held[row_ranks[r]]++;
  Placed out;
  for (size_t i = 0; i < count; ++i) {
    const int64_t row = row_of(i);
    MEGACTX_CHECK(row >= 0 && row < static_cast<int64_t>(row_ranks.size()),
                  "sampler: logits row {} of {}", row, row_ranks.size());
    const int share = row_ranks[static_cast<size_t>(row)];
    MEGACTX_CHECK(share >= 0, "sampler: logits row {} on rank {}", row, share);
    const int rank = rank_rows.holder(share);
    const auto r = static_cast<size_t>(rank);
    if (out.of_rank.size() <= r) {
      out.of_rank.resize(r + 1);
      out.bytes.resize(r + 1);
    }
    if (rank != 0 && out.bytes[r].empty()) out.bytes[r].push_back(kind);
    out.of_rank[r].push_back(i);
    out.rank.push_back(share);
    out.local.push_back(local_row[static_cast<size_t>(row)]);
  }
  return out;
}

// Rank 0's side of one command: the placed items out, `own()` (rank 0's
// items) while the others work, then read(item, Reader&) for each item of
// every other rank, in order. An error in `own` or a rank's reported error
// is an Error after the exchange (the ranks stay in step).
template <class Own, class Read>
void lead(RankRows& rank_rows, const Placed& placed, Own own, Read read) {
  rank_rows.run(encode_rows(placed.bytes), [&](parallel::Communicator& group) {
    MEGACTX_CHECK(placed.of_rank.size() <= static_cast<size_t>(group.size()),
                  "sampler: rows of rank {} in a group of {}", placed.of_rank.size() - 1,
                  group.size());
    std::string own_error;
    try {
      own();
    } catch (const std::exception& error) {  // any: the others wait for the exchange below
      own_error = error.what();
    }
    std::vector<int64_t> result_bytes;
    const std::vector<uint8_t> all = exchange_results(group, {}, result_bytes);
    MEGACTX_CHECK(own_error.empty(), "{}", own_error);
    size_t at = 0;
    for (size_t rank = 1; rank < result_bytes.size(); ++rank) {
      Reader in(std::span<const uint8_t>(all).subspan(at, static_cast<size_t>(result_bytes[rank])));
      at += static_cast<size_t>(result_bytes[rank]);
      const size_t count = rank < placed.of_rank.size() ? placed.of_rank[rank].size() : 0;
      if (count == 0 && result_bytes[rank] == 0) continue;
      if (in.get<uint8_t>() != 0) {
        const std::vector<char> message = in.list<char>();
        fail("rank {} could not sample its rows: {}", rank,
             std::string(message.begin(), message.end()));
      }
      for (size_t i = 0; i < count; ++i) read(placed.of_rank[rank][i], in);
      MEGACTX_CHECK(in.done(), "rank sampling: rank {} sent more results than rows", rank);
    }
  });
}

// One command of rank 0 over `items` (rows to sample, or queries to
// score): each goes to the rank that holds its logits row (put(Writer&,
// item, its row there)), rank 0's own ones to answer_own(items, answers)
// with their rows made local, and answers[i] gets item i's answer. The own
// vectors are the caller's, reused across steps.
template <class Item, class Answer, class Put, class AnswerOwn>
void answer_at_ranks(RankRows& rank_rows, std::span<const int> row_ranks, uint8_t kind,
                     std::span<const Item> items, std::span<Answer> answers,
                     std::vector<Item>& own_items, std::vector<Answer>& own_answers, Put put,
                     AnswerOwn answer_own) {
  MEGACTX_CHECK(answers.size() >= items.size(), "sampler: {} answers for {} rows", answers.size(),
                items.size());
  Placed placed = place(items.size(), row_ranks, rank_rows, kind,
                        [&](size_t i) { return items[i].logits_row; });
  own_items.clear();
  for (size_t i = 0; i < items.size(); ++i) {
    const auto rank = static_cast<size_t>(rank_rows.holder(placed.rank[i]));
    if (rank == 0) {
      own_items.push_back(items[i]);
      own_items.back().logits_row = placed.local[i];
    } else {
      Writer out(placed.bytes[rank]);
      put(out, items[i], placed.local[i]);
    }
  }
  if (items.empty()) return;
  own_answers.assign(own_items.size(), Answer{});  // fresh: no stale fields of a reused vector
  const auto own = [&] {
    if (!own_items.empty()) answer_own(own_items, own_answers);
  };
  if (placed.only_rank_0()) {
    own();  // nothing to send
  } else {
    lead(rank_rows, placed, own, [&](size_t i, Reader& in) { get_answer(in, answers[i]); });
  }
  for (size_t i = 0; i < own_items.size(); ++i)
    answers[placed.of_rank[0][i]] = std::move(own_answers[i]);
}

// A worker's items of one command (sampling rows or logprob queries: Held,
// read by get) answered by answer_all(items, answers) and written to `out`;
// their asked-for ids (ids_of) are checked first: the leader checked them,
// a bad one would read past the row.
template <class Held, class Answer, class Get, class IdsOf, class AnswerAll>
void answer_held(Reader& in, int64_t vocab, Get get, IdsOf ids_of, AnswerAll answer_all,
                 Writer& out) {
  std::vector<Held> held;
  while (!in.done()) get(in, held.emplace_back());
  std::vector<decltype(held.front().view())> items;
  items.reserve(held.size());
  for (const Held& h : held) {
    items.push_back(h.view());
    for (const int32_t id : ids_of(items.back()))
      MEGACTX_CHECK(id >= 0 && id < vocab, "sampler: logprob of token {} of {}", id, vocab);
  }
  std::vector<Answer> answers(items.size());
  answer_all(items, answers);
  put_answers(out, answers);
}

}  // namespace

void RankSampler::sample(Sampler& local, const Tensor& own_logits, std::span<const int> row_ranks,
                         std::span<const SamplingRow> rows, std::span<SampleResult> results,
                         std::vector<int64_t>& sampled_per_rank) {
  for (size_t i = 0; i < rows.size(); ++i)
    MEGACTX_CHECK(rows[i].params != nullptr, "sampler: row {} has no parameters", i);
  answer_at_ranks(rank_rows_, row_ranks, kSample, rows, results, own_rows_, own_results_, put_row,
                  [&](const std::vector<SamplingRow>& own, std::vector<SampleResult>& out) {
                    local.sample(own_logits, own, out);
                  });
  // Every row was placed, so its logits row is one of row_ranks'.
  for (const SamplingRow& row : rows) {
    const auto share = static_cast<size_t>(row_ranks[static_cast<size_t>(row.logits_row)]);
    if (sampled_per_rank.size() <= share) sampled_per_rank.resize(share + 1, 0);
    ++sampled_per_rank[share];
  }
}

void RankSampler::score(Sampler& local, const Tensor& own_logits, std::span<const int> row_ranks,
                        std::span<const LogprobQuery> queries, std::span<TokenLogprob> results) {
  answer_at_ranks(rank_rows_, row_ranks, kScore, queries, results, own_queries_, own_scores_,
                  put_query,
                  [&](const std::vector<LogprobQuery>& own, std::vector<TokenLogprob>& out) {
                    local.score(own_logits, own, out);
                  });
}

void RankSampler::check_drafts(Sampler& local, const Tensor& own_logits,
                               std::span<const int> row_ranks, std::span<const DraftCheck> checks,
                               std::span<DraftVerdict> verdicts) {
  for (const DraftCheck& check : checks) {
    // A request's k + 1 rows are on one rank (its data-parallel rank): the
    // check goes where its first row is and reads the rows after it there.
    const int64_t last = check.logits_row + static_cast<int64_t>(check.drafts.size());
    MEGACTX_CHECK(check.params != nullptr && check.logits_row >= 0 &&
                      last < static_cast<int64_t>(row_ranks.size()),
                  "sampler: a draft check of rows {} .. {} of {}", check.logits_row, last,
                  row_ranks.size());
    for (int64_t row = check.logits_row + 1; row <= last; ++row)
      MEGACTX_CHECK(
          row_ranks[static_cast<size_t>(row)] == row_ranks[static_cast<size_t>(check.logits_row)],
          "sampler: a draft check's rows on ranks {} and {}",
          row_ranks[static_cast<size_t>(check.logits_row)], row_ranks[static_cast<size_t>(row)]);
  }
  answer_at_ranks(rank_rows_, row_ranks, kCheckDrafts, checks, verdicts, own_checks_, own_verdicts_,
                  put_check,
                  [&](const std::vector<DraftCheck>& own, std::vector<DraftVerdict>& out) {
                    local.check_drafts(own_logits, own, out);
                  });
}

void RankSampler::distributions(Sampler& local, const Tensor& own_logits,
                                std::span<const int> row_ranks,
                                std::span<const DistributionQuery> queries,
                                std::span<std::vector<float>> out) {
  for (const DistributionQuery& query : queries)
    MEGACTX_CHECK(query.params != nullptr, "sampler: a distribution query without parameters");
  answer_at_ranks(
      rank_rows_, row_ranks, kDistribution, queries, out, own_distribution_queries_,
      own_distributions_, put_distribution_query,
      [&](const std::vector<DistributionQuery>& own, std::vector<std::vector<float>>& answers) {
        local.distributions(own_logits, own, answers);
      });
}

void serve_own_rows(const Tensor& own_logits, std::span<const int64_t> command, Sampler& local,
                    parallel::Communicator& group) {
  std::vector<uint8_t> reply;
  Writer out(reply);
  try {
    const std::vector<uint8_t> mine = rows_of(command, group.rank());
    if (!mine.empty()) {
      Reader in(mine);
      const int64_t vocab = own_logits.dim(1);
      const auto kind = in.get<uint8_t>();
      if (kind == kSample) {
        answer_held<HeldRow, SampleResult>(
            in, vocab, get_row, [](const SamplingRow& r) { return r.logprob_token_ids; },
            [&](const auto& rows, auto& results) { local.sample(own_logits, rows, results); }, out);
      } else if (kind == kCheckDrafts) {
        // The drafts are checked against the vocabulary by check_drafts.
        answer_held<HeldCheck, DraftVerdict>(
            in, vocab, get_check, [](const DraftCheck&) { return std::span<const int32_t>(); },
            [&](const auto& checks, auto& verdicts) {
              local.check_drafts(own_logits, checks, verdicts);
            },
            out);
      } else if (kind == kDistribution) {
        answer_held<HeldDistributionQuery, std::vector<float>>(
            in, vocab, get_distribution_query,
            [](const DistributionQuery&) { return std::span<const int32_t>(); },
            [&](const auto& queries, auto& answers) {
              local.distributions(own_logits, queries, answers);
            },
            out);
      } else {
        MEGACTX_CHECK(kind == kScore, "rank sampling: a command of kind {}", kind);
        answer_held<HeldQuery, TokenLogprob>(
            in, vocab, get_query, [](const LogprobQuery& q) { return q.token_ids; },
            [&](const auto& queries, auto& scores) { local.score(own_logits, queries, scores); },
            out);
      }
    }
  } catch (const std::exception& error) {
    // Rank 0 waits for these results: it gets the reason instead, and the
    // group stays in step.
    reply.clear();
    out.put<uint8_t>(1);
    const std::string what = error.what();
    out.list(std::span<const char>(what.data(), what.size()));
  }
  std::vector<int64_t> ignored;
  exchange_results(group, reply, ignored);
}

}  // namespace megactx
