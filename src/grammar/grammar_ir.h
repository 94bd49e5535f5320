// The grammar IR that every front end (JSON Schema, regex, GBNF) lowers to:
// named rules whose bodies are expressions over bytes, references to other
// rules and whole tokens. Text is UTF-8 and the automaton reads bytes, so a
// character class becomes the byte sequences of its UTF-8 encodings; a token
// whose bytes end inside a character is then handled like any other prefix.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace megactx::grammar {

struct ByteRange {
  uint8_t lo;
  uint8_t hi;
};

// Unicode scalar values [lo, hi]; surrogates are never encoded.
struct CodeRange {
  uint32_t lo;
  uint32_t hi;
};

enum class ExprKind : uint8_t {
  Empty,           // matches ""
  Nothing,         // matches no string
  Bytes,           // one byte out of `bytes`
  Seq,             // items in order
  Alt,             // any one of items
  Repeat,          // items[0] repeated [min, max] times (max -1: unbounded)
  RuleRef,         // the rule `rule`
  Token,           // one whole token out of `tokens` (named in the grammar)
  AnyTokenExcept,  // one whole non-special token not in `tokens`
  Graph,           // an explicit automaton whose edges carry expressions
};

using ExprId = int32_t;

// Graph edge from state `from` to `to` reading the expression `label`
// (-1: no input). Graphs express shapes whose regex form would be quadratic or
// exponential: JSON objects with optional properties, counters, products.
struct GraphEdge {
  int32_t from;
  int32_t to;
  ExprId label;
};

struct Expr {
  ExprKind kind = ExprKind::Empty;
  std::vector<ByteRange> bytes;
  std::vector<ExprId> items;
  int32_t min = 0;
  int32_t max = 0;
  int32_t rule = -1;
  std::vector<int32_t> tokens;
  int32_t num_states = 0;
  int32_t start = 0;
  std::vector<int32_t> finals;
  std::vector<GraphEdge> edges;
};

struct Rule {
  std::string name;
  ExprId body = -1;  // -1 until defined
};

class Grammar {
 public:
  Grammar();

  ExprId empty() const { return empty_; }
  ExprId nothing() const { return nothing_; }
  ExprId bytes(std::vector<ByteRange> ranges);
  ExprId byte(uint8_t b) { return bytes({{b, b}}); }
  ExprId literal(std::string_view text);  // the exact bytes of `text`
  ExprId seq(std::vector<ExprId> items);
  ExprId alt(std::vector<ExprId> items);
  ExprId repeat(ExprId item, int32_t min, int32_t max);
  ExprId star(ExprId item) { return repeat(item, 0, -1); }
  ExprId plus(ExprId item) { return repeat(item, 1, -1); }
  ExprId optional(ExprId item) { return repeat(item, 0, 1); }
  ExprId rule_ref(int32_t rule);
  ExprId token(std::vector<int32_t> ids);
  ExprId any_token_except(std::vector<int32_t> ids);
  ExprId graph(int32_t num_states, int32_t start, std::vector<int32_t> finals,
               std::vector<GraphEdge> edges);
  // One character out of `ranges`, as UTF-8 byte sequences.
  ExprId code_points(const std::vector<CodeRange>& ranges);

  int32_t add_rule(std::string name);  // declares; the body comes later
  void set_body(int32_t rule, ExprId body);
  int32_t find_rule(std::string_view name) const;  // -1 when absent
  // A fresh rule name starting with `prefix`, unique in this grammar.
  std::string fresh_name(std::string_view prefix);

  const Expr& expr(ExprId id) const { return exprs_[id]; }
  const std::vector<Rule>& rules() const { return rules_; }
  size_t num_exprs() const { return exprs_.size(); }

  int32_t root = -1;
  // Why parts of the grammar match no string, as the front end saw it (a
  // schema whose bounds contradict, say): the compile error names these
  // when the whole grammar ends up matching nothing. Parts in a branch that
  // another branch makes up for are listed too but never reported.
  std::vector<std::string> unsatisfiable;

 private:
  ExprId add(Expr expr);

  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
  std::unordered_map<std::string, int32_t> rule_index_;
  ExprId empty_ = -1;
  ExprId nothing_ = -1;
  int64_t fresh_counter_ = 0;
};

// Sorted, disjoint, merged code point ranges; `negate` complements over all
// scalar values.
std::vector<CodeRange> normalize_ranges(std::vector<CodeRange> ranges, bool negate = false);

// Appends the UTF-8 encoding of `code_point` to `out`.
void append_utf8(uint32_t code_point, std::string& out);

}  // namespace megactx::grammar
