#include "chat/jinja/interpreter.h"

#include "chat/jinja/builtins.h"
#include "chat/jinja/lexer.h"
#include "chat/jinja/objects.h"
#include "chat/jinja/operators.h"
#include "core/error.h"

namespace megactx::jinja {

namespace {
// Bound on nesting of macro calls and recursive loops (stack depth).
constexpr int kMaxCallDepth = 64;

bool has_position(const std::string& message) {
  return message.rfind("line ", 0) == 0;
}
}  // namespace

const Value* Scope::lookup(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

Interpreter::Interpreter(const std::string& source, size_t max_steps)
    : source_(source), max_steps_(max_steps) {}

void Interpreter::count_step() {
  if (++steps_ > max_steps_)
    fail("template exceeded {} steps (loop iterations, calls and filters)", max_steps_);
}

void Interpreter::enter_call() {
  if (++call_depth_ > kMaxCallDepth) {
    --call_depth_;
    fail("macro calls nested deeper than {}", kMaxCallDepth);
  }
}

void Interpreter::fail_at_offset(size_t offset, const std::string& message) const {
  fail_at(source_, offset, message);
}

std::string Interpreter::render(const Body& body, const Dict& globals) {
  auto global_scope = std::make_shared<Scope>();
  for (const auto& [key, value] : globals.entries)
    if (key.is_string()) global_scope->vars[key.text] = value;
  auto top = std::make_shared<Scope>();
  top->parent = global_scope;
  std::string out;
  auto cleanup = [&] {
    for (auto& scope : cycle_scopes_) scope->vars.clear();
    for (auto& object : cycle_objects_)
      if (auto* ns = dynamic_cast<Namespace*>(object.get())) ns->attributes.entries.clear();
    cycle_scopes_.clear();
    cycle_objects_.clear();
  };
  try {
    exec(body, top, out);
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  return out;
}

void Interpreter::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  exec_block(body, scope, out);
}

Interpreter::Flow Interpreter::exec_block(const Body& body, const ScopePtr& scope,
                                          std::string& out) {
  for (const StmtPtr& stmt : body) {
    Flow flow = exec_stmt(*stmt, scope, out);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& stmt, const ScopePtr& scope,
                                         std::string& out) {
  // Statements nest inside macro calls; one bound covers them and expressions.
  ++eval_depth_;
  struct Leave {
    int& depth;
    ~Leave() { --depth; }
  } leave{eval_depth_};
  if (eval_depth_ > kMaxEvalDepth) fail_at_offset(stmt.offset, "statements nested too deeply");
  try {
    switch (stmt.kind) {
      case Stmt::Kind::Data:
        out += stmt.text;
        break;
      case Stmt::Kind::Print: {
        Value v = eval(*stmt.expr, scope);
        out += to_str(v);
        if (out.size() > kMaxStringBytes) fail("rendered output too large");
        break;
      }
      case Stmt::Kind::If:
        for (size_t i = 0; i < stmt.conditions.size(); ++i)
          if (truthy(eval(*stmt.conditions[i], scope)))
            return exec_block(stmt.bodies[i], scope, out);
        return exec_block(stmt.else_body, scope, out);
      case Stmt::Kind::For:
        exec_for(stmt, scope, out);
        break;
      case Stmt::Kind::Set:
        assign(*stmt.target, eval(*stmt.expr, scope), scope);
        break;
      case Stmt::Kind::SetBlock: {
        std::string text;
        Flow flow = exec_block(stmt.body, scope, text);
        Value v = Value::string(std::move(text));
        if (stmt.filter) v = eval_filter(*stmt.filter, scope, &v);
        assign(*stmt.target, v, scope);
        if (flow != Flow::Normal) return flow;
        break;
      }
      case Stmt::Kind::Macro: {
        auto macro = std::make_shared<Macro>(stmt.text, stmt.signature, stmt.body, scope);
        scope->vars[stmt.text] = Value::make_object(macro);
        track(scope);
        break;
      }
      case Stmt::Kind::CallBlock: {
        const Expr& call_expr = *stmt.expr;
        Value callee = eval(*call_expr.items[0], scope);
        CallArgs args = eval_args(call_expr.args, scope);
        auto caller = std::make_shared<Macro>("caller", stmt.signature, stmt.body, scope);
        args.kwargs.emplace_back("caller", Value::make_object(caller));
        out += to_str(call(callee, args));
        break;
      }
      case Stmt::Kind::FilterBlock: {
        std::string text;
        Flow flow = exec_block(stmt.body, scope, text);
        Value v = Value::string(std::move(text));
        out += to_str(eval_filter(*stmt.filter, scope, &v));
        if (flow != Flow::Normal) return flow;
        break;
      }
      case Stmt::Kind::With: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        for (size_t i = 0; i < stmt.with_targets.size(); ++i)
          assign(*stmt.with_targets[i], eval(*stmt.with_values[i], scope), inner);
        return exec_block(stmt.body, inner, out);
      }
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
    }
  } catch (const Error& error) {
    if (has_position(error.what())) throw;
    fail_at_offset(stmt.offset, error.what());
  }
  return Flow::Normal;
}

void Interpreter::exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
  Value iterable = eval(*stmt.expr, scope);
  run_loop(stmt, scope, iterable, 1, out);
}

void Interpreter::run_loop(const Stmt& stmt, const ScopePtr& scope, const Value& iterable,
                           int depth, std::string& out) {
  if (depth > kMaxCallDepth) fail("recursive loop nested deeper than {}", kMaxCallDepth);
  List all = iterate(iterable);
  auto items = std::make_shared<List>();
  if (stmt.filter) {
    for (const Value& item : all) {
      count_step();
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      assign(*stmt.target, item, probe);
      if (truthy(eval(*stmt.filter, probe))) items->push_back(item);
    }
  } else {
    *items = std::move(all);
  }
  if (items->empty()) {
    exec_block(stmt.else_body, scope, out);
    return;
  }
  LoopObject::Recurse recurse;
  if (stmt.recursive) {
    recurse = [this, &stmt, scope](const Value& nested, int nested_depth) {
      std::string text;
      run_loop(stmt, scope, nested, nested_depth, text);
      return text;
    };
  }
  auto loop = std::make_shared<LoopObject>(items, depth, recurse);
  Value loop_value = Value::make_object(loop);
  for (size_t i = 0; i < items->size(); ++i) {
    count_step();
    loop->index0 = i;
    auto body_scope = std::make_shared<Scope>();
    body_scope->parent = scope;
    body_scope->vars["loop"] = loop_value;
    assign(*stmt.target, (*items)[i], body_scope);
    Flow flow = exec_block(stmt.body, body_scope, out);
    if (flow == Flow::Break) break;
  }
}

void Interpreter::assign(const Expr& target, const Value& value, const ScopePtr& scope) {
  switch (target.kind) {
    case Expr::Kind::Name:
      scope->vars[target.name] = value;
      return;
    case Expr::Kind::Tuple: {
      if (!value.is_sequence() && !value.is_string() && !value.is_dict())
        fail("cannot unpack non-iterable {} object", type_name(value));
      List parts = iterate(value);
      if (parts.size() != target.items.size())
        fail("{} values to unpack (expected {}, got {})",
             parts.size() > target.items.size() ? "too many" : "not enough", target.items.size(),
             parts.size());
      for (size_t i = 0; i < parts.size(); ++i) assign(*target.items[i], parts[i], scope);
      return;
    }
    case Expr::Kind::GetAttr: {
      const Value* ns = scope->lookup(target.items[0]->name);
      if (!ns || !ns->is_object() || !dynamic_cast<Namespace*>(ns->object.get()))
        fail("cannot assign attribute on non-namespace object");
      ns->object->set_attr(target.name, value);
      return;
    }
    default:
      fail("cannot assign to this target");
  }
}

Value Interpreter::call(const Value& callee, const CallArgs& args) {
  count_step();
  if (callee.is_undefined())
    throw Error(callee.text.empty() ? "undefined value is not callable" : callee.text);
  if (!callee.is_object() || !callee.object->is_callable())
    fail("'{}' object is not callable", type_name(callee));
  return callee.object->call(*this, args);
}

Value Interpreter::apply_filter(const std::string& name, const Value& input, const CallArgs& args) {
  count_step();
  return call_filter(*this, name, input, args);
}

bool Interpreter::apply_test(const std::string& name, const Value& input, const CallArgs& args) {
  count_step();
  return call_test(*this, name, input, args);
}

}  // namespace megactx::jinja
