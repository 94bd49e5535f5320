// jinja2's builtin filters (as of 3.1) plus HF's tojson (json.dumps with
// ensure_ascii=False by default).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>

#include "chat/jinja/builtins.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"
#include "chat/jinja/utf8.h"
#include "core/error.h"

namespace megactx::jinja {

namespace {

using FilterFunction = std::function<Value(Interpreter&, const Value&, const CallArgs&)>;

Value arg(const CallArgs& args, size_t index, const char* name,
          Value fallback = Value::undefined()) {
  return args.get(index, name, std::move(fallback));
}

// Arguments after the first `skip` positionals (for map/select passing on extra args).
CallArgs rest(const CallArgs& args, size_t skip) {
  CallArgs out;
  for (size_t i = skip; i < args.args.size(); ++i) out.args.push_back(args.args[i]);
  out.kwargs = args.kwargs;
  return out;
}

// jinja2's make_attrgetter: "a.b" and "0" (integer parts index) paths.
Value attribute_of(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return get_item(item, attribute);
  std::string path = to_str(attribute);
  Value current = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(),
                                                [](char c) { return c >= '0' && c <= '9'; });
    current = numeric ? get_item(current, Value::from_int(std::stoll(part.substr(0, 18))))
                      : get_item(current, Value::string(part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// Sort key comparison with jinja's case_sensitive=False lowering of strings.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(py_lower(v.text));
  return v;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Python's int(str, base) for base 10 with whitespace, sign and underscores.
bool parse_int(const std::string& text, int64_t& out) {
  std::string s = py_strip(text, true, true);
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_' && i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1])))
      continue;
    digits.push_back(c);
  }
  if (digits.empty()) return false;
  size_t start = (digits[0] == '-' || digits[0] == '+') ? 1 : 0;
  if (start == digits.size()) return false;
  for (size_t i = start; i < digits.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(digits[i]))) return false;
  errno = 0;
  out = std::strtoll(digits.c_str(), nullptr, 10);
  return errno != ERANGE;
}

// Python's float(str).
bool parse_float(const std::string& text, double& out) {
  std::string s = py_strip(text, true, true);
  if (s.empty()) return false;
  std::string lowered = py_lower(s);
  std::string body = (lowered[0] == '-' || lowered[0] == '+') ? lowered.substr(1) : lowered;
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : INFINITY;
    if (lowered[0] == '-') out = -out;
    return true;
  }
  for (char c : body)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' ||
          c == '-' || c == '_'))
      return false;
  std::string cleaned;
  for (char c : s)
    if (c != '_') cleaned.push_back(c);
  char* end = nullptr;
  out = std::strtod(cleaned.c_str(), &end);
  return end && *end == '\0' && end != cleaned.c_str();
}

Value filter_int(const Value& v, const CallArgs& args) {
  Value fallback = arg(args, 0, "default", Value::from_int(0));
  if (v.is_int()) return Value::from_int(v.integer);
  if (v.kind == Value::Kind::Float) {
    if (!std::isfinite(v.number) || std::fabs(v.number) >= 9.2e18) return fallback;
    return Value::from_int(static_cast<int64_t>(std::trunc(v.number)));
  }
  if (v.is_string()) {
    int64_t base = arg(args, 1, "base", Value::from_int(10)).integer;
    if (base != 10) {
      std::string s = py_strip(v.text, true, true);
      char* end = nullptr;
      errno = 0;
      long long r = std::strtoll(s.c_str(), &end, static_cast<int>(base));
      if (!s.empty() && end && *end == '\0' && errno == 0) return Value::from_int(r);
      return fallback;
    }
    int64_t i;
    if (parse_int(v.text, i)) return Value::from_int(i);
    double d;
    if (parse_float(v.text, d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
      return Value::from_int(static_cast<int64_t>(std::trunc(d)));
  }
  return fallback;
}

Value filter_float(const Value& v, const CallArgs& args) {
  Value fallback = arg(args, 0, "default", Value::from_float(0.0));
  if (v.is_number()) return Value::from_float(v.as_double());
  double d;
  if (v.is_string() && parse_float(v.text, d)) return Value::from_float(d);
  return fallback;
}

Value filter_round(const Value& v, const CallArgs& args) {
  int64_t precision = arg(args, 0, "precision", Value::from_int(0)).integer;
  std::string method = arg(args, 1, "method", Value::string("common")).text;
  if (!v.is_number()) fail("round filter needs a number, got {}", type_name(v));
  double x = v.as_double();
  if (method == "common" && v.is_int()) {
    // Python's round(int, n) stays an int (half to even for negative n).
    if (precision >= 0) return Value::from_int(v.integer);
    if (precision < -18) return Value::from_int(0);
    int64_t scale = 1;
    for (int64_t i = 0; i < -precision; ++i) scale *= 10;
    int64_t q = v.integer / scale, r = v.integer % scale;
    if (r < 0) {
      r += scale;
      --q;
    }
    if (2 * r > scale || (2 * r == scale && (q & 1))) ++q;
    return Value::from_int(q * scale);
  }
  if (method == "common") {
    if (!std::isfinite(x)) return Value::from_float(x);
    if (precision == 0) return Value::from_float(std::nearbyint(x));  // round half to even
    if (precision > 0 && precision < 300) {
      // Correctly rounded decimal conversion, as Python's round() does.
      char buffer[512];
      std::snprintf(buffer, sizeof(buffer), "%.*f", static_cast<int>(precision), x);
      return Value::from_float(std::strtod(buffer, nullptr));
    }
    double scale = std::pow(10.0, static_cast<double>(-precision));
    return Value::from_float(std::nearbyint(x / scale) * scale);
  }
  if (method != "ceil" && method != "floor") fail("method must be common, ceil or floor");
  double scale = std::pow(10.0, static_cast<double>(precision));
  double r = method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale);
  return Value::from_float(r / scale);
}

Value filter_tojson(const Value& v, const CallArgs& args) {
  JsonOptions options;
  options.ensure_ascii = truthy(arg(args, 0, "ensure_ascii", Value::boolean(false)));
  Value indent = arg(args, 1, "indent", Value::none());
  Value separators = arg(args, 2, "separators", Value::none());
  options.sort_keys = truthy(arg(args, 3, "sort_keys", Value::boolean(false)));
  if (!indent.is_none() && !indent.is_undefined()) {
    options.has_indent = true;
    if (indent.is_string()) {
      options.indent = indent.text;
    } else if (indent.is_int()) {
      options.indent =
          std::string(static_cast<size_t>(std::clamp<int64_t>(indent.integer, 0, 64)), ' ');
    } else {
      fail("tojson: indent must be an int or a string");
    }
    options.item_separator = ",";
  }
  if (!separators.is_none() && !separators.is_undefined()) {
    if (!separators.is_sequence() || separators.list->size() != 2 ||
        !(*separators.list)[0].is_string() || !(*separators.list)[1].is_string())
      fail("tojson: separators must be a pair of strings");
    options.item_separator = (*separators.list)[0].text;
    options.key_separator = (*separators.list)[1].text;
  }
  for (const auto& [key, value] : args.kwargs)
    if (key != "ensure_ascii" && key != "indent" && key != "separators" && key != "sort_keys")
      fail("tojson() got an unexpected keyword argument '{}'", key);
  return Value::string(json_dumps(v, options));
}

Value filter_indent(const Value& v, const CallArgs& args) {
  Value width = arg(args, 0, "width", Value::from_int(4));
  bool first = truthy(arg(args, 1, "first", Value::boolean(false)));
  bool blank = truthy(arg(args, 2, "blank", Value::boolean(false)));
  std::string indention =
      width.is_string()
          ? width.text
          : std::string(static_cast<size_t>(std::clamp<int64_t>(width.integer, 0, 1024)), ' ');
  std::string s = to_str(v) + "\n";
  // jinja appends a newline, then splits lines (str.splitlines()).
  List lines;
  {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        parts.push_back(s.substr(start, i - start));
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        start = i + 1;
      }
    }
    if (start < s.size()) parts.push_back(s.substr(start));
    for (auto& p : parts) lines.push_back(Value::string(p));
  }
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) {
        rv += '\n';
        rv += indention;
      }
      rv += lines[i].text;
    }
  } else if (!lines.empty()) {
    rv = lines[0].text;
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        if (!lines[i].text.empty()) rv += indention;
        rv += lines[i].text;
      }
    }
  }
  if (first) rv.insert(0, indention);
  return Value::string(rv);
}

Value filter_title(const Value& v) {
  // jinja's title(): words start after whitespace, '-', '(', '{', '[' or '<'.
  std::string s = to_str(v), out;
  bool at_start = true;
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t cp = utf8_next(s, pos);
    bool separator =
        is_py_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    if (separator) {
      utf8_append(out, cp);
      at_start = true;
    } else {
      utf8_append(out, at_start ? to_upper(cp) : to_lower(cp));
      at_start = false;
    }
  }
  return Value::string(out);
}

Value select_like(Interpreter& in, const Value& v, const CallArgs& args, bool attr, bool keep) {
  List out;
  size_t skip = attr ? 1 : 0;
  Value attribute = attr ? arg(args, 0, "attribute") : Value();
  bool has_test = args.args.size() > skip;
  std::string test = has_test ? to_str(args.args[skip]) : "";
  CallArgs test_args = rest(args, skip + 1);
  for (const Value& item : iterate(v)) {
    Value subject = attr ? attribute_of(item, attribute) : item;
    bool passed = has_test ? in.apply_test(test, subject, test_args) : truthy(subject);
    if (passed == keep) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

Value filter_map(Interpreter& in, const Value& v, const CallArgs& args) {
  List out;
  if (const Value* attribute = args.keyword("attribute")) {
    const Value* fallback = args.keyword("default");
    for (const Value& item : iterate(v)) {
      Value r = attribute_of(item, *attribute);
      if (r.is_undefined() && fallback) r = *fallback;
      out.push_back(r);
    }
    return Value::make_list(std::move(out));
  }
  if (args.args.empty()) fail("map requires a filter argument");
  std::string name = to_str(args.args[0]);
  CallArgs filter_args = rest(args, 1);
  for (const Value& item : iterate(v)) out.push_back(in.apply_filter(name, item, filter_args));
  return Value::make_list(std::move(out));
}

Value filter_sort(const Value& v, const CallArgs& args) {
  bool reverse = truthy(arg(args, 0, "reverse", Value::boolean(false)));
  bool case_sensitive = truthy(arg(args, 1, "case_sensitive", Value::boolean(false)));
  Value attribute = arg(args, 2, "attribute", Value::none());
  List items = iterate(v);
  auto key = [&](const Value& item) {
    return sort_key(attribute.is_none() ? item : attribute_of(item, attribute), case_sensitive);
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) keyed.emplace_back(key(item), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? less_than(b.first, a.first) : less_than(a.first, b.first);
  });
  List out;
  for (auto& [k, item] : keyed) out.push_back(item);
  return Value::make_list(std::move(out));
}

Value filter_dictsort(const Value& v, const CallArgs& args) {
  bool case_sensitive = truthy(arg(args, 0, "case_sensitive", Value::boolean(false)));
  std::string by = arg(args, 1, "by", Value::string("key")).text;
  bool reverse = truthy(arg(args, 2, "reverse", Value::boolean(false)));
  if (!v.is_dict()) fail("dictsort needs a mapping, got {}", type_name(v));
  if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
  size_t index = by == "key" ? 0 : 1;
  List pairs;
  for (const auto& [k, item] : v.dict->entries) pairs.push_back(Value::make_tuple({k, item}));
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& a, const Value& b) {
    Value ka = sort_key((*a.list)[index], case_sensitive),
          kb = sort_key((*b.list)[index], case_sensitive);
    return reverse ? less_than(kb, ka) : less_than(ka, kb);
  });
  return Value::make_list(std::move(pairs));
}

Value filter_min_max(const Value& v, const CallArgs& args, bool want_max) {
  bool case_sensitive = truthy(arg(args, 0, "case_sensitive", Value::boolean(false)));
  Value attribute = arg(args, 1, "attribute", Value::none());
  List items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  auto key = [&](size_t i) {
    return sort_key(attribute.is_none() ? items[i] : attribute_of(items[i], attribute),
                    case_sensitive);
  };
  for (size_t i = 1; i < items.size(); ++i) {
    bool better = want_max ? less_than(key(best), key(i)) : less_than(key(i), key(best));
    if (better) best = i;
  }
  return items[best];
}

Value filter_unique(const Value& v, const CallArgs& args) {
  bool case_sensitive = truthy(arg(args, 0, "case_sensitive", Value::boolean(false)));
  Value attribute = arg(args, 1, "attribute", Value::none());
  List seen, out;
  for (const Value& item : iterate(v)) {
    Value key =
        sort_key(attribute.is_none() ? item : attribute_of(item, attribute), case_sensitive);
    bool found = false;
    for (const Value& s : seen)
      if (equals(s, key)) found = true;
    if (found) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

Value filter_sum(const Value& v, const CallArgs& args) {
  Value attribute = arg(args, 0, "attribute", Value::none());
  Value total = arg(args, 1, "start", Value::from_int(0));
  for (const Value& item : iterate(v))
    total = binary_op("+", total, attribute.is_none() ? item : attribute_of(item, attribute));
  return total;
}

Value filter_batch(const Value& v, const CallArgs& args) {
  int64_t size = arg(args, 0, "linecount").integer;
  if (size <= 0) fail("batch size must be positive");
  Value fill = arg(args, 1, "fill_with", Value::none());
  List out, current;
  for (const Value& item : iterate(v)) {
    current.push_back(item);
    if (static_cast<int64_t>(current.size()) == size) {
      out.push_back(Value::make_list(std::move(current)));
      current.clear();
    }
  }
  if (!current.empty()) {
    if (!fill.is_none())
      while (static_cast<int64_t>(current.size()) < size) current.push_back(fill);
    out.push_back(Value::make_list(std::move(current)));
  }
  return Value::make_list(std::move(out));
}

Value filter_truncate(const Value& v, const CallArgs& args) {
  std::string s = to_str(v);
  int64_t length = arg(args, 0, "length", Value::from_int(255)).integer;
  bool killwords = truthy(arg(args, 1, "killwords", Value::boolean(false)));
  std::string end = arg(args, 2, "end", Value::string("...")).text;
  int64_t leeway = arg(args, 3, "leeway", Value::from_int(5)).integer;
  std::vector<char32_t> cps = utf8_decode(s);
  int64_t end_len = static_cast<int64_t>(utf8_length(end));
  if (length < end_len) fail("expected length >= {}, got {}", end_len, length);
  if (static_cast<int64_t>(cps.size()) <= length + leeway) return Value::string(s);
  std::vector<char32_t> head(cps.begin(), cps.begin() + (length - end_len));
  if (killwords) return Value::string(utf8_encode(head) + end);
  std::string h = utf8_encode(head);
  size_t space = h.rfind(' ');
  if (space != std::string::npos) h = h.substr(0, space);
  return Value::string(h + end);
}

int64_t wordcount(const std::string& s) {
  int64_t count = 0;
  bool in_word = false;
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t cp = utf8_next(s, pos);
    bool word = is_alpha(cp) || (cp >= '0' && cp <= '9') || cp == '_';
    if (word && !in_word) ++count;
    in_word = word;
  }
  return count;
}

const std::map<std::string, FilterFunction>& filters() {
  static const std::map<std::string, FilterFunction> table = [] {
    std::map<std::string, FilterFunction> t;
    t["abs"] = [](Interpreter&, const Value& v, const CallArgs&) {
      if (v.is_int()) return v.integer < 0 ? negate(v) : Value::from_int(v.integer);
      if (v.kind == Value::Kind::Float) return Value::from_float(std::fabs(v.number));
      fail("bad operand type for abs(): '{}'", type_name(v));
    };
    t["attr"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return get_attr(v, to_str(arg(a, 0, "name")));
    };
    t["batch"] = [](Interpreter&, const Value& v, const CallArgs& a) { return filter_batch(v, a); };
    t["capitalize"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return Value::string(py_capitalize(to_str(v)));
    };
    t["center"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      CallArgs c;
      c.args.push_back(arg(a, 0, "width", Value::from_int(80)));
      return in.call(bound_method(Value::string(to_str(v)), "center"), c);
    };
    t["count"] = t["length"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return Value::from_int(static_cast<int64_t>(length(v)));
    };
    t["d"] = t["default"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      Value fallback = arg(a, 0, "default_value", Value::string(""));
      bool boolean = truthy(arg(a, 1, "boolean", Value::boolean(false)));
      if (v.is_undefined() || (boolean && !truthy(v))) return fallback;
      return v;
    };
    t["dictsort"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return filter_dictsort(v, a);
    };
    t["e"] = t["escape"] = t["forceescape"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return Value::string(html_escape(to_str(v)));
    };
    t["first"] = [](Interpreter&, const Value& v, const CallArgs&) {
      List items = iterate(v);
      return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
    };
    t["last"] = [](Interpreter&, const Value& v, const CallArgs&) {
      List items = iterate(v);
      return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
    };
    t["float"] = [](Interpreter&, const Value& v, const CallArgs& a) { return filter_float(v, a); };
    t["format"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      if (!a.kwargs.empty() && !a.args.empty())
        fail("can't handle positional and keyword arguments at the same time");
      return binary_op("%", Value::string(to_str(v)), Value::make_tuple(a.args));
    };
    t["indent"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return filter_indent(v, a);
    };
    t["int"] = [](Interpreter&, const Value& v, const CallArgs& a) { return filter_int(v, a); };
    t["items"] = [](Interpreter&, const Value& v, const CallArgs&) {
      if (v.is_undefined()) return Value::make_list();
      if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
      List out;
      for (const auto& [k, item] : v.dict->entries) out.push_back(Value::make_tuple({k, item}));
      return Value::make_list(std::move(out));
    };
    t["join"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      std::string separator = to_str(arg(a, 0, "d", Value::string("")));
      Value attribute = arg(a, 1, "attribute", Value::none());
      std::string out;
      bool first = true;
      for (const Value& item : iterate(v)) {
        if (!first) out += separator;
        first = false;
        out += to_str(attribute.is_none() ? item : attribute_of(item, attribute));
        if (out.size() > Interpreter::kMaxStringBytes) fail("string too large");
      }
      return Value::string(out);
    };
    t["list"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return Value::make_list(iterate(v));
    };
    t["lower"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return Value::string(py_lower(to_str(v)));
    };
    t["upper"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return Value::string(py_upper(to_str(v)));
    };
    t["map"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      return filter_map(in, v, a);
    };
    t["max"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return filter_min_max(v, a, true);
    };
    t["min"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return filter_min_max(v, a, false);
    };
    t["pprint"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return Value::string(repr(v));
    };
    t["reject"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      return select_like(in, v, a, false, false);
    };
    t["rejectattr"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      return select_like(in, v, a, true, false);
    };
    t["select"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      return select_like(in, v, a, false, true);
    };
    t["selectattr"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      return select_like(in, v, a, true, true);
    };
    t["replace"] = [](Interpreter& in, const Value& v, const CallArgs& a) {
      CallArgs c;
      c.args = {Value::string(to_str(arg(a, 0, "old"))), Value::string(to_str(arg(a, 1, "new")))};
      Value count = arg(a, 2, "count", Value::none());
      if (!count.is_none()) c.args.push_back(count);
      return in.call(bound_method(Value::string(to_str(v)), "replace"), c);
    };
    t["reverse"] = [](Interpreter&, const Value& v, const CallArgs&) {
      if (v.is_string()) {
        std::vector<char32_t> cps = utf8_decode(v.text);
        std::reverse(cps.begin(), cps.end());
        return Value::string(utf8_encode(cps));
      }
      List items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::make_list(std::move(items));
    };
    t["round"] = [](Interpreter&, const Value& v, const CallArgs& a) { return filter_round(v, a); };
    t["safe"] = [](Interpreter&, const Value& v, const CallArgs&) { return v; };
    t["sort"] = [](Interpreter&, const Value& v, const CallArgs& a) { return filter_sort(v, a); };
    t["string"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return Value::string(to_str(v));
    };
    t["sum"] = [](Interpreter&, const Value& v, const CallArgs& a) { return filter_sum(v, a); };
    t["title"] = [](Interpreter&, const Value& v, const CallArgs&) { return filter_title(v); };
    t["tojson"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return filter_tojson(v, a);
    };
    t["trim"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      Value chars = arg(a, 0, "chars", Value::none());
      if (chars.is_none()) return Value::string(py_strip(to_str(v), true, true));
      return Value::string(py_strip_chars(to_str(v), to_str(chars), true, true));
    };
    t["truncate"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return filter_truncate(v, a);
    };
    t["unique"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return filter_unique(v, a);
    };
    t["wordcount"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return Value::from_int(wordcount(to_str(v)));
    };
    return t;
  }();
  return table;
}

}  // namespace

bool has_filter(const std::string& name) {
  return filters().count(name) > 0;
}

Value call_filter(Interpreter& interpreter, const std::string& name, const Value& input,
                  const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("No filter named '{}'.", name);
  // Filters other than default/d and the type tests see Undefined as an error
  // only when they use its value; jinja's Undefined acts as "" / [] here.
  return it->second(interpreter, input, args);
}

}  // namespace megactx::jinja
