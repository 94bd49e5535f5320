#include "grammar/token_classes.h"

#include <algorithm>
#include <unordered_map>

namespace megactx::grammar {

namespace {

// How far a path that ends the node's rule is followed into approximate
// callers before its token is simply called context-dependent.
constexpr int32_t kMaxEscapeLevels = 3;
// Elements one byte step may produce before the walk gives up on precision
// (the tokens below become context-dependent, never wrongly accepted).
constexpr size_t kMaxElements = 1024;

// A path: at `node`, with `parent` a frame of the local arena (-1: the stack
// below is unknown) and `level` the number of times it ended the rule it was
// in while the stack was unknown (0: still inside the node's own rule).
struct Elem {
  int32_t node;
  int32_t parent;
  int32_t level;
  bool operator==(const Elem& o) const {
    return node == o.node && parent == o.parent && level == o.level;
  }
  bool operator<(const Elem& o) const {
    if (node != o.node) return node < o.node;
    if (parent != o.parent) return parent < o.parent;
    return level < o.level;
  }
};

struct Frame {
  int32_t node;  // the caller's return node
  int32_t parent;
};

struct StepResult {
  bool alive_inside = false;   // some path is still inside the node's rule
  bool alive_outside = false;  // some path left it (unknown stack) and lives
  bool escaped = false;        // the node's own rule ended after this byte
  bool unknown = false;        // precision given up
};

class Classifier {
 public:
  explicit Classifier(const CompiledGrammar& grammar) : g_(grammar) {}

  TokenClasses run(int32_t start_node);

 private:
  int32_t intern(int32_t node, int32_t parent) {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) |
                         static_cast<uint32_t>(parent + 1);
    auto [it, inserted] = frame_ids_.emplace(key, static_cast<int32_t>(frames_.size()));
    if (inserted) frames_.push_back({node, parent});
    return it->second;
  }

  // Whether every string over `bytes` of at most `height` bytes read from
  // the plain node `node` passes only through plain nodes: then a whole trie
  // subtree is accepted without walking it.
  bool absorbs(int32_t node, const uint64_t* bytes, int32_t height);

  // Follows pushes and pops from `start` (just entered by reading a byte);
  // appends the elements that rest on scanning nodes to `out`.
  void expand(Elem start, std::vector<Elem>& out, StepResult& result);
  void step(const std::vector<Elem>& from, uint8_t byte, std::vector<Elem>& out,
            StepResult& result);

  const CompiledGrammar& g_;
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> frame_ids_;
  std::vector<Elem> work_;
  std::vector<Elem> visited_;
  std::vector<int32_t> frontier_;
  std::vector<int32_t> next_frontier_;
};

void Classifier::expand(Elem start, std::vector<Elem>& out, StepResult& result) {
  // The common case inside a rule: a plain byte-reading node.
  if (g_.is_plain(start.node)) {
    (start.level == 0 ? result.alive_inside : result.alive_outside) = true;
    out.push_back(start);
    return;
  }
  work_.clear();
  work_.push_back(start);
  while (!work_.empty()) {
    const Elem x = work_.back();
    work_.pop_back();
    if (std::find(visited_.begin(), visited_.end(), x) != visited_.end()) continue;
    if (visited_.size() >= kMaxElements) {
      result.unknown = true;
      return;
    }
    visited_.push_back(x);
    (x.level == 0 ? result.alive_inside : result.alive_outside) = true;
    if (g_.is_scanning(x.node)) out.push_back(x);
    for (const CallEdge& call : g_.calls(x.node)) {
      const int32_t frame = intern(call.ret, x.parent);
      work_.push_back({g_.rule_start(call.rule), frame, x.level});
    }
    if (!g_.is_final(x.node)) continue;
    if (x.parent >= 0) {
      const Frame& f = frames_[x.parent];
      work_.push_back({f.node, f.parent, x.level});
      continue;
    }
    // The rule ends with the stack unknown: continue in every caller.
    if (x.level == 0) result.escaped = true;
    const auto& callers = g_.callers(g_.rule_of(x.node));
    if (callers.empty()) continue;  // only the root: the output may end here
    if (x.level >= kMaxEscapeLevels) {
      result.unknown = true;
      continue;
    }
    for (int32_t ret : callers) work_.push_back({ret, -1, x.level + 1});
  }
}

bool Classifier::absorbs(int32_t node, const uint64_t* bytes, int32_t height) {
  frontier_.assign(1, node);
  for (int32_t level = 0; level < height; ++level) {
    next_frontier_.clear();
    for (int32_t y : frontier_) {
      const uint64_t* plain = g_.plain_bytes(y);
      for (int w = 0; w < 4; ++w) {
        if (bytes[w] & ~plain[w]) return false;
      }
      // Targets of the byte classes that hold any of `bytes`.
      const int32_t classes = g_.num_byte_classes(y);
      for (int32_t c = 0; c < classes; ++c) {
        const uint64_t* in_class = g_.byte_class_bytes(y, c);
        if (!((bytes[0] & in_class[0]) | (bytes[1] & in_class[1]) | (bytes[2] & in_class[2]) |
              (bytes[3] & in_class[3]))) {
          continue;
        }
        const int32_t t = g_.next_by_class(y, c);
        if (std::find(next_frontier_.begin(), next_frontier_.end(), t) == next_frontier_.end()) {
          next_frontier_.push_back(t);
        }
      }
      if (next_frontier_.size() > 32) return false;
    }
    std::sort(next_frontier_.begin(), next_frontier_.end());
    if (next_frontier_ == frontier_) return true;  // a fixpoint: any depth
    frontier_.swap(next_frontier_);
  }
  return true;
}

void Classifier::step(const std::vector<Elem>& from, uint8_t byte, std::vector<Elem>& out,
                      StepResult& result) {
  out.clear();
  visited_.clear();
  for (const Elem& x : from) {
    if (!g_.reads_bytes(x.node)) continue;
    const int32_t next = g_.next(x.node, byte);
    if (next >= 0) expand({next, x.parent, x.level}, out, result);
    if (result.unknown) break;
  }
  if (out.size() > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
}

TokenClasses Classifier::run(int32_t start_node) {
  const Vocabulary& vocab = g_.vocabulary();
  const int32_t max_depth = vocab.max_token_bytes();
  std::vector<std::vector<Elem>> states(max_depth + 1);
  std::vector<uint8_t> sticky(max_depth + 1, 0);
  states[0] = {{start_node, -1, 0}};
  const std::vector<int32_t>& trie_tokens = vocab.trie_tokens();

  std::vector<int32_t> accepted;
  std::vector<int32_t> whole;  // context-dependent, checked whole
  std::unordered_map<std::string, std::vector<int32_t>> by_suffix;
  std::vector<int32_t> escapes;  // depths on the current trie path where the rule ended
  int32_t num_uncertain = 0;
  auto add_uncertain = [&](int32_t token, int32_t depth) {
    ++num_uncertain;
    if (sticky[depth] || escapes.empty()) {
      whole.push_back(token);
      return;
    }
    const std::string& bytes = vocab.bytes(token);
    for (int32_t e : escapes) by_suffix[bytes.substr(e)].push_back(token);
  };
  for (int32_t i = 1; i < vocab.trie_size();) {
    const int32_t d = vocab.trie_depth(i);
    while (!escapes.empty() && escapes.back() >= d) escapes.pop_back();
    StepResult result;
    step(states[d - 1], vocab.trie_byte(i), states[d], result);
    sticky[d] = sticky[d - 1] || result.unknown;
    for (int32_t k = vocab.token_begin(i); k < vocab.token_begin(i + 1); ++k) {
      if (result.alive_inside) {
        accepted.push_back(trie_tokens[k]);
      } else if (result.alive_outside || sticky[d]) {
        add_uncertain(trie_tokens[k], d);
      }
    }
    if (result.escaped) escapes.push_back(d);
    const int32_t end = vocab.trie_end(i);
    // A big subtree the single in-frame path reads through plain nodes only
    // is accepted whole (string contents, counted character runs).
    if (states[d].size() == 1 && states[d][0].level == 0 && !sticky[d] &&
        vocab.token_begin(end) - vocab.token_begin(i + 1) >= 2 && g_.is_plain(states[d][0].node) &&
        absorbs(states[d][0].node, vocab.trie_subtree_bytes(i), vocab.trie_height(i))) {
      accepted.insert(accepted.end(), trie_tokens.begin() + vocab.token_begin(i + 1),
                      trie_tokens.begin() + vocab.token_begin(end));
      i = end;
      continue;
    }
    if (states[d].empty()) {
      if (sticky[d]) {
        for (int32_t k = vocab.token_begin(i + 1); k < vocab.token_begin(end); ++k) {
          add_uncertain(trie_tokens[k], d);
        }
      }
      i = end;
    } else {
      ++i;
    }
  }

  TokenClasses classes;
  classes.num_accepted = static_cast<int32_t>(accepted.size());
  classes.num_uncertain = num_uncertain;
  classes.num_rejected = vocab.num_matchable() - classes.num_accepted - num_uncertain;
  classes.uncertain = std::move(whole);
  for (auto& [suffix, tokens] : by_suffix) {
    classes.suffix_groups.push_back({suffix, std::move(tokens)});
  }
  // Deterministic order (by suffix) keeps masks reproducible run to run.
  std::sort(classes.suffix_groups.begin(), classes.suffix_groups.end(),
            [](const SuffixGroup& a, const SuffixGroup& b) { return a.suffix < b.suffix; });
  const int32_t words = vocab.mask_words();
  const int32_t smaller = std::min(classes.num_accepted, classes.num_rejected + num_uncertain);
  if (smaller > words) {
    classes.storage = TokenClasses::Storage::AcceptedBitset;
    classes.bitset.assign(words, 0);
    for (int32_t id : accepted) classes.bitset[id >> 5] |= 1u << (id & 31);
  } else if (classes.num_accepted <= classes.num_rejected + num_uncertain) {
    classes.storage = TokenClasses::Storage::AcceptedList;
    std::sort(accepted.begin(), accepted.end());
    classes.list = std::move(accepted);
  } else {
    classes.storage = TokenClasses::Storage::RejectedList;
    // Every matchable token not accepted outright: the rejected and the
    // context-dependent ones (the matcher adds back those that pass).
    std::vector<uint8_t> is_accepted(vocab.size(), 0);
    for (int32_t id : accepted) is_accepted[id] = 1;
    for (int32_t id = 0; id < vocab.size(); ++id) {
      if (vocab.is_matchable(id) && !is_accepted[id]) classes.list.push_back(id);
    }
  }
  return classes;
}

}  // namespace

TokenClasses classify_tokens(const CompiledGrammar& grammar, int32_t node) {
  Classifier classifier(grammar);
  return classifier.run(node);
}

}  // namespace megactx::grammar
