#include "gateway/http_judge.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>

#include "core/error.h"
#include "io/bounded_json.h"
#include "server/json_text.h"

namespace megactx::gateway {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

HttpEndpoint parse_judge_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    fail("--gateway-judge-url '{}': only http:// endpoints are supported", url);
  std::string rest = url.substr(scheme.size());
  HttpEndpoint endpoint;
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  if (authority.empty()) fail("--gateway-judge-url '{}' has no host", url);
  size_t colon = authority.rfind(':');
  if (authority.front() == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) fail("--gateway-judge-url '{}': unclosed '['", url);
    endpoint.host = authority.substr(1, close - 1);
    colon =
        authority.size() > close + 1 && authority[close + 1] == ':' ? close + 1 : std::string::npos;
  } else {
    endpoint.host = authority.substr(0, colon);
  }
  if (colon != std::string::npos) {
    endpoint.port = authority.substr(colon + 1);
    if (endpoint.port.empty() || endpoint.port.find_first_not_of("0123456789") != std::string::npos)
      fail("--gateway-judge-url '{}': bad port", url);
  }
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (path.empty())
    path = "/v1/chat/completions";
  else if (path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0)
    path += "/chat/completions";
  endpoint.target = path;
  return endpoint;
}

HttpReply http_post(const HttpEndpoint& endpoint, const std::string& body,
                    const std::string& api_key, int64_t timeout_seconds) {
  boost::asio::io_context io;
  tcp::resolver resolver(io);
  beast::tcp_stream stream(io);
  http::request<http::string_body> request{http::verb::post, endpoint.target, 11};
  request.set(http::field::host, endpoint.host);
  request.set(http::field::content_type, "application/json");
  if (!api_key.empty()) request.set(http::field::authorization, "Bearer " + api_key);
  request.body() = body;
  request.prepare_payload();
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(8u << 20);
  beast::error_code failure;
  const char* stage = "resolving";
  // Asynchronous steps, so that the stream's deadline covers every one.
  stream.expires_after(std::chrono::seconds(timeout_seconds));
  resolver.async_resolve(
      endpoint.host, endpoint.port,
      [&](beast::error_code error, tcp::resolver::results_type results) {
        if (error) {
          failure = error;
          return;
        }
        stage = "connecting";
        stream.async_connect(results, [&](beast::error_code error, const tcp::endpoint&) {
          if (error) {
            failure = error;
            return;
          }
          stage = "sending";
          http::async_write(stream, request, [&](beast::error_code error, size_t) {
            if (error) {
              failure = error;
              return;
            }
            stage = "reading";
            http::async_read(stream, buffer, parser, [&](beast::error_code error, size_t) {
              if (error) failure = error;
            });
          });
        });
      });
  io.run();
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  if (failure)
    fail("judge endpoint {}:{}{}: {} failed: {}", endpoint.host, endpoint.port, endpoint.target,
         stage, failure.message());
  return {static_cast<int>(parser.get().result_int()), parser.get().body()};
}

HttpJudge::HttpJudge(JudgeConfig config, int threads)
    : config_(std::move(config)),
      endpoint_(parse_judge_url(config_.endpoint)),
      pool_(std::make_unique<boost::asio::thread_pool>(static_cast<size_t>(threads))) {}

HttpJudge::~HttpJudge() {
  shutdown();
}

void HttpJudge::shutdown() {
  if (stopped_.exchange(true)) return;
  pool_->stop();
  pool_->join();
}

void HttpJudge::judge(const JudgeCase& item, std::function<void(Verdict)> done) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (stopped_.load()) return done({VerdictKind::Failed, "the server is shutting down", 0.0});
  const std::string body = server::dump_json(
      judge_request_body(item, config_.model, config_.max_tokens, /*template_kwargs=*/false));
  boost::asio::post(*pool_, [this, body, done = std::move(done), elapsed] {
    Verdict verdict;
    try {
      const HttpReply reply = http_post(endpoint_, body, config_.api_key, config_.timeout_seconds);
      const nlohmann::json response = try_parse_json(reply.body);
      if (reply.status != 200) {
        verdict = {VerdictKind::Failed,
                   "the judge endpoint answered " + std::to_string(reply.status) + ": " +
                       server::sanitize_utf8(reply.body.substr(0, 200)),
                   0.0};
      } else if (response.is_discarded() || !response.contains("choices") ||
                 !response["choices"].is_array() || response["choices"].empty() ||
                 !response["choices"][0].is_object() ||
                 !response["choices"][0].contains("message") ||
                 !response["choices"][0]["message"].is_object()) {
        verdict = {VerdictKind::Unparseable, "the judge endpoint's answer has no message", 0.0};
      } else {
        const nlohmann::json& message = response["choices"][0]["message"];
        const std::string content = message.contains("content") && message["content"].is_string()
                                        ? message["content"].get<std::string>()
                                        : std::string();
        verdict = parse_verdict(content);
      }
    } catch (const std::exception& error) {
      verdict = {VerdictKind::Failed, error.what(), 0.0};
    }
    verdict.seconds = elapsed();
    done(verdict);
  });
}

}  // namespace megactx::gateway
