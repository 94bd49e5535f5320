#include "chat/jinja/operators.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "chat/jinja/interpreter.h"
#include "chat/jinja/utf8.h"
#include "core/error.h"

namespace megactx::jinja {

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
}

void check_undefined(const Value& v) {
  if (v.is_undefined()) throw Error(v.text.empty() ? "value is undefined" : v.text);
}

// Python ints are unbounded; megactx's are int64 and overflow is an error.
int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail("integer overflow");
  return r;
}
int64_t checked_sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) fail("integer overflow");
  return r;
}
int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail("integer overflow");
  return r;
}

Value repeat(const Value& seq, int64_t times) {
  if (times < 0) times = 0;
  if (seq.is_string()) {
    if (times && seq.text.size() * static_cast<size_t>(times) > Interpreter::kMaxStringBytes)
      fail("string repetition result too large");
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.text;
    return Value::string(std::move(out));
  }
  if (times && seq.list->size() * static_cast<size_t>(times) > 1000000)
    fail("list repetition result too large");
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return seq.kind == Value::Kind::Tuple ? Value::make_tuple(std::move(out))
                                        : Value::make_list(std::move(out));
}

double py_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// Python's "%" string formatting for the conversions templates use.
std::string percent_format(const std::string& format, const Value& args) {
  List values = args.kind == Value::Kind::Tuple ? *args.list : List{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) fail("incomplete format");
    char c = format[i];
    if (c == '%') {
      out.push_back('%');
      continue;
    }
    if (next >= values.size()) fail("not enough arguments for format string");
    const Value& v = values[next++];
    if (c == 's') {
      out += to_str(v);
    } else if (c == 'r') {
      out += repr(v);
    } else if (c == 'd' || c == 'i') {
      if (!v.is_number()) fail("%d format: a real number is required, not {}", type_name(v));
      out += std::to_string(v.is_int() ? v.integer : static_cast<int64_t>(std::trunc(v.number)));
    } else {
      fail("unsupported format character '{}'", c);
    }
  }
  if (next < values.size()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  check_undefined(a);
  check_undefined(b);
  bool ints = a.is_int() && b.is_int();
  bool numbers = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return Value::from_int(checked_add(a.integer, b.integer));
    if (numbers) return Value::from_float(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      if (a.text.size() + b.text.size() > Interpreter::kMaxStringBytes) fail("string too large");
      return Value::string(a.text + b.text);
    }
    if (a.is_sequence() && a.kind == b.kind) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return a.kind == Value::Kind::Tuple ? Value::make_tuple(std::move(out))
                                          : Value::make_list(std::move(out));
    }
    if (a.is_string() || b.is_string())
      fail("can only concatenate str (not \"{}\") to str", type_name(a.is_string() ? b : a));
    unsupported(op, a, b);
  }
  if (op == "-") {
    if (ints) return Value::from_int(checked_sub(a.integer, b.integer));
    if (numbers) return Value::from_float(a.as_double() - b.as_double());
    unsupported(op, a, b);
  }
  if (op == "*") {
    if (ints) return Value::from_int(checked_mul(a.integer, b.integer));
    if (numbers) return Value::from_float(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_sequence()) && b.is_int()) return repeat(a, b.integer);
    if ((b.is_string() || b.is_sequence()) && a.is_int()) return repeat(b, a.integer);
    unsupported(op, a, b);
  }
  if (op == "/") {
    if (!numbers) unsupported(op, a, b);
    if (b.as_double() == 0) fail("division by zero");
    return Value::from_float(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (!numbers) unsupported(op, a, b);
    if (b.as_double() == 0) fail("integer division or modulo by zero");
    if (ints) {
      if (a.integer == std::numeric_limits<int64_t>::min() && b.integer == -1)
        fail("integer overflow");
      int64_t q = a.integer / b.integer;
      if ((a.integer % b.integer != 0) && ((a.integer < 0) != (b.integer < 0))) --q;
      return Value::from_int(q);
    }
    return Value::from_float(std::floor(a.as_double() / b.as_double()));
  }
  if (op == "%") {
    if (a.is_string()) return Value::string(percent_format(a.text, b));
    if (!numbers) unsupported(op, a, b);
    if (b.as_double() == 0) fail("integer division or modulo by zero");
    if (ints) {
      if (b.integer == -1) return Value::from_int(0);
      int64_t m = a.integer % b.integer;
      if (m != 0 && ((m < 0) != (b.integer < 0))) m += b.integer;
      return Value::from_int(m);
    }
    return Value::from_float(py_fmod(a.as_double(), b.as_double()));
  }
  if (op == "**") {
    if (!numbers) unsupported(op, a, b);
    if (ints && b.integer >= 0) {
      int64_t result = 1, base = a.integer, exponent = b.integer;
      while (exponent > 0) {
        if (exponent & 1) result = checked_mul(result, base);
        exponent >>= 1;
        if (exponent) base = checked_mul(base, base);
      }
      return Value::from_int(result);
    }
    if (a.as_double() == 0 && b.as_double() < 0) fail("0.0 cannot be raised to a negative power");
    return Value::from_float(std::pow(a.as_double(), b.as_double()));
  }
  fail("unknown operator {}", op);
}

Value negate(const Value& a) {
  check_undefined(a);
  if (a.is_int()) {
    if (a.integer == std::numeric_limits<int64_t>::min()) fail("integer overflow");
    return Value::from_int(-a.integer);
  }
  if (a.kind == Value::Kind::Float) return Value::from_float(-a.number);
  fail("bad operand type for unary -: '{}'", type_name(a));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Kind::String:
      if (!item.is_string())
        fail("'in <string>' requires string as left operand, not {}", type_name(item));
      return container.text.find(item.text) != std::string::npos;
    case Value::Kind::List:
    case Value::Kind::Tuple:
      for (const Value& v : *container.list)
        if (equals(v, item)) return true;
      return false;
    case Value::Kind::Dict:
      return container.dict->find(item) != nullptr;
    case Value::Kind::Undefined:
      return false;
    default:
      fail("argument of type '{}' is not iterable", type_name(container));
  }
}

Value get_attr(const Value& object, const std::string& name) {
  switch (object.kind) {
    case Value::Kind::Undefined:
      throw Error(object.text.empty() ? "'" + name + "' of undefined value" : object.text);
    case Value::Kind::Object:
      return object.object->get_attr(name);
    case Value::Kind::Dict: {
      Value method = bound_method(object, name);
      if (!method.is_undefined()) return method;
      if (const Value* v = object.dict->find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    default: {
      Value method = bound_method(object, name);
      if (!method.is_undefined()) return method;
      // Built by appending: GCC 12 at -O3 warns falsely (-Wrestrict, bug 105329)
      // on "literal" + std::string&&.
      std::string message = "'";
      message.append(type_name(object)).append(" object' has no attribute '").append(name) += "'";
      return Value::undefined(message);
    }
  }
}

namespace {
// Python index normalization; returns false when out of range.
bool normalize_index(int64_t& index, size_t size) {
  if (index < 0) index += static_cast<int64_t>(size);
  return index >= 0 && index < static_cast<int64_t>(size);
}
}  // namespace

Value get_item(const Value& object, const Value& key) {
  switch (object.kind) {
    case Value::Kind::Undefined:
      throw Error(object.text.empty() ? "value is undefined" : object.text);
    case Value::Kind::Dict:
      if (const Value* v = object.dict->find(key)) return *v;
      break;
    case Value::Kind::List:
    case Value::Kind::Tuple:
      if (key.is_int()) {
        int64_t index = key.integer;
        if (normalize_index(index, object.list->size())) return (*object.list)[index];
      }
      break;
    case Value::Kind::String:
      if (key.is_int()) {
        std::vector<char32_t> cps = utf8_decode(object.text);
        int64_t index = key.integer;
        if (normalize_index(index, cps.size())) {
          std::string out;
          utf8_append(out, cps[index]);
          return Value::string(out);
        }
      }
      break;
    default:
      break;
  }
  if (key.is_string() && object.kind != Value::Kind::Dict) {
    Value attr = get_attr(object, key.text);
    if (!attr.is_undefined()) return attr;
  }
  std::string message = "'";
  if (key.is_string()) {
    message.append(object.is_dict() ? std::string("dict") : type_name(object));
    message.append(" object' has no attribute '").append(key.text) += "'";
    return Value::undefined(message);
  }
  message.append(type_name(object)).append(" object' has no element ").append(repr(key));
  return Value::undefined(message);
}

Value slice(const Value& object, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_int()) fail("slice {} must be an integer or None", what);
    return v.integer;
  };
  std::optional<int64_t> start = as_index(start_v, "start"), stop = as_index(stop_v, "stop"),
                         step_o = as_index(step_v, "step");
  int64_t step = step_o.value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  std::vector<char32_t> cps;
  size_t size;
  if (object.is_string()) {
    cps = utf8_decode(object.text);
    size = cps.size();
  } else if (object.is_sequence()) {
    size = object.list->size();
  } else if (object.is_undefined()) {
    throw Error(object.text.empty() ? "value is undefined" : object.text);
  } else {
    fail("'{}' object is not subscriptable", type_name(object));
  }
  int64_t n = static_cast<int64_t>(size);
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t default_value) {
    if (!v) return default_value;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  // A step longer than the sequence selects at most one element; clamping it
  // keeps the index arithmetic below free of int64 overflow.
  step = std::clamp<int64_t>(step, -(n + 1), n + 1);
  int64_t begin = adjust(start, step < 0 ? n - 1 : 0);
  int64_t end = adjust(stop, step < 0 ? -1 : n);
  std::vector<size_t> indices;
  if (step > 0) {
    for (int64_t i = begin; i < end; i += step) indices.push_back(static_cast<size_t>(i));
  } else {
    for (int64_t i = begin; i > end; i += step) indices.push_back(static_cast<size_t>(i));
  }
  if (object.is_string()) {
    std::string out;
    for (size_t i : indices) utf8_append(out, cps[i]);
    return Value::string(std::move(out));
  }
  List out;
  for (size_t i : indices) out.push_back((*object.list)[i]);
  return object.kind == Value::Kind::Tuple ? Value::make_tuple(std::move(out))
                                           : Value::make_list(std::move(out));
}

}  // namespace megactx::jinja
