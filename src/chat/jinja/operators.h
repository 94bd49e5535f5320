// Python semantics of Jinja's operators, attribute and item access.
#pragma once

#include <optional>
#include <string>

#include "chat/jinja/value.h"

namespace megactx::jinja {

// + - * / // % ** with Python's int/float rules; throws megactx::Error on
// unsupported operand types, division by zero or integer overflow.
Value binary_op(const std::string& op, const Value& a, const Value& b);
Value negate(const Value& a);
// `item in container` (substring for strings, key for dicts).
bool contains(const Value& container, const Value& item);

// jinja2's getattr (obj.name): attribute (methods) first, then item.
Value get_attr(const Value& object, const std::string& name);
// jinja2's getitem (obj[key]): item first, then attribute for string keys.
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step] on lists, tuples and strings.
Value slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// Methods of str, list and dict reachable from templates (the ones the
// immutable sandbox allows); Undefined when `name` is not one.
Value bound_method(const Value& self, const std::string& name);

}  // namespace megactx::jinja
