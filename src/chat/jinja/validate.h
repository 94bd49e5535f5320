// Load-time checks of a parsed template, as jinja2's compiler makes them:
// a filter or test that does not exist is an error naming its line and column,
// except inside if-statements and conditional expressions, where jinja2 defers
// the error to the moment the filter is used (so templates can probe with
// `is filter`).
#pragma once

#include <string>

#include "chat/jinja/ast.h"

namespace megactx::jinja {

void validate_template(const Body& body, const std::string& normalized_source);

}  // namespace megactx::jinja
