// Fuzzes the output parser differentially: the first byte picks the options,
// the second where to cut the rest; streaming the two pieces (and byte by byte
// for short inputs) must give exactly the one-shot parse, and arguments must
// always be valid JSON. Any difference aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "chat/output_parser.h"

namespace {

using megactx::OutputParser;
using megactx::ParsedDelta;
using megactx::ParsedMessage;

void absorb(ParsedMessage& message, const ParsedDelta& delta) {
  message.content += delta.content;
  message.reasoning_content += delta.reasoning_content;
  for (const auto& call : delta.tool_calls) {
    if (call.index == static_cast<int>(message.tool_calls.size())) {
      message.tool_calls.push_back(
          {{"id", call.id}, {"function", {{"name", call.name}, {"arguments", ""}}}});
    } else if (call.index != static_cast<int>(message.tool_calls.size()) - 1) {
      std::abort();  // deltas out of order
    }
    auto& arguments = message.tool_calls.back()["function"]["arguments"];
    arguments = arguments.get<std::string>() + call.arguments;
  }
}

void check_same(const ParsedMessage& a, const ParsedMessage& b) {
  if (a.content != b.content || a.reasoning_content != b.reasoning_content) std::abort();
  if (a.tool_calls.size() != b.tool_calls.size()) std::abort();
  for (size_t i = 0; i < a.tool_calls.size(); ++i)
    if (a.tool_calls[i]["function"] != b.tool_calls[i]["function"]) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  megactx::OutputParserOptions options;
  options.format =
      (data[0] & 1) ? megactx::ToolCallFormat::DeepseekDsml : megactx::ToolCallFormat::Glm;
  options.starts_in_reasoning = data[0] & 2;
  options.parse_reasoning = !(data[0] & 4);
  options.parse_tool_calls = !(data[0] & 8);
  options.tool_call_id_seed = 1;
  if (data[0] & 16)
    options.tools = nlohmann::json::parse(
        R"([{"type":"function","function":{"name":"f","parameters":{"properties":{)"
        R"("i":{"type":"integer"},"s":{"type":"string"},"b":{"type":"boolean"}}}}}])");
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  const size_t cut = text.empty() ? 0 : data[1] % (text.size() + 1);

  const ParsedMessage whole = megactx::parse_output(text, options);
  for (const auto& call : whole.tool_calls) {
    const auto arguments =
        nlohmann::json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    if (arguments.is_discarded() || !arguments.is_object()) std::abort();
  }

  ParsedMessage streamed;
  OutputParser parser(options);
  absorb(streamed, parser.push(std::string_view(text).substr(0, cut)));
  absorb(streamed, parser.push(std::string_view(text).substr(cut)));
  absorb(streamed, parser.finish());
  check_same(streamed, whole);

  if (text.size() <= 256) {
    ParsedMessage bytewise;
    OutputParser byte_parser(options);
    for (char c : text) absorb(bytewise, byte_parser.push(std::string_view(&c, 1)));
    absorb(bytewise, byte_parser.finish());
    check_same(bytewise, whole);
  }
  return 0;
}
