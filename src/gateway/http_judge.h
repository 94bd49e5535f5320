// A judge behind an OpenAI-compatible HTTP endpoint (--gateway-judge-url):
// POST {base}/v1/chat/completions with the verdict schema as response_format,
// on threads of its own with a deadline per request. Plain HTTP only (a
// judge runs beside the trainer); the URL is checked at start-up.
#pragma once

#include <boost/asio/thread_pool.hpp>

#include <atomic>
#include <memory>
#include <string>

#include "gateway/gateway_config.h"
#include "gateway/judge.h"

namespace megactx::gateway {

struct HttpEndpoint {
  std::string host;
  std::string port = "80";
  std::string target;  // the path of the chat completions route
};

// "http://host[:port][/path]"; without a path, /v1/chat/completions; a path
// ending in /v1 gets /chat/completions appended. Throws megactx::Error.
HttpEndpoint parse_judge_url(const std::string& url);

class HttpJudge : public Judge {
 public:
  explicit HttpJudge(JudgeConfig config, int threads = 2);
  ~HttpJudge() override;
  void judge(const JudgeCase& item, std::function<void(Verdict)> done) override;
  void shutdown() override;

 private:
  JudgeConfig config_;
  HttpEndpoint endpoint_;
  std::unique_ptr<boost::asio::thread_pool> pool_;
  std::atomic<bool> stopped_{false};
};

// One POST with a deadline: the response's status and body. Throws
// megactx::Error on connection, timeout or protocol failures.
struct HttpReply {
  int status = 0;
  std::string body;
};
HttpReply http_post(const HttpEndpoint& endpoint, const std::string& body,
                    const std::string& api_key, int64_t timeout_seconds);

}  // namespace megactx::gateway
