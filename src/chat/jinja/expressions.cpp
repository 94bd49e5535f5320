// Expression evaluation of the interpreter (statements are in interpreter.cpp).
#include "chat/jinja/builtins.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/lexer.h"
#include "chat/jinja/operators.h"
#include "core/error.h"

namespace megactx::jinja {

namespace {
bool has_position(const std::string& message) {
  return message.rfind("line ", 0) == 0;
}
}  // namespace

Value Interpreter::eval(const Expr& expr, const ScopePtr& scope) {
  // Bounds C++ recursion across nested expressions and macro calls.
  struct DepthGuard {
    explicit DepthGuard(int& depth) : depth_(depth) { ++depth_; }
    ~DepthGuard() { --depth_; }
    int& depth_;
  } guard(eval_depth_);
  if (eval_depth_ > kMaxEvalDepth) fail_at_offset(expr.offset, "expressions nested too deeply");
  try {
    switch (expr.kind) {
      case Expr::Kind::Literal:
        return expr.literal;
      case Expr::Kind::Name: {
        if (const Value* v = scope->lookup(expr.name)) return *v;
        return Value::undefined("'" + expr.name + "' is undefined");
      }
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        List items;
        for (const ExprPtr& item : expr.items) items.push_back(eval(*item, scope));
        return expr.kind == Expr::Kind::List ? Value::make_list(std::move(items))
                                             : Value::make_tuple(std::move(items));
      }
      case Expr::Kind::Dict: {
        Value d = Value::make_dict();
        for (size_t i = 0; i + 1 < expr.items.size(); i += 2) {
          Value key = eval(*expr.items[i], scope);
          if (key.is_sequence() && key.kind == Value::Kind::List) fail("unhashable type: 'list'");
          if (key.is_dict()) fail("unhashable type: 'dict'");
          d.dict->set(key, eval(*expr.items[i + 1], scope));
        }
        d.update_nesting();
        return d;
      }
      case Expr::Kind::GetAttr:
        return get_attr(eval(*expr.items[0], scope), expr.name);
      case Expr::Kind::GetItem: {
        Value object = eval(*expr.items[0], scope);
        const Expr& key = *expr.items[1];
        if (key.kind == Expr::Kind::Slice) {
          auto part = [&](size_t i) {
            return key.items[i] ? eval(*key.items[i], scope) : Value::none();
          };
          return slice(object, part(0), part(1), part(2));
        }
        return get_item(object, eval(key, scope));
      }
      case Expr::Kind::Slice:
        fail("slice outside of a subscript");
      case Expr::Kind::Call: {
        Value callee = eval(*expr.items[0], scope);
        return call(callee, eval_args(expr.args, scope));
      }
      case Expr::Kind::Filter: {
        if (expr.items.empty()) fail("filter without input");
        return eval_filter(expr, scope, nullptr);
      }
      case Expr::Kind::Test: {
        Value input = eval(*expr.items[0], scope);
        return Value::boolean(apply_test(expr.name, input, eval_args(expr.args, scope)));
      }
      case Expr::Kind::Not:
        return Value::boolean(!truthy(eval(*expr.items[0], scope)));
      case Expr::Kind::Negate:
        return negate(eval(*expr.items[0], scope));
      case Expr::Kind::Plus: {
        Value v = eval(*expr.items[0], scope);
        if (!v.is_number()) fail("bad operand type for unary +: '{}'", type_name(v));
        return v.is_bool() ? Value::from_int(v.integer) : v;
      }
      case Expr::Kind::Binary:
        return binary_op(expr.name, eval(*expr.items[0], scope), eval(*expr.items[1], scope));
      case Expr::Kind::Compare:
        return eval_compare(expr, scope);
      case Expr::Kind::And: {
        Value left = eval(*expr.items[0], scope);
        return truthy(left) ? eval(*expr.items[1], scope) : left;
      }
      case Expr::Kind::Or: {
        Value left = eval(*expr.items[0], scope);
        return truthy(left) ? left : eval(*expr.items[1], scope);
      }
      case Expr::Kind::Condition:
        if (truthy(eval(*expr.items[0], scope))) return eval(*expr.items[1], scope);
        if (expr.items[2]) return eval(*expr.items[2], scope);
        return Value::undefined(
            "the inline if-expression on line evaluated to false and no else section was defined.");
      case Expr::Kind::Concat: {
        std::string out;
        for (const ExprPtr& item : expr.items) {
          out += to_str(eval(*item, scope));
          if (out.size() > kMaxStringBytes) fail("string too large");
        }
        return Value::string(std::move(out));
      }
    }
  } catch (const Error& error) {
    if (has_position(error.what())) throw;
    fail_at_offset(expr.offset, error.what());
  }
  fail_at_offset(expr.offset, "unsupported expression");
}

CallArgs Interpreter::eval_args(const ArgList& args, const ScopePtr& scope) {
  CallArgs out;
  for (const ExprPtr& arg : args.positional) out.args.push_back(eval(*arg, scope));
  for (const auto& [key, arg] : args.keywords) out.kwargs.emplace_back(key, eval(*arg, scope));
  if (args.star_args) {
    Value extra = eval(*args.star_args, scope);
    for (const Value& v : iterate(extra)) out.args.push_back(v);
  }
  if (args.star_kwargs) {
    Value extra = eval(*args.star_kwargs, scope);
    if (!extra.is_dict()) fail("argument after ** must be a mapping, not {}", type_name(extra));
    for (const auto& [key, value] : extra.dict->entries) {
      if (!key.is_string()) fail("keywords must be strings");
      out.kwargs.emplace_back(key.text, value);
    }
  }
  return out;
}

Value Interpreter::eval_compare(const Expr& expr, const ScopePtr& scope) {
  Value left = eval(*expr.items[0], scope);
  for (size_t i = 0; i < expr.ops.size(); ++i) {
    Value right = eval(*expr.items[i + 1], scope);
    const std::string& op = expr.ops[i];
    bool result;
    if (op == "==") {
      result = equals(left, right);
    } else if (op == "!=") {
      result = !equals(left, right);
    } else if (op == "<") {
      result = less_than(left, right);
    } else if (op == ">") {
      result = less_than(right, left);
    } else if (op == "<=") {
      result = less_than(left, right) || equals(left, right);
    } else if (op == ">=") {
      result = less_than(right, left) || equals(left, right);
    } else if (op == "in") {
      result = contains(right, left);
    } else {
      result = !contains(right, left);
    }
    if (!result) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

// Applies the filter chain `expr` (innermost filter first) to *input.
Value Interpreter::eval_filter(const Expr& expr, const ScopePtr& scope, const Value* input) {
  // A chain a|f|g is Filter(g, [Filter(f, [a])]); for block filters the
  // innermost has no input expression and takes *input.
  Value value;
  if (expr.items.empty()) {
    if (!input) fail("filter without input");
    value = *input;
  } else if (expr.items[0]->kind == Expr::Kind::Filter) {
    value = eval_filter(*expr.items[0], scope, input);
  } else {
    value = eval(*expr.items[0], scope);
  }
  try {
    return apply_filter(expr.name, value, eval_args(expr.args, scope));
  } catch (const Error& error) {
    if (has_position(error.what())) throw;
    fail_at_offset(expr.offset, error.what());
  }
}

}  // namespace megactx::jinja
