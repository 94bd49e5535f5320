// Renders the small templates of jinja_cases.txt and compares with the outputs
// Debian's python3-jinja2 produced for them (tools/fixtures/make_jinja_goldens.py,
// configured like HF's apply_chat_template). Cases where jinja2 raised must
// raise megactx::Error here too.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "chat/chat_template.h"
#include "core/error.h"

namespace megactx {
namespace {

nlohmann::ordered_json load_goldens() {
  std::ifstream file(std::string(MEGACTX_SOURCE_DIR) + "/tests/chat_template/jinja_goldens.json");
  EXPECT_TRUE(file) << "missing tests/chat_template/jinja_goldens.json";
  return nlohmann::ordered_json::parse(file);
}

TEST(JinjaGolden, MatchesPythonJinja2) {
  nlohmann::ordered_json goldens = load_goldens();
  const auto& cases = goldens.at("cases");
  ASSERT_GT(cases.size(), 50u);
  int failures = 0;
  for (const auto& c : cases) {
    std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE("case " + name);
    const std::string source = c.at("template").get<std::string>();
    if (c.contains("error")) {
      bool threw = false;
      try {
        ChatTemplate(source).render(c.at("context"));
      } catch (const Error&) {
        threw = true;
      }
      EXPECT_TRUE(threw) << "jinja2 raised " << c.at("error").get<std::string>();
      failures += !threw;
      continue;
    }
    std::string rendered;
    try {
      rendered = ChatTemplate(source).render(c.at("context"));
    } catch (const Error& error) {
      ADD_FAILURE() << "threw: " << error.what();
      ++failures;
      continue;
    }
    EXPECT_EQ(rendered, c.at("expected").get<std::string>());
    failures += rendered != c.at("expected").get<std::string>();
  }
  EXPECT_EQ(failures, 0);
}

TEST(JinjaGolden, RaiseExceptionKeepsTheTemplateMessage) {
  ChatTemplate t("{{ raise_exception('Conversation roles must alternate') }}");
  try {
    t.render(nlohmann::json::object());
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "Conversation roles must alternate");
  }
}

TEST(JinjaGolden, StrftimeNowFormatsTheCurrentDate) {
  // The clock is not a fixture; check the shape of the result instead.
  ChatTemplate t("{{ strftime_now('%Y') | length }}|{{ strftime_now('%d %b %Y') | length }}");
  EXPECT_EQ(t.render(nlohmann::json::object()), "4|11");
}

TEST(JinjaGolden, RendersTwiceWithTheSameResult) {
  ChatTemplate t(
      "{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n "
      "}}");
  nlohmann::json context = {{"xs", {1, 2, 3}}};
  EXPECT_EQ(t.render(context), "6");
  EXPECT_EQ(t.render(context), "6");
}

}  // namespace
}  // namespace megactx
