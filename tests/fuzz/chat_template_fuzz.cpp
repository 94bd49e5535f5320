// Fuzzes the Jinja chat-template lexer, parser and renderer: any input must
// either render or throw megactx::Error, within bounded time and memory.
// The renderer runs on a fixed conversation with tools, tool calls and
// reasoning so that template code paths touching messages execute.
#include <cstddef>
#include <cstdint>
#include <string>

#include "chat/chat_template.h"
#include "core/error.h"

namespace {

const nlohmann::ordered_json& fixed_context() {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": [{"type": "text", "text": "Weather in 東京?"}]},
      {"role": "assistant", "content": "<think>plan</think>ok", "reasoning_content": "plan",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "東京", "days": 2}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21.5}"},
      {"role": "user", "content": "Thanks /nothink"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true,
    "enable_thinking": false,
    "bos_token": "<s>",
    "eos_token": "</s>"
  })");
  return context;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string source(reinterpret_cast<const char*>(data), size);
  try {
    megactx::ChatTemplate chat_template(source);
    // Real templates take thousands of steps; a low bound keeps each input fast.
    chat_template.set_step_limit(100000);
    std::string rendered = chat_template.render(fixed_context());
    (void)rendered;
  } catch (const megactx::Error&) {
    // Syntax errors, unsupported constructs, runtime errors: all expected.
  }
  return 0;
}
