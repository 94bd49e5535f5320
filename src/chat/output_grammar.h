// The grammar of what a chat model may write back when a request constrains
// it (response_format, tool_choice "required" / named, strict tools), in the
// model's own output format, so that the OutputParser reads every output it
// allows as the content or the tool calls asked for:
//
//   output    ::= reasoning body
//   reasoning ::= ws (<think> TEXT </think> ws)?   the prompt left no think block
//               | TEXT </think> ws                  the prompt opened one
//               | ws                                the prompt closed one
//   body      ::= JSON                              response_format, no tools
//               | JSON | calls                      response_format, tools (auto)
//               | TEXT' calls?                      strict tools (auto)
//               | calls                             tool_choice required / named
//
// TEXT never contains "</think>", TEXT' never the start of a tool-call block.
// calls are the model's markup, one or more (parallel_tool_calls) calls of
// the allowed tools with every argument valid under the tool's parameters
// schema:
//
//   GLM:  <tool_call>NAME(\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>)*\n</tool_call>
//         (one block per call, "\n" between blocks)
//   DSML: <｜DSML｜function_calls>(\n<｜DSML｜invoke name="NAME">(\n<｜DSML｜parameter
//         name="K" string="true|false">V</｜DSML｜parameter>)*\n</｜DSML｜invoke>)+
//         \n</｜DSML｜function_calls>   (one block, one invoke per call)
//
// Properties come in the schema's order, required ones always, optional ones
// or not. A value is written as tool_call_parser_common.h's value_form says:
// raw text for string parameters (its pattern, format, length and enum as a
// language of raw text, never containing the closing marker), JSON under the
// parameter's schema otherwise (DSML writes every non-string value as
// string="false" JSON). Markers the vocabulary has as special tokens are
// those tokens.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "chat/output_parser.h"
#include "grammar/grammar_ir.h"
#include "grammar/json_schema.h"
#include "grammar/vocabulary.h"

namespace megactx {

// Where the prompt left the model with respect to a think block.
enum class ReasoningStart { None, Open, Closed };

struct ChatOutputConstraint {
  ToolCallFormat format = ToolCallFormat::Glm;
  ReasoningStart reasoning = ReasoningStart::None;
  // The content: free text (only with tools), none (tool calls only), any
  // JSON object, or JSON under `schema`.
  enum class Content { Free, None, JsonObject, JsonSchema };
  Content content = Content::Free;
  nlohmann::ordered_json schema;  // Content::JsonSchema
  grammar::JsonSchemaOptions json_options;
  // The callable tools, OpenAI's [{"type": "function", "function": {"name",
  // "parameters", "strict"}}] (strict: additionalProperties false unless the
  // schema says otherwise); empty: no tool calls.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  bool calls_required = false;  // the body is tool calls only, at least one
  bool parallel_calls = true;   // more than one call allowed

  // Every field as text, for the grammar cache.
  std::string cache_key() const;
};

// Lowers `constraint` into `grammar` and sets its root. Throws megactx::Error
// naming the tool and parameter when a schema cannot be written in the
// format (or is not a valid schema).
void lower_chat_output(grammar::Grammar& grammar, const grammar::Vocabulary& vocabulary,
                       const ChatOutputConstraint& constraint);

// Where `prompt` (a rendered chat prompt) leaves the model.
ReasoningStart reasoning_start(const std::string& prompt);

}  // namespace megactx
