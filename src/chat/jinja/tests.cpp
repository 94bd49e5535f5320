// jinja2's builtin tests (`x is defined`, `x is string`, `n is divisibleby 3`).
#include <functional>
#include <map>

#include "chat/jinja/builtins.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/utf8.h"
#include "core/error.h"

namespace megactx::jinja {

namespace {

using TestFunction = std::function<bool(Interpreter&, const Value&, const CallArgs&)>;

Value first_arg(const CallArgs& args, const char* name) {
  Value v = args.get(0, name);
  return v;
}

bool is_cased(const std::string& s, bool upper) {
  bool any = false;
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t cp = utf8_next(s, pos);
    if (to_lower(cp) == to_upper(cp)) continue;
    if (upper ? cp != to_upper(cp) : cp != to_lower(cp)) return false;
    any = true;
  }
  return any;
}

const std::map<std::string, TestFunction>& tests() {
  static const std::map<std::string, TestFunction> table = [] {
    std::map<std::string, TestFunction> t;
    t["defined"] = [](Interpreter&, const Value& v, const CallArgs&) { return !v.is_undefined(); };
    t["undefined"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_undefined(); };
    t["none"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_none(); };
    t["boolean"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_bool(); };
    t["true"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return v.is_bool() && v.integer;
    };
    t["false"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return v.is_bool() && !v.integer;
    };
    t["integer"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return v.kind == Value::Kind::Int;
    };
    t["float"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return v.kind == Value::Kind::Float;
    };
    t["number"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_number(); };
    t["string"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_string(); };
    t["mapping"] = [](Interpreter&, const Value& v, const CallArgs&) { return v.is_dict(); };
    t["iterable"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined();
    };
    t["sequence"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return v.is_string() || v.is_sequence() || v.is_dict();
    };
    t["callable"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return v.is_object() && v.object->is_callable();
    };
    t["sameas"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      Value other = first_arg(a, "other");
      if (v.kind != other.kind) return false;
      switch (v.kind) {
        case Value::Kind::None:
        case Value::Kind::Undefined:
          return true;
        case Value::Kind::Bool:
          return v.integer == other.integer;
        case Value::Kind::List:
        case Value::Kind::Tuple:
          return v.list == other.list;
        case Value::Kind::Dict:
          return v.dict == other.dict;
        case Value::Kind::Object:
          return v.object == other.object;
        // Small ints and equal strings may or may not be the same Python
        // object; equality is the useful answer.
        default:
          return equals(v, other);
      }
    };
    t["escaped"] = [](Interpreter&, const Value&, const CallArgs&) { return false; };
    t["lower"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return is_cased(to_str(v), false);
    };
    t["upper"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return is_cased(to_str(v), true);
    };
    t["odd"] = [](Interpreter&, const Value& v, const CallArgs&) {
      if (!v.is_int()) fail("odd test needs an integer, got {}", type_name(v));
      return (v.integer % 2) != 0;
    };
    t["even"] = [](Interpreter&, const Value& v, const CallArgs&) {
      if (!v.is_int()) fail("even test needs an integer, got {}", type_name(v));
      return (v.integer % 2) == 0;
    };
    t["divisibleby"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      Value n = first_arg(a, "num");
      Value r = binary_op("%", v, n);
      return !truthy(r);
    };
    auto eq = [](Interpreter&, const Value& v, const CallArgs& a) {
      return equals(v, first_arg(a, "other"));
    };
    t["eq"] = t["equalto"] = t["=="] = eq;
    auto ne = [](Interpreter&, const Value& v, const CallArgs& a) {
      return !equals(v, first_arg(a, "other"));
    };
    t["ne"] = t["!="] = ne;
    auto lt = [](Interpreter&, const Value& v, const CallArgs& a) {
      return less_than(v, first_arg(a, "other"));
    };
    t["lt"] = t["lessthan"] = t["<"] = lt;
    auto gt = [](Interpreter&, const Value& v, const CallArgs& a) {
      return less_than(first_arg(a, "other"), v);
    };
    t["gt"] = t["greaterthan"] = t[">"] = gt;
    auto le = [](Interpreter&, const Value& v, const CallArgs& a) {
      Value o = first_arg(a, "other");
      return less_than(v, o) || equals(v, o);
    };
    t["le"] = t["<="] = le;
    auto ge = [](Interpreter&, const Value& v, const CallArgs& a) {
      Value o = first_arg(a, "other");
      return less_than(o, v) || equals(v, o);
    };
    t["ge"] = t[">="] = ge;
    t["in"] = [](Interpreter&, const Value& v, const CallArgs& a) {
      return contains(first_arg(a, "seq"), v);
    };
    t["filter"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return v.is_string() && has_filter(v.text);
    };
    t["test"] = [](Interpreter&, const Value& v, const CallArgs&) {
      return v.is_string() && has_test(v.text);
    };
    return t;
  }();
  return table;
}

}  // namespace

bool has_test(const std::string& name) {
  return tests().count(name) > 0;
}

bool call_test(Interpreter& interpreter, const std::string& name, const Value& input,
               const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("No test named '{}'.", name);
  return it->second(interpreter, input, args);
}

}  // namespace megactx::jinja
