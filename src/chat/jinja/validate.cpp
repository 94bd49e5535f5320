#include "chat/jinja/validate.h"

#include "chat/jinja/builtins.h"
#include "chat/jinja/lexer.h"

namespace megactx::jinja {

namespace {

class Validator {
 public:
  explicit Validator(const std::string& source) : source_(source) {}

  void body(const Body& statements, bool soft) {
    for (const StmtPtr& s : statements) statement(*s, soft);
  }

 private:
  void statement(const Stmt& s, bool soft) {
    bool inner_soft = soft || s.kind == Stmt::Kind::If;
    expr(s.target.get(), soft);
    expr(s.expr.get(), soft);
    expr(s.filter.get(), soft);
    for (const ExprPtr& e : s.conditions) expr(e.get(), inner_soft);
    for (const Body& b : s.bodies) body(b, inner_soft);
    body(s.body, soft);
    body(s.else_body, inner_soft);
    for (const ExprPtr& e : s.signature.defaults) expr(e.get(), soft);
    for (const ExprPtr& e : s.with_values) expr(e.get(), soft);
  }

  // Expression trees are built by loops (a or b or c ..., a.b.c ...), so
  // their depth is checked here rather than by the parser's recursion guard.
  static constexpr int kMaxExprDepth = 200;

  void expr(const Expr* e, bool soft, int depth = 0) {
    if (!e) return;
    if (depth > kMaxExprDepth) fail_at(source_, e->offset, "expression nested too deeply");
    if (!soft && e->kind == Expr::Kind::Filter && !has_filter(e->name))
      fail_at(source_, e->offset, "No filter named '" + e->name + "'.");
    if (!soft && e->kind == Expr::Kind::Test && !has_test(e->name))
      fail_at(source_, e->offset, "No test named '" + e->name + "'.");
    bool inner_soft = soft || e->kind == Expr::Kind::Condition;
    for (const ExprPtr& item : e->items) expr(item.get(), inner_soft, depth + 1);
    for (const ExprPtr& arg : e->args.positional) expr(arg.get(), inner_soft, depth + 1);
    for (const auto& [name, arg] : e->args.keywords) expr(arg.get(), inner_soft, depth + 1);
    expr(e->args.star_args.get(), inner_soft, depth + 1);
    expr(e->args.star_kwargs.get(), inner_soft, depth + 1);
  }

  const std::string& source_;
};

}  // namespace

void validate_template(const Body& body, const std::string& normalized_source) {
  Validator(normalized_source).body(body, false);
}

}  // namespace megactx::jinja
