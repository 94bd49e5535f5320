// The web UI's routes over a fake engine: the embedded files (content types,
// gzip negotiation, cache headers, ETag revalidation, 404 for unknown or
// traversing paths, no API key needed) and its JSON endpoints (/ui/stats,
// /ui/model, /tokenize) with their API-key rules.
#include <gtest/gtest.h>

#include <string>

#include "server/server_stats_json.h"
#include "server/web_ui.h"
#include "server_fixture.h"

namespace megactx::server::testing {
namespace {

using nlohmann::json;

const WebAsset* find_asset(std::string_view path) {
  for (const WebAsset& asset : web_assets())
    if (asset.path == path) return &asset;
  return nullptr;
}

WebAsset sample_asset(bool immutable) {
  WebAsset asset;
  asset.path = "/assets/app-1234.js";
  asset.content_type = "text/javascript; charset=utf-8";
  asset.body = "console.log('plain');";
  asset.gzip_body = "GZIPPED";
  asset.etag = "\"abc123\"";
  asset.immutable = immutable;
  return asset;
}

HttpRequest get(std::map<std::string, std::string> headers = {}) {
  HttpRequest request;
  request.method = "GET";
  request.path = request.target = "/assets/app-1234.js";
  request.headers = std::move(headers);
  return request;
}

TEST(WebUi, AcceptsGzipFollowsQualityValues) {
  EXPECT_TRUE(accepts_gzip("gzip"));
  EXPECT_TRUE(accepts_gzip("gzip, deflate, br, zstd"));
  EXPECT_TRUE(accepts_gzip("br;q=1.0, GZIP;q=0.5"));
  EXPECT_TRUE(accepts_gzip("x-gzip"));
  EXPECT_TRUE(accepts_gzip("*"));
  EXPECT_FALSE(accepts_gzip(""));
  EXPECT_FALSE(accepts_gzip("identity"));
  EXPECT_FALSE(accepts_gzip("br, deflate"));
  EXPECT_FALSE(accepts_gzip("gzip;q=0"));
  EXPECT_FALSE(accepts_gzip("gzip; q=0.000, br"));
  EXPECT_FALSE(accepts_gzip("*, gzip;q=0"));  // the explicit refusal wins over *
  EXPECT_FALSE(accepts_gzip("*;q=0"));
}

TEST(WebUi, GzipOnlyWhenTheClientTakesIt) {
  const WebAsset asset = sample_asset(true);
  HttpResponse plain = web_asset_response(asset, get());
  EXPECT_EQ(plain.status, 200);
  EXPECT_EQ(plain.body, asset.body);
  EXPECT_EQ(plain.content_type, "text/javascript; charset=utf-8");
  EXPECT_FALSE(plain.headers.contains("Content-Encoding"));
  EXPECT_EQ(plain.headers["Vary"], "Accept-Encoding");

  HttpResponse packed = web_asset_response(asset, get({{"accept-encoding", "gzip, br"}}));
  EXPECT_EQ(packed.body, asset.gzip_body);
  EXPECT_EQ(packed.headers["Content-Encoding"], "gzip");
  EXPECT_EQ(packed.headers["Vary"], "Accept-Encoding");

  WebAsset incompressible = asset;
  incompressible.gzip_body = {};
  HttpResponse raw = web_asset_response(incompressible, get({{"accept-encoding", "gzip"}}));
  EXPECT_EQ(raw.body, asset.body);
  EXPECT_FALSE(raw.headers.contains("Content-Encoding"));
  EXPECT_FALSE(raw.headers.contains("Vary"));
}

TEST(WebUi, CacheHeadersAndEtagRevalidation) {
  HttpResponse hashed = web_asset_response(sample_asset(true), get());
  EXPECT_EQ(hashed.headers["Cache-Control"], "public, max-age=31536000, immutable");
  EXPECT_EQ(hashed.headers["ETag"], "\"abc123\"");
  EXPECT_EQ(hashed.headers["X-Content-Type-Options"], "nosniff");

  HttpResponse page = web_asset_response(sample_asset(false), get());
  EXPECT_EQ(page.headers["Cache-Control"], "no-cache");

  for (const char* tag : {"\"abc123\"", "W/\"abc123\"", "\"old\", \"abc123\"", "*"}) {
    HttpResponse same = web_asset_response(sample_asset(false), get({{"if-none-match", tag}}));
    EXPECT_EQ(same.status, 304) << tag;
    EXPECT_TRUE(same.body.empty());
    EXPECT_EQ(same.headers["ETag"], "\"abc123\"");
  }
  HttpResponse changed =
      web_asset_response(sample_asset(false), get({{"if-none-match", "\"old\""}}));
  EXPECT_EQ(changed.status, 200);
  EXPECT_EQ(changed.body, "console.log('plain');");
}

TEST(WebUi, RootServesThePageWithoutAnApiKey) {
  ServerFixture f("secret");
  auto r = f.call("GET", "/");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->content_type, "text/html; charset=utf-8");
  EXPECT_NE(r->body.find("<html"), std::string::npos);
  EXPECT_EQ(r->headers["Cache-Control"], "no-cache");
  // No script or style from anywhere but this server.
  EXPECT_NE(r->headers["Content-Security-Policy"].find("default-src 'self'"), std::string::npos);
  if (web_assets().empty()) {
    EXPECT_FALSE(web_ui_build_note().empty());
    EXPECT_NE(r->body.find("was not built"), std::string::npos);
  } else {
    EXPECT_TRUE(web_ui_build_note().empty());
    ASSERT_NE(find_asset("/index.html"), nullptr);
    EXPECT_EQ(r->body, find_asset("/index.html")->body);
  }
}

TEST(WebUi, EveryEmbeddedFileIsServedWithItsType) {
  if (web_assets().empty()) GTEST_SKIP() << "web UI not built: " << web_ui_build_note();
  ServerFixture f("secret");
  bool saw_script = false, saw_style = false;
  for (const WebAsset& asset : web_assets()) {
    const std::string path(asset.path);
    auto r = f.call("GET", path, nullptr, {{"accept-encoding", "gzip"}});
    ASSERT_EQ(r->status, 200) << path;
    EXPECT_EQ(r->content_type, asset.content_type) << path;
    EXPECT_FALSE(asset.etag.empty()) << path;
    if (!asset.gzip_body.empty()) {
      EXPECT_EQ(r->headers["Content-Encoding"], "gzip") << path;
    }
    if (path.ends_with(".js")) {
      saw_script = true;
      EXPECT_EQ(asset.content_type, "text/javascript; charset=utf-8");
      EXPECT_TRUE(asset.immutable) << path;
      EXPECT_FALSE(asset.gzip_body.empty()) << "scripts compress well";
    }
    if (path.ends_with(".css")) {
      saw_style = true;
      EXPECT_EQ(asset.content_type, "text/css; charset=utf-8");
    }
  }
  EXPECT_TRUE(saw_script);
  EXPECT_TRUE(saw_style);
  // HEAD works like GET (the session drops the body).
  auto head = f.call("HEAD", "/");
  EXPECT_EQ(head->status, 200);
}

TEST(WebUi, UnknownAndTraversingPathsAre404) {
  ServerFixture f;
  for (const char* path : {"/assets/missing.js", "/assets/../../etc/passwd", "/../etc/passwd",
                           "/%2e%2e/%2e%2e/etc/passwd", "/assets/", "/index.htm",
                           "/samples/../../models/default/config.json", "//etc/passwd"}) {
    auto r = f.call("GET", path);
    EXPECT_EQ(r->status, 404) << path;
    EXPECT_EQ(r->content_type, "application/json") << path;
  }
  // Files are read-only.
  EXPECT_EQ(f.call("POST", "/")->status, 405);
}

TEST(WebUi, StatsAreOpenLikeMetrics) {
  ServerFixture f("secret");
  f.call("POST", "/v1/completions", {{"prompt", "ab"}, {"max_tokens", 3}},
         {{"authorization", "Bearer secret"}});
  auto r = f.call("GET", "/ui/stats");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->headers["Cache-Control"], "no-store");
  json stats = r->json();
  EXPECT_EQ(stats["engine"]["kv_pages_total"], 100);
  EXPECT_EQ(stats["engine"]["kv_pages_used"], 7);
  EXPECT_EQ(stats["engine"]["prefix_cache_hits"], 4);
  EXPECT_EQ(stats["engine"]["spec_verify_steps"], 10);
  EXPECT_EQ(stats["counters"]["generated_tokens"], 3);
  EXPECT_EQ(stats["counters"]["requests_finished"], 1);
  EXPECT_TRUE(stats["monotonic_ms"].is_number());
  const json& ttft = stats["histograms"]["time_to_first_token"];
  EXPECT_EQ(ttft["count"], 1);
  EXPECT_EQ(ttft["counts"].size(), ttft["upper_bounds"].size() + 1);  // + the +Inf bucket
  uint64_t sum = 0;
  for (const auto& n : ttft["counts"]) sum += n.get<uint64_t>();
  EXPECT_EQ(sum, 1u);
  EXPECT_TRUE(stats["histograms"].contains("time_per_output_token"));
}

TEST(WebUi, HistogramJsonHasPerBucketCounts) {
  Histogram histogram({0.1, 1.0});
  histogram.observe(0.05);
  histogram.observe(0.5);
  histogram.observe(0.7);
  histogram.observe(5.0);
  json j = histogram_json(histogram.snapshot());
  EXPECT_EQ(j["upper_bounds"], json({0.1, 1.0}));
  EXPECT_EQ(j["counts"], json({1, 2, 1}));
  EXPECT_EQ(j["count"], 4);
  EXPECT_DOUBLE_EQ(j["sum"].get<double>(), 6.25);
}

TEST(WebUi, ModelCardNeedsTheKey) {
  ServerFixture f("secret");
  EXPECT_EQ(f.call("GET", "/ui/model")->status, 401);
  auto r = f.call("GET", "/ui/model", nullptr, {{"authorization", "Bearer secret"}});
  ASSERT_EQ(r->status, 200) << r->body;
  json card = r->json();
  EXPECT_EQ(card["served_model_name"], "test-model");
  EXPECT_EQ(card["max_context_tokens"], 4096);
  EXPECT_EQ(card["vocab_size"], 258);
  EXPECT_EQ(card["api_key_required"], true);
  EXPECT_EQ(card["kv_pool"]["pages_total"], 100);
  // The fake engine's config describes no real model: a summary or the reason.
  EXPECT_TRUE(card["summary"].is_object() || card["summary_error"].is_string());
}

TEST(WebUi, TokenizeAPrompt) {
  ServerFixture f;
  auto r = f.call("POST", "/tokenize", {{"prompt", "ab"}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = r->json();
  EXPECT_EQ(body["count"], 3);  // <bos> a b: special tokens by default, as vLLM
  EXPECT_EQ(body["tokens"], json({257, 'a', 'b'}));
  EXPECT_EQ(body["max_model_len"], 4096);
  EXPECT_TRUE(body["token_strs"].is_null());

  body = f.call("POST", "/tokenize",
                {{"prompt", "ab"},
                 {"add_special_tokens", false},
                 {"return_tokens", false},
                 {"return_token_strs", true}})
             ->json();
  EXPECT_EQ(body["count"], 2);
  EXPECT_TRUE(body["tokens"].is_null());
  EXPECT_EQ(body["token_strs"], json({"a", "b"}));
}

TEST(WebUi, TokenizeMessagesRendersTheChatTemplate) {
  ServerFixture f;
  json tool = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  json request = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                  {"tools", {tool}},
                  {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto r = f.call("POST", "/tokenize", request);
  ASSERT_EQ(r->status, 200) << r->body;
  json body = r->json();
  const std::string prompt = "<tools>get_weather;</tools><|user|>hi<|assistant|><think></think>";
  EXPECT_EQ(body["prompt"], prompt);
  EXPECT_EQ(body["count"], prompt.size());  // one byte per token, no <bos> added

  // tool_choice "none" renders without tools, as the chat endpoint does.
  request["tool_choice"] = "none";
  body = f.call("POST", "/tokenize", request)->json();
  EXPECT_EQ(body["prompt"], "<|user|>hi<|assistant|><think></think>");
}

TEST(WebUi, TokenizeErrorsAndKey) {
  ServerFixture f("secret");
  EXPECT_EQ(f.call("POST", "/tokenize", {{"prompt", "ab"}})->status, 401);
  const std::map<std::string, std::string> key = {{"authorization", "Bearer secret"}};
  EXPECT_EQ(f.call("POST", "/tokenize", json::object(), key)->status, 400);
  EXPECT_EQ(f.call("POST", "/tokenize", {{"prompt", 3}}, key)->status, 400);
  EXPECT_EQ(
      f.call("POST", "/tokenize", {{"prompt", "a"}, {"messages", json::array()}}, key)->status,
      400);
  EXPECT_EQ(f.call("POST", "/tokenize", {{"messages", json::array()}}, key)->status, 400);
  EXPECT_EQ(f.call("POST", "/tokenize", {{"prompt", "a"}, {"model", "other"}}, key)->status, 404);
  auto r = f.call("POST", "/tokenize", json::array({1, 2}), key);
  EXPECT_EQ(r->status, 400) << r->body;
}

}  // namespace
}  // namespace megactx::server::testing
