// The chat output grammar (chat/output_grammar.h) against the output parser
// and an independent JSON Schema validator: random walks through the
// compiled grammar over the default model's vocabulary (each step a token
// the mask allows) are parsed by the OutputParser as the chat API parses
// them, and every walk that ends must read back as what the request asked
// for -- tool calls of the allowed tools only, arguments valid under their
// parameters schema (tests/grammar/json_validator.h, written from the
// specification), content valid under the response_format schema, no markup
// in the content -- in GLM's markup and in DeepSeek's DSML.
#include <gtest/gtest.h>

#include <random>

#include "../grammar/json_validator.h"
#include "chat/output_grammar.h"
#include "chat/tool_call_parser_common.h"
#include "core/error.h"
#include "grammar/compiled_grammar.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace megactx {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const grammar::Vocabulary> vocabulary() {
  static const std::shared_ptr<const grammar::Vocabulary> vocab = [] {
    auto tokenizer = Tokenizer::load(std::string(MEGACTX_SOURCE_DIR) + "/models/default");
    return grammar::Vocabulary::from_tokenizer(*tokenizer, {0, 4, 6});
  }();
  return vocab;
}

// The same with the DSML block markers as two more special tokens (how a
// DeepSeek tokenizer may hold them): a walk then opens a block as often as a
// GLM one does.
std::shared_ptr<const grammar::Vocabulary> vocabulary_with_dsml_markers() {
  static const std::shared_ptr<const grammar::Vocabulary> vocab = [] {
    const grammar::Vocabulary& base = *vocabulary();
    std::vector<std::string> bytes;
    std::vector<int32_t> special;
    for (int32_t id = 0; id < base.size(); ++id) {
      bytes.push_back(base.bytes(id));
      if (base.is_special(id)) special.push_back(id);
    }
    for (std::string_view marker : {tool_calls::kDsmlStart, tool_calls::kDsmlEnd}) {
      special.push_back(static_cast<int32_t>(bytes.size()));
      bytes.emplace_back(marker);
    }
    return std::make_shared<const grammar::Vocabulary>(std::move(bytes), special,
                                                       std::vector<int32_t>{0, 4, 6});
  }();
  return vocab;
}

const Json& tools() {
  static const Json t = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": {
      "type": "object", "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 8},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "when": {"type": ["string", "null"], "format": "date"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
      "required": ["city", "unit", "days", "when", "code"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "search", "parameters": {
      "type": "object", "properties": {
        "query": {"type": "string", "maxLength": 12},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        "filters": {"type": "array", "items": {"$ref": "#/$defs/filter"}, "maxItems": 2},
        "exact": {"type": "boolean"},
        "note": {"$ref": "#/$defs/note"}},
      "required": ["query"], "additionalProperties": false,
      "$defs": {
        "filter": {"type": "object", "properties": {
          "field": {"enum": ["title", "body"]}, "value": {"type": "string", "maxLength": 6}},
          "required": ["field", "value"], "additionalProperties": false},
        "note": {"type": "string", "maxLength": 5}}}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object",
      "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}}}])");
  return t;
}

// A constrained output drawn at random: uniform over the allowed tokens,
// except that special tokens (markers) and the stop token, when allowed, are
// taken with probability 0.3, so reasoning, free text and open-ended values
// end soon. Empty when the walk did not end within `max_steps`.
std::optional<std::string> walk(const std::shared_ptr<const grammar::CompiledGrammar>& g,
                                std::mt19937& rng, int max_steps = 600) {
  grammar::GrammarMatcher matcher(g);
  const grammar::Vocabulary& vocab = g->vocabulary();
  std::vector<uint32_t> mask(static_cast<size_t>(vocab.mask_words()));
  std::string text;
  std::uniform_real_distribution<double> coin(0, 1);
  for (int step = 0; step < max_steps; ++step) {
    matcher.fill_next_token_bitmask(mask.data());
    std::vector<int32_t> plain, special;
    for (int32_t id = 0; id < vocab.size(); ++id) {
      if (!((mask[static_cast<size_t>(id >> 5)] >> (id & 31)) & 1)) continue;
      (vocab.is_special(id) || vocab.is_eos(id) ? special : plain).push_back(id);
    }
    EXPECT_FALSE(plain.empty() && special.empty()) << "a dead end after '" << text << "'";
    if (plain.empty() && special.empty()) return std::nullopt;
    const bool take_special = !special.empty() && (plain.empty() || coin(rng) < 0.3);
    const std::vector<int32_t>& from = take_special ? special : plain;
    const int32_t id = from[rng() % from.size()];
    EXPECT_TRUE(matcher.accept_token(id));
    if (vocab.is_eos(id)) return text;
    text += vocab.bytes(id);
  }
  return std::nullopt;
}

OutputParserOptions parser_options(const ChatOutputConstraint& c) {
  OutputParserOptions options;
  options.format = c.format;
  options.tools = nlohmann::json::parse(c.tools.dump());
  options.starts_in_reasoning = c.reasoning == ReasoningStart::Open;
  options.known_tools_only = true;
  options.strip_unparsed_markup = true;
  options.max_tool_calls = c.parallel_calls ? 0 : 1;
  return options;
}

const Json* parameters_of(const std::string& name) {
  for (const Json& tool : tools())
    if (tool["function"]["name"] == name) return &tool["function"]["parameters"];
  return nullptr;
}

bool has_markup(const std::string& text) {
  for (const char* marker : {"<tool_call>", "</tool_call>", "<arg_key>", "<arg_value>",
                             "\xEF\xBD\x9C"
                             "DSML\xEF\xBD\x9C"})
    if (text.find(marker) != std::string::npos) return true;
  return false;
}

struct WalkStats {
  int ended = 0, with_calls = 0, with_content = 0;
};

// Walks `c`'s grammar `walks` times and checks each parsed output.
WalkStats check_walks(const ChatOutputConstraint& c, int walks, uint32_t seed,
                      std::shared_ptr<const grammar::Vocabulary> vocab = vocabulary()) {
  grammar::Grammar g;
  lower_chat_output(g, *vocab, c);
  const auto compiled = grammar::compile_grammar(g, vocab);
  std::mt19937 rng(seed);
  WalkStats stats;
  for (int i = 0; i < walks; ++i) {
    const std::optional<std::string> text = walk(compiled, rng);
    if (!text) continue;
    ++stats.ended;
    const ParsedMessage message = parse_output(*text, parser_options(c));
    EXPECT_FALSE(has_markup(message.content)) << *text;
    EXPECT_EQ(message.reasoning_content.find("</think>"), std::string::npos) << *text;
    if (!message.tool_calls.empty()) ++stats.with_calls;
    if (!tool_calls::trim(message.content).empty()) ++stats.with_content;
    if (c.calls_required) {
      EXPECT_FALSE(message.tool_calls.empty()) << *text;
      EXPECT_TRUE(tool_calls::trim(message.content).empty()) << *text;
    }
    if (!c.parallel_calls) {
      EXPECT_LE(message.tool_calls.size(), 1u) << *text;
    }
    for (const auto& call : message.tool_calls) {
      const std::string name = call["function"]["name"];
      const Json* parameters = parameters_of(name);
      bool offered = false;
      for (const Json& tool : c.tools) offered = offered || tool["function"]["name"] == name;
      EXPECT_TRUE(offered && parameters != nullptr) << name << " in " << *text;
      const std::string arguments = call["function"]["arguments"];
      EXPECT_TRUE(nlohmann::json::accept(arguments)) << arguments;
      if (!offered || parameters == nullptr || !nlohmann::json::accept(arguments)) continue;
      EXPECT_TRUE(grammar::test::JsonValidator(*parameters).valid(Json::parse(arguments)))
          << name << " " << arguments << " from " << *text;
    }
    if (message.tool_calls.empty() && c.content == ChatOutputConstraint::Content::JsonSchema) {
      const std::string content(tool_calls::trim(message.content));
      EXPECT_TRUE(nlohmann::json::accept(content)) << *text;
      if (!nlohmann::json::accept(content)) continue;
      EXPECT_TRUE(grammar::test::JsonValidator(c.schema).valid(Json::parse(content))) << content;
      EXPECT_EQ(content.find('<'), std::string::npos) << "JSON content holds no raw '<'";
    }
  }
  EXPECT_GT(stats.ended, walks / 2);
  return stats;
}

ChatOutputConstraint required_calls(ToolCallFormat format) {
  ChatOutputConstraint c;
  c.format = format;
  c.reasoning = ReasoningStart::Closed;
  c.tools = tools();
  c.calls_required = true;
  c.json_options.escape_less_than = true;
  c.json_options.max_whitespace = 2;
  return c;
}

TEST(ChatOutputGrammar, RequiredCallsAreValidCallsInGlmMarkup) {
  const WalkStats stats = check_walks(required_calls(ToolCallFormat::Glm), 300, 1);
  EXPECT_EQ(stats.with_calls, stats.ended);
}

TEST(ChatOutputGrammar, RequiredCallsAreValidCallsInDsml) {
  const WalkStats stats = check_walks(required_calls(ToolCallFormat::DeepseekDsml), 300, 2);
  EXPECT_EQ(stats.with_calls, stats.ended);
}

TEST(ChatOutputGrammar, ANamedToolWithoutParallelCallsIsExactlyOneCallOfIt) {
  for (const ToolCallFormat format : {ToolCallFormat::Glm, ToolCallFormat::DeepseekDsml}) {
    ChatOutputConstraint c = required_calls(format);
    c.tools = Json::array({tools()[1]});
    c.parallel_calls = false;
    c.reasoning = ReasoningStart::None;  // the model may reason first
    check_walks(c, 200, 3);
  }
}

TEST(ChatOutputGrammar, ResponseFormatContentOrCallsAfterReasoning) {
  for (const ToolCallFormat format : {ToolCallFormat::Glm, ToolCallFormat::DeepseekDsml}) {
    ChatOutputConstraint c = required_calls(format);
    c.calls_required = false;
    c.reasoning = ReasoningStart::Open;
    c.content = ChatOutputConstraint::Content::JsonSchema;
    c.schema = Json::parse(R"({"type": "object", "properties": {
        "answer": {"type": "string", "maxLength": 6},
        "html": {"enum": ["<b>", "</tool_call>"]}},
      "required": ["answer", "html"], "additionalProperties": false})");
    const WalkStats stats = check_walks(c, 300, 4, vocabulary_with_dsml_markers());
    EXPECT_GT(stats.with_calls, 0);
    EXPECT_GT(stats.with_content, 0);
  }
}

TEST(ChatOutputGrammar, StrictToolsUnderAutoKeepContentFreeOfMarkup) {
  for (const ToolCallFormat format : {ToolCallFormat::Glm, ToolCallFormat::DeepseekDsml}) {
    ChatOutputConstraint c = required_calls(format);
    c.calls_required = false;
    c.content = ChatOutputConstraint::Content::Free;
    const WalkStats stats = check_walks(c, 300, 5, vocabulary_with_dsml_markers());
    EXPECT_GT(stats.with_calls, 0);
    EXPECT_GT(stats.with_content, 0);
  }
}

TEST(ChatOutputGrammar, SchemasTheFormatCannotWriteAreErrorsNamingThem) {
  auto error_of = [](ToolCallFormat format, const char* tool) {
    ChatOutputConstraint c = required_calls(format);
    c.tools = Json::array({Json::parse(tool)});
    grammar::Grammar g;
    try {
      lower_chat_output(g, *vocabulary(), c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string mixed = error_of(ToolCallFormat::Glm, R"({"type": "function", "function":
      {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": ["string", "integer"], "minimum": 3}}}}})");
  EXPECT_NE(mixed.find("tool 'f'"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("property 'x'"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("minimum"), std::string::npos) << mixed;
  // DSML writes such a value as JSON: no error.
  EXPECT_EQ(error_of(ToolCallFormat::DeepseekDsml, R"({"type": "function", "function":
      {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": ["string", "integer"], "minimum": 3}}}}})"),
            "");
  const std::string not_object = error_of(ToolCallFormat::Glm, R"({"type": "function",
      "function": {"name": "f", "parameters": {"type": "array"}}})");
  EXPECT_NE(not_object.find("type object"), std::string::npos) << not_object;
  const std::string spaced = error_of(ToolCallFormat::Glm, R"({"type": "function",
      "function": {"name": "two words", "parameters": {}}})");
  EXPECT_NE(spaced.find("function name"), std::string::npos) << spaced;
  const std::string unknown = error_of(ToolCallFormat::Glm, R"({"type": "function",
      "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "integer", "multipleOf": 2}}}}})");
  EXPECT_NE(unknown.find("multipleOf"), std::string::npos) << unknown;
}

TEST(ChatOutputGrammar, WhereThePromptLeavesTheModel) {
  EXPECT_EQ(reasoning_start("<|assistant|>"), ReasoningStart::None);
  EXPECT_EQ(reasoning_start("<|assistant|>\n<think>"), ReasoningStart::Open);
  EXPECT_EQ(reasoning_start("<|assistant|>\n<think></think>\n"), ReasoningStart::Closed);
  EXPECT_EQ(reasoning_start("<think>a</think><|user|>hi<|assistant|>"), ReasoningStart::None);
}

}  // namespace
}  // namespace megactx
