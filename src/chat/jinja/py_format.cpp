#include "chat/jinja/py_format.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/jinja/utf8.h"
#include "core/error.h"

namespace megactx::jinja {

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, e.g. "1.2345e+02".
  char buffer[64];
  auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string sci(buffer, result.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits.push_back(c);
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_text[16];
  std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+',
                std::abs(exponent));
  return out + exp_text;
}

namespace {

// Python's str.isprintable() approximated: C0/C1 controls, separators other
// than the space, soft hyphen and surrogates/non-characters are not printable.
bool printable(char32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
      (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF)
    return false;
  if (cp >= 0xD800 && cp <= 0xDFFF) return false;
  if (cp == 0xFFFE || cp == 0xFFFF || cp > 0x10FFFF) return false;
  return true;
}

void append_hex(std::string& out, const char* prefix, unsigned value, int width) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "%s%0*x", prefix, width, value);
  out += buffer;
}

}  // namespace

std::string string_repr(const std::string& text) {
  bool has_single = text.find('\'') != std::string::npos;
  bool has_double = text.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp = utf8_next(text, pos);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (printable(cp)) {
      utf8_append(out, cp);
    } else if (cp < 0x100) {
      append_hex(out, "\\x", cp, 2);
    } else if (cp < 0x10000) {
      append_hex(out, "\\u", cp, 4);
    } else {
      append_hex(out, "\\U", cp, 8);
    }
  }
  out.push_back(quote);
  return out;
}

namespace {

void json_string(std::string& out, const std::string& text, bool ensure_ascii) {
  out.push_back('"');
  size_t pos = 0;
  while (pos < text.size()) {
    size_t start = pos;
    char32_t cp = utf8_next(text, pos);
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20) {
      append_hex(out, "\\u", cp, 4);
    } else if (ensure_ascii && cp >= 0x7F) {
      if (cp >= 0x10000) {
        char32_t v = cp - 0x10000;
        append_hex(out, "\\u", 0xD800 + (v >> 10), 4);
        append_hex(out, "\\u", 0xDC00 + (v & 0x3FF), 4);
      } else {
        append_hex(out, "\\u", cp, 4);
      }
    } else {
      out.append(text, start, pos - start);
    }
  }
  out.push_back('"');
}

std::string json_key(const Value& key) {
  switch (key.kind) {
    case Value::Kind::String:
      return key.text;
    case Value::Kind::Bool:
      return key.integer ? "true" : "false";
    case Value::Kind::None:
      return "null";
    case Value::Kind::Int:
      return std::to_string(key.integer);
    case Value::Kind::Float:
      return float_repr(key.number);
    default:
      fail("keys must be str, int, float, bool or None, not {}", type_name(key));
  }
}

void dump(std::string& out, const Value& value, const JsonOptions& options, int depth) {
  if (depth > 512) fail("tojson: value nested too deeply");
  auto newline = [&](int level) {
    if (!options.has_indent) return;
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += options.indent;
  };
  switch (value.kind) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += value.integer ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(value.integer);
      return;
    case Value::Kind::Float:
      if (std::isnan(value.number))
        out += "NaN";
      else if (std::isinf(value.number))
        out += value.number > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(value.number);
      return;
    case Value::Kind::String:
      json_string(out, value.text, options.ensure_ascii);
      return;
    case Value::Kind::List:
    case Value::Kind::Tuple: {
      if (value.list->empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      bool first = true;
      for (const Value& item : *value.list) {
        if (!first) out += options.item_separator;
        first = false;
        newline(depth + 1);
        dump(out, item, options, depth + 1);
      }
      newline(depth);
      out.push_back(']');
      return;
    }
    case Value::Kind::Dict: {
      if (value.dict->entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [key, item] : value.dict->entries)
        entries.emplace_back(json_key(key), &item);
      if (options.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : entries) {
        if (!first) out += options.item_separator;
        first = false;
        newline(depth + 1);
        json_string(out, key, options.ensure_ascii);
        out += options.key_separator;
        dump(out, *item, options, depth + 1);
      }
      newline(depth);
      out.push_back('}');
      return;
    }
    default:
      fail("Object of type {} is not JSON serializable", type_name(value));
  }
}

}  // namespace

std::string json_dumps(const Value& value, const JsonOptions& options) {
  std::string out;
  dump(out, value, options, 0);
  return out;
}

}  // namespace megactx::jinja
