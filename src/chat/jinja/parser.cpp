#include "chat/jinja/parser.h"

#include <cerrno>
#include <cstdlib>
#include <set>

#include "chat/jinja/lexer.h"
#include "core/error.h"

namespace megactx::jinja {

namespace {

// Deep nesting is legal Jinja but would overflow the C++ stack; chat
// templates nest a handful of levels.
constexpr int kMaxDepth = 128;

class Parser {
 public:
  Parser(const std::string& source, std::vector<Token> tokens)
      : src_(source), tokens_(std::move(tokens)) {}

  Body parse() {
    Body body = subparse({});
    if (current().type != TokenType::End) error("unexpected token");
    return body;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxDepth) parser.error("template nested too deeply");
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  const Token& current() const { return tokens_[pos_]; }
  const Token& look(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }

  [[noreturn]] void error(const std::string& message) const {
    fail_at(src_, current().offset, message);
  }
  [[noreturn]] void error_at(size_t offset, const std::string& message) const {
    fail_at(src_, offset, message);
  }

  std::string describe(const Token& token) const {
    switch (token.type) {
      case TokenType::Data:
        return "template data";
      case TokenType::VariableBegin:
        return "begin of print statement";
      case TokenType::VariableEnd:
        return "end of print statement";
      case TokenType::BlockBegin:
        return "begin of statement block";
      case TokenType::BlockEnd:
        return "end of statement block";
      case TokenType::Name:
        return "'" + token.value + "'";
      case TokenType::String:
        return "string";
      case TokenType::Integer:
        return "integer";
      case TokenType::Float:
        return "float";
      case TokenType::Operator:
        return "'" + token.value + "'";
      case TokenType::End:
        return "end of template";
    }
    return "token";
  }

  bool is_op(const char* op) const {
    return current().type == TokenType::Operator && current().value == op;
  }
  bool is_name(const char* name) const {
    return current().type == TokenType::Name && current().value == name;
  }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(std::string("expected '") + op + "', got " + describe(current()));
  }
  std::string expect_name() {
    if (current().type != TokenType::Name) error("expected name, got " + describe(current()));
    std::string name = current().value;
    advance();
    return name;
  }
  void expect_block_end() {
    if (current().type != TokenType::BlockEnd)
      error("expected end of statement block, got " + describe(current()));
    advance();
  }

  ExprPtr make(Expr::Kind kind, size_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }

  // ---- statements ---------------------------------------------------------

  // Parses until a block whose first name is in `end_tokens`; leaves the
  // stream at that name (after {%).
  Body subparse(const std::set<std::string>& end_tokens) {
    DepthGuard guard(*this);
    Body body;
    while (current().type != TokenType::End) {
      const Token& token = current();
      if (token.type == TokenType::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Data;
        s->offset = token.offset;
        s->text = token.value;
        body.push_back(std::move(s));
        advance();
      } else if (token.type == TokenType::VariableBegin) {
        advance();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Print;
        s->offset = current().offset;
        s->expr = parse_tuple(true, false, {});
        if (current().type != TokenType::VariableEnd)
          error("expected end of print statement, got " + describe(current()));
        advance();
        body.push_back(std::move(s));
      } else if (token.type == TokenType::BlockBegin) {
        advance();
        if (current().type == TokenType::Name && end_tokens.count(current().value)) return body;
        body.push_back(parse_statement(end_tokens));
        expect_block_end();
      } else {
        error("unexpected " + describe(token));
      }
    }
    if (!end_tokens.empty()) {
      std::string expected;
      for (const auto& name : end_tokens)
        expected += (expected.empty() ? "'" : " or '") + name + "'";
      error("unexpected end of template, expected " + expected);
    }
    return body;
  }

  // Body of a statement: `%}` then statements up to one of `end_tokens`.
  Body parse_body(const std::set<std::string>& end_tokens) {
    expect_block_end();
    return subparse(end_tokens);
  }

  StmtPtr parse_statement(const std::set<std::string>& outer_end) {
    const Token& token = current();
    if (token.type != TokenType::Name) error("tag name expected");
    const std::string& name = token.value;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "call") return parse_call_block();
    if (name == "filter") return parse_filter_block();
    if (name == "with") return parse_with();
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) error("'" + name + "' outside of a loop");
      auto s = std::make_unique<Stmt>();
      s->kind = name == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      s->offset = token.offset;
      advance();
      return s;
    }
    static const std::set<std::string> kUnsupported = {
        "extends", "include", "import", "from", "block", "autoescape", "do", "print", "trans"};
    if (kUnsupported.count(name)) error("unsupported tag '" + name + "'");
    if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      std::string message = "Encountered unknown tag '" + name + "'.";
      if (!outer_end.empty()) {
        std::string expected;
        for (const auto& n : outer_end) expected += (expected.empty() ? "'" : " or '") + n + "'";
        message += " Jinja was looking for the following tags: " + expected + ".";
      }
      error(message);
    }
    error("Encountered unknown tag '" + name + "'.");
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::If;
    s->offset = current().offset;
    advance();
    while (true) {
      s->conditions.push_back(parse_tuple(false, false, {}));
      s->bodies.push_back(parse_body({"elif", "else", "endif"}));
      std::string which = current().value;
      advance();
      if (which == "elif") continue;
      if (which == "else") {
        s->else_body = parse_body({"endif"});
        advance();
      }
      break;
    }
    return s;
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::For;
    s->offset = current().offset;
    advance();
    s->target = parse_assign_target(false, "in");
    if (!skip_name("in")) error("expected 'in', got " + describe(current()));
    s->expr = parse_tuple(false, false, {"recursive"});
    if (skip_name("if")) s->filter = parse_expression(true);
    s->recursive = skip_name("recursive");
    ++loop_depth_;
    s->body = parse_body({"endfor", "else"});
    --loop_depth_;
    std::string which = current().value;
    advance();
    if (which == "else") {
      s->else_body = parse_body({"endfor"});
      advance();
    }
    return s;
  }

  StmtPtr parse_set() {
    auto s = std::make_unique<Stmt>();
    s->offset = current().offset;
    advance();
    s->target = parse_assign_target(true, "");
    if (skip_op("=")) {
      s->kind = Stmt::Kind::Set;
      s->expr = parse_tuple(true, false, {});
      return s;
    }
    s->kind = Stmt::Kind::SetBlock;
    if (is_op("|")) s->filter = parse_filter(nullptr, false);
    s->body = parse_body({"endset"});
    advance();
    return s;
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::Macro;
    s->offset = current().offset;
    advance();
    s->text = expect_name();
    parse_signature(s->signature);
    macro_stack_.push_back(&s->signature);
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved_loops;
    macro_stack_.pop_back();
    advance();
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::CallBlock;
    s->offset = current().offset;
    advance();
    if (is_op("(")) parse_signature(s->signature);
    s->expr = parse_expression(true);
    if (s->expr->kind != Expr::Kind::Call) error_at(s->offset, "expected call");
    macro_stack_.push_back(&s->signature);
    s->body = parse_body({"endcall"});
    macro_stack_.pop_back();
    advance();
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::FilterBlock;
    s->offset = current().offset;
    advance();
    s->filter = parse_filter(nullptr, true);
    s->body = parse_body({"endfilter"});
    advance();
    return s;
  }

  StmtPtr parse_with() {
    auto s = std::make_unique<Stmt>();
    s->kind = Stmt::Kind::With;
    s->offset = current().offset;
    advance();
    while (current().type != TokenType::BlockEnd) {
      if (!s->with_targets.empty()) expect_op(",");
      s->with_targets.push_back(parse_assign_target(false, ""));
      expect_op("=");
      s->with_values.push_back(parse_expression(true));
    }
    s->body = parse_body({"endwith"});
    advance();
    return s;
  }

  void parse_signature(Signature& signature) {
    expect_op("(");
    while (!is_op(")")) {
      if (!signature.names.empty()) expect_op(",");
      signature.names.push_back(expect_name());
      if (skip_op("=")) {
        signature.defaults.push_back(parse_expression(true));
      } else if (!signature.defaults.empty()) {
        error("non-default argument follows default argument");
      }
    }
    expect_op(")");
  }

  // Name, ns.attr (with_namespace), or a tuple of names "a, b".
  ExprPtr parse_assign_target(bool with_namespace, const char* end_name) {
    size_t offset = current().offset;
    if (with_namespace && current().type == TokenType::Name && look().type == TokenType::Operator &&
        look().value == ".") {
      auto ns = make(Expr::Kind::GetAttr, offset);
      auto base = make(Expr::Kind::Name, offset);
      base->name = expect_name();
      advance();  // dot
      ns->name = expect_name();
      ns->items.push_back(std::move(base));
      return ns;
    }
    std::vector<ExprPtr> names;
    bool tuple = false;
    while (true) {
      if (!names.empty()) expect_op(",");
      if (is_op("(")) error("unsupported nested assignment target");
      if (current().type != TokenType::Name || (*end_name && is_name(end_name))) {
        if (names.empty()) error("expected name, got " + describe(current()));
        break;
      }
      auto n = make(Expr::Kind::Name, current().offset);
      n->name = expect_name();
      if (n->name == "true" || n->name == "false" || n->name == "none" || n->name == "True" ||
          n->name == "False" || n->name == "None")
        error_at(n->offset, "can't assign to 'const'");
      names.push_back(std::move(n));
      if (!is_op(",")) break;
      tuple = true;
    }
    if (!tuple) return std::move(names[0]);
    auto t = make(Expr::Kind::Tuple, offset);
    t->items = std::move(names);
    return t;
  }

  // ---- expressions --------------------------------------------------------

  bool is_tuple_end(const std::set<std::string>& extra_end) const {
    const Token& t = current();
    if (t.type == TokenType::VariableEnd || t.type == TokenType::BlockEnd ||
        t.type == TokenType::End)
      return true;
    if (t.type == TokenType::Operator && t.value == ")") return true;
    return t.type == TokenType::Name && extra_end.count(t.value);
  }

  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parentheses,
                      const std::set<std::string>& extra_end) {
    size_t offset = current().offset;
    std::vector<ExprPtr> items;
    bool tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(",")) {
        tuple = true;
      } else {
        break;
      }
    }
    if (!tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) error("Expected an expression, got " + describe(current()));
    }
    auto t = make(Expr::Kind::Tuple, offset);
    t->items = std::move(items);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    size_t offset = current().offset;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      auto cond = make(Expr::Kind::Condition, offset);
      cond->items.push_back(parse_or());
      cond->items.push_back(std::move(expr1));
      cond->items.push_back(skip_name("else") ? parse_condexpr() : nullptr);
      expr1 = std::move(cond);
    }
    return expr1;
  }

  ExprPtr binary(Expr::Kind kind, size_t offset, ExprPtr left, ExprPtr right, std::string op = {}) {
    auto e = make(kind, offset);
    e->name = std::move(op);
    e->items.push_back(std::move(left));
    e->items.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    size_t offset = current().offset;
    ExprPtr left = parse_and();
    while (skip_name("or")) left = binary(Expr::Kind::Or, offset, std::move(left), parse_and());
    return left;
  }

  ExprPtr parse_and() {
    size_t offset = current().offset;
    ExprPtr left = parse_not();
    while (skip_name("and")) left = binary(Expr::Kind::And, offset, std::move(left), parse_not());
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto e = make(Expr::Kind::Not, current().offset);
      advance();
      e->items.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    size_t offset = current().offset;
    ExprPtr expr = parse_math1();
    ExprPtr compare;
    while (true) {
      std::string op;
      const Token& t = current();
      if (t.type == TokenType::Operator && (t.value == "==" || t.value == "!=" || t.value == "<" ||
                                            t.value == "<=" || t.value == ">" || t.value == ">=")) {
        op = t.value;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && look().type == TokenType::Name && look().value == "in") {
        op = "notin";
        advance();
        advance();
      } else {
        break;
      }
      if (!compare) {
        compare = make(Expr::Kind::Compare, offset);
        compare->items.push_back(std::move(expr));
      }
      compare->ops.push_back(op);
      compare->items.push_back(parse_math1());
    }
    return compare ? std::move(compare) : std::move(expr);
  }

  ExprPtr parse_math1() {
    size_t offset = current().offset;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = current().value;
      advance();
      left = binary(Expr::Kind::Binary, offset, std::move(left), parse_concat(), op);
    }
    return left;
  }

  ExprPtr parse_concat() {
    size_t offset = current().offset;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make(Expr::Kind::Concat, offset);
    e->items.push_back(std::move(first));
    while (skip_op("~")) e->items.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    size_t offset = current().offset;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = current().value;
      advance();
      left = binary(Expr::Kind::Binary, offset, std::move(left), parse_pow(), op);
    }
    return left;
  }

  ExprPtr parse_pow() {
    size_t offset = current().offset;
    ExprPtr left = parse_unary(true);
    while (skip_op("**"))
      left = binary(Expr::Kind::Binary, offset, std::move(left), parse_unary(true), "**");
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    size_t offset = current().offset;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make(is_op("-") ? Expr::Kind::Negate : Expr::Kind::Plus, offset);
      advance();
      node->items.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& token = current();
    size_t offset = token.offset;
    switch (token.type) {
      case TokenType::Name: {
        auto e = make(Expr::Kind::Literal, offset);
        const std::string& v = token.value;
        if (v == "true" || v == "True") {
          e->literal = Value::boolean(true);
        } else if (v == "false" || v == "False") {
          e->literal = Value::boolean(false);
        } else if (v == "none" || v == "None") {
          e->literal = Value::none();
        } else {
          e->kind = Expr::Kind::Name;
          e->name = v;
          note_name(v);
        }
        advance();
        return e;
      }
      case TokenType::String: {
        auto e = make(Expr::Kind::Literal, offset);
        std::string text;
        while (current().type == TokenType::String) {
          text += current().value;
          advance();
        }
        e->literal = Value::string(std::move(text));
        return e;
      }
      case TokenType::Integer:
      case TokenType::Float: {
        auto e = make(Expr::Kind::Literal, offset);
        e->literal = number_literal(token);
        advance();
        return e;
      }
      case TokenType::Operator:
        if (token.value == "(") {
          advance();
          ExprPtr e = parse_tuple(true, true, {});
          expect_op(")");
          return e;
        }
        if (token.value == "[") return parse_list();
        if (token.value == "{") return parse_dict();
        break;
      default:
        break;
    }
    error("unexpected " + describe(token));
  }

  Value number_literal(const Token& token) {
    const std::string& text = token.value;
    if (token.type == TokenType::Float)
      return Value::from_float(std::strtod(text.c_str(), nullptr));
    int base = 10;
    size_t skip = 0;
    if (text.size() > 1 && text[0] == '0') {
      char b = static_cast<char>(text[1] | 0x20);
      if (b == 'x') base = 16, skip = 2;
      if (b == 'o') base = 8, skip = 2;
      if (b == 'b') base = 2, skip = 2;
    }
    errno = 0;
    long long v = std::strtoll(text.c_str() + skip, nullptr, base);
    if (errno == ERANGE) error("integer literal too large");
    return Value::from_int(v);
  }

  void note_name(const std::string& name) {
    if (macro_stack_.empty()) return;
    Signature* s = macro_stack_.back();
    if (name == "varargs") s->uses_varargs = true;
    if (name == "kwargs") s->uses_kwargs = true;
    if (name == "caller") s->uses_caller = true;
  }

  ExprPtr parse_list() {
    auto e = make(Expr::Kind::List, current().offset);
    expect_op("[");
    while (!is_op("]")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("]")) break;
      e->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    auto e = make(Expr::Kind::Dict, current().offset);
    expect_op("{");
    while (!is_op("}")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("}")) break;
      e->items.push_back(parse_expression(true));
      expect_op(":");
      e->items.push_back(parse_expression(true));
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    DepthGuard guard(*this);
    const Token& token = current();
    // Errors of obj.attr / obj[key] point at the start of the whole expression.
    size_t offset = node->offset;
    if (token.value == ".") {
      advance();
      const Token& attr = current();
      if (attr.type == TokenType::Name) {
        auto e = make(Expr::Kind::GetAttr, offset);
        e->name = attr.value;
        e->items.push_back(std::move(node));
        advance();
        return e;
      }
      if (attr.type != TokenType::Integer) error("expected name or number");
      auto e = make(Expr::Kind::GetItem, offset);
      e->items.push_back(std::move(node));
      auto index = make(Expr::Kind::Literal, attr.offset);
      index->literal = number_literal(attr);
      e->items.push_back(std::move(index));
      advance();
      return e;
    }
    advance();  // [
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make(Expr::Kind::GetItem, offset);
    e->items.push_back(std::move(node));
    if (args.size() == 1) {
      e->items.push_back(std::move(args[0]));
    } else {
      auto t = make(Expr::Kind::Tuple, offset);
      t->items = std::move(args);
      e->items.push_back(std::move(t));
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    size_t offset = current().offset;
    auto slice = make(Expr::Kind::Slice, offset);
    if (is_op(":")) {
      advance();
      slice->items.push_back(nullptr);
    } else {
      ExprPtr node = parse_expression(true);
      if (!is_op(":")) return node;
      advance();
      slice->items.push_back(std::move(node));
    }
    if (is_op(":") || is_op("]") || is_op(",")) {
      slice->items.push_back(nullptr);
    } else {
      slice->items.push_back(parse_expression(true));
    }
    if (skip_op(":") && !is_op("]") && !is_op(",")) {
      slice->items.push_back(parse_expression(true));
    } else {
      slice->items.push_back(nullptr);
    }
    return slice;
  }

  void parse_call_args(ArgList& args) {
    size_t offset = current().offset;
    expect_op("(");
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      auto ensure = [&](bool ok) {
        if (!ok) error_at(offset, "invalid syntax for function call expression");
      };
      if (is_op("*")) {
        ensure(!args.star_args && !args.star_kwargs);
        advance();
        args.star_args = parse_expression(true);
      } else if (is_op("**")) {
        ensure(!args.star_kwargs);
        advance();
        args.star_kwargs = parse_expression(true);
      } else if (current().type == TokenType::Name && look().type == TokenType::Operator &&
                 look().value == "=") {
        ensure(!args.star_kwargs);
        std::string key = current().value;
        advance();
        advance();
        args.keywords.emplace_back(key, parse_expression(true));
      } else {
        ensure(!args.star_args && !args.star_kwargs && args.keywords.empty());
        args.positional.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    DepthGuard guard(*this);
    // Errors of a call point at the start of the callee expression.
    auto e = make(Expr::Kind::Call, node->offset);
    e->items.push_back(std::move(node));
    parse_call_args(e->args);
    return e;
  }

  // `| name(args) | ...`; with start_inline the first pipe is implicit
  // ({% filter upper %}). `node` may be null for block filters.
  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      DepthGuard guard(*this);
      if (!start_inline) advance();
      auto e = make(Expr::Kind::Filter, current().offset);
      e->name = expect_name();
      while (skip_op(".")) e->name.append(".").append(expect_name());
      if (is_op("(")) parse_call_args(e->args);
      if (node) e->items.push_back(std::move(node));
      node = std::move(e);
      start_inline = false;
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    DepthGuard guard(*this);
    size_t offset = current().offset;
    advance();  // is
    bool negated = skip_name("not");
    auto e = make(Expr::Kind::Test, offset);
    e->name = expect_name();
    while (skip_op(".")) e->name += "." + expect_name();
    e->items.push_back(std::move(node));
    const Token& t = current();
    if (is_op("(")) {
      parse_call_args(e->args);
    } else if ((t.type == TokenType::Name || t.type == TokenType::String ||
                t.type == TokenType::Integer || t.type == TokenType::Float ||
                (t.type == TokenType::Operator && (t.value == "[" || t.value == "{"))) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) error("You cannot chain multiple tests with is");
      e->args.positional.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n = make(Expr::Kind::Not, offset);
    n->items.push_back(std::move(e));
    return n;
  }

  const std::string& src_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<Signature*> macro_stack_;
};

}  // namespace

Body parse_template(const std::string& normalized_source) {
  return Parser(normalized_source, tokenize(normalized_source)).parse();
}

}  // namespace megactx::jinja
