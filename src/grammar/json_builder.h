// Building blocks of JSON grammars: whitespace and separators, the shared
// rules for any string / number / value (shared rules share their token
// classes too), strings whose decoded text is constrained (canonical
// escapes), objects and arrays as graphs (optional properties, any order,
// counted items without quadratic expansion).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar_ir.h"
#include "grammar/json_schema.h"

namespace megactx::grammar {

class JsonBuilder {
 public:
  JsonBuilder(Grammar& grammar, const JsonSchemaOptions& options);

  Grammar& grammar() { return g_; }

  ExprId ws();
  ExprId item_separator();
  ExprId key_separator();

  ExprId any_string();   // rule: "..." with any escapes
  ExprId any_number();   // rule: JSON number
  ExprId any_integer();  // rule: -?(0|[1-9][0-9]*)
  ExprId any_value();    // rule: any JSON value
  ExprId any_object();   // rule: any JSON object
  ExprId any_array();    // rule: any JSON array
  ExprId boolean();
  ExprId null();

  // One character of string content in any JSON spelling (any escape).
  ExprId string_char();
  // One character out of `ranges` as a JSON serializer writes it: UTF-8, or
  // \" \\ \b \f \n \r \t \u00xx for quote, backslash and controls.
  ExprId canonical_chars(const std::vector<CodeRange>& ranges);
  // "text" with canonical escapes (text is UTF-8).
  ExprId string_literal(std::string_view text);
  // A quoted string (canonical escapes) whose text is none of `keys`.
  ExprId string_not_in(const std::vector<std::string>& keys);

  struct Member {
    ExprId key;  // the quoted key
    ExprId value;
    bool required;
  };
  // { members..., then extra members (extra_key: quoted key expr, -1: none) }.
  ExprId object(const std::vector<Member>& members, ExprId extra_key, ExprId extra_value,
                bool any_order);
  // [ prefix[0], prefix[1], ..., then rest items (-1: none) ], counted.
  ExprId array(const std::vector<ExprId>& prefix, ExprId rest, int64_t min_items,
               int64_t max_items);

 private:
  int32_t rule(const std::string& name, int32_t& slot);
  // open ws (items ws)? close, where `items` is never empty: one gap of
  // whitespace inside an empty container, not two (max_whitespace per gap).
  ExprId bracketed(char open, ExprId items, bool may_be_empty, char close);

  Grammar& g_;
  const JsonSchemaOptions& options_;
  ExprId ws_ = -1;
  ExprId string_char_ = -1;
  int32_t string_rule_ = -1, number_rule_ = -1, integer_rule_ = -1, value_rule_ = -1,
          object_rule_ = -1, array_rule_ = -1;
};

}  // namespace megactx::grammar
