// Parser for Jinja templates, following jinja2's grammar and operator
// precedence (condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < ** <
// unary < postfix/filters/tests). Unsupported statements (extends, include,
// import, block, ...) are rejected with their line and column.
#pragma once

#include <string>

#include "chat/jinja/ast.h"

namespace megactx::jinja {

// `normalized_source` comes from normalize_template_source(); errors are
// megactx::Error "line L, column C: ...".
Body parse_template(const std::string& normalized_source);

}  // namespace megactx::jinja
