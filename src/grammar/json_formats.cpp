#include "grammar/json_formats.h"

#include <map>

namespace megactx::grammar {

namespace {

// RFC 3339 dates with the real month lengths and leap years (a year is leap
// when divisible by 4, except centuries not divisible by 400).
constexpr const char* kYear = "[0-9]{4}";
constexpr const char* kLeapYear =
    "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)";
constexpr const char* kMonthDay =
    "((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"
    "02-(0[1-9]|1[0-9]|2[0-8]))";
constexpr const char* kTime =
    "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-"
    "9])";
constexpr const char* kOctet = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
constexpr const char* kHextet = "[0-9A-Fa-f]{1,4}";
constexpr const char* kLabel = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";

std::string date() {
  return std::string("(") + kYear + "-" + kMonthDay + "|" + kLeapYear + "-02-29)";
}

std::string ipv4() {
  return std::string("(") + kOctet + "\\.){3}" + kOctet;
}

// The RFC 4291 text forms: eight hextets, or fewer around one "::", the last
// 32 bits optionally as an IPv4 address.
std::string ipv6() {
  const std::string h = kHextet;
  auto times = [&](int n) {  // n hextets each followed by ':'
    return n == 0 ? std::string() : "(" + h + ":){" + std::to_string(n) + "}";
  };
  const std::string tail32 = "(" + h + ":" + h + "|" + ipv4() + ")";
  std::string out = "(" + times(6) + tail32;
  // k hextets (0..7) before "::", the rest (up to 7-k, the last 32 bits as a
  // pair or IPv4) after.
  for (int before = 0; before <= 7; ++before) {
    const std::string head =
        before == 0 ? "" : "(" + h + ":){" + std::to_string(before - 1) + "}" + h;
    const int room = 7 - before;  // hextets after "::" (an IPv4 counts as two)
    std::string after = "(";
    after += "";  // nothing after
    for (int n = 1; n <= room; ++n) {
      after += "|(" + h + ":){" + std::to_string(n - 1) + "}" + h;
      if (n >= 2) after += "|(" + h + ":){" + std::to_string(n - 2) + "}" + ipv4();
    }
    after += ")";
    out += "|" + head + "::" + after;
  }
  return out + ")";
}

}  // namespace

std::optional<std::string> format_regex(std::string_view format) {
  static const std::map<std::string, std::string, std::less<>> formats = {
      {"date", date()},
      {"time", kTime},
      {"date-time", date() + "[Tt]" + kTime},
      // A domain of two labels or more: RFC 5321 would take a single label
      // ("a@localhost"), but common validators (ajv-formats' full mode among
      // them) reject it, and a generated address should pass all of them.
      {"email", "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@" +
                    std::string(kLabel) + "(\\." + kLabel + ")+"},
      {"hostname", std::string(kLabel) + "(\\." + kLabel + ")*"},
      {"ipv4", ipv4()},
      {"ipv6", ipv6()},
      {"uuid", "[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"},
      {"uri", "[A-Za-z][A-Za-z0-9+.-]*:[^\\x00-\\x20\"<>\\\\^`{|}]*"},
  };
  auto it = formats.find(format);
  if (it == formats.end()) return std::nullopt;
  return it->second;
}

}  // namespace megactx::grammar
