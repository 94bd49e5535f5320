// Output parsers: split what the model writes into OpenAI's content,
// reasoning_content and tool_calls, incrementally so a stream can emit deltas.
//
//  * reasoning: `<think> ... </think>`; some templates open the think block in
//    the prompt, so the parser may start inside it.
//  * tool calls, GLM format:
//      <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
//    (newlines allowed between the parts);
//  * tool calls, DeepSeek-V3.2 DSML format (see the shared template).
// Argument values are typed by the tool's JSON schema (a string stays a
// string; integer/number/boolean/object/array values are parsed as JSON).
// Malformed tool calls are kept as text, never dropped (with
// strip_unparsed_markup, as their text without the markup).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace megactx {

enum class ToolCallFormat { Glm, DeepseekDsml };

struct ToolCallDelta {
  int index = 0;          // position of the call in this message's tool_calls
  std::string id;         // set in the first delta of a call ("call_...")
  std::string name;       // set in the first delta of a call
  std::string arguments;  // a piece of the JSON arguments string
};

struct ParsedDelta {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && reasoning_content.empty() && tool_calls.empty(); }
};

struct OutputParserOptions {
  ToolCallFormat format = ToolCallFormat::Glm;
  nlohmann::json tools = nlohmann::json::array();  // the request's OpenAI tools
  bool parse_reasoning = true;
  bool starts_in_reasoning = false;  // the prompt ended inside <think>
  bool parse_tool_calls = true;
  int max_tool_calls = 0;  // 0: any number; 1 for parallel_tool_calls false
  // Only calls of `tools` are tool calls (with no tools, nothing is); otherwise
  // with no tools any well-formed name is.
  bool known_tools_only = false;
  // A block that does not become tool calls (a function not in `tools`,
  // malformed or cut-off markup) goes to content as its text with every
  // tool-call marker removed instead of as written, so a client never sees
  // the markup (the chat API).
  bool strip_unparsed_markup = false;
  // Tool call ids are "call_" + 24 letters/digits drawn from a generator seeded
  // with this value; 0 seeds it randomly (tests set it to compare runs).
  uint64_t tool_call_id_seed = 0;
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);
  ~OutputParser();
  // Feeds newly generated text; returns what can be emitted now. Text that may
  // still turn into a marker (a prefix of "<tool_call>") is held back.
  ParsedDelta push(std::string_view text);
  // End of generation: flushes everything held back.
  ParsedDelta finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whole-message convenience: content, reasoning_content and complete
// tool_calls ([{id, type:"function", function:{name, arguments}}]).
struct ParsedMessage {
  std::string content;
  std::string reasoning_content;
  nlohmann::json tool_calls = nlohmann::json::array();
};
ParsedMessage parse_output(std::string_view text, const OutputParserOptions& options);

}  // namespace megactx
