#include "grammar/grammar_ir.h"

#include <algorithm>

#include "core/error.h"

namespace megactx::grammar {

namespace {

// Front ends can build expressions from attacker-controlled input; a bound on
// the IR keeps a pathological schema from exhausting memory.
constexpr size_t kMaxExprs = 4'000'000;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

int utf8_length(uint32_t cp) {
  if (cp < 0x80) return 1;
  if (cp < 0x800) return 2;
  if (cp < 0x10000) return 3;
  return 4;
}

void encode(uint32_t cp, int length, uint8_t* out) {
  switch (length) {
    case 1:
      out[0] = static_cast<uint8_t>(cp);
      break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
  }
}

// Splits [lo, hi] (same encoded length) until every byte position of the
// encodings ranges independently, then emits one byte-range sequence per part.
void utf8_sequences(uint32_t lo, uint32_t hi, int length,
                    std::vector<std::vector<ByteRange>>& out) {
  for (int i = 1; i < length; ++i) {
    const uint32_t mask = (1u << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        utf8_sequences(lo, lo | mask, length, out);
        utf8_sequences((lo | mask) + 1, hi, length, out);
        return;
      }
      if ((hi & mask) != mask) {
        utf8_sequences(lo, (hi & ~mask) - 1, length, out);
        utf8_sequences(hi & ~mask, hi, length, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode(lo, length, a);
  encode(hi, length, b);
  std::vector<ByteRange> sequence;
  for (int i = 0; i < length; ++i) sequence.push_back({a[i], b[i]});
  out.push_back(std::move(sequence));
}

}  // namespace

std::vector<CodeRange> normalize_ranges(std::vector<CodeRange> ranges, bool negate) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CodeRange& x, const CodeRange& y) { return x.lo < y.lo; });
  std::vector<CodeRange> merged;
  for (CodeRange r : ranges) {
    if (r.lo > r.hi) continue;
    r.hi = std::min(r.hi, kMaxCodePoint);
    if (r.lo > kMaxCodePoint) continue;
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  if (!negate) return merged;
  std::vector<CodeRange> complement;
  uint32_t next = 0;
  for (const CodeRange& r : merged) {
    if (r.lo > next) complement.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodePoint) complement.push_back({next, kMaxCodePoint});
  return complement;
}

void append_utf8(uint32_t code_point, std::string& out) {
  uint8_t bytes[4];
  const int length = utf8_length(code_point);
  encode(code_point, length, bytes);
  out.append(reinterpret_cast<const char*>(bytes), length);
}

Grammar::Grammar() {
  Expr e;
  e.kind = ExprKind::Empty;
  empty_ = add(e);
  e.kind = ExprKind::Nothing;
  nothing_ = add(e);
}

ExprId Grammar::add(Expr expr) {
  MEGACTX_CHECK(exprs_.size() < kMaxExprs, "grammar is too large (over {} expressions)", kMaxExprs);
  exprs_.push_back(std::move(expr));
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId Grammar::bytes(std::vector<ByteRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.lo < b.lo; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : ranges) {
    if (r.lo > r.hi) continue;
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  if (merged.empty()) return nothing_;
  Expr e;
  e.kind = ExprKind::Bytes;
  e.bytes = std::move(merged);
  return add(std::move(e));
}

ExprId Grammar::literal(std::string_view text) {
  std::vector<ExprId> items;
  items.reserve(text.size());
  for (char c : text) items.push_back(byte(static_cast<uint8_t>(c)));
  return seq(std::move(items));
}

ExprId Grammar::seq(std::vector<ExprId> items) {
  std::vector<ExprId> kept;
  for (ExprId item : items) {
    const Expr& e = exprs_[item];
    if (e.kind == ExprKind::Nothing) return nothing_;
    if (e.kind == ExprKind::Empty) continue;
    if (e.kind == ExprKind::Seq) {
      kept.insert(kept.end(), e.items.begin(), e.items.end());
    } else {
      kept.push_back(item);
    }
  }
  if (kept.empty()) return empty_;
  if (kept.size() == 1) return kept[0];
  Expr e;
  e.kind = ExprKind::Seq;
  e.items = std::move(kept);
  return add(std::move(e));
}

ExprId Grammar::alt(std::vector<ExprId> items) {
  std::vector<ExprId> kept;
  for (ExprId item : items) {
    const Expr& e = exprs_[item];
    if (e.kind == ExprKind::Nothing) continue;
    if (e.kind == ExprKind::Alt) {
      kept.insert(kept.end(), e.items.begin(), e.items.end());
    } else {
      kept.push_back(item);
    }
  }
  if (kept.empty()) return nothing_;
  if (kept.size() == 1) return kept[0];
  Expr e;
  e.kind = ExprKind::Alt;
  e.items = std::move(kept);
  return add(std::move(e));
}

ExprId Grammar::repeat(ExprId item, int32_t min, int32_t max) {
  MEGACTX_CHECK(min >= 0 && (max == -1 || max >= min), "bad repetition {{{},{}}}", min, max);
  const Expr& e = exprs_[item];
  if (max == 0 || e.kind == ExprKind::Empty) return empty_;
  if (e.kind == ExprKind::Nothing) return min == 0 ? empty_ : nothing_;
  if (min == 1 && max == 1) return item;
  Expr r;
  r.kind = ExprKind::Repeat;
  r.items = {item};
  r.min = min;
  r.max = max;
  return add(std::move(r));
}

ExprId Grammar::rule_ref(int32_t rule) {
  MEGACTX_CHECK(rule >= 0 && rule < static_cast<int32_t>(rules_.size()), "bad rule id {}", rule);
  Expr e;
  e.kind = ExprKind::RuleRef;
  e.rule = rule;
  return add(std::move(e));
}

ExprId Grammar::token(std::vector<int32_t> ids) {
  if (ids.empty()) return nothing_;
  Expr e;
  e.kind = ExprKind::Token;
  e.tokens = std::move(ids);
  return add(std::move(e));
}

ExprId Grammar::any_token_except(std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  Expr e;
  e.kind = ExprKind::AnyTokenExcept;
  e.tokens = std::move(ids);
  return add(std::move(e));
}

ExprId Grammar::graph(int32_t num_states, int32_t start, std::vector<int32_t> finals,
                      std::vector<GraphEdge> edges) {
  MEGACTX_CHECK(num_states > 0 && start >= 0 && start < num_states, "bad graph start");
  for (const GraphEdge& edge : edges) {
    MEGACTX_CHECK(edge.from >= 0 && edge.from < num_states && edge.to >= 0 && edge.to < num_states,
                  "bad graph edge");
  }
  Expr e;
  e.kind = ExprKind::Graph;
  e.num_states = num_states;
  e.start = start;
  e.finals = std::move(finals);
  e.edges = std::move(edges);
  return add(std::move(e));
}

ExprId Grammar::code_points(const std::vector<CodeRange>& input) {
  // Surrogates have no UTF-8 encoding: cut them out of every range.
  std::vector<CodeRange> ranges;
  for (const CodeRange& r : normalize_ranges(input)) {
    if (r.hi < 0xD800 || r.lo > 0xDFFF) {
      ranges.push_back(r);
      continue;
    }
    if (r.lo < 0xD800) ranges.push_back({r.lo, 0xD7FF});
    if (r.hi > 0xDFFF) ranges.push_back({0xE000, r.hi});
  }
  std::vector<std::vector<ByteRange>> sequences;
  static constexpr uint32_t kLengthEnds[4] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  for (const CodeRange& r : ranges) {
    uint32_t lo = r.lo;
    for (int length = 1; length <= 4 && lo <= r.hi; ++length) {
      if (lo > kLengthEnds[length - 1]) continue;
      const uint32_t hi = std::min(r.hi, kLengthEnds[length - 1]);
      utf8_sequences(lo, hi, length, sequences);
      lo = hi + 1;
    }
  }
  // Single-byte sequences merge into one byte set (ASCII classes stay one edge).
  std::vector<ByteRange> single;
  std::vector<ExprId> options;
  for (const auto& sequence : sequences) {
    if (sequence.size() == 1) {
      single.push_back(sequence[0]);
      continue;
    }
    std::vector<ExprId> items;
    for (const ByteRange& r : sequence) items.push_back(bytes({r}));
    options.push_back(seq(std::move(items)));
  }
  if (!single.empty()) options.insert(options.begin(), bytes(std::move(single)));
  return alt(std::move(options));
}

int32_t Grammar::add_rule(std::string name) {
  MEGACTX_CHECK(rule_index_.count(name) == 0, "rule '{}' is defined twice", name);
  const auto id = static_cast<int32_t>(rules_.size());
  rule_index_.emplace(name, id);
  rules_.push_back({std::move(name), -1});
  return id;
}

void Grammar::set_body(int32_t rule, ExprId body) {
  rules_.at(rule).body = body;
}

int32_t Grammar::find_rule(std::string_view name) const {
  auto it = rule_index_.find(std::string(name));
  return it == rule_index_.end() ? -1 : it->second;
}

std::string Grammar::fresh_name(std::string_view prefix) {
  for (;;) {
    std::string name = std::string(prefix) + "_" + std::to_string(fresh_counter_++);
    if (find_rule(name) < 0) return name;
  }
}

}  // namespace megactx::grammar
