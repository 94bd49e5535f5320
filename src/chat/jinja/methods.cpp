// Methods of Python's str, list and dict that chat templates call
// (content.startswith('x'), text.split('</think>'), message.get('content')).
// Methods that mutate a list or dict are refused as jinja2's
// ImmutableSandboxedEnvironment (what HF uses) refuses them.
#include <set>

#include "chat/jinja/operators.h"
#include "chat/jinja/utf8.h"
#include "core/error.h"

namespace megactx::jinja {

namespace {

const std::set<std::string>& string_methods() {
  static const std::set<std::string> names = {
      "startswith",   "endswith",     "strip",     "lstrip",     "rstrip",  "split",
      "rsplit",       "splitlines",   "replace",   "lower",      "upper",   "title",
      "capitalize",   "find",         "rfind",     "count",      "join",    "isdigit",
      "isalpha",      "isalnum",      "isspace",   "islower",    "isupper", "format",
      "removeprefix", "removesuffix", "partition", "rpartition", "index",   "rindex",
      "casefold",     "swapcase",     "zfill",     "center",     "ljust",   "rjust"};
  return names;
}

bool mutating(const Value& self, const std::string& name) {
  static const std::set<std::string> list_names = {"append", "extend",  "insert", "pop",
                                                   "remove", "reverse", "sort",   "clear"};
  static const std::set<std::string> dict_names = {"pop", "popitem", "setdefault", "update",
                                                   "clear"};
  if (self.is_sequence() && self.kind == Value::Kind::List) return list_names.count(name) > 0;
  if (self.is_dict()) return dict_names.count(name) > 0;
  return false;
}

std::string require_string(const Value& v, const char* method) {
  if (!v.is_string()) fail("{}() argument must be str, not {}", method, type_name(v));
  return v.text;
}

std::vector<std::string> split_whitespace(const std::string& text, int64_t maxsplit,
                                          bool from_right) {
  std::vector<char32_t> cps = utf8_decode(text);
  std::vector<std::string> parts;
  if (!from_right) {
    size_t i = 0, n = cps.size();
    while (true) {
      while (i < n && is_py_space(cps[i])) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t end = n;
        while (end > i && is_py_space(cps[end - 1])) --end;
        parts.push_back(utf8_encode({cps.begin() + i, cps.begin() + end}));
        break;
      }
      size_t start = i;
      while (i < n && !is_py_space(cps[i])) ++i;
      parts.push_back(utf8_encode({cps.begin() + start, cps.begin() + i}));
    }
    return parts;
  }
  int64_t i = static_cast<int64_t>(cps.size()) - 1;
  while (true) {
    while (i >= 0 && is_py_space(cps[i])) --i;
    if (i < 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      int64_t begin = 0;
      while (begin <= i && is_py_space(cps[begin])) ++begin;
      parts.push_back(utf8_encode({cps.begin() + begin, cps.begin() + i + 1}));
      break;
    }
    int64_t end = i;
    while (i >= 0 && !is_py_space(cps[i])) --i;
    parts.push_back(utf8_encode({cps.begin() + i + 1, cps.begin() + end + 1}));
  }
  return {parts.rbegin(), parts.rend()};
}

std::vector<std::string> split_on(const std::string& text, const std::string& sep, int64_t maxsplit,
                                  bool from_right) {
  if (sep.empty()) fail("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t found = text.find(sep, start);
      if (found == std::string::npos) break;
      parts.push_back(text.substr(start, found - start));
      start = found + sep.size();
    }
    parts.push_back(text.substr(start));
    return parts;
  }
  size_t end = text.size();
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < sep.size()) break;
    size_t found = text.rfind(sep, end - sep.size());
    if (found == std::string::npos) break;
    parts.push_back(text.substr(found + sep.size(), end - found - sep.size()));
    end = found;
  }
  parts.push_back(text.substr(0, end));
  return {parts.rbegin(), parts.rend()};
}

Value string_list(const std::vector<std::string>& parts) {
  List out;
  for (const auto& p : parts) out.push_back(Value::string(p));
  return Value::make_list(std::move(out));
}

// Code point index of a byte offset (find() returns code point positions).
int64_t cp_index(const std::string& text, size_t byte_offset) {
  return static_cast<int64_t>(utf8_length(std::string_view(text).substr(0, byte_offset)));
}

template <typename Predicate>
bool all_chars(const std::string& text, Predicate predicate) {
  if (text.empty()) return false;
  size_t pos = 0;
  while (pos < text.size())
    if (!predicate(utf8_next(text, pos))) return false;
  return true;
}

bool has_cased(const std::string& text, bool upper) {
  bool any = false;
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp = utf8_next(text, pos);
    if (to_lower(cp) == to_upper(cp)) continue;
    if ((upper && cp == to_lower(cp)) || (!upper && cp == to_upper(cp))) return false;
    any = true;
  }
  return any;
}

bool prefix_match(const std::string& text, const Value& prefix, bool suffix) {
  auto one = [&](const Value& p) {
    std::string s = require_string(p, suffix ? "endswith" : "startswith");
    if (s.size() > text.size()) return false;
    return suffix ? text.compare(text.size() - s.size(), s.size(), s) == 0
                  : text.compare(0, s.size(), s) == 0;
  };
  if (prefix.kind == Value::Kind::Tuple) {
    for (const Value& p : *prefix.list)
      if (one(p)) return true;
    return false;
  }
  return one(prefix);
}

// str.format with positional {} / {0} and keyword {name} fields (no format specs).
std::string py_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    char c = format[i];
    if (c == '{' && i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
    } else if (c == '}' && i + 1 < format.size() && format[i + 1] == '}') {
      out.push_back('}');
      ++i;
    } else if (c == '{') {
      size_t close = format.find('}', i);
      if (close == std::string::npos) fail("Single '{{' encountered in format string");
      std::string field = format.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos)
        fail("unsupported format field '{{{}}}'", field);
      const Value* value = nullptr;
      size_t index = 0;
      if (field.empty()) {
        index = auto_index++;
      } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
        if (field.size() > 9 || field.find_first_not_of("0123456789") != std::string::npos)
          fail("unsupported format field '{{{}}}'", field);
        index = std::stoul(field);
      } else {
        value = args.keyword(field);
        if (!value) fail("KeyError: '{}'", field);
      }
      if (!value) {
        if (index >= args.args.size()) fail("Replacement index {} out of range", index);
        value = &args.args[index];
      }
      out += to_str(*value);
      i = close;
    } else if (c == '}') {
      fail("Single '}}' encountered in format string");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string pad(const std::string& text, const CallArgs& args, char where) {
  int64_t width = args.get(0, "width").integer;
  std::string fill = args.get(1, "fillchar", Value::string(" ")).text;
  int64_t len = static_cast<int64_t>(utf8_length(text));
  if (width <= len) return text;
  if (width > static_cast<int64_t>(1 << 20)) fail("width too large");
  int64_t total = width - len;
  int64_t left = where == 'l' ? 0 : where == 'r' ? total : total / 2 + (total & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += text;
  for (int64_t i = 0; i < total - left; ++i) out += fill;
  return out;
}

Value call_string_method(const std::string& s, const std::string& name, const CallArgs& args) {
  auto arg = [&](size_t i, const char* key, Value fallback = Value::undefined()) {
    return args.get(i, key, std::move(fallback));
  };
  if (name == "startswith" || name == "endswith")
    return Value::boolean(prefix_match(s, arg(0, "prefix"), name == "endswith"));
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    Value chars = arg(0, "chars");
    if (chars.is_none() || chars.is_undefined()) return Value::string(py_strip(s, left, right));
    return Value::string(py_strip_chars(s, require_string(chars, name.c_str()), left, right));
  }
  if (name == "split" || name == "rsplit") {
    Value sep = arg(0, "sep");
    Value maxsplit = arg(1, "maxsplit", Value::from_int(-1));
    bool right = name == "rsplit";
    if (sep.is_none() || sep.is_undefined())
      return string_list(split_whitespace(s, maxsplit.integer, right));
    return string_list(split_on(s, require_string(sep, name.c_str()), maxsplit.integer, right));
  }
  if (name == "splitlines") {
    bool keepends = truthy(arg(0, "keepends"));
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        size_t end = i;
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        lines.push_back(s.substr(start, (keepends ? i + 1 : end) - start));
        start = i + 1;
      }
    }
    if (start < s.size()) lines.push_back(s.substr(start));
    return string_list(lines);
  }
  if (name == "replace") {
    std::string old_text = require_string(arg(0, "old"), "replace");
    std::string new_text = require_string(arg(1, "new"), "replace");
    int64_t count = arg(2, "count", Value::from_int(-1)).integer;
    std::string out;
    if (old_text.empty()) {
      // Python inserts `new` between every character (and at both ends).
      std::vector<char32_t> cps = utf8_decode(s);
      int64_t done = 0;
      for (size_t i = 0; i <= cps.size(); ++i) {
        if (count < 0 || done < count) {
          out += new_text;
          ++done;
        }
        if (i < cps.size()) utf8_append(out, cps[i]);
        if (out.size() > 64u << 20) fail("string too large");
      }
      return Value::string(out);
    }
    size_t start = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
      size_t found = s.find(old_text, start);
      if (found == std::string::npos) break;
      out.append(s, start, found - start);
      out += new_text;
      start = found + old_text.size();
      ++done;
      if (out.size() > 64u << 20) fail("string too large");
    }
    out.append(s, start);
    return Value::string(out);
  }
  if (name == "lower" || name == "casefold") return Value::string(py_lower(s));
  if (name == "upper") return Value::string(py_upper(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "swapcase") {
    std::string out;
    size_t pos = 0;
    while (pos < s.size()) {
      char32_t cp = utf8_next(s, pos);
      utf8_append(out, cp == to_lower(cp) ? to_upper(cp) : to_lower(cp));
    }
    return Value::string(out);
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    std::string needle = require_string(arg(0, "sub"), name.c_str());
    size_t found = (name == "find" || name == "index") ? s.find(needle) : s.rfind(needle);
    if (found == std::string::npos) {
      if (name == "index" || name == "rindex") fail("substring not found");
      return Value::from_int(-1);
    }
    return Value::from_int(cp_index(s, found));
  }
  if (name == "count") {
    std::string needle = require_string(arg(0, "sub"), "count");
    if (needle.empty()) return Value::from_int(static_cast<int64_t>(utf8_length(s)) + 1);
    int64_t count = 0;
    for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + needle.size()))
      ++count;
    return Value::from_int(count);
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& item : iterate(arg(0, "iterable"))) {
      if (!first) out += s;
      first = false;
      out += require_string(item, "join");
    }
    return Value::string(out);
  }
  if (name == "isdigit")
    return Value::boolean(all_chars(s, [](char32_t c) { return c >= '0' && c <= '9'; }));
  if (name == "isalpha") return Value::boolean(all_chars(s, is_alpha));
  if (name == "isalnum")
    return Value::boolean(
        all_chars(s, [](char32_t c) { return is_alpha(c) || (c >= '0' && c <= '9'); }));
  if (name == "isspace") return Value::boolean(all_chars(s, is_py_space));
  if (name == "islower") return Value::boolean(has_cased(s, false));
  if (name == "isupper") return Value::boolean(has_cased(s, true));
  if (name == "format") return Value::string(py_format(s, args));
  if (name == "removeprefix" || name == "removesuffix") {
    std::string affix = require_string(arg(0, "prefix"), name.c_str());
    bool suffix = name == "removesuffix";
    if (prefix_match(s, Value::string(affix), suffix))
      return Value::string(suffix ? s.substr(0, s.size() - affix.size()) : s.substr(affix.size()));
    return Value::string(s);
  }
  if (name == "partition" || name == "rpartition") {
    std::string sep = require_string(arg(0, "sep"), name.c_str());
    if (sep.empty()) fail("empty separator");
    size_t found = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (found == std::string::npos)
      return name == "partition"
                 ? Value::make_tuple({Value::string(s), Value::string(""), Value::string("")})
                 : Value::make_tuple({Value::string(""), Value::string(""), Value::string(s)});
    return Value::make_tuple({Value::string(s.substr(0, found)), Value::string(sep),
                              Value::string(s.substr(found + sep.size()))});
  }
  if (name == "zfill") {
    int64_t width = arg(0, "width").integer;
    int64_t len = static_cast<int64_t>(utf8_length(s));
    if (width <= len) return Value::string(s);
    if (width > (1 << 20)) fail("width too large");
    size_t sign = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
    return Value::string(s.substr(0, sign) + std::string(width - len, '0') + s.substr(sign));
  }
  if (name == "center") return Value::string(pad(s, args, 'c'));
  if (name == "ljust") return Value::string(pad(s, args, 'l'));
  if (name == "rjust") return Value::string(pad(s, args, 'r'));
  fail("'str' object has no attribute '{}'", name);
}

Value call_collection_method(const Value& self, const std::string& name, const CallArgs& args) {
  if (self.is_dict()) {
    if (name == "get") {
      const Value* v = self.dict->find(args.get(0, "key"));
      return v ? *v : args.get(1, "default", Value::none());
    }
    if (name == "items") {
      List out;
      for (const auto& [k, v] : self.dict->entries) out.push_back(Value::make_tuple({k, v}));
      return Value::make_list(std::move(out));
    }
    if (name == "keys" || name == "values") {
      List out;
      for (const auto& [k, v] : self.dict->entries) out.push_back(name == "keys" ? k : v);
      return Value::make_list(std::move(out));
    }
    if (name == "copy") {
      Value copy = Value::make_dict();
      *copy.dict = *self.dict;
      copy.nesting = self.nesting;
      return copy;
    }
  }
  if (self.is_sequence()) {
    if (name == "index") {
      Value item = args.get(0, "value");
      for (size_t i = 0; i < self.list->size(); ++i)
        if (equals((*self.list)[i], item)) return Value::from_int(static_cast<int64_t>(i));
      fail("{} is not in list", repr(item));
    }
    if (name == "count") {
      Value item = args.get(0, "value");
      int64_t count = 0;
      for (const Value& v : *self.list) count += equals(v, item);
      return Value::from_int(count);
    }
    if (name == "copy" && self.kind == Value::Kind::List) return Value::make_list(*self.list);
  }
  fail("'{}' object has no attribute '{}'", type_name(self), name);
}

class BoundMethod : public Object {
 public:
  BoundMethod(Value self, std::string name) : self_(std::move(self)), name_(std::move(name)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  bool is_callable() const override { return true; }
  Value call(Interpreter&, const CallArgs& args) override {
    if (mutating(self_, name_))
      fail("access to attribute '{}' of '{}' object is unsafe.", name_, jinja::type_name(self_));
    if (self_.is_string()) return call_string_method(self_.text, name_, args);
    return call_collection_method(self_, name_, args);
  }
  std::string repr() const override {
    return "<built-in method " + name_ + " of " + jinja::type_name(self_) + " object>";
  }

 private:
  Value self_;
  std::string name_;
};

}  // namespace

Value bound_method(const Value& self, const std::string& name) {
  static const std::set<std::string> dict_methods = {"get", "items", "keys", "values", "copy"};
  static const std::set<std::string> list_methods = {"index", "count", "copy"};
  bool known = false;
  if (self.is_string()) known = string_methods().count(name) > 0;
  if (self.is_dict()) known = dict_methods.count(name) > 0 || mutating(self, name);
  if (self.is_sequence())
    known = list_methods.count(name) > 0 || mutating(self, name) ||
            (self.kind == Value::Kind::Tuple && (name == "index" || name == "count"));
  if (!known) return Value::undefined();
  return Value::make_object(std::make_shared<BoundMethod>(self, name));
}

}  // namespace megactx::jinja
