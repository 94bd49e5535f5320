// Template-visible objects: namespace(), builtin functions, macros (and the
// `caller` of call blocks) and the `loop` variable of for-loops.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "chat/jinja/interpreter.h"

namespace megactx::jinja {

class Namespace : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  Value get_attr(const std::string& name) const override;
  bool set_attr(const std::string& name, const Value& value) override;
  std::string repr() const override;
  int nesting() const override { return nesting_; }
  // Sets an attribute, keeping the nesting bound (throws when exceeded).
  void set(const Value& key, const Value& value);

  Dict attributes;

 private:
  int nesting_ = 1;
};

class BuiltinFunction : public Object {
 public:
  using Function = std::function<Value(Interpreter&, const CallArgs&)>;
  BuiltinFunction(std::string name, Function function)
      : name_(std::move(name)), function_(std::move(function)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  bool is_callable() const override { return true; }
  Value call(Interpreter& interpreter, const CallArgs& args) override {
    return function_(interpreter, args);
  }
  std::string repr() const override { return "<built-in function " + name_ + ">"; }

 private:
  std::string name_;
  Function function_;
};

// A {% macro %} (or the caller of a {% call %} block): renders its body in a
// fresh scope over the scope it was defined in.
class Macro : public Object {
 public:
  Macro(std::string name, const Signature& signature, const Body& body, ScopePtr closure)
      : name_(std::move(name)), signature_(signature), body_(body), closure_(std::move(closure)) {}
  std::string type_name() const override { return "Macro"; }
  bool is_callable() const override { return true; }
  Value call(Interpreter& interpreter, const CallArgs& args) override;
  std::string repr() const override { return "<Macro '" + name_ + "'>"; }
  Value get_attr(const std::string& name) const override;

 private:
  std::string name_;
  const Signature& signature_;
  const Body& body_;
  ScopePtr closure_;
};

// `loop` inside a for-loop body.
class LoopObject : public Object, public std::enable_shared_from_this<LoopObject> {
 public:
  using Recurse = std::function<std::string(const Value& iterable, int depth)>;
  LoopObject(std::shared_ptr<const List> items, int depth, Recurse recurse)
      : items_(std::move(items)), depth_(depth), recurse_(std::move(recurse)) {}
  std::string type_name() const override { return "LoopContext"; }
  Value get_attr(const std::string& name) const override;
  bool is_callable() const override { return static_cast<bool>(recurse_); }
  Value call(Interpreter& interpreter, const CallArgs& args) override;
  std::string repr() const override;

  size_t index0 = 0;
  Value last_changed;  // loop.changed() state
  bool changed_called = false;

 private:
  std::shared_ptr<const List> items_;  // the (filtered) items iterated
  int depth_;
  Recurse recurse_;
};

}  // namespace megactx::jinja
