#include "server/http_session.h"

#include <spdlog/spdlog.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <cctype>

#include "server/api_error.h"
#include "server/json_text.h"
#include "server/session_channel.h"

namespace megactx::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

HttpSession::HttpSession(tcp::socket socket, const HttpServerOptions& options,
                         const RequestHandler& handler, Closed on_closed)
    : stream_(std::move(socket)),
      options_(options),
      handler_(handler),
      on_closed_(std::move(on_closed)) {}

HttpSession::~HttpSession() = default;

void HttpSession::start() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
}

void HttpSession::reject(int status, const std::string& message) {
  net::dispatch(stream_.get_executor(), [self = shared_from_this(), status, message] {
    self->keep_alive_ = false;
    self->fail_request(status, message);
  });
}

void HttpSession::close_from_server() {
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->close(false); });
}

void HttpSession::post_output(std::string bytes, bool ends_response) {
  net::post(stream_.get_executor(),
            [self = shared_from_this(), bytes = std::move(bytes), ends_response]() mutable {
              self->enqueue(std::move(bytes), ends_response);
            });
}

void HttpSession::read_header() {
  if (closed_) return;
  parser_.emplace();
  parser_->body_limit(options_.max_body_bytes);
  parser_->header_limit(options_.max_header_bytes);
  // Waiting for the next request on a kept-alive connection: the idle timeout.
  stream_.expires_after(options_.idle_timeout);
  http::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code error, size_t) { self->on_header(error); });
}

void HttpSession::on_header(beast::error_code error) {
  if (closed_) return;
  if (error) {
    if (error == http::error::body_limit)
      return fail_request(
          413, "request body larger than " + std::to_string(options_.max_body_bytes) + " bytes");
    if (error == http::error::header_limit)
      return fail_request(413, "request headers larger than " +
                                   std::to_string(options_.max_header_bytes) + " bytes");
    if (error == http::error::end_of_stream || error == net::error::eof ||
        error == beast::error::timeout || error == net::error::operation_aborted ||
        error == net::error::connection_reset)
      return close(true);
    return fail_request(400, "malformed HTTP request: " + error.message());
  }
  const auto& header = parser_->get();
  auto expect = header.find(http::field::expect);
  if (expect != header.end() && beast::iequals(expect->value(), "100-continue")) {
    // curl and others wait for this before sending a large body.
    auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    stream_.expires_after(options_.write_timeout);
    net::async_write(stream_, net::buffer(*interim),
                     [self = shared_from_this(), interim](beast::error_code error, size_t) {
                       if (error) return self->close(true);
                       self->read_body();
                     });
    return;
  }
  read_body();
}

void HttpSession::read_body() {
  stream_.expires_after(options_.read_timeout);
  http::async_read(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code error, size_t) { self->on_body(error); });
}

void HttpSession::on_body(beast::error_code error) {
  if (closed_) return;
  if (error) {
    if (error == http::error::body_limit)
      return fail_request(
          413, "request body larger than " + std::to_string(options_.max_body_bytes) + " bytes");
    if (error == beast::error::timeout) return fail_request(408, "timed out reading the request");
    if (error == http::error::end_of_stream || error == net::error::eof ||
        error == net::error::operation_aborted || error == net::error::connection_reset ||
        error == http::error::partial_message)
      return close(true);
    return fail_request(400, "malformed HTTP request: " + error.message());
  }
  dispatch();
}

void HttpSession::fail_request(int status, const std::string& message) {
  // The stream position is unknown after a protocol error: answer and close.
  keep_alive_ = false;
  response_pending_ = true;
  HttpResponse response = error_response(status, message);
  enqueue(
      format_response_head(response.status, response.content_type,
                           static_cast<int64_t>(response.body.size()), false, response.headers) +
          response.body,
      true);
}

void HttpSession::dispatch() {
  auto message = parser_->release();
  HttpRequest request;
  request.method = std::string(message.method_string());
  request.target = std::string(message.target());
  size_t query = request.target.find('?');
  request.path = request.target.substr(0, query);
  for (const auto& field : message) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    request.headers[name] = std::string(field.value());
  }
  request.body = std::move(message.body());
  keep_alive_ = message.keep_alive();
  response_pending_ = true;

  channel_ =
      std::make_shared<SessionChannel>(weak_from_this(), keep_alive_, request.method == "HEAD");
  stream_.expires_never();
  watch_disconnect();
  auto channel = channel_;
  try {
    handler_(request, channel);
  } catch (const std::exception& error) {
    // The router already turns handler errors into responses; this is a last guard.
    channel->respond(error_response(500, std::string("internal error: ") + error.what()));
  }
}

void HttpSession::enqueue(std::string bytes, bool ends_response) {
  if (closed_) return;
  if (ends_response) channel_.reset();
  outgoing_.push_back(Piece{std::move(bytes), ends_response});
  if (!writing_) write_next();
}

void HttpSession::write_next() {
  if (outgoing_.empty() || closed_) {
    writing_ = false;
    return;
  }
  writing_ = true;
  stream_.expires_after(options_.write_timeout);
  net::async_write(stream_, net::buffer(outgoing_.front().bytes),
                   [self = shared_from_this()](beast::error_code error, size_t) {
                     bool ends = !self->outgoing_.empty() && self->outgoing_.front().ends_response;
                     self->on_write(error, ends);
                   });
}

void HttpSession::on_write(beast::error_code error, bool ends_response) {
  if (closed_) {
    writing_ = false;
    outgoing_.clear();
    return;
  }
  if (error) return close(true);
  outgoing_.pop_front();
  if (ends_response) {
    response_pending_ = false;
    stream_.expires_never();
    if (!keep_alive_) {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      return close(false);
    }
    if (watching_) {
      // Drop the disconnect watch before reading again on the same socket.
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
    }
    writing_ = false;
    if (outgoing_.empty()) return read_header();
  }
  write_next();
}

void HttpSession::watch_disconnect() {
  if (watching_ || closed_) return;
  watching_ = true;
  stream_.socket().async_wait(
      tcp::socket::wait_read,
      [self = shared_from_this()](beast::error_code error) { self->on_readable(error); });
}

void HttpSession::on_readable(beast::error_code error) {
  watching_ = false;
  if (closed_ || !response_pending_ || error == net::error::operation_aborted) return;
  beast::error_code available_error;
  size_t available = stream_.socket().available(available_error);
  // Readable with nothing to read: the peer closed (or reset) the connection.
  // Readable with bytes: a pipelined request; it is read once this one is done.
  if (error || available_error || available == 0) close(true);
}

void HttpSession::close(bool client_went_away) {
  if (closed_) return;
  closed_ = true;
  // A write in flight still reads its buffer; on_write drops the queue then.
  if (!writing_) outgoing_.clear();
  if (channel_) {
    auto channel = std::move(channel_);
    channel->notify_disconnect();
  }
  beast::error_code ignored;
  stream_.socket().close(ignored);
  if (on_closed_) on_closed_(this);
  (void)client_went_away;
}

}  // namespace megactx::server
