#include "server/session_channel.h"

#include <fmt/format.h>
#include <boost/beast/http/status.hpp>

#include "server/http_session.h"

namespace megactx::server {

std::string format_response_head(int status, const std::string& content_type,
                                 int64_t content_length, bool keep_alive,
                                 const std::map<std::string, std::string>& extra_headers) {
  namespace http = boost::beast::http;
  std::string reason(http::obsolete_reason(static_cast<http::status>(status)));
  std::string head = fmt::format("HTTP/1.1 {} {}\r\nServer: megactx\r\n", status, reason);
  if (!content_type.empty()) head += fmt::format("Content-Type: {}\r\n", content_type);
  if (content_length >= 0)
    head += fmt::format("Content-Length: {}\r\n", content_length);
  else
    head += "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n";
  head += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [name, value] : extra_headers) head += fmt::format("{}: {}\r\n", name, value);
  head += "\r\n";
  return head;
}

std::string format_chunk(const std::string& data) {
  return fmt::format("{:x}\r\n", data.size()) + data + "\r\n";
}

SessionChannel::SessionChannel(std::weak_ptr<HttpSession> session, bool keep_alive,
                               bool head_request)
    : session_(std::move(session)), keep_alive_(keep_alive), head_request_(head_request) {}

void SessionChannel::post(std::string bytes, bool ends_response) {
  // Under mutex_: posts reach the strand in the order they were made.
  if (auto session = session_.lock()) session->post_output(std::move(bytes), ends_response);
}

void SessionChannel::respond(HttpResponse response) {
  std::lock_guard lock(mutex_);
  if (state_ != State::Fresh) return;
  state_ = State::Done;
  std::string bytes = format_response_head(response.status, response.content_type,
                                           static_cast<int64_t>(response.body.size()), keep_alive_,
                                           response.headers);
  if (!head_request_) bytes += response.body;
  post(std::move(bytes), true);
  session_.reset();
}

void SessionChannel::begin_stream(int status, const std::string& content_type) {
  std::lock_guard lock(mutex_);
  if (state_ != State::Fresh) return;
  state_ = State::Streaming;
  post(format_response_head(status, content_type, -1, keep_alive_, {}), false);
}

void SessionChannel::write(std::string piece) {
  std::lock_guard lock(mutex_);
  if (state_ != State::Streaming || piece.empty()) return;
  post(format_chunk(piece), false);
}

void SessionChannel::end_stream() {
  std::lock_guard lock(mutex_);
  if (state_ != State::Streaming) return;
  state_ = State::Done;
  post("0\r\n\r\n", true);
  session_.reset();
}

void SessionChannel::on_disconnect(std::function<void()> callback) {
  {
    std::lock_guard lock(mutex_);
    if (!disconnected_.load()) {
      on_disconnect_ = std::move(callback);
      return;
    }
  }
  callback();
}

void SessionChannel::notify_disconnect() {
  std::function<void()> callback;
  {
    std::lock_guard lock(mutex_);
    if (disconnected_.exchange(true)) return;
    session_.reset();
    if (state_ == State::Done) return;  // the whole answer was already handed over
    state_ = State::Done;
    callback = std::move(on_disconnect_);
  }
  if (callback) callback();
}

}  // namespace megactx::server
