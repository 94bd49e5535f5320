// Syntax and runtime errors name line and column; bad requests are clear
// megactx::Errors; chat_template_context builds what HF's apply_chat_template
// passes to the template.
#include <gtest/gtest.h>

#include <string>

#include "chat/chat_template.h"
#include "core/error.h"

namespace megactx {
namespace {

std::string error_of(const std::string& source,
                     const nlohmann::json& context = nlohmann::json::object()) {
  try {
    ChatTemplate(source).render(context);
  } catch (const Error& error) {
    return error.what();
  }
  return "<no error>";
}

::testing::AssertionResult starts_with(const std::string& text, const std::string& prefix) {
  if (text.rfind(prefix, 0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not start with '" << prefix << "'";
}

TEST(ChatTemplateErrors, SyntaxErrorsNameLineAndColumn) {
  EXPECT_TRUE(starts_with(error_of("Hello\n{{ 1 + }}"), "line 2, column 8: "));
  EXPECT_TRUE(
      starts_with(error_of("{% if x %}abc"), "line 1, column 14: unexpected end of template"));
  EXPECT_TRUE(starts_with(error_of("{{ 'abc }}"), "line 1, column 4: "));
  EXPECT_TRUE(starts_with(error_of("{% for x in y %}{% endif %}"),
                          "line 1, column 20: Encountered unknown tag 'endif'"));
  EXPECT_TRUE(starts_with(error_of("x\n\n{{ a ! b }}"), "line 3, column 6: unexpected char '!'"));
  EXPECT_TRUE(starts_with(error_of("{{ }}"), "line 1, column 4: Expected an expression"));
  EXPECT_TRUE(starts_with(error_of("{% macro m(a=1, b) %}{% endmacro %}"),
                          "line 1, column 18: non-default argument"));
  EXPECT_TRUE(starts_with(error_of("{% break %}"), "line 1, column 4: 'break' outside of a loop"));
  EXPECT_TRUE(
      starts_with(error_of("{# never closed"), "line 1, column 1: Missing end of comment tag"));
  EXPECT_TRUE(starts_with(error_of("{% raw %}never closed"),
                          "line 1, column 1: Missing end of raw directive"));
  EXPECT_TRUE(starts_with(error_of("{{ (1 }}"), "line 1, column 7: unexpected '}'"));
}

TEST(ChatTemplateErrors, UnsupportedConstructsNameLineAndColumn) {
  EXPECT_TRUE(starts_with(error_of("a\n  {% include 'x.jinja' %}"),
                          "line 2, column 6: unsupported tag 'include'"));
  EXPECT_TRUE(
      starts_with(error_of("{% extends 'base' %}"), "line 1, column 4: unsupported tag 'extends'"));
  EXPECT_TRUE(
      starts_with(error_of("{% do x.append(1) %}"), "line 1, column 4: unsupported tag 'do'"));
  EXPECT_TRUE(starts_with(error_of("{% frobnicate %}"),
                          "line 1, column 4: Encountered unknown tag 'frobnicate'"));
}

TEST(ChatTemplateErrors, RuntimeErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("line1\nline2 {{ 1 / 0 }}"), "line 2, column 10: division by zero");
  EXPECT_EQ(error_of("{{ x.y.z }}"), "line 1, column 4: 'x' is undefined");
  EXPECT_TRUE(
      starts_with(error_of("\n{{ 'a' | nope }}"), "line 2, column 10: No filter named 'nope'"));
  EXPECT_TRUE(starts_with(error_of("{% set l = [] %}{{ l.append(1) }}"),
                          "line 1, column 20: access to attribute 'append'"));
  EXPECT_TRUE(starts_with(error_of("{{ range(1000000) }}"), "line 1, column 4: Range too big"));
}

TEST(ChatTemplateErrors, HostileTemplatesStayBounded) {
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("nested deeper"),
            std::string::npos);
  ChatTemplate nested(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  nested.set_step_limit(100000);
  try {
    nested.render(nlohmann::json::object());
    ADD_FAILURE() << "expected the step limit to stop the render";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("exceeded 100000 steps"), std::string::npos)
        << error.what();
  }
  EXPECT_NE(error_of("{{ 'x' * 1000000000 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
  std::string deep = std::string(5000, '(') + "1" + std::string(5000, ')');
  EXPECT_NE(error_of("{{ " + deep + " }}").find("nested too deeply"), std::string::npos);
  std::string nots;
  for (int i = 0; i < 5000; ++i) nots += "not ";
  EXPECT_NE(error_of("{{ " + nots + "x }}").find("nested too deeply"), std::string::npos);
  std::string chain = "x";
  for (int i = 0; i < 5000; ++i) chain += " or x";
  EXPECT_NE(error_of("{{ " + chain + " }}").find("nested too deeply"), std::string::npos);
  std::string attributes = "x";
  for (int i = 0; i < 5000; ++i) attributes += ".a";
  EXPECT_NE(error_of("{{ " + attributes + " }}").find("nested too deeply"), std::string::npos);
  EXPECT_NE(
      error_of("{% set ns = namespace(l=[]) %}{% for i in range(2000) %}{% set ns.l = [ns.l] %}"
               "{% endfor %}{{ ns.l }}")
          .find("nested deeper than 512"),
      std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(x=0) %}{% for i in range(2000) %}"
                     "{% set ns.x = namespace(y=ns.x) %}{% endfor %}")
                .find("nested deeper than 512"),
            std::string::npos);
  // Recursion within the bounds works.
  EXPECT_EQ(
      error_of("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(30) }}"),
      "<no error>");
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if x %}";
  EXPECT_NE(error_of(blocks).find("nested too deeply"), std::string::npos);
}

TEST(ChatTemplateContext, DefaultsAndKwargs) {
  nlohmann::json request = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                            {"chat_template_kwargs", {{"enable_thinking", false}}}};
  nlohmann::json context = chat_template_context(request, nlohmann::json::object());
  EXPECT_EQ(context["add_generation_prompt"], true);
  EXPECT_TRUE(context["tools"].is_null());
  EXPECT_EQ(context["enable_thinking"], false);
  EXPECT_EQ(context["messages"], request["messages"]);

  request["add_generation_prompt"] = false;
  request["tools"] = nlohmann::json::array({{{"type", "function"}}});
  context = chat_template_context(request, nlohmann::json::object());
  EXPECT_EQ(context["add_generation_prompt"], false);
  EXPECT_EQ(context["tools"].size(), 1u);
}

TEST(ChatTemplateContext, SpecialTokensFromTokenizerConfig) {
  nlohmann::json config = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                           {"eos_token", "</s>"},
                           {"pad_token", nullptr},
                           {"model_max_length", 10},
                           {"additional_special_tokens", {"<a>", {{"content", "<b>"}}}}};
  nlohmann::json request = {{"messages", nlohmann::json::array()}, {"eos_token", "<override>"}};
  nlohmann::json context = chat_template_context(request, config);
  EXPECT_EQ(context["bos_token"], "<s>");
  EXPECT_EQ(context["eos_token"], "<override>");
  EXPECT_FALSE(context.contains("pad_token"));
  EXPECT_FALSE(context.contains("model_max_length"));
  EXPECT_EQ(context["additional_special_tokens"], nlohmann::json({"<a>", "<b>"}));
}

TEST(ChatTemplateContext, BadRequestsAreErrors) {
  EXPECT_THROW(chat_template_context(nlohmann::json::array(), nlohmann::json::object()), Error);
  EXPECT_THROW(chat_template_context({{"prompt", "x"}}, nlohmann::json::object()), Error);
  EXPECT_THROW(chat_template_context({{"messages", "x"}}, nlohmann::json::object()), Error);
  EXPECT_THROW(
      chat_template_context({{"messages", nlohmann::json::array()}, {"chat_template_kwargs", 3}},
                            nlohmann::json::object()),
      Error);
  EXPECT_THROW(
      chat_template_context({{"messages", nlohmann::json::array()},
                             {"chat_template_kwargs", {{"messages", nlohmann::json::array()}}}},
                            nlohmann::json::object()),
      Error);
  EXPECT_THROW(ChatTemplate("x").render(nlohmann::json::array()), Error);
}

TEST(ChatTemplateContext, OrderedJsonKeepsKeyOrderLikePythonDicts) {
  auto context = nlohmann::ordered_json::parse(
      R"({"tools": [{"type": "function", "b": 1, "a": {"z": 1, "y": 2}}]})");
  EXPECT_EQ(ChatTemplate("{{ tools[0] | tojson }}").render(context),
            R"({"type": "function", "b": 1, "a": {"z": 1, "y": 2}})");
}

TEST(ChatTemplateContext, DecodeToolCallArgumentsParsesJsonObjectStrings) {
  auto request = nlohmann::ordered_json::parse(R"({"messages": [
    {"role": "user", "content": "x"},
    {"role": "assistant", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [true]}"}},
      {"type": "function", "function": {"name": "g", "arguments": "not json"}},
      {"type": "function", "function": {"name": "h", "arguments": "[1, 2]"}},
      {"type": "function", "function": {"name": "k", "arguments": {"already": "object"}}}]}]})");
  decode_tool_call_arguments(request);
  const auto& calls = request["messages"][1]["tool_calls"];
  EXPECT_EQ(calls[0]["function"]["arguments"].dump(), R"({"b":1,"a":[true]})");
  EXPECT_EQ(calls[1]["function"]["arguments"], "not json");
  EXPECT_EQ(calls[2]["function"]["arguments"], "[1, 2]");
  EXPECT_EQ(calls[3]["function"]["arguments"]["already"], "object");
  nlohmann::ordered_json not_a_request = 3;
  decode_tool_call_arguments(not_a_request);  // ignored, no crash
  EXPECT_EQ(not_a_request, 3);
}

}  // namespace
}  // namespace megactx
