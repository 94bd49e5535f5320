#define PCRE2_CODE_UNIT_WIDTH 8
#include "gateway/rule_regex.h"

#include <pcre2.h>

#include "core/error.h"

namespace megactx::gateway {

namespace {

constexpr uint32_t kMatchLimit = 200'000;
constexpr uint32_t kDepthLimit = 2'000;

}  // namespace

struct RulePattern::Impl {
  pcre2_code* code = nullptr;
  pcre2_match_context* context = nullptr;
  ~Impl() {
    if (context != nullptr) pcre2_match_context_free(context);
    if (code != nullptr) pcre2_code_free(code);
  }
};

RulePattern::RulePattern(std::string pattern, bool case_sensitive)
    : pattern_(std::move(pattern)), impl_(std::make_unique<Impl>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  if (!case_sensitive) options |= PCRE2_CASELESS;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                              options, &error_code, &error_offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    fail("rule pattern '{}' does not compile at offset {}: {}", pattern_, error_offset,
         reinterpret_cast<const char*>(message));
  }
  impl_->context = pcre2_match_context_create(nullptr);
  MEGACTX_CHECK(impl_->context != nullptr, "out of memory for a PCRE2 match context");
  pcre2_set_match_limit(impl_->context, kMatchLimit);
  pcre2_set_depth_limit(impl_->context, kDepthLimit);
}

RulePattern::~RulePattern() = default;
RulePattern::RulePattern(RulePattern&&) noexcept = default;
RulePattern& RulePattern::operator=(RulePattern&&) noexcept = default;

bool RulePattern::search(std::string_view text, std::string* matched) const {
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  if (data == nullptr) return false;
  const int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                             0, data, impl_->context);
  const bool found = rc >= 0;
  if (found && matched != nullptr) {
    const PCRE2_SIZE* offsets = pcre2_get_ovector_pointer(data);
    if (offsets[0] <= offsets[1] && offsets[1] <= text.size())
      *matched = std::string(text.substr(offsets[0], offsets[1] - offsets[0]));
  }
  pcre2_match_data_free(data);
  return found;
}

}  // namespace megactx::gateway
