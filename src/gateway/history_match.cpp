#include "gateway/history_match.h"

#include <algorithm>

namespace megactx::gateway {

namespace {

// The cut lies between the end of the last recorded span and the first new
// content: closing and opening markup, never more than this many characters
// before `upper` in any chat template the gateway has met.
constexpr size_t kSearchWindow = 4096;
// Matches longer than this carry no more evidence.
constexpr size_t kMatchCap = 4096;

size_t common_prefix(std::string_view a, std::string_view b) {
  const size_t limit = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < limit && a[i] == b[i]) ++i;
  return i;
}

// Length of the common suffix of text[0, pos) and target, capped.
size_t suffix_match(std::string_view text, size_t pos, std::string_view target) {
  size_t n = 0;
  const size_t limit = std::min({pos, target.size(), kMatchCap});
  while (n < limit && text[pos - 1 - n] == target[target.size() - 1 - n]) ++n;
  return n;
}

struct Best {
  size_t pos = 0;
  size_t length = 0;
};

Best best_end(std::string_view rendered, size_t lo, size_t hi, std::string_view target) {
  Best best;
  for (size_t pos = lo; pos <= hi; ++pos) {
    const size_t length = suffix_match(rendered, pos, target);
    if (length > 0 && length >= best.length) best = {pos, length};
  }
  return best;
}

}  // namespace

HistoryMatch match_history(const Session& session, const std::vector<uint64_t>& fingerprints) {
  HistoryMatch best;
  for (const Trace& trace : session.traces) {
    const size_t common = static_cast<size_t>(
        std::mismatch(fingerprints.begin(),
                      fingerprints.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                 fingerprints.size(), trace.history.size())),
                      trace.history.begin())
            .first -
        fingerprints.begin());
    // The latest turn of this trace whose history the request repeats whole.
    for (size_t j = trace.turns.size(); j-- > 0;) {
      const size_t end = trace.turn_history_end[j];
      if (end > common) continue;
      const bool latest = j + 1 == trace.turns.size();
      // Longer wins; at equal length a continuation beats a fork, a later trace an earlier one.
      if (!best.found || end > best.history_end || (end == best.history_end && latest)) {
        best.found = true;
        best.trace = trace.index;
        best.turn = trace.turns[j];
        best.history_end = end;
        best.token_end = trace.turn_token_end[j];
        best.latest = latest;
      }
      break;
    }
  }
  return best;
}

Alignment align_history(std::string_view rendered, std::string_view recorded, size_t stop_chars,
                        size_t output_chars, size_t upper) {
  Alignment alignment;
  alignment.diverges_at = common_prefix(rendered, recorded);
  if (alignment.diverges_at == recorded.size()) {
    alignment.aligned = alignment.exact = true;
    alignment.cut = recorded.size();
    return alignment;
  }
  stop_chars = std::min(stop_chars, recorded.size());
  const size_t hi = std::min(upper, rendered.size());
  const size_t window_start = hi > kSearchWindow ? hi - kSearchWindow : 0;
  // The first difference can lie inside the stop token's text when the
  // rendering goes on with markup of the same start ("<|endoftext|>" against
  // "<|user|>"), past where the text without it ends: search from there.
  const size_t first = std::min(alignment.diverges_at, recorded.size() - stop_chars);
  const size_t lo = std::min(std::max(first, window_start), hi);
  // Enough of the generated text must match to trust the place: a few
  // characters, or everything the rendering has between the first
  // difference and the cut (a template that re-rendered the span's start).
  const size_t evidence = std::min<size_t>(8, output_chars);
  auto trusted = [&](const Best& best, size_t stop) {
    return best.length > stop &&
           (best.length >= stop + evidence || best.pos - best.length <= alignment.diverges_at);
  };
  // The stop token's text written by the template right after the span (GLM
  // writes <|observation|> before tool results), else the span without it.
  const Best with_stop = best_end(rendered, lo, hi, recorded);
  if (trusted(with_stop, stop_chars)) {
    alignment.aligned = true;
    alignment.cut = with_stop.pos;
    return alignment;
  }
  if (stop_chars > 0) {
    const std::string_view without_stop = recorded.substr(0, recorded.size() - stop_chars);
    const Best best = best_end(rendered, lo, hi, without_stop);
    if (trusted(best, 0)) {
      alignment.aligned = true;
      alignment.cut = best.pos;
    }
  }
  return alignment;
}

}  // namespace megactx::gateway
