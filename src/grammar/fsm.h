// Finite automata for rule bodies: Thompson NFA from an expression, subset
// construction, Hopcroft minimisation. Besides bytes a DFA edge may call a
// rule (the pushdown part of the grammar) or read one whole named token; the
// minimiser treats both as alphabet symbols. Call-free automata also support
// products (intersection, difference), used for number bounds and
// pattern-with-length strings.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "grammar/grammar_ir.h"

namespace megactx::grammar {

struct DfaByteEdge {
  uint8_t lo;
  uint8_t hi;
  int32_t target;
};

// Calls: label = rule id. Tokens: label >= 0 is a token id; label < 0 is
// -(expr + 1) of an AnyTokenExcept expression.
struct DfaLabelEdge {
  int32_t label;
  int32_t target;
};

struct Dfa {
  int32_t start = 0;
  std::vector<uint8_t> final;
  std::vector<std::vector<DfaByteEdge>> bytes;  // sorted, disjoint per state
  std::vector<std::vector<DfaLabelEdge>> calls;
  std::vector<std::vector<DfaLabelEdge>> tokens;

  int32_t num_states() const { return static_cast<int32_t>(final.size()); }
  int32_t add_state();
  bool call_free() const;
};

struct FsmLimits {
  int64_t max_nfa_nodes = 4'000'000;
  int64_t max_dfa_states = 250'000;
};

// `what` names the rule in error messages. Rules for which inline_rule says
// true are expanded in place instead of called (inline_all_rules: every rule,
// giving a call-free automaton); inlining a rule inside itself is an error.
using InlineRule = std::function<bool(int32_t rule)>;
Dfa build_dfa(const Grammar& grammar, ExprId body, const FsmLimits& limits, std::string_view what,
              const InlineRule& inline_rule = {});
bool inline_all_rules(int32_t rule);

// Removes states that cannot reach a final state (every call is assumed to
// return), merges equivalent states and numbers them breadth-first from the
// start, which becomes state 0. An automaton of no string keeps one dead start.
void minimize(Dfa& dfa);

// Call-free automata only.
Dfa intersect(const Dfa& a, const Dfa& b);
Dfa subtract(const Dfa& a, const Dfa& b);  // strings of a that b rejects

// A Graph expression with the automaton's edges, for embedding a product back
// into a grammar.
ExprId dfa_to_expr(Grammar& grammar, const Dfa& dfa);

}  // namespace megactx::grammar
