// Runtime values of the Jinja interpreter, modelled on the Python objects that
// jinja2 manipulates when HF renders a chat template: None, bool, int, float,
// str, list, tuple, dict (insertion ordered), jinja2's Undefined, and objects
// (namespace, loop, macros, builtin functions, bound methods).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace megactx::jinja {

struct Value;
struct Dict;
class Object;
class Interpreter;

using List = std::vector<Value>;

struct Value {
  enum class Kind : uint8_t {
    Undefined,
    None,
    Bool,
    Int,
    Float,
    String,
    List,
    Tuple,
    Dict,
    Object
  };

  Kind kind = Kind::Undefined;
  // Containers: 1 + the deepest element's nesting. Bounded (kMaxNesting) so
  // that repr, comparison and destruction never recurse deeply enough to
  // overflow the stack, whatever a template builds.
  uint16_t nesting = 0;
  int64_t integer = 0;             // Int, and Bool as 0/1 (Python bools are ints)
  double number = 0;               // Float
  std::string text;                // String; for Undefined the reason, e.g. "'x' is undefined"
  std::shared_ptr<List> list;      // List and Tuple (shared: Python reference semantics)
  std::shared_ptr<Dict> dict;      // Dict
  std::shared_ptr<Object> object;  // Object

  static Value undefined(std::string reason = {});
  static Value none();
  static Value boolean(bool b);
  static Value from_int(int64_t i);
  static Value from_float(double d);
  static Value string(std::string s);
  static Value make_list(List items = {});
  static Value make_tuple(List items);
  static Value make_dict();
  static Value make_object(std::shared_ptr<Object> object);
  // JSON objects keep their key order only with ordered_json (Python dicts do,
  // and tojson output must match HF's byte for byte).
  static Value from_json(const nlohmann::json& json);
  static Value from_json(const nlohmann::ordered_json& json);

  static constexpr int kMaxNesting = 512;
  // Recomputes `nesting` of a List/Tuple/Dict from its elements; throws
  // megactx::Error when it exceeds kMaxNesting.
  void update_nesting();

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_bool() const { return kind == Kind::Bool; }
  bool is_int() const { return kind == Kind::Int || kind == Kind::Bool; }
  bool is_number() const { return is_int() || kind == Kind::Float; }
  bool is_string() const { return kind == Kind::String; }
  bool is_sequence() const { return kind == Kind::List || kind == Kind::Tuple; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_object() const { return kind == Kind::Object; }
  double as_double() const { return kind == Kind::Float ? number : static_cast<double>(integer); }
};

// A Python dict: insertion-ordered key/value pairs. Chat-template dicts are
// small, so lookups are linear scans.
struct Dict {
  std::vector<std::pair<Value, Value>> entries;

  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  void set(Value key, Value value);
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;

  // Python-style binding: positional `index` or keyword `name`, else fallback.
  Value get(size_t index, const std::string& name, Value fallback = Value::undefined()) const;
  const Value* keyword(const std::string& name) const;
};

// Objects with attributes or a call operator: namespace(), loop, macros,
// builtin functions and methods.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;
  // Attribute lookup; returns Undefined when absent.
  virtual Value get_attr(const std::string& name) const;
  // Attribute assignment ({% set ns.x = ... %}); false when not supported.
  virtual bool set_attr(const std::string& name, const Value& value);
  virtual bool is_callable() const { return false; }
  virtual Value call(Interpreter& interpreter, const CallArgs& args);
  virtual std::string repr() const;
  // Truthiness (Python objects are true unless they say otherwise).
  virtual bool truthy() const { return true; }
  // Nesting of values held by the object (see Value::nesting).
  virtual int nesting() const { return 0; }
};

int nesting_of(const Value& value);

// Python semantics.
bool truthy(const Value& value);
bool equals(const Value& a, const Value& b);
// a < b; throws megactx::Error when the types cannot be ordered.
bool less_than(const Value& a, const Value& b);
std::string type_name(const Value& value);  // "str", "int", "dict", "list", ...
// str(value) and repr(value) as Python prints them.
std::string to_str(const Value& value);
std::string repr(const Value& value);
// Length as len(value); throws for types without one.
size_t length(const Value& value);
// Elements of `value` when iterated: list/tuple items, dict keys, string
// characters, nothing for Undefined; throws for non-iterables.
List iterate(const Value& value);

}  // namespace megactx::jinja
