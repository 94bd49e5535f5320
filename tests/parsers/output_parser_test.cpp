// Output parsers: reasoning, GLM and DeepSeek-V3.2 DSML tool calls, typed
// arguments, malformed calls kept as text, and streaming: for every way of
// cutting the text in two (and byte by byte) the concatenated deltas equal the
// one-shot parse. Expected values are written out by hand from the formats the
// chat templates (tests/fixtures/chat/model_templates) teach the models.
#include "chat/output_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace megactx {
namespace {

using nlohmann::json;

// "｜" (U+FF5C) as in the DeepSeek-V3.2 template.
const std::string kBar = "\xEF\xBD\x9C";
const std::string kDsml = "<" + kBar + "DSML" + kBar;
const std::string kDsmlClose = "</" + kBar + "DSML" + kBar;

json weather_tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object",
      "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "options": {"type": "object"},
        "zip": {"type": "string"},
        "ratio": {"type": ["number", "null"]}
      }}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
  ])");
}

OutputParserOptions glm_options() {
  OutputParserOptions options;
  options.format = ToolCallFormat::Glm;
  options.tools = weather_tools();
  options.tool_call_id_seed = 42;
  return options;
}

OutputParserOptions dsml_options() {
  OutputParserOptions options = glm_options();
  options.format = ToolCallFormat::DeepseekDsml;
  options.starts_in_reasoning = true;  // the V3.2 template ends the prompt with <think>
  return options;
}

// Assembles a message from stream deltas, checking the delta protocol on the way:
// a call's first delta carries its id and name (and no arguments), later ones only arguments.
ParsedMessage assemble(const std::vector<ParsedDelta>& deltas) {
  ParsedMessage message;
  for (const auto& delta : deltas) {
    message.content += delta.content;
    message.reasoning_content += delta.reasoning_content;
    for (const auto& call : delta.tool_calls) {
      const auto count = static_cast<int>(message.tool_calls.size());
      if (call.index == count) {
        EXPECT_FALSE(call.id.empty());
        EXPECT_FALSE(call.name.empty());
        EXPECT_TRUE(call.arguments.empty());
        message.tool_calls.push_back({{"id", call.id},
                                      {"type", "function"},
                                      {"function", {{"name", call.name}, {"arguments", ""}}}});
      } else {
        EXPECT_EQ(call.index, count - 1) << "deltas of an earlier call after a later one";
        EXPECT_TRUE(call.id.empty());
        EXPECT_TRUE(call.name.empty());
        auto& arguments = message.tool_calls.back()["function"]["arguments"];
        arguments = arguments.get<std::string>() + call.arguments;
      }
    }
  }
  return message;
}

void expect_same(const ParsedMessage& a, const ParsedMessage& b, const std::string& what) {
  EXPECT_EQ(a.content, b.content) << what;
  EXPECT_EQ(a.reasoning_content, b.reasoning_content) << what;
  EXPECT_EQ(a.tool_calls, b.tool_calls) << what;
}

// Parses `text` one-shot and streamed at every cut (two pieces) and byte by byte;
// all must agree. Returns the one-shot result.
ParsedMessage parse_everywhere(const std::string& text, const OutputParserOptions& options) {
  const ParsedMessage whole = parse_output(text, options);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    OutputParser parser(options);
    std::vector<ParsedDelta> deltas;
    deltas.push_back(parser.push(std::string_view(text).substr(0, cut)));
    deltas.push_back(parser.push(std::string_view(text).substr(cut)));
    deltas.push_back(parser.finish());
    expect_same(assemble(deltas), whole, "cut at " + std::to_string(cut));
  }
  OutputParser parser(options);
  std::vector<ParsedDelta> deltas;
  for (char c : text) deltas.push_back(parser.push(std::string_view(&c, 1)));
  deltas.push_back(parser.finish());
  expect_same(assemble(deltas), whole, "byte by byte");
  return whole;
}

json arguments_of(const ParsedMessage& message, size_t index) {
  return json::parse(message.tool_calls.at(index)["function"]["arguments"].get<std::string>());
}

TEST(OutputParser, PlainContent) {
  const auto m = parse_everywhere("Hello, world! 1 < 2 and <b>bold</b>.", glm_options());
  EXPECT_EQ(m.content, "Hello, world! 1 < 2 and <b>bold</b>.");
  EXPECT_TRUE(m.reasoning_content.empty());
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(OutputParser, Reasoning) {
  auto m =
      parse_everywhere("<think>Two plus two is four.</think>\nThe answer is 4.", glm_options());
  EXPECT_EQ(m.reasoning_content, "Two plus two is four.");
  EXPECT_EQ(m.content, "The answer is 4.");

  // The prompt ended inside <think>: the output starts with reasoning.
  OutputParserOptions inside = glm_options();
  inside.starts_in_reasoning = true;
  m = parse_everywhere("step 1, step 2</think>Done.", inside);
  EXPECT_EQ(m.reasoning_content, "step 1, step 2");
  EXPECT_EQ(m.content, "Done.");

  // Unterminated reasoning stays reasoning.
  m = parse_everywhere("<think>still thinking", glm_options());
  EXPECT_EQ(m.reasoning_content, "still thinking");
  EXPECT_EQ(m.content, "");

  // Empty think block (enable_thinking off) and leading whitespace.
  m = parse_everywhere("\n<think></think>Hi", glm_options());
  EXPECT_EQ(m.reasoning_content, "");
  EXPECT_EQ(m.content, "Hi");

  // <think> after content is ordinary text.
  m = parse_everywhere("Use the <think> tag.", glm_options());
  EXPECT_EQ(m.content, "Use the <think> tag.");

  // Reasoning parsing off: everything is content.
  OutputParserOptions off = glm_options();
  off.parse_reasoning = false;
  m = parse_everywhere("<think>x</think>y", off);
  EXPECT_EQ(m.content, "<think>x</think>y");
}

TEST(OutputParser, GlmToolCallTyped) {
  const std::string text =
      "<think>The user wants weather.</think>\nLet me check.\n<tool_call>get_weather\n"
      "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
      "<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n"
      "<arg_key>tags</arg_key>\n<arg_value>[\"rain\", \"wind\"]</arg_value>\n"
      "<arg_key>options</arg_key>\n<arg_value>{\"hourly\": false}</arg_value>\n"
      "<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n"
      "<arg_key>ratio</arg_key>\n<arg_value>0.5</arg_value>\n"
      "</tool_call>";
  const auto m = parse_everywhere(text, glm_options());
  EXPECT_EQ(m.reasoning_content, "The user wants weather.");
  EXPECT_EQ(m.content, "Let me check.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0]["type"], "function");
  EXPECT_EQ(m.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_TRUE(m.tool_calls[0]["id"].get<std::string>().starts_with("call_"));
  // Arguments keep the model's order, typed by the schema ("zip" stays a string).
  EXPECT_EQ(m.tool_calls[0]["function"]["arguments"],
            R"({"city":"Paris","days":3,"metric":true,"tags":["rain","wind"],)"
            R"("options":{"hourly":false},"zip":"75001","ratio":0.5})");
}

TEST(OutputParser, GlmCompactFormAndSeveralCalls) {
  // The compact form of the issue text, two calls, whitespace between them dropped.
  const std::string text =
      "<tool_call>get_time</tool_call>\n<tool_call>get_weather<arg_key>city</arg_key>"
      "<arg_value>Oslo</arg_value><arg_key>ratio</arg_key><arg_value>None</arg_value>"
      "</tool_call>\n";
  const auto m = parse_everywhere(text, glm_options());
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0]["function"]["name"], "get_time");
  EXPECT_EQ(m.tool_calls[0]["function"]["arguments"], "{}");
  EXPECT_EQ(m.tool_calls[1]["function"]["name"], "get_weather");
  EXPECT_EQ(arguments_of(m, 1), json({{"city", "Oslo"}, {"ratio", nullptr}}));
  EXPECT_NE(m.tool_calls[0]["id"], m.tool_calls[1]["id"]);
}

TEST(OutputParser, GlmStringValuesKeepTheirText) {
  // Multi-line string with markup-like text and JSON-looking content stays verbatim.
  const std::string text =
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>  New\n\"York\" "
      "{1}</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>not a number</arg_value>\n</tool_call>";
  const auto m = parse_everywhere(text, glm_options());
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(arguments_of(m, 0)["city"], "  New\n\"York\" {1}");
  EXPECT_EQ(arguments_of(m, 0)["days"], "not a number");  // unparsable: kept as text
}

TEST(OutputParser, NoToolsGivenUntypedValues) {
  OutputParserOptions options = glm_options();
  options.tools = json::array();
  const auto m = parse_everywhere(
      "<tool_call>lookup\n<arg_key>n</arg_key>\n<arg_value>12</arg_value>\n<arg_key>q</arg_key>\n"
      "<arg_value>hello</arg_value>\n<arg_key>flag</arg_key>\n<arg_value>false</arg_value>\n"
      "</tool_call>",
      options);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(arguments_of(m, 0), json({{"n", 12}, {"q", "hello"}, {"flag", false}}));
}

TEST(OutputParser, GlmMalformedKeptAsText) {
  const auto options = glm_options();
  // Unknown tool.
  std::string text =
      "Sure.\n<tool_call>launch_rockets\n<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n</"
      "tool_call>";
  auto m = parse_everywhere(text, options);
  EXPECT_EQ(m.content, text);
  EXPECT_TRUE(m.tool_calls.empty());
  // Missing </arg_value>.
  text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris\n</tool_call> ok";
  m = parse_everywhere(text, options);
  EXPECT_EQ(m.content, text);
  // Stray text between arguments.
  text =
      "<tool_call>get_weather\n<arg_key>city</arg_key>junk<arg_value>Paris</arg_value></tool_call>";
  EXPECT_EQ(parse_everywhere(text, options).content, text);
  // Duplicate key.
  text =
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>A</arg_value><arg_key>city</arg_key>"
      "<arg_value>B</arg_value></tool_call>";
  EXPECT_EQ(parse_everywhere(text, options).content, text);
  // Unterminated at the end of generation.
  text = "Checking. <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par";
  m = parse_everywhere(text, options);
  EXPECT_EQ(m.content, text);
  EXPECT_TRUE(m.tool_calls.empty());
  // A new call opens before the first closed: the first is text, the second a call.
  text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<tool_call>get_time\n</tool_call>";
  m = parse_everywhere(text, options);
  EXPECT_EQ(m.content, "<tool_call>get_weather\n<arg_key>city</arg_key>\n");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0]["function"]["name"], "get_time");
  // A good call, then a bad one: the bad one keeps its preceding newline.
  text = "<tool_call>get_time</tool_call>\n<tool_call></tool_call>";
  m = parse_everywhere(text, options);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.content, "\n<tool_call></tool_call>");
}

TEST(OutputParser, UnparsedBlocksLoseTheirMarkupWhenAsked) {
  // The chat API: only the request's tools are calls, and whatever is not a
  // call reaches content without tool-call markup (never raw markup).
  OutputParserOptions options = glm_options();
  options.known_tools_only = true;
  options.strip_unparsed_markup = true;
  std::string text =
      "Sure.\n<tool_call>launch_rockets\n<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n</"
      "tool_call>";
  auto m = parse_everywhere(text, options);
  EXPECT_EQ(m.content, "Sure.\nlaunch_rockets\nn\n3\n");
  EXPECT_TRUE(m.tool_calls.empty());
  // Cut off by max_tokens.
  m = parse_everywhere("Checking. <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
                       options);
  EXPECT_EQ(m.content, "Checking. get_weather\ncity\nPar");
  // A known tool still is a call.
  m = parse_everywhere("<tool_call>get_time\n</tool_call>", options);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  // No tools offered (tool_choice none): no call at all.
  options.tools = json::array();
  m = parse_everywhere("<tool_call>get_time\n</tool_call>", options);
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.content, "get_time\n");
  // DSML: every tag goes, attributes included.
  OutputParserOptions dsml = dsml_options();
  dsml.known_tools_only = true;
  dsml.strip_unparsed_markup = true;
  text = "</think>" + kDsml + "function_calls>\n" + kDsml + "invoke name=\"nope\">\n" + kDsml +
         "parameter name=\"x\" string=\"true\">1" + kDsmlClose + "parameter>\n" + kDsmlClose +
         "invoke>\n" + kDsmlClose + "function_calls>";
  m = parse_everywhere(text, dsml);
  EXPECT_EQ(m.content, "\n\n1\n\n");
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(OutputParser, ToolParsingOff) {
  OutputParserOptions options = glm_options();
  options.parse_tool_calls = false;
  const std::string text = "<tool_call>get_time</tool_call>";
  const auto m = parse_everywhere(text, options);
  EXPECT_EQ(m.content, text);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(OutputParser, DsmlToolCalls) {
  // As the V3.2 template renders an assistant turn: reasoning, content, "\n\n", the block.
  const std::string text =
      "The user asks for weather in two cities.</think>I'll look both up.\n\n" + kDsml +
      "function_calls>\n" + kDsml + "invoke name=\"get_weather\">\n" + kDsml +
      "parameter name=\"city\" string=\"true\">San Francisco</" + kBar + "DSML" + kBar +
      "parameter>\n" + kDsml + "parameter name=\"days\" string=\"false\">2</" + kBar + "DSML" +
      kBar + "parameter>\n" + kDsml + "parameter name=\"tags\" string=\"false\">[\"fog\"]" +
      kDsmlClose + "parameter>\n" + kDsmlClose + "invoke>\n" + kDsml +
      "invoke name=\"get_weather\">\n" + kDsml + "parameter name=\"city\" string=\"true\">123" +
      kDsmlClose + "parameter>\n" + kDsmlClose + "invoke>\n" + kDsmlClose + "function_calls>";
  const auto m = parse_everywhere(text, dsml_options());
  EXPECT_EQ(m.reasoning_content, "The user asks for weather in two cities.");
  EXPECT_EQ(m.content, "I'll look both up.");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(m.tool_calls[0]["function"]["arguments"],
            R"({"city":"San Francisco","days":2,"tags":["fog"]})");
  EXPECT_EQ(arguments_of(m, 1), json({{"city", "123"}}));  // string="true": stays a string
}

TEST(OutputParser, DsmlMalformedAndJsonBody) {
  const auto options = dsml_options();
  // Unknown tool -> text.
  std::string text = "</think>" + kDsml + "function_calls>\n" + kDsml + "invoke name=\"nope\">\n" +
                     kDsmlClose + "invoke>\n" + kDsmlClose + "function_calls>";
  auto m = parse_everywhere(text, options);
  EXPECT_EQ(m.content, text.substr(8));
  EXPECT_TRUE(m.tool_calls.empty());
  // Unterminated -> text.
  text = "</think>Let me see." + kDsml + "function_calls>\n" + kDsml + "invoke name=\"get_time\">";
  m = parse_everywhere(text, options);
  EXPECT_EQ(m.content, text.substr(8));
  // Bad string attribute -> text.
  text = "</think>" + kDsml + "function_calls>" + kDsml + "invoke name=\"get_weather\">" + kDsml +
         "parameter name=\"city\" string=\"maybe\">x" + kDsmlClose + "parameter>" + kDsmlClose +
         "invoke>" + kDsmlClose + "function_calls>";
  EXPECT_EQ(parse_everywhere(text, options).content, text.substr(8));
  // An invoke whose body is a JSON object.
  text = "</think>" + kDsml + "function_calls>" + kDsml + "invoke name=\"get_weather\">" +
         "{\"city\": \"Rome\", \"days\": 1}" + kDsmlClose + "invoke>" + kDsmlClose +
         "function_calls>";
  m = parse_everywhere(text, options);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0]["function"]["arguments"], R"({"city":"Rome","days":1})");
  // A GLM marker in DSML mode is plain text.
  text = "</think><tool_call>get_time</tool_call>";
  EXPECT_EQ(parse_everywhere(text, options).content, "<tool_call>get_time</tool_call>");
}

TEST(OutputParser, StreamingEmitsEarlyAndHoldsMarkers) {
  OutputParser parser(glm_options());
  EXPECT_EQ(parser.push("<think>abc").reasoning_content, "abc");
  EXPECT_EQ(parser.push("de</thi").reasoning_content, "de");  // "</thi" held back
  ParsedDelta delta = parser.push("nk>Hello <tool");
  EXPECT_EQ(delta.content, "Hello");  // " <tool" held back
  delta = parser.push("_call>get_time</tool_call>");
  EXPECT_TRUE(delta.content.empty());
  ASSERT_EQ(delta.tool_calls.size(), 2u);  // name first, then the arguments
  EXPECT_EQ(delta.tool_calls[0].name, "get_time");
  EXPECT_EQ(delta.tool_calls[1].arguments, "{}");
  EXPECT_EQ(parser.push(" bye").content, "bye");
  EXPECT_TRUE(parser.finish().empty());
}

TEST(OutputParser, IdsAreSeededAndDistinctPerParser) {
  const std::string text = "<tool_call>get_time</tool_call>";
  EXPECT_EQ(parse_output(text, glm_options()).tool_calls,
            parse_output(text, glm_options()).tool_calls);
  OutputParserOptions random = glm_options();
  random.tool_call_id_seed = 0;
  EXPECT_NE(parse_output(text, random).tool_calls[0]["id"],
            parse_output(text, random).tool_calls[0]["id"]);
}

TEST(OutputParser, InvalidUtf8NeverThrows) {
  OutputParserOptions options = glm_options();
  options.tools = json::array();
  const std::string text =
      "\xff\xfe<think>\xc3</think>\x80<tool_call>f\n<arg_key>k\xff</arg_key><arg_value>\xe2\x82"
      "</arg_value></tool_call>";
  const auto m = parse_everywhere(text, options);
  // The bytes before <think> make it content; the call itself is well formed.
  EXPECT_EQ(m.content, "\xff\xfe<think>\xc3</think>\x80");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  // Invalid bytes are replaced, so the arguments are still valid JSON.
  EXPECT_NO_THROW(arguments_of(m, 0));
}

// The assistant turn as the real templates render it (fixtures made by
// tests/parsers/make_roundtrip_fixtures.py with the reference renderer) parses
// back into the message that produced it.
void check_roundtrip(const std::string& name, ToolCallFormat format) {
  const std::string base = std::string(MEGACTX_SOURCE_DIR) + "/tests/parsers/fixtures/" + name;
  std::ifstream text_file(base + "_roundtrip.txt", std::ios::binary);
  std::stringstream text;
  text << text_file.rdbuf();
  std::ifstream expected_file(base + "_roundtrip.json");
  const json expected = json::parse(expected_file);
  ASSERT_FALSE(text.str().empty());

  OutputParserOptions options;
  options.format = format;
  options.tools = expected["tools"];
  options.starts_in_reasoning = expected["starts_in_reasoning"].get<bool>();
  options.tool_call_id_seed = 7;
  const auto m = parse_everywhere(text.str(), options);
  EXPECT_EQ(m.reasoning_content, expected["reasoning_content"]);
  EXPECT_EQ(m.content, expected["content"]);
  ASSERT_EQ(m.tool_calls.size(), expected["tool_calls"].size());
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    EXPECT_EQ(m.tool_calls[i]["function"]["name"], expected["tool_calls"][i]["name"]);
    EXPECT_EQ(arguments_of(m, i), expected["tool_calls"][i]["arguments"]) << name << " call " << i;
  }
}

TEST(OutputParser, GlmTemplateRoundTrip) {
  check_roundtrip("glm", ToolCallFormat::Glm);
}
TEST(OutputParser, DeepseekTemplateRoundTrip) {
  check_roundtrip("deepseek", ToolCallFormat::DeepseekDsml);
}

}  // namespace
}  // namespace megactx
