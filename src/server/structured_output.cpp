#include "server/structured_output.h"

#include "chat/output_grammar.h"
#include "grammar/grammar_compiler.h"
#include "io/bounded_json.h"
#include "server/api_error.h"
#include "server/request_fields.h"

namespace megactx::server {

namespace {

using Json = nlohmann::ordered_json;

grammar::GrammarCompiler& compiler_of(EngineApi& engine, const std::string& param) {
  grammar::GrammarCompiler* compiler = engine.grammar_compiler();
  if (compiler == nullptr)
    throw_invalid(param, "structured output ('" + param + "') is not supported by this engine");
  return *compiler;
}

// Runs `compile`, turning a grammar error into a 400 naming `param`.
template <typename Compile>
std::shared_ptr<const grammar::CompiledGrammar> compiled(const std::string& param,
                                                         Compile compile) {
  try {
    return compile();
  } catch (const ApiError&) {
    throw;
  } catch (const Error& error) {
    throw_invalid(param, "'" + param + "': " + error.what());
  }
}

grammar::JsonSchemaOptions json_options(bool strict, bool chat) {
  grammar::JsonSchemaOptions options;
  options.strict = strict;
  options.max_whitespace = kJsonMaxWhitespace;
  options.escape_less_than = chat;
  return options;
}

const Json* ordered_field(const Json& object, const char* name) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// OpenAI's response_format of `body`: what the content must be.
struct ResponseFormat {
  ChatOutputConstraint::Content content = ChatOutputConstraint::Content::Free;  // Free: text
  Json schema;  // Content::JsonSchema
  bool strict = false;
};

ResponseFormat parse_response_format(const Json& body) {
  ResponseFormat out;
  const std::string format_param = "response_format";
  const Json* response_format = ordered_field(body, "response_format");
  if (response_format == nullptr) return out;
  if (!response_format->is_object() || !(*response_format).contains("type") ||
      !(*response_format)["type"].is_string())
    throw_invalid(format_param, "'response_format' must be an object with a string 'type'");
  const std::string type = (*response_format)["type"].get<std::string>();
  if (type == "json_object") {
    out.content = ChatOutputConstraint::Content::JsonObject;
  } else if (type == "json_schema") {
    const Json* spec = ordered_field(*response_format, "json_schema");
    if (spec == nullptr || !spec->is_object())
      throw_invalid(format_param, "response_format 'json_schema' needs a 'json_schema' object");
    for (const auto& [key, value] : spec->items())
      if (key != "name" && key != "schema" && key != "strict" && key != "description")
        throw_invalid(format_param, "unknown field 'json_schema." + key + "' in response_format");
    const Json* schema = ordered_field(*spec, "schema");
    if (schema == nullptr || !(schema->is_object() || schema->is_boolean()))
      throw_invalid(format_param, "response_format.json_schema.schema must be a JSON Schema");
    if (const Json* name = ordered_field(*spec, "name"); name != nullptr && !name->is_string())
      throw_invalid(format_param, "response_format.json_schema.name must be a string");
    if (const Json* value = ordered_field(*spec, "strict")) {
      if (!value->is_boolean())
        throw_invalid(format_param, "response_format.json_schema.strict must be a boolean");
      out.strict = value->get<bool>();
    }
    out.content = ChatOutputConstraint::Content::JsonSchema;
    out.schema = *schema;
  } else if (type != "text") {
    throw_invalid(format_param, "response_format type '" + type +
                                    "' is not supported (text, json_object or json_schema)");
  }
  return out;
}

}  // namespace

void refuse_unsupported_constraints(const nlohmann::json& body, bool chat) {
  // vLLM's guided decoding fields: a client that sends them expects the
  // output constrained, so they are refused, never ignored.
  for (const char* name :
       {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
        "guided_whitespace_pattern", "structured_outputs"}) {
    if (has_field(body, name))
      throw_invalid(name, std::string("'") + name +
                              "' is not supported; constrain the output with 'response_format'" +
                              (chat ? "" : " (or SGLang's 'json_schema', 'regex', 'ebnf')"));
  }
  if (!chat) return;
  // SGLang's extras constrain a chat's whole output text; here the chat
  // grammar constrains the content the output parser returns.
  for (const char* name : {"regex", "ebnf", "json_schema", "structural_tag"}) {
    if (has_field(body, name))
      throw_invalid(name, std::string("'") + name +
                              "' is not supported in chat completions; use 'response_format' "
                              "(or /generate's sampling_params." +
                              name + ")");
  }
}

std::shared_ptr<const grammar::CompiledGrammar> completion_grammar(EngineApi& engine,
                                                                   const Json& body) {
  const ResponseFormat format = parse_response_format(body);
  const nlohmann::json plain = nlohmann::json::parse(body.dump());
  std::shared_ptr<const grammar::CompiledGrammar> sglang = sglang_grammar(engine, plain);
  if (format.content == ChatOutputConstraint::Content::Free) return sglang;
  if (sglang)
    throw_invalid("response_format",
                  "give either 'response_format' or one of 'json_schema', 'regex' and 'ebnf'");
  const std::string param = "response_format";
  grammar::GrammarCompiler& compiler = compiler_of(engine, param);
  if (format.content == ChatOutputConstraint::Content::JsonObject)
    return compiled(param, [&] { return compiler.compile_json_object(json_options(true, false)); });
  return compiled(param, [&] {
    return compiler.compile_json_schema_object(format.schema, json_options(format.strict, false));
  });
}

std::shared_ptr<const grammar::CompiledGrammar> sglang_grammar(
    EngineApi& engine, const nlohmann::json& sampling_params) {
  if (!sampling_params.is_object()) return nullptr;
  if (has_field(sampling_params, "structural_tag"))
    throw_invalid("structural_tag", "structured output by 'structural_tag' is not supported");
  const char* chosen = nullptr;
  for (const char* name : {"json_schema", "regex", "ebnf"}) {
    if (!has_field(sampling_params, name)) continue;
    if (chosen != nullptr)
      throw_invalid(name, std::string("give only one of 'json_schema', 'regex' and 'ebnf' (got '") +
                              chosen + "' and '" + name + "')");
    chosen = name;
  }
  if (chosen == nullptr) return nullptr;
  const std::string param = chosen;
  const nlohmann::json& value = sampling_params[param];
  if (!value.is_string())
    throw_invalid(param, "'" + param + "' must be a string" +
                             (param == "json_schema" ? " (the JSON Schema as JSON text)" : ""));
  const std::string text = value.get<std::string>();
  grammar::GrammarCompiler& compiler = compiler_of(engine, param);
  if (param == "json_schema") {
    const Json schema = try_parse_ordered_json(text);
    if (schema.is_discarded()) throw_invalid(param, "'json_schema' is not valid JSON");
    // xgrammar's default for SGLang: objects without additionalProperties are closed.
    return compiled(param, [&] {
      return compiler.compile_json_schema_object(schema, json_options(true, false));
    });
  }
  if (param == "regex") return compiled(param, [&] { return compiler.compile_regex(text); });
  return compiled(param, [&] { return compiler.compile_ebnf(text); });
}

std::shared_ptr<const grammar::CompiledGrammar> chat_grammar(EngineApi& engine, const Json& body,
                                                             const std::string& prompt,
                                                             const nlohmann::json& tools,
                                                             ToolCallFormat format) {
  ChatOutputConstraint constraint;
  constraint.format = format;
  constraint.reasoning = reasoning_start(prompt);
  constraint.json_options = json_options(false, true);
  bool constrained = false;

  // response_format: the content.
  const std::string format_param = "response_format";
  const ResponseFormat response_format = parse_response_format(body);
  if (response_format.content != ChatOutputConstraint::Content::Free) {
    constraint.content = response_format.content;
    constraint.schema = response_format.schema;
    constraint.json_options.strict = response_format.strict;
    constrained = true;
  }

  // The tools tool_choice left, in the client's key order.
  const Json* listed = ordered_field(body, "tools");
  if (listed != nullptr && listed->is_array()) {
    for (const Json& tool : *listed) {
      const std::string name = tool.contains("function") && tool["function"].is_object()
                                   ? tool["function"].value("name", "")
                                   : "";
      for (const auto& kept : tools)
        if (kept["function"]["name"] == name) constraint.tools.push_back(tool);
    }
  }
  bool any_strict = false;
  for (const Json& tool : constraint.tools) {
    const Json& function = tool["function"];
    if (function.contains("strict") && !function["strict"].is_null()) {
      if (!function["strict"].is_boolean())
        throw_invalid("tools", "a function's 'strict' must be a boolean");
      any_strict = any_strict || function["strict"].get<bool>();
    }
  }
  std::string choice = "auto";
  if (const Json* tool_choice = ordered_field(body, "tool_choice"))
    choice = tool_choice->is_string() ? tool_choice->get<std::string>() : "named";
  if (!constraint.tools.empty()) {
    if (choice == "required" || choice == "named") {
      constraint.calls_required = true;
      constrained = true;
    } else if (any_strict) {
      constrained = true;  // calls of strict tools follow their schemas; content stays free
    }
    if (const Json* parallel = ordered_field(body, "parallel_tool_calls")) {
      if (!parallel->is_boolean())
        throw_invalid("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
      constraint.parallel_calls = parallel->get<bool>();
    }
  }
  if (!constrained) return nullptr;
  const bool about_tools =
      constraint.content == ChatOutputConstraint::Content::Free || constraint.calls_required;
  grammar::GrammarCompiler& compiler = compiler_of(engine, about_tools ? "tools" : format_param);
  try {
    return compiler.compile_built(constraint.cache_key(),
                                  [&](grammar::Grammar& g, const grammar::Vocabulary& vocabulary) {
                                    lower_chat_output(g, vocabulary, constraint);
                                  });
  } catch (const Error& error) {
    // Lowering names a tool ("tool 'f': ...") when a tool's schema is the problem.
    const std::string message = error.what();
    const std::string param = about_tools || message.starts_with("tool '") ? "tools" : format_param;
    throw_invalid(param, "'" + param + "': " + message);
  }
}

}  // namespace megactx::server
