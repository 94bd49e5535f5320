// StreamingDetokenizer: bytes of each token are appended to `pending_`; what
// is settled (everything but an unfinished UTF-8 sequence at the end) is
// emitted, with ill-formed bytes replaced by U+FFFD exactly as decode() of the
// whole sequence would (a settled prefix never changes its replacement).
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace megactx {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamingDetokenizer::push(TokenId id) {
  if (skip_special_tokens_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id);
  const size_t settled = pending_.size() - utf8::incomplete_suffix_length(pending_);
  if (settled == 0) return {};
  const std::string_view ready(pending_.data(), settled);
  std::string out = utf8::is_valid(ready) ? std::string(ready) : utf8::sanitize(ready);
  pending_.erase(0, settled);
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace megactx
