#include "chat/jinja/objects.h"

#include <algorithm>
#include <memory>

#include "core/error.h"

namespace megactx::jinja {

Value Namespace::get_attr(const std::string& name) const {
  if (const Value* v = attributes.find(name)) return *v;
  return Value::undefined("'Namespace' object has no attribute '" + name + "'");
}

bool Namespace::set_attr(const std::string& name, const Value& value) {
  set(Value::string(name), value);
  return true;
}

void Namespace::set(const Value& key, const Value& value) {
  int depth = nesting_of(value) + 1;
  if (depth > Value::kMaxNesting) fail("values nested deeper than {} levels", Value::kMaxNesting);
  nesting_ = std::max(nesting_, depth);
  attributes.set(key, value);
}

std::string Namespace::repr() const {
  Value d = Value::make_dict();
  *d.dict = attributes;
  return "<Namespace " + jinja::repr(d) + ">";
}

Value Macro::call(Interpreter& interpreter, const CallArgs& args) {
  const auto& names = signature_.names;
  auto scope = std::make_shared<Scope>();
  scope->parent = closure_;
  if (args.args.size() > names.size() && !signature_.uses_varargs)
    fail("macro '{}' takes not more than {} argument(s)", name_, names.size());
  List varargs;
  for (size_t i = 0; i < args.args.size(); ++i) {
    if (i < names.size()) {
      scope->vars[names[i]] = args.args[i];
    } else {
      varargs.push_back(args.args[i]);
    }
  }
  Value kwargs = Value::make_dict();
  Value caller;
  for (const auto& [key, value] : args.kwargs) {
    bool matched = false;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] != key) continue;
      if (i < args.args.size())
        fail("macro '{}' got multiple values for argument '{}'", name_, key);
      scope->vars[key] = value;
      matched = true;
    }
    if (matched) continue;
    if (key == "caller" && signature_.uses_caller) {
      caller = value;
    } else if (signature_.uses_kwargs) {
      kwargs.dict->set(Value::string(key), value);
    } else {
      fail("macro '{}' takes no keyword argument '{}'", name_, key);
    }
  }
  size_t first_default = names.size() - signature_.defaults.size();
  for (size_t i = 0; i < names.size(); ++i) {
    if (scope->vars.count(names[i])) continue;
    if (i >= first_default) {
      // Defaults are evaluated at call time, seeing earlier parameters.
      scope->vars[names[i]] = interpreter.eval(*signature_.defaults[i - first_default], scope);
    } else {
      scope->vars[names[i]] = Value::undefined("parameter '" + names[i] + "' was not provided");
    }
  }
  if (signature_.uses_varargs) scope->vars["varargs"] = Value::make_tuple(std::move(varargs));
  if (signature_.uses_kwargs) scope->vars["kwargs"] = kwargs;
  if (signature_.uses_caller && !caller.is_undefined()) scope->vars["caller"] = caller;
  interpreter.enter_call();
  std::string out;
  try {
    interpreter.exec(body_, scope, out);
  } catch (...) {
    interpreter.leave_call();
    throw;
  }
  interpreter.leave_call();
  return Value::string(std::move(out));
}

Value Macro::get_attr(const std::string& name) const {
  if (name == "name") return Value::string(name_);
  if (name == "arguments") {
    List out;
    for (const auto& n : signature_.names) out.push_back(Value::string(n));
    return Value::make_tuple(std::move(out));
  }
  return Object::get_attr(name);
}

Value LoopObject::get_attr(const std::string& name) const {
  const List& items = *items_;
  int64_t length = static_cast<int64_t>(items.size());
  int64_t i = static_cast<int64_t>(index0);
  if (name == "index0") return Value::from_int(i);
  if (name == "index") return Value::from_int(i + 1);
  if (name == "revindex") return Value::from_int(length - i);
  if (name == "revindex0") return Value::from_int(length - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i == length - 1);
  if (name == "length") return Value::from_int(length);
  if (name == "depth") return Value::from_int(depth_);
  if (name == "depth0") return Value::from_int(depth_ - 1);
  if (name == "previtem")
    return i > 0 ? items[index0 - 1] : Value::undefined("there is no previous item");
  if (name == "nextitem")
    return i + 1 < length ? items[index0 + 1] : Value::undefined("there is no next item");
  // cycle and changed need the loop's state: methods bound to this object.
  if (name == "cycle") {
    size_t index = index0;
    return Value::make_object(std::make_shared<BuiltinFunction>(
        "cycle", [index](Interpreter&, const CallArgs& args) -> Value {
          if (args.args.empty()) fail("no items for cycling given");
          return args.args[index % args.args.size()];
        }));
  }
  if (name == "changed") {
    auto self = std::const_pointer_cast<LoopObject>(shared_from_this());
    return Value::make_object(std::make_shared<BuiltinFunction>(
        "changed", [self](Interpreter&, const CallArgs& args) -> Value {
          Value current = Value::make_tuple(args.args);
          bool changed = !self->changed_called || !equals(current, self->last_changed);
          self->changed_called = true;
          self->last_changed = current;
          return Value::boolean(changed);
        }));
  }
  return Object::get_attr(name);
}

Value LoopObject::call(Interpreter&, const CallArgs& args) {
  if (!recurse_)
    fail("Tried to call non recursive loop. Maybe you forgot the 'recursive' modifier.");
  if (args.args.size() != 1) fail("loop() takes exactly one argument");
  return Value::string(recurse_(args.args[0], depth_ + 1));
}

std::string LoopObject::repr() const {
  return "<LoopContext " + std::to_string(index0 + 1) + "/" + std::to_string(items_->size()) + ">";
}

}  // namespace megactx::jinja
