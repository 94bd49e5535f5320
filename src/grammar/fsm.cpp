#include "grammar/fsm.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace megactx::grammar {

namespace {

// Expression nesting the NFA builder follows by recursion; front ends bound
// their own nesting well below this.
constexpr int kMaxExprDepth = 4000;

struct NfaNode {
  std::vector<int32_t> eps;
  std::vector<std::pair<ByteRange, int32_t>> bytes;
  std::vector<std::pair<int32_t, int32_t>> calls;   // (rule, target)
  std::vector<std::pair<int32_t, int32_t>> tokens;  // (label, target)
};

class NfaBuilder {
 public:
  NfaBuilder(const Grammar& grammar, const FsmLimits& limits, std::string_view what,
             const InlineRule& inline_rule)
      : grammar_(grammar), limits_(limits), what_(what), inline_rule_(inline_rule) {}

  int32_t add() {
    if (static_cast<int64_t>(nodes_.size()) >= limits_.max_nfa_nodes) {
      fail(
          "rule '{}' is too large: its automaton exceeds {} NFA states (lower the repetition "
          "counts or lengths)",
          what_, limits_.max_nfa_nodes);
    }
    nodes_.emplace_back();
    return static_cast<int32_t>(nodes_.size() - 1);
  }

  // Builds `id` starting at node `from`; returns the node where it ends. Loops
  // always go through fresh nodes, so `from` may be shared by alternatives.
  int32_t build(ExprId id, int32_t from, int depth) {
    MEGACTX_CHECK(depth < kMaxExprDepth, "rule '{}' nests expressions deeper than {}", what_,
                  kMaxExprDepth);
    const Expr& e = grammar_.expr(id);
    switch (e.kind) {
      case ExprKind::Empty:
        return from;
      case ExprKind::Nothing:
        return add();  // unreachable end: no edge leads there
      case ExprKind::Bytes: {
        const int32_t to = add();
        for (const ByteRange& r : e.bytes) nodes_[from].bytes.push_back({r, to});
        return to;
      }
      case ExprKind::Seq: {
        int32_t at = from;
        for (ExprId item : e.items) at = build(item, at, depth + 1);
        return at;
      }
      case ExprKind::Alt: {
        const int32_t to = add();
        for (ExprId item : e.items) {
          const int32_t end = build(item, from, depth + 1);
          nodes_[end].eps.push_back(to);
        }
        return to;
      }
      case ExprKind::Repeat: {
        const ExprId item = e.items[0];
        const int32_t min = e.min;
        const int32_t max = e.max;
        int32_t at = from;
        for (int32_t i = 0; i < min; ++i) at = build(item, at, depth + 1);
        if (max == -1) {
          const int32_t loop = add();
          nodes_[at].eps.push_back(loop);
          const int32_t end = build(item, loop, depth + 1);
          nodes_[end].eps.push_back(loop);
          return loop;
        }
        const int32_t to = add();
        for (int32_t i = min; i < max; ++i) {
          nodes_[at].eps.push_back(to);
          const int32_t next = add();
          nodes_[at].eps.push_back(next);
          at = build(item, next, depth + 1);
        }
        nodes_[at].eps.push_back(to);
        return to;
      }
      case ExprKind::RuleRef: {
        if (inline_rule_ && inline_rule_(e.rule)) {
          // Inlining a rule inside itself would never end.
          if (std::find(inlining_.begin(), inlining_.end(), e.rule) != inlining_.end()) {
            fail("rule '{}' is recursive, so '{}' has no finite automaton",
                 grammar_.rules()[e.rule].name, what_);
          }
          MEGACTX_CHECK(grammar_.rules()[e.rule].body >= 0, "rule '{}' is used but never defined",
                        grammar_.rules()[e.rule].name);
          inlining_.push_back(e.rule);
          const int32_t end = build(grammar_.rules()[e.rule].body, from, depth + 1);
          inlining_.pop_back();
          return end;
        }
        const int32_t to = add();
        nodes_[from].calls.push_back({e.rule, to});
        return to;
      }
      case ExprKind::Token: {
        const int32_t to = add();
        for (int32_t token : e.tokens) nodes_[from].tokens.push_back({token, to});
        return to;
      }
      case ExprKind::AnyTokenExcept: {
        const int32_t to = add();
        nodes_[from].tokens.push_back({-(id + 1), to});
        return to;
      }
      case ExprKind::Graph: {
        std::vector<int32_t> state(e.num_states);
        for (int32_t& s : state) s = add();
        nodes_[from].eps.push_back(state[e.start]);
        for (const GraphEdge& edge : e.edges) {
          const int32_t end =
              edge.label < 0 ? state[edge.from] : build(edge.label, state[edge.from], depth + 1);
          nodes_[end].eps.push_back(state[edge.to]);
        }
        const int32_t to = add();
        for (int32_t f : e.finals) nodes_[state.at(f)].eps.push_back(to);
        return to;
      }
    }
    fail("unknown expression kind");
  }

  std::vector<NfaNode>& nodes() { return nodes_; }

 private:
  const Grammar& grammar_;
  const FsmLimits& limits_;
  std::string_view what_;
  const InlineRule& inline_rule_;
  std::vector<int32_t> inlining_;
  std::vector<NfaNode> nodes_;
};

struct VectorHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct SignatureHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

void closure(const std::vector<NfaNode>& nodes, std::vector<int32_t>& set,
             std::vector<uint32_t>& mark, uint32_t stamp) {
  std::vector<int32_t> stack(set.begin(), set.end());
  set.clear();
  while (!stack.empty()) {
    const int32_t n = stack.back();
    stack.pop_back();
    if (mark[n] == stamp) continue;
    mark[n] = stamp;
    set.push_back(n);
    for (int32_t m : nodes[n].eps) {
      if (mark[m] != stamp) stack.push_back(m);
    }
  }
  std::sort(set.begin(), set.end());
}

// Sorted disjoint intervals covering the union of the given byte ranges, each
// with the targets of every range containing it.
void split_byte_edges(std::vector<std::pair<ByteRange, int32_t>>& edges,
                      std::vector<std::pair<ByteRange, std::vector<int32_t>>>& out) {
  out.clear();
  if (edges.empty()) return;
  std::vector<int> points;
  for (const auto& [r, t] : edges) {
    points.push_back(r.lo);
    points.push_back(r.hi + 1);
  }
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  for (size_t i = 0; i + 1 < points.size(); ++i) {
    const int lo = points[i];
    const int hi = points[i + 1] - 1;
    std::vector<int32_t> targets;
    for (const auto& [r, t] : edges) {
      if (r.lo <= lo && hi <= r.hi) targets.push_back(t);
    }
    if (targets.empty()) continue;
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}, std::move(targets)});
  }
}

void add_byte_edge(std::vector<DfaByteEdge>& edges, uint8_t lo, uint8_t hi, int32_t target) {
  if (!edges.empty() && edges.back().target == target && edges.back().hi + 1 == lo) {
    edges.back().hi = hi;
  } else {
    edges.push_back({lo, hi, target});
  }
}

}  // namespace

int32_t Dfa::add_state() {
  final.push_back(0);
  bytes.emplace_back();
  calls.emplace_back();
  tokens.emplace_back();
  return num_states() - 1;
}

bool Dfa::call_free() const {
  for (int32_t s = 0; s < num_states(); ++s) {
    if (!calls[s].empty() || !tokens[s].empty()) return false;
  }
  return true;
}

bool inline_all_rules(int32_t) {
  return true;
}

Dfa build_dfa(const Grammar& grammar, ExprId body, const FsmLimits& limits, std::string_view what,
              const InlineRule& inline_rule) {
  NfaBuilder builder(grammar, limits, what, inline_rule);
  const int32_t start = builder.add();
  const int32_t end = builder.build(body, start, 0);
  std::vector<NfaNode>& nodes = builder.nodes();

  std::vector<uint32_t> mark(nodes.size(), 0);
  uint32_t stamp = 0;
  std::unordered_map<std::vector<int32_t>, int32_t, VectorHash> ids;
  std::vector<std::vector<int32_t>> sets;
  Dfa dfa;
  auto intern = [&](std::vector<int32_t> set) -> int32_t {
    closure(nodes, set, mark, ++stamp);
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    if (dfa.num_states() >= limits.max_dfa_states) {
      fail("rule '{}' is too complex: its automaton exceeds {} DFA states", what,
           limits.max_dfa_states);
    }
    const int32_t id = dfa.add_state();
    ids.emplace(set, id);
    sets.push_back(std::move(set));
    return id;
  };
  dfa.start = intern({start});

  std::vector<std::pair<ByteRange, int32_t>> byte_edges;
  std::vector<std::pair<ByteRange, std::vector<int32_t>>> intervals;
  for (int32_t s = 0; s < dfa.num_states(); ++s) {
    byte_edges.clear();
    std::map<int32_t, std::vector<int32_t>> calls;
    std::map<int32_t, std::vector<int32_t>> tokens;
    bool is_final = false;
    for (int32_t n : sets[s]) {
      if (n == end) is_final = true;
      for (const auto& e : nodes[n].bytes) byte_edges.push_back(e);
      for (const auto& [rule, t] : nodes[n].calls) calls[rule].push_back(t);
      for (const auto& [label, t] : nodes[n].tokens) tokens[label].push_back(t);
    }
    dfa.final[s] = is_final;
    split_byte_edges(byte_edges, intervals);
    for (auto& [range, targets] : intervals) {
      const int32_t t = intern(std::move(targets));
      add_byte_edge(dfa.bytes[s], range.lo, range.hi, t);
    }
    for (auto& [rule, targets] : calls) {
      const int32_t t = intern(std::move(targets));
      dfa.calls[s].push_back({rule, t});
    }
    for (auto& [label, targets] : tokens) {
      const int32_t t = intern(std::move(targets));
      dfa.tokens[s].push_back({label, t});
    }
  }
  minimize(dfa);
  return dfa;
}

void minimize(Dfa& dfa) {
  const int32_t n = dfa.num_states();
  // 1. Trim: keep the states that can reach a final state.
  std::vector<std::vector<int32_t>> reverse(n);
  for (int32_t s = 0; s < n; ++s) {
    for (const auto& e : dfa.bytes[s]) reverse[e.target].push_back(s);
    for (const auto& e : dfa.calls[s]) reverse[e.target].push_back(s);
    for (const auto& e : dfa.tokens[s]) reverse[e.target].push_back(s);
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> stack;
  for (int32_t s = 0; s < n; ++s) {
    if (dfa.final[s]) {
      live[s] = 1;
      stack.push_back(s);
    }
  }
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t p : reverse[s]) {
      if (!live[p]) {
        live[p] = 1;
        stack.push_back(p);
      }
    }
  }
  auto keep = [&](std::vector<DfaByteEdge>& v) {
    v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& e) { return !live[e.target]; }),
            v.end());
  };
  auto keep_labels = [&](std::vector<DfaLabelEdge>& v) {
    v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& e) { return !live[e.target]; }),
            v.end());
  };
  for (int32_t s = 0; s < n; ++s) {
    keep(dfa.bytes[s]);
    keep_labels(dfa.calls[s]);
    keep_labels(dfa.tokens[s]);
  }
  if (!live[dfa.start]) {
    Dfa dead;
    dead.start = dead.add_state();
    dfa = std::move(dead);
    return;
  }

  // 2. Symbols: the byte classes of the whole automaton, then one symbol per
  // call label and per token label.
  std::vector<int> points = {0, 256};
  for (int32_t s = 0; s < n; ++s) {
    if (!live[s]) continue;
    for (const auto& e : dfa.bytes[s]) {
      points.push_back(e.lo);
      points.push_back(e.hi + 1);
    }
  }
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  std::vector<int32_t> byte_class(256);
  for (size_t i = 0; i + 1 < points.size(); ++i) {
    for (int b = points[i]; b < points[i + 1]; ++b) byte_class[b] = static_cast<int32_t>(i);
  }
  const int32_t num_byte_classes = static_cast<int32_t>(points.size() - 1);
  std::map<std::pair<int, int32_t>, int32_t> label_symbol;  // (0 call / 1 token, label)
  for (int32_t s = 0; s < n; ++s) {
    if (!live[s]) continue;
    for (const auto& e : dfa.calls[s]) label_symbol.emplace(std::make_pair(0, e.label), 0);
    for (const auto& e : dfa.tokens[s]) label_symbol.emplace(std::make_pair(1, e.label), 0);
  }
  int32_t num_symbols = num_byte_classes;
  for (auto& [key, symbol] : label_symbol) symbol = num_symbols++;

  // Transitions per (state, symbol), -1 where undefined, and their inverse.
  struct Move {
    int32_t symbol;
    int32_t target;
  };
  std::vector<std::vector<Move>> moves(n);
  for (int32_t s = 0; s < n; ++s) {
    if (!live[s]) continue;
    for (const auto& e : dfa.bytes[s]) {
      for (int b = e.lo; b <= e.hi;) {
        const int32_t c = byte_class[b];
        moves[s].push_back({c, e.target});
        b = points[c + 1];
      }
    }
    for (const auto& e : dfa.calls[s]) {
      moves[s].push_back({label_symbol.at({0, e.label}), e.target});
    }
    for (const auto& e : dfa.tokens[s]) {
      moves[s].push_back({label_symbol.at({1, e.label}), e.target});
    }
  }
  std::vector<std::vector<Move>> inverse(n);  // (symbol, source)
  for (int32_t s = 0; s < n; ++s) {
    for (const Move& m : moves[s]) inverse[m.target].push_back({m.symbol, s});
  }

  // 3. Hopcroft refinement. Undefined moves go to an implicit sink; the
  // initial partition by (final, defined symbols) accounts for it.
  std::vector<int32_t> block_of(n, -1);
  std::vector<std::vector<int32_t>> blocks;
  {
    std::unordered_map<std::vector<int64_t>, int32_t, SignatureHash> initial;
    for (int32_t s = 0; s < n; ++s) {
      if (!live[s]) continue;
      std::vector<int64_t> key = {dfa.final[s]};
      std::vector<int32_t> symbols;
      for (const Move& m : moves[s]) symbols.push_back(m.symbol);
      std::sort(symbols.begin(), symbols.end());
      key.insert(key.end(), symbols.begin(), symbols.end());
      auto [it, inserted] = initial.emplace(key, static_cast<int32_t>(blocks.size()));
      if (inserted) blocks.emplace_back();
      block_of[s] = it->second;
      blocks[it->second].push_back(s);
    }
  }
  std::vector<int32_t> worklist;
  std::vector<uint8_t> in_worklist(blocks.size(), 1);
  for (size_t b = 0; b < blocks.size(); ++b) worklist.push_back(static_cast<int32_t>(b));
  std::vector<uint8_t> marked(n, 0);
  std::vector<Move> preimage;  // (symbol, source)
  std::vector<int32_t> touched;
  std::vector<std::vector<int32_t>> marked_in(blocks.size());
  while (!worklist.empty()) {
    const int32_t splitter = worklist.back();
    worklist.pop_back();
    in_worklist[splitter] = 0;
    preimage.clear();
    for (int32_t t : blocks[splitter]) {
      for (const Move& m : inverse[t]) preimage.push_back(m);
    }
    std::sort(preimage.begin(), preimage.end(), [](const Move& a, const Move& b) {
      return a.symbol != b.symbol ? a.symbol < b.symbol : a.target < b.target;
    });
    for (size_t i = 0; i < preimage.size();) {
      size_t j = i;
      touched.clear();
      for (; j < preimage.size() && preimage[j].symbol == preimage[i].symbol; ++j) {
        const int32_t s = preimage[j].target;
        if (marked[s]) continue;
        marked[s] = 1;
        const int32_t b = block_of[s];
        if (marked_in[b].empty()) touched.push_back(b);
        marked_in[b].push_back(s);
      }
      for (int32_t b : touched) {
        std::vector<int32_t> in;
        in.swap(marked_in[b]);
        const bool split = in.size() < blocks[b].size();
        std::vector<int32_t> rest;
        if (split) {
          for (int32_t s : blocks[b]) {
            if (!marked[s]) rest.push_back(s);
          }
        }
        for (int32_t s : in) marked[s] = 0;
        if (!split) continue;
        // b keeps the unmarked states; the marked ones form a new block.
        const auto fresh = static_cast<int32_t>(blocks.size());
        for (int32_t s : in) block_of[s] = fresh;
        blocks.push_back(std::move(in));
        blocks[b] = std::move(rest);
        in_worklist.push_back(0);
        marked_in.emplace_back();
        if (in_worklist[b]) {
          worklist.push_back(fresh);
          in_worklist[fresh] = 1;
        } else {
          const int32_t smaller = blocks[fresh].size() <= blocks[b].size() ? fresh : b;
          worklist.push_back(smaller);
          in_worklist[smaller] = 1;
        }
      }
      i = j;
    }
  }

  // 4. Rebuild, numbering blocks breadth-first from the start's block.
  std::vector<int32_t> order(blocks.size(), -1);
  std::vector<int32_t> queue = {block_of[dfa.start]};
  order[block_of[dfa.start]] = 0;
  Dfa out;
  for (size_t qi = 0; qi < queue.size(); ++qi) {
    const int32_t rep = blocks[queue[qi]][0];
    auto visit = [&](int32_t target) {
      const int32_t b = block_of[target];
      if (order[b] < 0) {
        order[b] = static_cast<int32_t>(queue.size());
        queue.push_back(b);
      }
    };
    for (const auto& e : dfa.bytes[rep]) visit(e.target);
    for (const auto& e : dfa.calls[rep]) visit(e.target);
    for (const auto& e : dfa.tokens[rep]) visit(e.target);
  }
  for (size_t i = 0; i < queue.size(); ++i) out.add_state();
  for (size_t qi = 0; qi < queue.size(); ++qi) {
    const int32_t rep = blocks[queue[qi]][0];
    out.final[qi] = dfa.final[rep];
    for (const auto& e : dfa.bytes[rep]) {
      add_byte_edge(out.bytes[qi], e.lo, e.hi, order[block_of[e.target]]);
    }
    for (const auto& e : dfa.calls[rep]) {
      out.calls[qi].push_back({e.label, order[block_of[e.target]]});
    }
    for (const auto& e : dfa.tokens[rep]) {
      out.tokens[qi].push_back({e.label, order[block_of[e.target]]});
    }
  }
  out.start = 0;
  dfa = std::move(out);
}

namespace {

// Product of two call-free automata; `final_rule` decides a pair's finality.
template <typename FinalRule>
Dfa product(const Dfa& a, const Dfa& b, bool complete_b, FinalRule final_rule) {
  MEGACTX_CHECK(a.call_free() && b.call_free(), "automaton product needs call-free automata");
  // b completed with a sink (-1) when its rejections matter (subtraction).
  std::map<std::pair<int32_t, int32_t>, int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  Dfa out;
  auto intern = [&](int32_t x, int32_t y) {
    auto [it, inserted] = ids.emplace(std::make_pair(x, y), out.num_states());
    if (inserted) {
      out.add_state();
      pairs.push_back({x, y});
      MEGACTX_CHECK(out.num_states() <= 250'000, "automaton product is too large");
    }
    return it->second;
  };
  out.start = intern(a.start, b.start);
  for (int32_t s = 0; s < out.num_states(); ++s) {
    const auto [x, y] = pairs[s];
    out.final[s] = final_rule(a.final[x] != 0, y >= 0 && b.final[y] != 0);
    for (const auto& ea : a.bytes[x]) {
      int lo = ea.lo;
      const int hi = ea.hi;
      if (y >= 0) {
        for (const auto& eb : b.bytes[y]) {
          if (eb.hi < lo || eb.lo > hi) continue;
          const int l = std::max<int>(lo, eb.lo);
          const int h = std::min<int>(hi, eb.hi);
          if (complete_b && l > lo) {
            const int32_t t = intern(ea.target, -1);
            add_byte_edge(out.bytes[s], static_cast<uint8_t>(lo), static_cast<uint8_t>(l - 1), t);
          }
          const int32_t t = intern(ea.target, eb.target);
          add_byte_edge(out.bytes[s], static_cast<uint8_t>(l), static_cast<uint8_t>(h), t);
          lo = h + 1;
        }
      }
      if (complete_b && lo <= hi) {
        const int32_t t = intern(ea.target, -1);
        add_byte_edge(out.bytes[s], static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), t);
      }
    }
  }
  minimize(out);
  return out;
}

}  // namespace

Dfa intersect(const Dfa& a, const Dfa& b) {
  return product(a, b, false, [](bool x, bool y) { return x && y; });
}

Dfa subtract(const Dfa& a, const Dfa& b) {
  return product(a, b, true, [](bool x, bool y) { return x && !y; });
}

ExprId dfa_to_expr(Grammar& grammar, const Dfa& dfa) {
  std::vector<GraphEdge> edges;
  std::vector<int32_t> finals;
  for (int32_t s = 0; s < dfa.num_states(); ++s) {
    if (dfa.final[s]) finals.push_back(s);
    std::map<int32_t, std::vector<ByteRange>> by_target;
    for (const auto& e : dfa.bytes[s]) by_target[e.target].push_back({e.lo, e.hi});
    for (auto& [target, ranges] : by_target) {
      edges.push_back({s, target, grammar.bytes(std::move(ranges))});
    }
    for (const auto& e : dfa.calls[s]) edges.push_back({s, e.target, grammar.rule_ref(e.label)});
    for (const auto& e : dfa.tokens[s]) {
      MEGACTX_CHECK(e.label >= 0, "cannot embed an any-token edge");
      edges.push_back({s, e.target, grammar.token({e.label})});
    }
  }
  if (finals.empty()) return grammar.nothing();
  return grammar.graph(dfa.num_states(), dfa.start, std::move(finals), std::move(edges));
}

}  // namespace megactx::grammar
