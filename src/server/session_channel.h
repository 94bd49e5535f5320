// The ResponseChannel of one request on one connection: turns respond /
// begin_stream / write / end_stream into HTTP/1.1 bytes (Content-Length for
// whole responses, chunked transfer encoding for streams) and posts them to
// the connection. Thread-safe; holds the connection only weakly so a client
// that is gone costs nothing but ignored writes.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "server/http_types.h"

namespace megactx::server {

class HttpSession;

// Status line and headers of a response; content_length < 0 means chunked.
std::string format_response_head(int status, const std::string& content_type,
                                 int64_t content_length, bool keep_alive,
                                 const std::map<std::string, std::string>& extra_headers);
// One chunk of a chunked body (empty `data` is never framed: it would end the body).
std::string format_chunk(const std::string& data);

class SessionChannel : public ResponseChannel {
 public:
  SessionChannel(std::weak_ptr<HttpSession> session, bool keep_alive, bool head_request);

  void respond(HttpResponse response) override;
  void begin_stream(int status, const std::string& content_type) override;
  void write(std::string piece) override;
  void end_stream() override;
  void on_disconnect(std::function<void()> callback) override;
  bool disconnected() const override { return disconnected_.load(); }

  // Called by the session (on its strand) when the client went away.
  void notify_disconnect();

 private:
  enum class State { Fresh, Streaming, Done };
  void post(std::string bytes, bool ends_response);

  mutable std::mutex mutex_;
  std::weak_ptr<HttpSession> session_;
  bool keep_alive_;
  bool head_request_;
  State state_ = State::Fresh;
  std::function<void()> on_disconnect_;
  std::atomic<bool> disconnected_{false};
};

}  // namespace megactx::server
