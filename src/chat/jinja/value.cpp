#include "chat/jinja/value.h"

#include <algorithm>
#include <cmath>

#include "chat/jinja/py_format.h"
#include "chat/jinja/utf8.h"
#include "core/error.h"

namespace megactx::jinja {

Value Value::undefined(std::string reason) {
  Value v;
  v.text = std::move(reason);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::Bool;
  v.integer = b ? 1 : 0;
  return v;
}
Value Value::from_int(int64_t i) {
  Value v;
  v.kind = Kind::Int;
  v.integer = i;
  return v;
}
Value Value::from_float(double d) {
  Value v;
  v.kind = Kind::Float;
  v.number = d;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind = Kind::String;
  v.text = std::move(s);
  return v;
}
Value Value::make_list(List items) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<List>(std::move(items));
  v.update_nesting();
  return v;
}

void Value::update_nesting() {
  int deepest = 0;
  if (kind == Kind::List || kind == Kind::Tuple) {
    for (const Value& item : *list) deepest = std::max(deepest, nesting_of(item));
  } else if (kind == Kind::Dict) {
    for (const auto& [key, item] : dict->entries)
      deepest = std::max({deepest, nesting_of(key), nesting_of(item)});
  } else {
    return;
  }
  if (deepest + 1 > kMaxNesting) fail("values nested deeper than {} levels", kMaxNesting);
  nesting = static_cast<uint16_t>(deepest + 1);
}

int nesting_of(const Value& value) {
  switch (value.kind) {
    case Value::Kind::List:
    case Value::Kind::Tuple:
    case Value::Kind::Dict:
      return value.nesting;
    case Value::Kind::Object:
      return value.object->nesting();
    default:
      return 0;
  }
}
Value Value::make_tuple(List items) {
  Value v = make_list(std::move(items));
  v.kind = Kind::Tuple;
  return v;
}
Value Value::make_dict() {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::make_object(std::shared_ptr<Object> object) {
  Value v;
  v.kind = Kind::Object;
  v.object = std::move(object);
  return v;
}

namespace {
template <typename Json>
Value value_from_json(const Json& json) {
  switch (json.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(json.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::from_int(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = json.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::from_float(static_cast<double>(u));
      return Value::from_int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::from_float(json.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(json.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(value_from_json(item));
      return Value::make_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value v = Value::make_dict();
      // JSON keys are unique, so entries are appended without lookups.
      for (const auto& [key, item] : json.items())
        v.dict->entries.emplace_back(Value::string(key), value_from_json(item));
      v.update_nesting();
      return v;
    }
    default:
      return Value::none();
  }
}
}  // namespace

Value Value::from_json(const nlohmann::json& json) {
  return value_from_json(json);
}
Value Value::from_json(const nlohmann::ordered_json& json) {
  return value_from_json(json);
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : entries)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k.kind == Value::Kind::String && k.text == key) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : entries)
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(std::move(key), std::move(value));
}

Value CallArgs::get(size_t index, const std::string& name, Value fallback) const {
  if (index < args.size()) return args[index];
  if (const Value* v = keyword(name)) return *v;
  return fallback;
}

const Value* CallArgs::keyword(const std::string& name) const {
  for (const auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}

Value Object::get_attr(const std::string& name) const {
  return Value::undefined("'" + type_name() + "' object has no attribute '" + name + "'");
}
bool Object::set_attr(const std::string&, const Value&) {
  return false;
}
Value Object::call(Interpreter&, const CallArgs&) {
  fail("'{}' object is not callable", type_name());
}
std::string Object::repr() const {
  return "<" + type_name() + " object>";
}

bool truthy(const Value& value) {
  switch (value.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return false;
    case Value::Kind::Bool:
    case Value::Kind::Int:
      return value.integer != 0;
    case Value::Kind::Float:
      return value.number != 0;
    case Value::Kind::String:
      return !value.text.empty();
    case Value::Kind::List:
    case Value::Kind::Tuple:
      return !value.list->empty();
    case Value::Kind::Dict:
      return !value.dict->entries.empty();
    case Value::Kind::Object:
      return value.object->truthy();
  }
  return false;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.integer == b.integer;
    return a.as_double() == b.as_double();
  }
  if (a.is_sequence() && b.is_sequence()) {
    if (a.kind != b.kind || a.list->size() != b.list->size()) return false;
    for (size_t i = 0; i < a.list->size(); ++i)
      if (!equals((*a.list)[i], (*b.list)[i])) return false;
    return true;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return true;
    case Value::Kind::String:
      return a.text == b.text;
    case Value::Kind::Dict: {
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [key, item] : a.dict->entries) {
        const Value* other = b.dict->find(key);
        if (!other || !equals(item, *other)) return false;
      }
      return true;
    }
    case Value::Kind::Object:
      return a.object == b.object;
    default:
      return false;
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.integer < b.integer;
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.text < b.text;  // UTF-8 keeps code point order
  if (a.is_sequence() && b.is_sequence() && a.kind == b.kind) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i) {
      const Value& x = (*a.list)[i];
      const Value& y = (*b.list)[i];
      if (!equals(x, y)) return less_than(x, y);
    }
    return a.list->size() < b.list->size();
  }
  fail("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b));
}

std::string type_name(const Value& value) {
  switch (value.kind) {
    case Value::Kind::Undefined:
      return "Undefined";
    case Value::Kind::None:
      return "NoneType";
    case Value::Kind::Bool:
      return "bool";
    case Value::Kind::Int:
      return "int";
    case Value::Kind::Float:
      return "float";
    case Value::Kind::String:
      return "str";
    case Value::Kind::List:
      return "list";
    case Value::Kind::Tuple:
      return "tuple";
    case Value::Kind::Dict:
      return "dict";
    case Value::Kind::Object:
      return value.object->type_name();
  }
  return "object";
}

std::string to_str(const Value& value) {
  switch (value.kind) {
    case Value::Kind::Undefined:
      return "";
    case Value::Kind::String:
      return value.text;
    default:
      return repr(value);
  }
}

std::string repr(const Value& value) {
  switch (value.kind) {
    case Value::Kind::Undefined:
      return "Undefined";
    case Value::Kind::None:
      return "None";
    case Value::Kind::Bool:
      return value.integer ? "True" : "False";
    case Value::Kind::Int:
      return std::to_string(value.integer);
    case Value::Kind::Float:
      return float_repr(value.number);
    case Value::Kind::String:
      return string_repr(value.text);
    case Value::Kind::List:
    case Value::Kind::Tuple: {
      bool tuple = value.kind == Value::Kind::Tuple;
      std::string out = tuple ? "(" : "[";
      for (size_t i = 0; i < value.list->size(); ++i) {
        if (i) out += ", ";
        out += repr((*value.list)[i]);
      }
      if (tuple && value.list->size() == 1) out += ",";
      return out + (tuple ? ")" : "]");
    }
    case Value::Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, item] : value.dict->entries) {
        if (!first) out += ", ";
        first = false;
        out += repr(key) + ": " + repr(item);
      }
      return out + "}";
    }
    case Value::Kind::Object:
      return value.object->repr();
  }
  return "";
}

size_t length(const Value& value) {
  switch (value.kind) {
    case Value::Kind::Undefined:
      return 0;
    case Value::Kind::String:
      return utf8_length(value.text);
    case Value::Kind::List:
    case Value::Kind::Tuple:
      return value.list->size();
    case Value::Kind::Dict:
      return value.dict->entries.size();
    default:
      fail("object of type '{}' has no len()", type_name(value));
  }
}

List iterate(const Value& value) {
  switch (value.kind) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::List:
    case Value::Kind::Tuple:
      return *value.list;
    case Value::Kind::Dict: {
      List keys;
      for (const auto& entry : value.dict->entries) keys.push_back(entry.first);
      return keys;
    }
    case Value::Kind::String: {
      List chars;
      size_t pos = 0;
      while (pos < value.text.size()) {
        size_t start = pos;
        utf8_next(value.text, pos);
        chars.push_back(Value::string(value.text.substr(start, pos - start)));
      }
      return chars;
    }
    default:
      fail("'{}' object is not iterable", type_name(value));
  }
}

}  // namespace megactx::jinja
