// A grammar compiled against one vocabulary: a pushdown automaton over bytes.
// Every rule is a minimal DFA; all DFA states share one numbering ("nodes").
// A node may read a byte (same rule), call a rule (push, continue at the
// return node when the callee reaches a final node) or read one named token.
// For every node that reads bytes the vocabulary is split once, with the
// stack below the node's rule unknown, into tokens always accepted, always
// rejected and context-dependent ones (TokenClasses); a matcher only walks the
// last group per step. Immutable after compilation and shared across threads;
// the token classes of a node are computed on first use when not
// precomputed, published atomically.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "grammar/fsm.h"
#include "grammar/grammar_ir.h"
#include "grammar/vocabulary.h"

namespace megactx::grammar {

struct CallEdge {
  int32_t rule;
  int32_t ret;  // node where the caller continues
};

// label >= 0: that token id; label < 0: any matchable token outside
// except_mask(-label - 1).
struct TokenEdge {
  int32_t label;
  int32_t target;
};

// A context-dependent token leaves the node's rule (the rule ends) after
// some of its bytes; what decides it is whether the rest of its bytes fit
// where the real caller continues. Tokens with the same rest share one
// check: `"name":` and `"id":` both need ':' after the string rule ends.
struct SuffixGroup {
  std::string suffix;           // the bytes after the rule ends
  std::vector<int32_t> tokens;  // allowed when the caller accepts `suffix`
};

// The vocabulary split for one node (see the file comment). Lists hold ids.
struct TokenClasses {
  enum class Storage : uint8_t { AcceptedList, RejectedList, AcceptedBitset };
  Storage storage = Storage::AcceptedList;
  // AcceptedList: the accepted ids; RejectedList: every other matchable id
  // (rejected or context-dependent).
  std::vector<int32_t> list;
  std::vector<uint32_t> bitset;  // AcceptedBitset
  std::vector<SuffixGroup> suffix_groups;
  // Context-dependent tokens the split could not reduce to suffixes (a walk
  // past its precision bounds): checked whole, in byte order so consecutive
  // ones share their prefix's work.
  std::vector<int32_t> uncertain;
  int32_t num_accepted = 0;
  int32_t num_rejected = 0;
  int32_t num_uncertain = 0;  // distinct tokens in suffix_groups and uncertain
};

struct CompileOptions {
  FsmLimits limits;
  // Deepest stack (in frames: about two per JSON nesting level) a matcher
  // builds; deeper nesting is rejected (a token that
  // needs it is not allowed), so no input can exhaust memory.
  int32_t max_stack_depth = 2048;
  // Classify tokens for every node at compile time; otherwise on first use.
  bool precompute_token_classes = true;
  // Threads for that (0: the hardware's, at most 8).
  int32_t precompute_threads = 0;
  // Expand small non-recursive rules into their callers (GBNF's `ws`, `hex`):
  // a token crossing a rule boundary costs a runtime check, one inside a rule
  // does not. JSON Schema grammars share their rules on purpose instead.
  bool inline_small_rules = false;
};

class CompiledGrammar {
 public:
  CompiledGrammar() = default;
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  const Vocabulary& vocabulary() const { return *vocabulary_; }
  const std::shared_ptr<const Vocabulary>& vocabulary_ptr() const { return vocabulary_; }

  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()); }
  int32_t num_rules() const { return static_cast<int32_t>(rule_start_.size()); }
  int32_t root_rule() const { return root_rule_; }
  int32_t rule_start(int32_t rule) const { return rule_start_[rule]; }
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }
  int32_t rule_of(int32_t node) const { return nodes_[node].rule; }
  bool is_final(int32_t node) const { return nodes_[node].final; }
  bool reads_bytes(int32_t node) const { return nodes_[node].reads_bytes; }
  // Reads bytes or tokens: a node a matcher's state rests on between bytes.
  bool is_scanning(int32_t node) const { return nodes_[node].scanning; }
  // Neither final nor calling: entering it leads nowhere else.
  bool is_plain(int32_t node) const { return nodes_[node].plain; }
  int32_t next(int32_t node, uint8_t byte) const {
    const Node& n = nodes_[node];
    return byte_next_[n.row + byte_class_[n.class_map + byte]];
  }
  // The byte classes of a node's rule: their number, the bytes of each (4
  // words of 64 bits) and the node's target per class (-1: none).
  int32_t num_byte_classes(int32_t node) const { return rule_classes_[nodes_[node].rule]; }
  const uint64_t* byte_class_bytes(int32_t node, int32_t c) const {
    return &class_bytes_[4 * (rule_class_begin_[nodes_[node].rule] + c)];
  }
  int32_t next_by_class(int32_t node, int32_t c) const { return byte_next_[nodes_[node].row + c]; }
  // Bytes leading from `node` to a plain node (4 words of 64 bits).
  const uint64_t* plain_bytes(int32_t node) const { return &plain_bytes_[4 * node]; }
  std::span<const CallEdge> calls(int32_t node) const {
    const Node& n = nodes_[node];
    return {calls_.data() + n.call_begin, calls_.data() + n.call_end};
  }
  std::span<const TokenEdge> tokens(int32_t node) const {
    const Node& n = nodes_[node];
    return {tokens_.data() + n.token_begin, tokens_.data() + n.token_end};
  }
  // Return nodes of every call of `rule`: where its end may lead.
  const std::vector<int32_t>& callers(int32_t rule) const { return callers_[rule]; }
  const std::vector<uint32_t>& except_mask(int32_t index) const { return except_masks_[index]; }
  bool uses_tokens() const { return !tokens_.empty(); }
  int32_t max_stack_depth() const { return max_stack_depth_; }

  const TokenClasses& token_classes(int32_t node) const;
  // Nodes that share token classes (the same behaviour for every string as
  // long as the longest token) share one representative; a counted
  // repetition's interior is then classified once.
  int32_t class_representative(int32_t node) const { return representative_[node]; }

  // Readable dump of the automaton, for error messages and debugging.
  std::string describe() const;

 private:
  friend std::shared_ptr<const CompiledGrammar> compile_grammar(const Grammar&,
                                                                std::shared_ptr<const Vocabulary>,
                                                                const CompileOptions&);

  struct Node {
    int32_t rule = 0;
    int32_t row = 0;        // into byte_next_
    int32_t class_map = 0;  // into byte_class_ (256 entries per rule)
    int32_t call_begin = 0, call_end = 0;
    int32_t token_begin = 0, token_end = 0;
    bool final = false;
    bool reads_bytes = false;
    bool scanning = false;
    bool plain = false;
  };

  std::shared_ptr<const Vocabulary> vocabulary_;
  std::vector<Node> nodes_;
  std::vector<int32_t> byte_next_;  // -1: no edge
  std::vector<uint16_t> byte_class_;
  std::vector<CallEdge> calls_;
  std::vector<TokenEdge> tokens_;
  std::vector<int32_t> rule_start_;
  std::vector<std::string> rule_names_;
  std::vector<std::vector<int32_t>> callers_;
  std::vector<std::vector<uint32_t>> except_masks_;
  std::vector<int32_t> representative_;
  std::vector<uint64_t> plain_bytes_;
  std::vector<int32_t> rule_classes_;      // byte classes per rule
  std::vector<int32_t> rule_class_begin_;  // first class of each rule in class_bytes_
  std::vector<uint64_t> class_bytes_;
  int32_t root_rule_ = 0;
  int32_t max_stack_depth_ = 2048;
  // Lazily published classes; owned, freed in the destructor.
  std::unique_ptr<std::atomic<const TokenClasses*>[]> classes_;
};

// Builds the automaton: one minimal DFA per rule reachable from the root,
// rules that derive no string dropped, left recursion rejected (a pushdown
// walk could never terminate), named tokens resolved. Throws megactx::Error.
std::shared_ptr<const CompiledGrammar> compile_grammar(const Grammar& grammar,
                                                       std::shared_ptr<const Vocabulary> vocabulary,
                                                       const CompileOptions& options = {});

}  // namespace megactx::grammar
