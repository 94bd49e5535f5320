#include "grammar/json_number_bounds.h"

#include <vector>

#include "core/error.h"
#include "grammar/regex_parser.h"

namespace megactx::grammar {

namespace {

// Bounds come from schemas; a 1e100000 bound would expand to that many digits.
constexpr int64_t kMaxDigits = 400;

constexpr const char* kUnsignedInteger = "(0|[1-9][0-9]*)";
constexpr const char* kAnyFraction = "(\\.[0-9]+)?";

std::string digits(char lo, char hi) {
  if (lo == hi) return std::string(1, lo);
  return std::string("[") + lo + "-" + hi + "]";
}

std::string join(const std::vector<std::string>& options) {
  if (options.empty()) return "";
  std::string out = "(";
  for (size_t i = 0; i < options.size(); ++i) {
    if (i) out += "|";
    out += options[i];
  }
  return out + ")";
}

// Integer parts (no leading zeros) greater / smaller than `I`.
std::vector<std::string> integers_greater(const std::string& I) {
  const size_t n = I.size();
  std::vector<std::string> out = {"[1-9][0-9]{" + std::to_string(n) + ",}"};
  for (size_t j = 0; j < n; ++j) {
    if (I[j] == '9') continue;
    out.push_back(I.substr(0, j) + digits(static_cast<char>(I[j] + 1), '9') + "[0-9]{" +
                  std::to_string(n - j - 1) + "}");
  }
  return out;
}

std::vector<std::string> integers_smaller(const std::string& I) {
  const size_t n = I.size();
  std::vector<std::string> out;
  if (I == "0") return out;
  if (n >= 2) {
    out.push_back("0");
    out.push_back("[1-9][0-9]{0," + std::to_string(n - 2) + "}");
  }
  for (size_t j = 0; j < n; ++j) {
    const char lo = (j == 0 && n > 1) ? '1' : '0';
    if (I[j] <= lo) continue;
    out.push_back(I.substr(0, j) + digits(lo, static_cast<char>(I[j] - 1)) + "[0-9]{" +
                  std::to_string(n - j - 1) + "}");
  }
  return out;
}

// Fraction parts (including the dot; may be absent where noted) compared to
// the fraction digits F of the bound, trailing zeros padding both.
std::string fraction_at_least(const std::string& F, bool strict) {
  if (F.empty()) return strict ? "\\.[0-9]*[1-9][0-9]*" : kAnyFraction;
  std::vector<std::string> options;
  for (size_t j = 0; j < F.size(); ++j) {
    if (F[j] == '9') continue;
    options.push_back(F.substr(0, j) + digits(static_cast<char>(F[j] + 1), '9') + "[0-9]*");
  }
  options.push_back(F + (strict ? "[0-9]*[1-9][0-9]*" : "[0-9]*"));
  return "\\." + join(options);
}

// Empty string when no fraction satisfies (only possible for `< .0`).
std::string fraction_at_most(const std::string& F, bool strict) {
  if (F.empty()) return strict ? "" : "(\\.0+)?";
  std::vector<std::string> options;
  for (size_t j = 0; j < F.size(); ++j) {
    if (F[j] == '0') continue;
    options.push_back(F.substr(0, j) + digits('0', static_cast<char>(F[j] - 1)) + "[0-9]*");
  }
  options.push_back("0+");
  const size_t prefixes = strict ? F.size() : F.size() + 1;
  for (size_t j = 1; j < prefixes; ++j) options.push_back(F.substr(0, j) + "0*");
  return "(\\." + join(options) + ")?";
}

// Unsigned decimals m (no sign) with m >= c (m > c when strict).
std::string unsigned_at_least(const Decimal& c, bool strict) {
  return join({join(integers_greater(c.integer)) + kAnyFraction,
               c.integer + fraction_at_least(c.fraction, strict)});
}

// Empty string when none satisfies (m < 0).
std::string unsigned_at_most(const Decimal& c, bool strict) {
  std::vector<std::string> options;
  const auto smaller = integers_smaller(c.integer);
  if (!smaller.empty()) options.push_back(join(smaller) + kAnyFraction);
  const std::string same = fraction_at_most(c.fraction, strict);
  if (!same.empty()) options.push_back(c.integer + same);
  return options.empty() ? "" : join(options);
}

const std::string kAnyUnsigned = std::string(kUnsignedInteger) + kAnyFraction;

// x >= L (x > L when exclusive), as a regex over -?m.
std::string at_least(const NumberBound& b) {
  std::vector<std::string> options;
  if (!b.value.negative) {
    options.push_back(unsigned_at_least(b.value, b.exclusive));
    if (b.value.is_zero() && !b.exclusive) options.push_back("-0(\\.0+)?");
  } else {
    options.push_back(kAnyUnsigned);
    const std::string neg = unsigned_at_most(b.value, b.exclusive);
    if (!neg.empty()) options.push_back("-" + neg);
  }
  return join(options);
}

std::string at_most(const NumberBound& b) {
  std::vector<std::string> options;
  if (!b.value.negative) {
    const std::string pos = unsigned_at_most(b.value, b.exclusive);
    if (!pos.empty()) options.push_back(pos);
    if (b.value.is_zero() && b.exclusive) {
      options.push_back("-" + unsigned_at_least(b.value, true));
    } else {
      options.push_back("-" + kAnyUnsigned);
    }
  } else {
    options.push_back("-" + unsigned_at_least(b.value, b.exclusive));
  }
  return join(options);
}

Dfa regex_dfa(Grammar& grammar, const std::string& regex, const FsmLimits& limits) {
  return build_dfa(grammar, parse_regex(grammar, regex), limits, "number bounds");
}

}  // namespace

Decimal parse_decimal(std::string_view text) {
  size_t i = 0;
  Decimal d;
  auto bad = [&]() { fail("'{}' is not a JSON number", text); };
  if (i < text.size() && text[i] == '-') {
    d.negative = true;
    ++i;
  }
  std::string int_digits;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') int_digits += text[i++];
  if (int_digits.empty()) bad();
  std::string frac_digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') frac_digits += text[i++];
    if (frac_digits.empty()) bad();
  }
  int64_t exponent = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool negative_exponent = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative_exponent = text[i++] == '-';
    if (i >= text.size()) bad();
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      exponent = exponent * 10 + (text[i++] - '0');
      MEGACTX_CHECK(exponent <= kMaxDigits, "number {} is too large or too small for a bound",
                    text);
    }
    if (negative_exponent) exponent = -exponent;
  }
  if (i != text.size()) bad();
  // Shift the decimal point by the exponent.
  std::string all = int_digits + frac_digits;
  int64_t point = static_cast<int64_t>(int_digits.size()) + exponent;
  if (point < 0) {
    all = std::string(static_cast<size_t>(-point), '0') + all;
    point = 0;
  }
  if (point > static_cast<int64_t>(all.size())) all += std::string(point - all.size(), '0');
  d.integer = all.substr(0, point);
  d.fraction = all.substr(point);
  const size_t first = d.integer.find_first_not_of('0');
  d.integer = first == std::string::npos ? "0" : d.integer.substr(first);
  while (!d.fraction.empty() && d.fraction.back() == '0') d.fraction.pop_back();
  MEGACTX_CHECK(d.integer.size() + d.fraction.size() <= kMaxDigits,
                "number {} has too many digits for a bound", text);
  if (d.is_zero()) d.negative = false;
  return d;
}

ExprId bounded_number(Grammar& grammar, const std::optional<NumberBound>& lower,
                      const std::optional<NumberBound>& upper, bool integer,
                      const FsmLimits& limits) {
  const std::string base = integer ? std::string("-?") + kUnsignedInteger : "-?" + kAnyUnsigned;
  Dfa dfa = regex_dfa(grammar, base, limits);
  if (lower) dfa = intersect(dfa, regex_dfa(grammar, at_least(*lower), limits));
  if (upper) dfa = intersect(dfa, regex_dfa(grammar, at_most(*upper), limits));
  return dfa_to_expr(grammar, dfa);
}

}  // namespace megactx::grammar
