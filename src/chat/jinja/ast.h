// Syntax tree of a parsed Jinja template. Expressions and statements keep the
// byte offset of their first token so runtime errors can name line and column.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/jinja/value.h"

namespace megactx::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// Arguments of a call, filter or test: f(a, b, key=c, *args, **kwargs).
struct ArgList {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  ExprPtr star_args;    // *expr
  ExprPtr star_kwargs;  // **expr
};

struct Expr {
  enum class Kind {
    Literal,    // literal
    Name,       // name
    List,       // items
    Tuple,      // items
    Dict,       // items: key0, value0, key1, value1, ...
    GetAttr,    // items[0].name
    GetItem,    // items[0][items[1]]
    Slice,      // items[0..2] = start, stop, step (null when omitted)
    Call,       // items[0](args)
    Filter,     // items[0] | name(args); items empty for filter blocks
    Test,       // items[0] is name(args)
    Not,        // not items[0]
    Negate,     // -items[0]
    Plus,       // +items[0]
    Binary,     // items[0] <name> items[1]: + - * / // % **
    Compare,    // items[0] ops[0] items[1] ops[1] items[2] ...
    And,        // items[0] and items[1]
    Or,         // items[0] or items[1]
    Condition,  // items[1] if items[0] else items[2] (items[2] may be null)
    Concat,     // items joined with ~
  };

  Kind kind;
  size_t offset = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> items;
  std::vector<std::string> ops;  // Compare: == != < <= > >= in notin
  ArgList args;
};

// A macro or call-block signature: names with optional defaults.
struct Signature {
  std::vector<std::string> names;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() names
  bool uses_varargs = false;      // body refers to varargs
  bool uses_kwargs = false;       // body refers to kwargs
  bool uses_caller = false;       // body refers to caller
};

struct Stmt {
  enum class Kind {
    Data,         // text
    Print,        // {{ expr }}
    If,           // branches: (conditions[i], bodies[i]); else_body
    For,          // target in expr [if filter] [recursive]: body [else else_body]
    Set,          // target = expr
    SetBlock,     // {% set target %}body{% endset %} with optional filter
    Macro,        // {% macro name(signature) %}body
    CallBlock,    // {% call(signature) expr %}body
    FilterBlock,  // {% filter f %}body
    With,         // {% with a = x, ... %}body
    Break,
    Continue,
  };

  Kind kind;
  size_t offset = 0;
  std::string text;                 // Data text; Macro name
  ExprPtr target;                   // Set/SetBlock/For target (Name, Tuple or namespace GetAttr)
  ExprPtr expr;                     // Print, Set value, For iterable, CallBlock call
  ExprPtr filter;                   // For condition, SetBlock/FilterBlock filter chain
  std::vector<ExprPtr> conditions;  // If
  std::vector<Body> bodies;         // If bodies
  Body body;
  Body else_body;
  bool recursive = false;
  Signature signature;                // Macro, CallBlock
  std::vector<ExprPtr> with_targets;  // With
  std::vector<ExprPtr> with_values;
};

}  // namespace megactx::jinja
