#include "grammar/matcher.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace megactx::grammar {

namespace {

void set_bit(uint32_t* words, int32_t id) {
  words[id >> 5] |= 1u << (id & 31);
}
bool test_bit(const uint32_t* words, int32_t id) {
  return (words[id >> 5] >> (id & 31)) & 1u;
}

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)) {
  MEGACTX_CHECK(grammar_ != nullptr, "GrammarMatcher needs a compiled grammar");
  depth_states_.resize(grammar_->vocabulary().max_token_bytes() + 1);
  reset();
}

void GrammarMatcher::reset() {
  frames_.clear();
  frame_ids_.clear();
  elems_.clear();
  history_.clear();
  std::vector<Elem> start;
  bool can_end = false;
  visited_.clear();
  expand({grammar_->rule_start(grammar_->root_rule()), -1}, start, can_end);
  std::sort(start.begin(), start.end());
  start.erase(std::unique(start.begin(), start.end()), start.end());
  push_state(start, can_end, false);
}

int32_t GrammarMatcher::intern(int32_t node, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) |
                       static_cast<uint32_t>(parent + 1);
  auto [it, inserted] = frame_ids_.emplace(key, static_cast<int32_t>(frames_.size()));
  if (inserted) {
    const int32_t depth = parent >= 0 ? frames_[parent].depth + 1 : 1;
    frames_.push_back({node, parent, depth});
  }
  return it->second;
}

void GrammarMatcher::expand(Elem start, std::vector<Elem>& out, bool& can_end) {
  const CompiledGrammar& g = *grammar_;
  if (g.is_plain(start.node)) {
    out.push_back(start);
    return;
  }
  work_.clear();
  work_.push_back(start);
  while (!work_.empty()) {
    const Elem x = work_.back();
    work_.pop_back();
    if (std::find(visited_.begin(), visited_.end(), x) != visited_.end()) continue;
    visited_.push_back(x);
    if (g.is_scanning(x.node)) out.push_back(x);
    const auto calls = g.calls(x.node);
    if (!calls.empty()) {
      const int32_t depth = x.parent >= 0 ? frames_[x.parent].depth : 0;
      // Deeper nesting than the bound is not allowed: the path ends here.
      if (depth < g.max_stack_depth()) {
        for (const CallEdge& call : calls) {
          const int32_t frame = intern(call.ret, x.parent);
          work_.push_back({g.rule_start(call.rule), frame});
        }
      }
    }
    if (!g.is_final(x.node)) continue;
    if (x.parent >= 0) {
      const Frame& f = frames_[x.parent];
      work_.push_back({f.node, f.parent});
    } else {
      can_end = true;
    }
  }
}

void GrammarMatcher::step(const Elem* begin, const Elem* end, uint8_t byte, std::vector<Elem>& out,
                          bool& can_end) {
  const CompiledGrammar& g = *grammar_;
  out.clear();
  visited_.clear();
  can_end = false;
  for (const Elem* x = begin; x != end; ++x) {
    if (!g.reads_bytes(x->node)) continue;
    const int32_t next = g.next(x->node, byte);
    if (next >= 0) expand({next, x->parent}, out, can_end);
  }
  if (out.size() > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
}

void GrammarMatcher::push_state(std::vector<Elem>& elems, bool can_end, bool terminated) {
  State s;
  s.begin = elems_.size();
  elems_.insert(elems_.end(), elems.begin(), elems.end());
  s.end = elems_.size();
  s.can_end = can_end;
  s.terminated = terminated;
  history_.push_back(s);
}

bool GrammarMatcher::accept_token(int32_t token) {
  const CompiledGrammar& g = *grammar_;
  const Vocabulary& vocab = g.vocabulary();
  const State cur = history_.back();
  if (token < 0 || token >= vocab.size()) return false;
  if (cur.terminated && !vocab.is_eos(token)) return false;
  if (vocab.is_eos(token)) {
    if (!cur.can_end && !cur.terminated) return false;
    std::vector<Elem> none;
    push_state(none, true, true);
    return true;
  }
  bool can_end = false;
  next_.clear();
  if (vocab.is_matchable(token) && !consume(vocab.bytes(token), next_, can_end)) {
    next_.clear();
    can_end = false;
  }
  if (g.uses_tokens()) {
    visited_.clear();
    for (size_t i = cur.begin; i < cur.end; ++i) {
      const Elem x = elems_[i];
      for (const TokenEdge& edge : g.tokens(x.node)) {
        const bool match = edge.label >= 0 ? edge.label == token
                                           : test_bit(g.except_mask(-edge.label - 1).data(), token);
        if (match) expand({edge.target, x.parent}, next_, can_end);
      }
    }
    std::sort(next_.begin(), next_.end());
    next_.erase(std::unique(next_.begin(), next_.end()), next_.end());
  }
  if (next_.empty() && !can_end) return false;
  push_state(next_, can_end, false);
  return true;
}

bool GrammarMatcher::consume(std::string_view bytes, std::vector<Elem>& out, bool& can_end) {
  const State cur = history_.back();
  next2_.assign(elems_.begin() + cur.begin, elems_.begin() + cur.end);
  can_end = cur.can_end;
  for (size_t k = 0; k < bytes.size(); ++k) {
    step(next2_.data(), next2_.data() + next2_.size(), static_cast<uint8_t>(bytes[k]), out,
         can_end);
    out.swap(next2_);
    // No element left: only an output that ends right after the last byte.
    if (next2_.empty()) {
      if (k + 1 < bytes.size() || !can_end) return false;
      break;
    }
  }
  out.swap(next2_);
  return true;
}

bool GrammarMatcher::accept_string(std::string_view bytes) {
  if (history_.back().terminated) return false;
  bool can_end = false;
  if (!consume(bytes, next_, can_end)) return false;
  push_state(next_, can_end, false);
  return true;
}

void GrammarMatcher::rollback(int32_t n) {
  MEGACTX_CHECK(n >= 0 && n <= num_steps(), "cannot roll back {} steps (have {})", n, num_steps());
  for (int32_t i = 0; i < n; ++i) {
    elems_.resize(history_.back().begin);
    history_.pop_back();
  }
}

void GrammarMatcher::fill_next_token_bitmask(uint32_t* words) {
  const CompiledGrammar& g = *grammar_;
  const Vocabulary& vocab = g.vocabulary();
  const int32_t n_words = vocab.mask_words();
  std::memset(words, 0, sizeof(uint32_t) * n_words);
  const State cur = history_.back();
  if (cur.terminated) {
    for (int32_t id : vocab.eos_ids()) set_bit(words, id);
    return;
  }
  bool empty_mask = true;
  std::vector<Elem> group;
  for (size_t i = cur.begin; i < cur.end;) {
    const int32_t node = elems_[i].node;
    group.clear();
    for (; i < cur.end && elems_[i].node == node; ++i) group.push_back(elems_[i]);
    if (g.reads_bytes(node)) {
      const TokenClasses& classes = g.token_classes(node);
      switch (classes.storage) {
        case TokenClasses::Storage::AcceptedBitset:
          for (int32_t w = 0; w < n_words; ++w) words[w] |= classes.bitset[w];
          break;
        case TokenClasses::Storage::AcceptedList:
          for (int32_t id : classes.list) set_bit(words, id);
          break;
        case TokenClasses::Storage::RejectedList: {
          // Everything matchable but the listed (rejected or uncertain) tokens.
          uint32_t* target = words;
          if (!empty_mask) {
            scratch_mask_.resize(n_words);
            target = scratch_mask_.data();
          }
          std::memcpy(target, vocab.matchable_mask().data(), sizeof(uint32_t) * n_words);
          for (int32_t id : classes.list) target[id >> 5] &= ~(1u << (id & 31));
          if (target != words) {
            for (int32_t w = 0; w < n_words; ++w) words[w] |= target[w];
          }
          break;
        }
      }
      empty_mask = false;
      check_suffixes(group, classes.suffix_groups, words);
      check_uncertain(group, classes.uncertain, words);
    }
    for (const Elem& x : group) {
      for (const TokenEdge& edge : g.tokens(x.node)) {
        if (edge.label >= 0) {
          set_bit(words, edge.label);
        } else {
          const std::vector<uint32_t>& mask = g.except_mask(-edge.label - 1);
          for (int32_t w = 0; w < n_words; ++w) words[w] |= mask[w];
        }
        empty_mask = false;
      }
    }
  }
  if (cur.can_end) {
    for (int32_t id : vocab.eos_ids()) set_bit(words, id);
  }
}

template <typename BytesOf, typename Accept>
void GrammarMatcher::walk_sorted(const std::vector<Elem>& start, size_t count, BytesOf bytes_of,
                                 Accept accept) {
  // depth_states_[k]: the elements after the first k bytes of the current
  // string; valid for k <= computed. Strings come sorted, so consecutive ones
  // share most of their prefix.
  if (depth_states_.size() < 2) return;
  depth_states_[0] = start;
  can_end_at_.assign(depth_states_.size(), 0);
  size_t computed = 0;
  std::string_view previous;
  bool have_previous = false;
  for (size_t i = 0; i < count; ++i) {
    const std::string_view s = bytes_of(i);
    if (s.empty() || s.size() >= depth_states_.size()) continue;
    size_t k = 0;
    if (have_previous) {
      const size_t limit = std::min({previous.size(), s.size(), computed});
      while (k < limit && previous[k] == s[k]) ++k;
    }
    for (; k < s.size(); ++k) {
      if (depth_states_[k].empty()) break;
      bool can_end = false;
      step(depth_states_[k].data(), depth_states_[k].data() + depth_states_[k].size(),
           static_cast<uint8_t>(s[k]), depth_states_[k + 1], can_end);
      can_end_at_[k + 1] = can_end;
    }
    computed = k;
    previous = s;
    have_previous = true;
    if (k == s.size() && (!depth_states_[k].empty() || can_end_at_[k])) accept(i);
  }
}

void GrammarMatcher::check_suffixes(const std::vector<Elem>& group,
                                    const std::vector<SuffixGroup>& suffixes, uint32_t* words) {
  if (suffixes.empty()) return;
  // The node's rule ended inside the token: the rest must fit where the
  // caller continues, i.e. at the frame below the element.
  std::vector<int32_t> parents;
  for (const Elem& x : group) {
    if (x.parent >= 0) parents.push_back(x.parent);
  }
  std::sort(parents.begin(), parents.end());
  parents.erase(std::unique(parents.begin(), parents.end()), parents.end());
  std::vector<Elem> start;
  for (int32_t parent : parents) {
    start.clear();
    bool can_end = false;
    visited_.clear();
    expand({frames_[parent].node, frames_[parent].parent}, start, can_end);
    std::sort(start.begin(), start.end());
    start.erase(std::unique(start.begin(), start.end()), start.end());
    walk_sorted(
        start, suffixes.size(), [&](size_t i) { return std::string_view(suffixes[i].suffix); },
        [&](size_t i) {
          for (int32_t token : suffixes[i].tokens) set_bit(words, token);
        });
  }
}

void GrammarMatcher::check_uncertain(const std::vector<Elem>& group,
                                     const std::vector<int32_t>& tokens, uint32_t* words) {
  if (tokens.empty()) return;
  const Vocabulary& vocab = grammar_->vocabulary();
  walk_sorted(
      group, tokens.size(), [&](size_t i) { return std::string_view(vocab.bytes(tokens[i])); },
      [&](size_t i) { set_bit(words, tokens[i]); });
}

std::string GrammarMatcher::find_jump_forward_string(size_t max_bytes) {
  const CompiledGrammar& g = *grammar_;
  const State cur = history_.back();
  std::string out;
  if (cur.terminated || cur.can_end) return out;
  next2_.assign(elems_.begin() + cur.begin, elems_.begin() + cur.end);
  while (out.size() < max_bytes) {
    int forced = -1;
    bool several = false;
    for (const Elem& x : next2_) {
      if (!g.tokens(x.node).empty()) several = true;
      if (!g.reads_bytes(x.node)) continue;
      for (int b = 0; b < 256 && !several; ++b) {
        if (g.next(x.node, static_cast<uint8_t>(b)) < 0) continue;
        if (forced < 0) {
          forced = b;
        } else if (forced != b) {
          several = true;
        }
      }
      if (several) break;
    }
    if (several || forced < 0) break;
    bool can_end = false;
    step(next2_.data(), next2_.data() + next2_.size(), static_cast<uint8_t>(forced), next_,
         can_end);
    out.push_back(static_cast<char>(forced));
    next_.swap(next2_);
    if (can_end || next2_.empty()) break;
  }
  return out;
}

}  // namespace megactx::grammar
