#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/ranges.h>

#include "core/error.h"
#include "grammar/token_classes.h"

namespace megactx::grammar {

namespace {

// Rules referenced from `body`, found by walking the expression DAG.
void referenced_rules(const Grammar& grammar, ExprId body, std::vector<int32_t>& out,
                      std::vector<uint8_t>& seen_expr) {
  std::vector<ExprId> stack = {body};
  while (!stack.empty()) {
    const ExprId id = stack.back();
    stack.pop_back();
    if (seen_expr[id]) continue;
    seen_expr[id] = 1;
    const Expr& e = grammar.expr(id);
    if (e.kind == ExprKind::RuleRef) out.push_back(e.rule);
    for (ExprId item : e.items) stack.push_back(item);
    for (const GraphEdge& edge : e.edges) {
      if (edge.label >= 0) stack.push_back(edge.label);
    }
  }
}

// States of `dfa` reachable from its start through edges `follow` accepts.
template <typename Follow>
std::vector<uint8_t> reach(const Dfa& dfa, Follow follow_call, bool bytes_and_tokens) {
  std::vector<uint8_t> seen(dfa.num_states(), 0);
  std::vector<int32_t> stack = {dfa.start};
  seen[dfa.start] = 1;
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    auto visit = [&](int32_t t) {
      if (!seen[t]) {
        seen[t] = 1;
        stack.push_back(t);
      }
    };
    if (bytes_and_tokens) {
      for (const auto& e : dfa.bytes[s]) visit(e.target);
      for (const auto& e : dfa.tokens[s]) visit(e.target);
    }
    for (const auto& e : dfa.calls[s]) {
      if (follow_call(e.label)) visit(e.target);
    }
  }
  return seen;
}

// NFA-sized estimate of an expression, for choosing rules worth inlining.
int64_t expr_size(const Grammar& grammar, ExprId id, std::vector<int64_t>& memo) {
  if (memo[id] >= 0) return memo[id];
  const Expr& e = grammar.expr(id);
  int64_t size = 1;
  for (ExprId item : e.items) size += expr_size(grammar, item, memo);
  if (e.kind == ExprKind::Repeat) size *= std::max<int64_t>(1, e.max < 0 ? e.min + 1 : e.max);
  for (const GraphEdge& edge : e.edges) {
    if (edge.label >= 0) size += expr_size(grammar, edge.label, memo);
  }
  size = std::min<int64_t>(size, 1 << 20);
  memo[id] = size;
  return size;
}

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

bool reaches_final(const Dfa& dfa, const std::vector<uint8_t>& seen) {
  for (int32_t s = 0; s < dfa.num_states(); ++s) {
    if (seen[s] && dfa.final[s]) return true;
  }
  return false;
}

}  // namespace

CompiledGrammar::~CompiledGrammar() {
  if (!classes_) return;
  for (int32_t i = 0; i < num_nodes(); ++i) delete classes_[i].load(std::memory_order_acquire);
}

const TokenClasses& CompiledGrammar::token_classes(int32_t node) const {
  node = representative_[node];
  std::atomic<const TokenClasses*>& slot = classes_[node];
  const TokenClasses* classes = slot.load(std::memory_order_acquire);
  if (classes != nullptr) return *classes;
  // Two threads may race to compute the same node; the loser frees its copy.
  auto* computed = new TokenClasses(classify_tokens(*this, node));
  const TokenClasses* expected = nullptr;
  if (slot.compare_exchange_strong(expected, computed, std::memory_order_acq_rel)) {
    return *computed;
  }
  delete computed;
  return *expected;
}

std::string CompiledGrammar::describe() const {
  std::string out;
  for (int32_t r = 0; r < num_rules(); ++r) {
    out += rule_names_[r] + (r == root_rule_ ? " (root)" : "") + ":\n";
    for (int32_t n = 0; n < num_nodes(); ++n) {
      if (nodes_[n].rule != r) continue;
      out += "  " + std::to_string(n) + (nodes_[n].final ? " final" : "") +
             (n == rule_start_[r] ? " start" : "") + ":";
      for (int b = 0; b < 256;) {
        const int32_t t = next(n, static_cast<uint8_t>(b));
        int e = b;
        while (e + 1 < 256 && next(n, static_cast<uint8_t>(e + 1)) == t) ++e;
        if (t >= 0)
          out += " [" + std::to_string(b) + "-" + std::to_string(e) + "]->" + std::to_string(t);
        b = e + 1;
      }
      for (const CallEdge& c : calls(n)) {
        out += " " + rule_names_[c.rule] + "->" + std::to_string(c.ret);
      }
      for (const TokenEdge& t : tokens(n)) {
        out += " <" + std::to_string(t.label) + ">->" + std::to_string(t.target);
      }
      out += "\n";
    }
  }
  return out;
}

std::shared_ptr<const CompiledGrammar> compile_grammar(const Grammar& grammar,
                                                       std::shared_ptr<const Vocabulary> vocabulary,
                                                       const CompileOptions& options) {
  const auto& rules = grammar.rules();
  const auto num_rules = static_cast<int32_t>(rules.size());
  MEGACTX_CHECK(grammar.root >= 0 && grammar.root < num_rules, "grammar has no root rule");

  // 1. Rules reachable from the root; each must be defined.
  std::vector<int32_t> order = {grammar.root};
  std::vector<uint8_t> reachable(num_rules, 0);
  reachable[grammar.root] = 1;
  std::vector<uint8_t> seen_expr(grammar.num_exprs(), 0);
  for (size_t i = 0; i < order.size(); ++i) {
    const Rule& rule = rules[order[i]];
    MEGACTX_CHECK(rule.body >= 0, "rule '{}' is used but never defined", rule.name);
    std::vector<int32_t> refs;
    referenced_rules(grammar, rule.body, refs, seen_expr);
    for (int32_t r : refs) {
      if (!reachable[r]) {
        reachable[r] = 1;
        order.push_back(r);
      }
    }
  }

  // 2. One minimal DFA per rule, small non-recursive rules inlined on request.
  std::vector<uint8_t> inline_rule(num_rules, 0);
  if (options.inline_small_rules) {
    std::vector<std::vector<int32_t>> refs(num_rules);
    for (int32_t r : order) {
      std::vector<uint8_t> seen(grammar.num_exprs(), 0);
      referenced_rules(grammar, rules[r].body, refs[r], seen);
    }
    std::vector<int64_t> memo(grammar.num_exprs(), -1);
    for (int32_t r : order) {
      if (r == grammar.root || expr_size(grammar, rules[r].body, memo) > 48) continue;
      // Recursive rules (reaching themselves) stay rules.
      std::vector<uint8_t> seen(num_rules, 0);
      std::vector<int32_t> stack(refs[r].begin(), refs[r].end());
      bool recursive = false;
      while (!stack.empty() && !recursive) {
        const int32_t x = stack.back();
        stack.pop_back();
        if (x == r) recursive = true;
        if (seen[x]) continue;
        seen[x] = 1;
        stack.insert(stack.end(), refs[x].begin(), refs[x].end());
      }
      if (!recursive) inline_rule[r] = 1;
    }
  }
  const InlineRule inline_predicate = [&](int32_t r) { return inline_rule[r] != 0; };
  std::vector<Dfa> dfas(num_rules);
  for (int32_t r : order) {
    dfas[r] = build_dfa(grammar, rules[r].body, options.limits, rules[r].name,
                        options.inline_small_rules ? inline_predicate : InlineRule());
  }

  // 3. Rules that derive some string, to a fixpoint; calls of the others can
  // never return, so those edges go.
  std::vector<uint8_t> productive(num_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r : order) {
      if (productive[r]) continue;
      auto seen = reach(
          dfas[r], [&](int32_t callee) { return productive[callee] != 0; }, true);
      if (reaches_final(dfas[r], seen)) {
        productive[r] = 1;
        changed = true;
      }
    }
  }
  if (!productive[grammar.root]) {
    if (!grammar.unsatisfiable.empty())
      fail("the grammar matches no string: {}", fmt::join(grammar.unsatisfiable, "; "));
    fail("grammar matches no string (rule '{}' never ends)", rules[grammar.root].name);
  }
  for (int32_t r : order) {
    bool removed = false;
    for (auto& calls : dfas[r].calls) {
      const size_t before = calls.size();
      calls.erase(std::remove_if(calls.begin(), calls.end(),
                                 [&](const DfaLabelEdge& e) { return !productive[e.label]; }),
                  calls.end());
      removed |= calls.size() != before;
    }
    if (removed) minimize(dfas[r]);
  }
  // Reachability again: dropped edges may orphan rules.
  std::fill(reachable.begin(), reachable.end(), 0);
  std::vector<int32_t> live_order = {grammar.root};
  reachable[grammar.root] = 1;
  for (size_t i = 0; i < live_order.size(); ++i) {
    for (const auto& calls : dfas[live_order[i]].calls) {
      for (const auto& e : calls) {
        if (!reachable[e.label]) {
          reachable[e.label] = 1;
          live_order.push_back(e.label);
        }
      }
    }
  }
  order = std::move(live_order);

  // 4. Nullable rules, then left recursion: a rule that can call itself before
  // reading anything would make the pushdown closure infinite.
  std::vector<uint8_t> nullable(num_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r : order) {
      if (nullable[r]) continue;
      auto seen = reach(
          dfas[r], [&](int32_t callee) { return nullable[callee] != 0; }, false);
      if (reaches_final(dfas[r], seen)) {
        nullable[r] = 1;
        changed = true;
      }
    }
  }
  std::vector<std::vector<int32_t>> left_calls(num_rules);
  for (int32_t r : order) {
    auto seen = reach(
        dfas[r], [&](int32_t callee) { return nullable[callee] != 0; }, false);
    for (int32_t s = 0; s < dfas[r].num_states(); ++s) {
      if (!seen[s]) continue;
      for (const auto& e : dfas[r].calls[s]) left_calls[r].push_back(e.label);
    }
  }
  {
    std::vector<uint8_t> color(num_rules, 0);  // 0 new, 1 on the path, 2 done
    std::vector<int32_t> path;
    std::vector<std::pair<int32_t, size_t>> stack;
    for (int32_t r0 : order) {
      if (color[r0]) continue;
      stack.push_back({r0, 0});
      color[r0] = 1;
      path.push_back(r0);
      while (!stack.empty()) {
        auto& [r, i] = stack.back();
        if (i < left_calls[r].size()) {
          const int32_t s = left_calls[r][i++];
          if (color[s] == 1) {
            std::string cycle;
            auto from = std::find(path.begin(), path.end(), s);
            for (auto it = from; it != path.end(); ++it) cycle += rules[*it].name + " -> ";
            fail("grammar is left-recursive: {}{} (rewrite the rule to consume input first)", cycle,
                 rules[s].name);
          }
          if (color[s] == 0) {
            color[s] = 1;
            path.push_back(s);
            stack.push_back({s, 0});
          }
        } else {
          color[r] = 2;
          path.pop_back();
          stack.pop_back();
        }
      }
    }
  }

  // 5. One numbering for all nodes; byte rows over per-rule byte classes.
  auto out = std::make_shared<CompiledGrammar>();
  CompiledGrammar& g = *out;
  g.vocabulary_ = std::move(vocabulary);
  g.max_stack_depth_ = options.max_stack_depth;
  std::vector<int32_t> rule_index(num_rules, -1);
  std::vector<int32_t> node_base(num_rules, 0);
  int32_t total_nodes = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    rule_index[order[i]] = static_cast<int32_t>(i);
    node_base[order[i]] = total_nodes;
    total_nodes += dfas[order[i]].num_states();
  }
  g.root_rule_ = 0;
  g.nodes_.resize(total_nodes);
  g.callers_.resize(order.size());
  const Vocabulary& vocab = *g.vocabulary_;
  std::vector<std::pair<std::vector<int32_t>, int32_t>> except_lists;  // (ids, index)
  std::vector<int32_t> rule_classes;                                   // byte classes of each rule
  for (size_t ri = 0; ri < order.size(); ++ri) {
    const int32_t r = order[ri];
    const Dfa& dfa = dfas[r];
    const int32_t base = node_base[r];
    g.rule_names_.push_back(rules[r].name);
    g.rule_start_.push_back(base + dfa.start);
    std::vector<int> points = {0, 256};
    for (int32_t s = 0; s < dfa.num_states(); ++s) {
      for (const auto& e : dfa.bytes[s]) {
        points.push_back(e.lo);
        points.push_back(e.hi + 1);
      }
    }
    std::sort(points.begin(), points.end());
    points.erase(std::unique(points.begin(), points.end()), points.end());
    const auto class_map = static_cast<int32_t>(g.byte_class_.size());
    const auto num_classes = static_cast<int32_t>(points.size() - 1);
    rule_classes.push_back(num_classes);
    g.byte_class_.resize(class_map + 256);
    for (int32_t c = 0; c < num_classes; ++c) {
      for (int b = points[c]; b < points[c + 1]; ++b) g.byte_class_[class_map + b] = c;
    }
    for (int32_t s = 0; s < dfa.num_states(); ++s) {
      CompiledGrammar::Node& node = g.nodes_[base + s];
      node.rule = static_cast<int32_t>(ri);
      node.final = dfa.final[s] != 0;
      node.class_map = class_map;
      node.row = static_cast<int32_t>(g.byte_next_.size());
      g.byte_next_.resize(g.byte_next_.size() + num_classes, -1);
      for (const auto& e : dfa.bytes[s]) {
        for (int b = e.lo; b <= e.hi; ++b) {
          g.byte_next_[node.row + g.byte_class_[class_map + b]] = base + e.target;
        }
      }
      node.reads_bytes = !dfa.bytes[s].empty();
      node.call_begin = static_cast<int32_t>(g.calls_.size());
      for (const auto& e : dfa.calls[s]) {
        g.calls_.push_back({rule_index[e.label], base + e.target});
      }
      node.call_end = static_cast<int32_t>(g.calls_.size());
      node.token_begin = static_cast<int32_t>(g.tokens_.size());
      for (const auto& e : dfa.tokens[s]) {
        int32_t label = e.label;
        if (label >= 0) {
          MEGACTX_CHECK(label < vocab.size(),
                        "grammar names token id {}, but the vocabulary has "
                        "{} tokens",
                        label, vocab.size());
          MEGACTX_CHECK(!vocab.is_eos(label),
                        "grammar names the stop token {} (<[{}]>); the output ends with it "
                        "implicitly where the grammar is complete",
                        vocab.bytes(label), label);
        } else {
          const std::vector<int32_t>& ids = grammar.expr(-label - 1).tokens;
          auto it = std::find_if(except_lists.begin(), except_lists.end(),
                                 [&](const auto& p) { return p.first == ids; });
          int32_t index;
          if (it != except_lists.end()) {
            index = it->second;
          } else {
            index = static_cast<int32_t>(g.except_masks_.size());
            std::vector<uint32_t> mask = vocab.matchable_mask();
            for (int32_t id : ids) {
              MEGACTX_CHECK(id >= 0 && id < vocab.size(),
                            "grammar names token id {}, but the "
                            "vocabulary has {} tokens",
                            id, vocab.size());
              mask[id >> 5] &= ~(1u << (id & 31));
            }
            g.except_masks_.push_back(std::move(mask));
            except_lists.push_back({ids, index});
          }
          label = -index - 1;
        }
        g.tokens_.push_back({label, base + e.target});
      }
      node.token_end = static_cast<int32_t>(g.tokens_.size());
      node.scanning = node.reads_bytes || node.token_end > node.token_begin;
      node.plain = !node.final && node.call_end == node.call_begin;
    }
  }
  for (int32_t n = 0; n < total_nodes; ++n) {
    for (const CallEdge& c : g.calls(n)) g.callers_[c.rule].push_back(c.ret);
  }
  for (auto& callers : g.callers_) {
    std::sort(callers.begin(), callers.end());
    callers.erase(std::unique(callers.begin(), callers.end()), callers.end());
  }

  g.rule_classes_ = rule_classes;
  for (size_t ri = 0; ri < order.size(); ++ri) {
    g.rule_class_begin_.push_back(static_cast<int32_t>(g.class_bytes_.size() / 4));
    g.class_bytes_.resize(g.class_bytes_.size() + 4 * static_cast<size_t>(rule_classes[ri]), 0);
  }
  for (int32_t n = 0; n < total_nodes; ++n) {
    if (g.rule_start_[g.nodes_[n].rule] != n) continue;  // one node per rule suffices
    for (int b = 0; b < 256; ++b) {
      const int32_t c = g.byte_class_[g.nodes_[n].class_map + b];
      g.class_bytes_[4 * (g.rule_class_begin_[g.nodes_[n].rule] + c) + b / 64] |= 1ull << (b % 64);
    }
  }
  g.plain_bytes_.assign(4 * static_cast<size_t>(total_nodes), 0);
  for (int32_t n = 0; n < total_nodes; ++n) {
    for (int b = 0; b < 256; ++b) {
      const int32_t t = g.next(n, static_cast<uint8_t>(b));
      if (t >= 0 && g.nodes_[t].plain) g.plain_bytes_[4 * n + b / 64] |= 1ull << (b % 64);
    }
  }

  // 6. Nodes whose behaviour agrees on every string up to the longest token
  // (Moore refinement for that many rounds; calls and tokens must agree
  // exactly) get the same token classes.
  {
    std::vector<int32_t> cls(total_nodes);
    std::unordered_map<std::vector<int64_t>, int32_t, KeyHash> ids;
    std::vector<int64_t> key;
    for (int32_t n = 0; n < total_nodes; ++n) {
      const CompiledGrammar::Node& node = g.nodes_[n];
      key = {node.rule, node.final, node.reads_bytes};
      for (const CallEdge& c : g.calls(n)) {
        key.push_back(c.rule);
        key.push_back(c.ret);
      }
      key.push_back(-1);
      for (const TokenEdge& t : g.tokens(n)) {
        key.push_back(t.label);
        key.push_back(t.target);
      }
      cls[n] = ids.emplace(key, static_cast<int32_t>(ids.size())).first->second;
    }
    size_t count = ids.size();
    for (int32_t round = 0; round < vocab.max_token_bytes(); ++round) {
      ids.clear();
      std::vector<int32_t> next(total_nodes);
      for (int32_t n = 0; n < total_nodes; ++n) {
        const CompiledGrammar::Node& node = g.nodes_[n];
        key = {cls[n]};
        for (int32_t c = 0; c < rule_classes[node.rule]; ++c) {
          const int32_t t = g.byte_next_[node.row + c];
          key.push_back(t >= 0 ? cls[t] : -1);
        }
        next[n] = ids.emplace(key, static_cast<int32_t>(ids.size())).first->second;
      }
      cls.swap(next);
      if (ids.size() == count) break;
      count = ids.size();
    }
    std::vector<int32_t> first(count, -1);
    g.representative_.resize(total_nodes);
    for (int32_t n = 0; n < total_nodes; ++n) {
      if (first[cls[n]] < 0) first[cls[n]] = n;
      g.representative_[n] = first[cls[n]];
    }
  }

  g.classes_ = std::make_unique<std::atomic<const TokenClasses*>[]>(total_nodes);
  for (int32_t n = 0; n < total_nodes; ++n) g.classes_[n].store(nullptr);
  if (options.precompute_token_classes) {
    std::vector<int32_t> todo;
    for (int32_t n = 0; n < total_nodes; ++n) {
      if (g.nodes_[n].reads_bytes && g.representative_[n] == n) todo.push_back(n);
    }
    int32_t threads = options.precompute_threads;
    if (threads <= 0) threads = std::min<int32_t>(8, std::thread::hardware_concurrency());
    threads = std::max<int32_t>(1, std::min<int32_t>(threads, static_cast<int32_t>(todo.size())));
    std::atomic<size_t> next{0};
    std::exception_ptr error;
    std::mutex error_mutex;
    auto work = [&]() {
      try {
        for (size_t i; (i = next.fetch_add(1)) < todo.size();) g.token_classes(todo[i]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        error = std::current_exception();
        next = todo.size();
      }
    };
    std::vector<std::thread> pool;
    for (int32_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    if (error) std::rethrow_exception(error);
  }
  return out;
}

}  // namespace megactx::grammar
