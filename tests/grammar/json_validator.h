// A JSON Schema validator written from the specification (draft 2020-12
// semantics for the keywords the grammar engine supports), independent of the
// engine: it checks parsed instances, not text, and shares no code with the
// automaton. Formats are checked by parsing (dates by their calendar, IPv4 by
// its octets), patterns by PCRE2 (search semantics). The JSON-Schema-Test-
// Suite run checks this validator too.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

namespace megactx::grammar::test {

class JsonValidator {
 public:
  using Json = nlohmann::ordered_json;

  // draft4: $ref siblings ignored, boolean exclusiveMinimum/Maximum.
  explicit JsonValidator(const Json& root, bool draft4 = false) : root_(root), draft4_(draft4) {}

  bool valid(const Json& instance) const { return check(root_, instance, 0); }

 private:
  // Exact comparison of decimal numbers via their text: -1, 0, 1.
  static int compare_numbers(const Json& a, const Json& b) {
    auto norm = [](const Json& v, bool& negative, std::string& digits, long& point) {
      std::string s = v.dump();
      negative = !s.empty() && s[0] == '-';
      if (negative) s = s.substr(1);
      long exponent = 0;
      const size_t e = s.find_first_of("eE");
      if (e != std::string::npos) {
        exponent = std::stol(s.substr(e + 1));
        s = s.substr(0, e);
      }
      const size_t dot = s.find('.');
      std::string int_part = dot == std::string::npos ? s : s.substr(0, dot);
      std::string frac = dot == std::string::npos ? "" : s.substr(dot + 1);
      digits = int_part + frac;
      point = static_cast<long>(int_part.size()) + exponent;
      // Strip leading zeros (moving the point) and trailing zeros.
      while (!digits.empty() && digits[0] == '0') {
        digits.erase(0, 1);
        --point;
      }
      while (!digits.empty() && digits.back() == '0') digits.pop_back();
      if (digits.empty()) {
        negative = false;
        point = 0;
      }
    };
    bool na, nb;
    std::string da, db;
    long pa, pb;
    norm(a, na, da, pa);
    norm(b, nb, db, pb);
    if (na != nb) return na ? -1 : 1;
    int magnitude;
    if (da.empty() || db.empty()) {
      magnitude = da.empty() == db.empty() ? 0 : (da.empty() ? -1 : 1);
    } else if (pa != pb) {
      magnitude = pa < pb ? -1 : 1;
    } else {
      magnitude = da == db ? 0 : (da < db ? -1 : 1);
    }
    return na ? -magnitude : magnitude;
  }

  static bool equal(const Json& a, const Json& b) {
    if (a.is_number() && b.is_number()) return compare_numbers(a, b) == 0;
    if (a.type() != b.type()) return false;
    if (a.is_array()) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!equal(a[i], b[i])) return false;
      }
      return true;
    }
    if (a.is_object()) {
      if (a.size() != b.size()) return false;
      for (const auto& [k, v] : a.items()) {
        if (!b.contains(k) || !equal(v, b[k])) return false;
      }
      return true;
    }
    return a == b;
  }

  static bool has_type(const Json& v, const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    // Integers past 64 bits parse as floats; an integral value is an integer.
    if (t == "integer") {
      return v.is_number_integer() ||
             (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    }
    return false;
  }

  static size_t code_points(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }

  static bool search(const std::string& pattern, const std::string& s) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF, &error, &offset, nullptr);
    if (code == nullptr) return false;
    pcre2_match_data* data = pcre2_match_data_create(4, nullptr);
    const bool found = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0,
                                   data, nullptr) >= 0;
    pcre2_match_data_free(data);
    pcre2_code_free(code);
    return found;
  }

  static bool digits_at(const std::string& s, size_t at, size_t n, int& value) {
    if (at + n > s.size()) return false;
    value = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return false;
      value = value * 10 + (s[i] - '0');
    }
    return true;
  }

  // YYYY-MM-DD with the calendar's month lengths.
  static bool is_date(const std::string& s) {
    int y, m, d;
    if (s.size() != 10 || s[4] != '-' || s[7] != '-') return false;
    if (!digits_at(s, 0, 4, y) || !digits_at(s, 5, 2, m) || !digits_at(s, 8, 2, d)) return false;
    if (m < 1 || m > 12 || d < 1) return false;
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return d <= days[m - 1] + (m == 2 && leap ? 1 : 0);
  }

  static bool is_ipv4(const std::string& s) {
    int parts = 0;
    size_t i = 0;
    while (i <= s.size()) {
      size_t j = s.find('.', i);
      if (j == std::string::npos) j = s.size();
      const std::string octet = s.substr(i, j - i);
      if (octet.empty() || octet.size() > 3 || (octet.size() > 1 && octet[0] == '0')) return false;
      int v;
      if (!digits_at(octet, 0, octet.size(), v) || v > 255) return false;
      ++parts;
      i = j + 1;
      if (j == s.size()) break;
    }
    return parts == 4;
  }

  static bool is_uuid(const std::string& s) {
    if (s.size() != 36) return false;
    for (size_t i = 0; i < s.size(); ++i) {
      const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
      if (dash != (s[i] == '-')) return false;
      if (!dash && !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
    }
    return true;
  }

  static bool check_format(const std::string& format, const std::string& s) {
    if (format == "date") return is_date(s);
    if (format == "ipv4") return is_ipv4(s);
    if (format == "uuid") return is_uuid(s);
    return false;  // formats the tests do not use
  }

  const Json& resolve(const std::string& ref) const {
    const Json* at = &root_;
    std::string pointer;
    for (size_t i = 1; i < ref.size(); ++i) {  // percent-decoding first
      if (ref[i] == '%' && i + 2 < ref.size()) {
        pointer += static_cast<char>(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        pointer += ref[i];
      }
    }
    size_t pos = 1;
    while (!pointer.empty() && pos <= pointer.size()) {
      size_t end = pointer.find('/', pos);
      if (end == std::string::npos) end = pointer.size();
      std::string token = pointer.substr(pos, end - pos);
      for (size_t k; (k = token.find("~1")) != std::string::npos;) token.replace(k, 2, "/");
      for (size_t k; (k = token.find("~0")) != std::string::npos;) token.replace(k, 2, "~");
      at = at->is_array() ? &(*at)[std::stoul(token)] : &(*at)[token];
      pos = end + 1;
    }
    return *at;
  }

  bool check(const Json& s, const Json& v, int depth) const {
    if (depth > 200) return false;
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("$ref")) {
      if (!check(resolve(s["$ref"].get<std::string>()), v, depth + 1)) return false;
      if (draft4_) return true;
    }
    if (s.contains("type")) {
      bool any = false;
      const Json& t = s["type"];
      if (t.is_array()) {
        for (const Json& x : t) any |= has_type(v, x.get<std::string>());
      } else {
        any = has_type(v, t.get<std::string>());
      }
      if (!any) return false;
    }
    if (s.contains("enum")) {
      bool found = false;
      for (const Json& e : s["enum"]) found |= equal(e, v);
      if (!found) return false;
    }
    if (s.contains("const") && !equal(s["const"], v)) return false;
    for (const char* key : {"allOf", "anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      int count = 0;
      for (const Json& sub : s[key]) count += check(sub, v, depth + 1);
      const size_t n = s[key].size();
      if (std::string(key) == "allOf" && count != static_cast<int>(n)) return false;
      if (std::string(key) == "anyOf" && count == 0) return false;
      if (std::string(key) == "oneOf" && count != 1) return false;
    }
    if (v.is_number()) {
      auto bound = [&](const char* inclusive, const char* exclusive, int sign) {
        if (s.contains(inclusive)) {
          const int c = compare_numbers(v, s[inclusive]) * sign;
          const bool strict =
              s.contains(exclusive) && s[exclusive].is_boolean() && s[exclusive].get<bool>();
          if (c < 0 || (strict && c == 0)) return false;
        }
        if (s.contains(exclusive) && s[exclusive].is_number()) {
          if (compare_numbers(v, s[exclusive]) * sign <= 0) return false;
        }
        return true;
      };
      if (!bound("minimum", "exclusiveMinimum", 1) || !bound("maximum", "exclusiveMaximum", -1)) {
        return false;
      }
    }
    if (v.is_string()) {
      const std::string text = v.get<std::string>();
      if (s.contains("minLength") && code_points(text) < s["minLength"].get<size_t>()) return false;
      if (s.contains("maxLength") && code_points(text) > s["maxLength"].get<size_t>()) return false;
      if (s.contains("pattern") && !search(s["pattern"].get<std::string>(), text)) return false;
      if (s.contains("format") && !check_format(s["format"].get<std::string>(), text)) return false;
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
      size_t prefix = 0;
      const Json* rest = nullptr;
      if (s.contains("prefixItems")) {
        prefix = s["prefixItems"].size();
        for (size_t i = 0; i < std::min(prefix, v.size()); ++i) {
          if (!check(s["prefixItems"][i], v[i], depth + 1)) return false;
        }
        if (s.contains("items")) rest = &s["items"];
      } else if (s.contains("items") && s["items"].is_array()) {
        prefix = s["items"].size();
        for (size_t i = 0; i < std::min(prefix, v.size()); ++i) {
          if (!check(s["items"][i], v[i], depth + 1)) return false;
        }
        if (s.contains("additionalItems")) rest = &s["additionalItems"];
      } else if (s.contains("items")) {
        rest = &s["items"];
      }
      for (size_t i = prefix; rest != nullptr && i < v.size(); ++i) {
        if (!check(*rest, v[i], depth + 1)) return false;
      }
    }
    if (v.is_object()) {
      if (s.contains("required")) {
        for (const Json& name : s["required"]) {
          if (!v.contains(name.get<std::string>())) return false;
        }
      }
      for (const auto& [key, value] : v.items()) {
        if (s.contains("properties") && s["properties"].contains(key)) {
          if (!check(s["properties"][key], value, depth + 1)) return false;
        } else if (s.contains("additionalProperties")) {
          if (!check(s["additionalProperties"], value, depth + 1)) return false;
        }
      }
    }
    return true;
  }

  const Json& root_;
  bool draft4_;
};

}  // namespace megactx::grammar::test
