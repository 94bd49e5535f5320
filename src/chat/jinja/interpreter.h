// Tree-walking evaluator for parsed templates. Scoping follows jinja2: each
// for-loop iteration, macro call and with-block gets a fresh scope over its
// parent; if-blocks and set-blocks write into the current scope; macros see the
// scope they were defined in.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/value.h"

namespace megactx::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* lookup(const std::string& name) const;
};
using ScopePtr = std::shared_ptr<Scope>;

// Thrown by raise_exception(): carries the template's own message unchanged.
struct TemplateRaised {
  std::string message;
};

class Interpreter {
 public:
  // `source` is the normalized template text (for line/column in errors).
  // `max_steps` bounds loop iterations + calls + filters of one render.
  explicit Interpreter(const std::string& source, size_t max_steps = kDefaultMaxSteps);
  static constexpr size_t kDefaultMaxSteps = 10'000'000;

  std::string render(const Body& body, const Dict& globals);

  // Used by objects (macros, loop, filters that call tests/filters).
  Value eval(const Expr& expr, const ScopePtr& scope);
  void exec(const Body& body, const ScopePtr& scope, std::string& out);
  Value apply_filter(const std::string& name, const Value& input, const CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, const CallArgs& args);
  Value call(const Value& callee, const CallArgs& args);

  // Objects that can form reference cycles (a macro stored in the scope it
  // closes over, a namespace holding itself); render() breaks the cycles.
  void track(const ScopePtr& scope) { cycle_scopes_.push_back(scope); }
  void track(const std::shared_ptr<Object>& object) { cycle_objects_.push_back(object); }

  // Resource guards so that hostile templates (fuzzing) stay bounded.
  void count_step();
  void enter_call();
  void leave_call() { --call_depth_; }
  static constexpr size_t kMaxStringBytes = size_t{64} << 20;

 private:
  enum class Flow { Normal, Break, Continue };

  Flow exec_block(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec_stmt(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  void exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  void run_loop(const Stmt& stmt, const ScopePtr& scope, const Value& iterable, int depth,
                std::string& out);
  void assign(const Expr& target, const Value& value, const ScopePtr& scope);
  CallArgs eval_args(const ArgList& args, const ScopePtr& scope);
  Value eval_compare(const Expr& expr, const ScopePtr& scope);
  Value eval_filter(const Expr& expr, const ScopePtr& scope, const Value* input);
  [[noreturn]] void fail_at_offset(size_t offset, const std::string& message) const;

  const std::string& source_;
  std::vector<ScopePtr> cycle_scopes_;
  std::vector<std::shared_ptr<Object>> cycle_objects_;
  static constexpr int kMaxEvalDepth = 1000;
  int eval_depth_ = 0;
  size_t max_steps_;
  size_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace megactx::jinja
