// The HTTP layer as the API handlers see it: a parsed request and a response
// channel. Handlers never touch sockets, so they are unit-tested with a fake
// channel and served by HttpServer over Boost.Beast.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace megactx::server {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // as sent, e.g. "/v1/models?x=1"
  std::string path;                            // target without the query string
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  // Header value or "" when absent (name in lower case).
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::map<std::string, std::string> headers;  // extra headers (e.g. Allow, WWW-Authenticate)
};

// Where a handler sends its answer: one complete response, or a stream
// (status + content type, then body pieces, then end). Thread-safe: engine
// callbacks write from the engine thread; the channel hands the bytes to the
// connection's own executor. Calls after the response is complete, or after
// the client went away, are ignored.
class ResponseChannel {
 public:
  virtual ~ResponseChannel() = default;
  virtual void respond(HttpResponse response) = 0;
  virtual void begin_stream(int status, const std::string& content_type) = 0;
  virtual void write(std::string piece) = 0;
  virtual void end_stream() = 0;
  // Runs `callback` once if the client disconnects before the response is
  // complete (immediately when it already has). Used to abort engine requests.
  virtual void on_disconnect(std::function<void()> callback) = 0;
  virtual bool disconnected() const = 0;
};

using RequestHandler =
    std::function<void(const HttpRequest& request, std::shared_ptr<ResponseChannel> channel)>;

}  // namespace megactx::server
