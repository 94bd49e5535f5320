// Python's text formats for values: float.__repr__, str.__repr__ and
// json.dumps (what HF's tojson filter calls).
#pragma once

#include <string>

#include "chat/jinja/value.h"

namespace megactx::jinja {

// repr(float): shortest round-trip digits, fixed notation for exponents in
// [-4, 16), "1e-05"/"1e+16" otherwise, "inf", "nan".
std::string float_repr(double value);
// repr(str): single quotes unless the text holds ' and no ", escapes as Python.
std::string string_repr(const std::string& text);

struct JsonOptions {
  bool ensure_ascii = false;  // HF's tojson default
  bool sort_keys = false;
  bool has_indent = false;  // indent=None when false
  std::string indent;       // indent as a string (an int n means n spaces)
  std::string item_separator = ", ";
  std::string key_separator = ": ";
};

// json.dumps(value, ...); throws megactx::Error for values JSON cannot hold.
std::string json_dumps(const Value& value, const JsonOptions& options);

}  // namespace megactx::jinja
