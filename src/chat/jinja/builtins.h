// The filters, tests and global functions available to templates: jinja2's
// defaults plus what HF adds (tojson with json.dumps semantics,
// raise_exception, strftime_now).
#pragma once

#include <string>

#include "chat/jinja/interpreter.h"

namespace megactx::jinja {

bool has_filter(const std::string& name);
Value call_filter(Interpreter& interpreter, const std::string& name, const Value& input,
                  const CallArgs& args);

bool has_test(const std::string& name);
bool call_test(Interpreter& interpreter, const std::string& name, const Value& input,
               const CallArgs& args);

// range, namespace, dict, cycler, joiner, raise_exception, strftime_now.
void add_global_functions(Dict& globals);

}  // namespace megactx::jinja
