// SSE framing, JSON text helpers and error objects.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/json_text.h"
#include "server/sse.h"

namespace megactx::server {
namespace {

TEST(Sse, OneDataLinePerEvent) {
  nlohmann::json payload = {{"text", "line1\nline2"}};
  std::string event = sse_event(payload);
  EXPECT_EQ(event, "data: {\"text\":\"line1\\nline2\"}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
}

TEST(JsonText, InvalidUtf8IsReplacedNotThrown) {
  EXPECT_EQ(sanitize_utf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(sanitize_utf8("a\xC3"), "a\xEF\xBF\xBD");                                // truncated
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  nlohmann::json value = {{"text", std::string("bad \xFF byte")}};
  EXPECT_EQ(dump_json(value), "{\"text\":\"bad \xEF\xBF\xBD byte\"}");
}

TEST(JsonText, RequestBodiesMustBeObjects) {
  EXPECT_EQ(parse_request_json("{\"a\":1}")["a"], 1);
  for (std::string bad : {"", "[]", "1", "{", "{\"a\":}", "nul"}) {
    try {
      parse_request_json(bad);
      ADD_FAILURE() << bad;
    } catch (const ApiError& error) {
      EXPECT_EQ(error.status(), 400);
    }
  }
}

TEST(ApiErrors, OpenAiShapeForEveryStatus) {
  struct Case {
    int status;
    const char* type;
  } cases[] = {{400, "invalid_request_error"}, {401, "authentication_error"},
               {404, "invalid_request_error"}, {405, "invalid_request_error"},
               {413, "invalid_request_error"}, {500, "internal_server_error"},
               {503, "server_overloaded"}};
  for (const auto& c : cases) {
    HttpResponse response = error_response(c.status, "why", c.status == 400 ? "field" : "");
    EXPECT_EQ(response.status, c.status);
    EXPECT_EQ(response.content_type, "application/json");
    auto body = nlohmann::json::parse(response.body);
    EXPECT_EQ(body["error"]["message"], "why");
    EXPECT_EQ(body["error"]["type"], c.type);
    EXPECT_EQ(body["error"]["code"], c.status);
    if (c.status == 400)
      EXPECT_EQ(body["error"]["param"], "field");
    else
      EXPECT_TRUE(body["error"]["param"].is_null());
  }
}

}  // namespace
}  // namespace megactx::server
