#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace megactx {

std::string translate_onig_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (e == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else if (e == 'w') {
        out += in_class ? "\\p{L}\\p{M}\\p{Nd}\\p{Pc}" : "[\\p{L}\\p{M}\\p{Nd}\\p{Pc}]";
      } else if (e == 'W' && !in_class) {
        out += "[^\\p{L}\\p{M}\\p{Nd}\\p{Pc}]";
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
};

Regex::Regex(std::string_view pattern, bool translate)
    : pattern_(pattern), impl_(std::make_unique<Impl>()) {
  const std::string source = translate ? translate_onig_pattern(pattern) : std::string(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
                              PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    fail("cannot compile tokenizer regex '{}': {} at offset {}", std::string(pattern),
         reinterpret_cast<const char*>(message), error_offset);
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

namespace {

// Match data is per thread: Regex objects are shared by concurrent encodes.
struct MatchData {
  pcre2_match_data* data = pcre2_match_data_create(4, nullptr);
  ~MatchData() { pcre2_match_data_free(data); }
};

pcre2_match_data* thread_match_data() {
  thread_local MatchData match_data;
  return match_data.data;
}

}  // namespace

bool Regex::next_match(std::string_view text, size_t* start, size_t* match_start,
                       size_t* match_end) const {
  if (*start > text.size()) return false;
  pcre2_match_data* data = thread_match_data();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = PCRE2_ERROR_JIT_STACKLIMIT;
  if (impl_->jit)
    rc = pcre2_jit_match(impl_->code, subject, text.size(), *start, PCRE2_NO_UTF_CHECK, data,
                         nullptr);
  // The interpreter has no small fixed stack: the fallback when JIT gives up.
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
    rc = pcre2_match(impl_->code, subject, text.size(), *start, PCRE2_NO_UTF_CHECK, data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail("tokenizer regex '{}' failed to match (PCRE2 error {})", pattern_, rc);
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  *match_start = ovector[0];
  *match_end = ovector[1];
  if (*match_end < *match_start) return false;  // \K tricks; not used by tokenizer files
  if (*match_end > *match_start) {
    *start = *match_end;
  } else if (*match_end >= text.size()) {  // empty match at the end: last one
    *start = text.size() + 1;
  } else {  // empty match: step over one character, as Oniguruma's find_iter
    size_t length = 1;
    utf8::decode(text, *match_end, &length);
    *start = *match_end + length;
  }
  return true;
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
  matches.clear();
  for_each_match(text, [&](size_t s, size_t e) { matches.emplace_back(s, e); });
}

bool Regex::matches_at(std::string_view text, size_t pos, size_t* end) const {
  pcre2_match_data* data = thread_match_data();
  const int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                             pos, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, data, nullptr);
  if (rc < 0) return false;
  if (end) *end = pcre2_get_ovector_pointer(data)[1];
  return true;
}

}  // namespace megactx
