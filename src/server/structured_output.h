// Structured output requests, compiled at admission into the grammar the
// engine masks every step with (SamplingParams::grammar), over the engine's
// vocabulary (EngineApi::grammar_compiler). Anything that does not compile is
// a 400 naming the parameter and the problem.
//
//  * /generate (SGLang): sampling_params.json_schema (a JSON Schema as text),
//    .regex, .ebnf (GBNF, root rule "root"); at most one; the whole output.
//  * /v1/completions (OpenAI, SGLang): response_format json_object /
//    json_schema, or json_schema / regex / ebnf as /generate takes them.
//  * /v1/chat/completions (OpenAI): response_format {"type": "json_object"} or
//    {"type": "json_schema", "json_schema": {"schema", "strict", "name"}};
//    tool_choice "required" or {"type": "function", "function": {"name"}}
//    (calls of the allowed tools only, in the model's markup, arguments valid
//    under their parameters schema; parallel_tool_calls false: one call);
//    with tool_choice "auto", tools marked "strict": true constrain the
//    calls the model makes (content stays free). The chat grammar
//    (chat/output_grammar.h) lets the model reason first when its template
//    leaves a think block to it.
// JSON in chat never holds a raw '<' (the escape \u003c instead), so it
// cannot look like tool-call markup to the output parser; whitespace between
// JSON tokens is at most kJsonMaxWhitespace characters per gap, so a model
// cannot spend its tokens on spaces.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "chat/output_parser.h"
#include "engine/engine_api.h"
#include "grammar/compiled_grammar.h"

namespace megactx::server {

inline constexpr int32_t kJsonMaxWhitespace = 8;

// /generate: the grammar of one item's sampling_params, or null when it asks
// for none. Throws ApiError 400 (also for structural_tag, which is not supported).
std::shared_ptr<const grammar::CompiledGrammar> sglang_grammar(
    EngineApi& engine, const nlohmann::json& sampling_params);

// /v1/completions: response_format json_object / json_schema (strict as the
// request says) or SGLang's json_schema / regex / ebnf fields, over the whole
// completion text; null when nothing constrains it. Throws ApiError 400.
std::shared_ptr<const grammar::CompiledGrammar> completion_grammar(
    EngineApi& engine, const nlohmann::ordered_json& body);

// 400 for the structured-output fields of other servers that are not
// served here (vLLM's guided_*; in chat, SGLang's top-level regex / ebnf /
// json_schema), so that no constraint is silently ignored.
void refuse_unsupported_constraints(const nlohmann::json& body, bool chat);

// /v1/chat/completions: the grammar of the request `body` (parsed with its
// keys in order, so schemas keep their property order) for the rendered
// `prompt`, where `tools` are the tools tool_choice left (chat_prompt.h);
// null when nothing constrains the output. Throws ApiError 400.
std::shared_ptr<const grammar::CompiledGrammar> chat_grammar(EngineApi& engine,
                                                             const nlohmann::ordered_json& body,
                                                             const std::string& prompt,
                                                             const nlohmann::json& tools,
                                                             ToolCallFormat format);

}  // namespace megactx::server
