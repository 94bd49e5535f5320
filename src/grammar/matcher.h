// GrammarMatcher: the per-request state of constrained decoding. Cheap to
// create from a CompiledGrammar; used by one thread at a time.
//
// State: a set of stack tops over a persistent stack (frames are shared and
// never mutated, so every past state stays valid), one state per accepted
// token kept for rollback. Per decode step the sampler calls
// fill_next_token_bitmask, masks the logits, samples, then accept_token.
// Speculative decoding checks drafts with accept_token and undoes the
// rejected ones with rollback.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/compiled_grammar.h"

namespace megactx::grammar {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Writes vocabulary().mask_words() words: bit i of words[i / 32] set when
  // token i may come next. Stop tokens are allowed exactly when the output may
  // end; special tokens only where the grammar names them. After the stop
  // token only stop tokens are set.
  void fill_next_token_bitmask(uint32_t* words);

  // Advances by one token; false (and the state unchanged) when the token
  // would violate the grammar. A stop token is accepted when the output may
  // end and terminates the matcher; once terminated only stop tokens are
  // accepted (each one more step, as the mask says).
  bool accept_token(int32_t token);

  // Advances by raw bytes (forced text, e.g. a jump-forward string); counts as
  // one step for rollback. False and unchanged when the bytes do not fit.
  bool accept_string(std::string_view bytes);

  // Undoes the last n accept_token / accept_string steps (n <= num_steps()).
  void rollback(int32_t n);
  void reset();

  // Bytes the grammar forces next (no other byte or token possible and the
  // output cannot end before them); may end inside a UTF-8 character.
  std::string find_jump_forward_string(size_t max_bytes = 4096);

  bool is_terminated() const { return history_.back().terminated; }
  // The output may end here (a stop token is allowed).
  bool can_terminate() const { return history_.back().can_end; }
  int32_t num_steps() const { return static_cast<int32_t>(history_.size()) - 1; }
  int32_t mask_words() const { return grammar_->vocabulary().mask_words(); }
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  struct Elem {
    int32_t node;
    int32_t parent;  // frame id, -1: the bottom of the stack
    bool operator==(const Elem& o) const { return node == o.node && parent == o.parent; }
    bool operator<(const Elem& o) const {
      return node != o.node ? node < o.node : parent < o.parent;
    }
  };
  struct Frame {
    int32_t node;  // the caller's return node
    int32_t parent;
    int32_t depth;
  };
  struct State {
    size_t begin;  // into elems_
    size_t end;
    bool can_end;
    bool terminated;
  };

  int32_t intern(int32_t node, int32_t parent);
  // Follows pushes and pops from `start`; resting elements go to `out`.
  void expand(Elem start, std::vector<Elem>& out, bool& can_end);
  void step(const Elem* begin, const Elem* end, uint8_t byte, std::vector<Elem>& out,
            bool& can_end);
  // Runs `bytes` from the current state into `out`; false when they do not fit.
  bool consume(std::string_view bytes, std::vector<Elem>& out, bool& can_end);
  void push_state(std::vector<Elem>& elems, bool can_end, bool terminated);
  // Runs `count` byte strings (sorted, bytes_of(i)) from the elements
  // `start`; accept(i) for each that fits. Consecutive strings share the work
  // of their common prefix.
  template <typename BytesOf, typename Accept>
  void walk_sorted(const std::vector<Elem>& start, size_t count, BytesOf bytes_of, Accept accept);
  // A node's context-dependent tokens checked exactly from `group`.
  void check_suffixes(const std::vector<Elem>& group, const std::vector<SuffixGroup>& suffixes,
                      uint32_t* words);
  void check_uncertain(const std::vector<Elem>& group, const std::vector<int32_t>& tokens,
                       uint32_t* words);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> frame_ids_;
  std::vector<Elem> elems_;     // all states' elements, back to back
  std::vector<State> history_;  // history_[0]: the start state

  // Scratch reused between calls.
  std::vector<Elem> work_;
  std::vector<Elem> visited_;
  std::vector<Elem> next_;
  std::vector<Elem> next2_;
  std::vector<std::vector<Elem>> depth_states_;
  std::vector<uint8_t> can_end_at_;
  std::vector<uint32_t> scratch_mask_;
};

}  // namespace megactx::grammar
