// How a new request of a session relates to what was recorded, in two steps.
//
// match_history, on message fingerprints (message_fingerprint.h): the
// recorded turn whose whole history (its request's messages and the reply the
// gateway returned) is the longest prefix of the new request. On a trace's
// latest turn the trace continues (append, or realign, below); on an earlier
// turn the request forks a new trace sharing that prefix; with none the
// history was rewritten (a compaction) or the session is new.
//
// align_history, on text: where, in the new request's rendered prompt, the
// recorded tokens end, so that only what follows is tokenized and the ids the
// engine generated are kept as they were (re-tokenizing their text drifts).
// When the rendering starts with the recorded text it is an append; when the
// template re-rendered an earlier span differently (reasoning dropped from
// older turns, arguments re-serialized, a blocked call the client never saw)
// the end of the recorded text is found in the rendering instead: realign.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "gateway/trajectory.h"

namespace megactx::gateway {

struct HistoryMatch {
  bool found = false;
  int64_t trace = -1;
  int64_t turn = -1;       // session turn index
  size_t history_end = 0;  // fingerprints covered (request messages + reply)
  size_t token_end = 0;    // the trace's tokens through that turn
  bool latest = false;     // the turn is the last of its trace (else: a fork)
};

HistoryMatch match_history(const Session& session, const std::vector<uint64_t>& fingerprints);

struct Alignment {
  bool aligned = false;
  bool exact = false;      // the rendering starts with the recorded text (append)
  size_t cut = 0;          // the new tokens are rendered[cut, end)
  size_t diverges_at = 0;  // first character where rendering and recorded text differ
};

// `recorded` is the decoded text of the trace through the matched turn,
// ending with that turn's output, whose last `stop_chars` characters are the
// text of the stop token the engine generated (absent from the rendering when
// the template does not write it there) and the `output_chars` before them
// are the generated text. The cut is searched no further than `upper` (where
// the first new message's content begins in the rendering).
Alignment align_history(std::string_view rendered, std::string_view recorded, size_t stop_chars,
                        size_t output_chars, size_t upper);

}  // namespace megactx::gateway
