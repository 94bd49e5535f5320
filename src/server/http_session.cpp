#include "server/http_session.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <cctype>
#include <string_view>

#include "server/api_error.h"
#include "server/session_channel.h"

namespace megactx::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

// A pipelined request waiting behind the one being answered is kept up to
// this size; past it the connection stops reading until its turn comes.
constexpr size_t kMaxPipelinedBytes = 1u << 20;
constexpr size_t kReadChunk = 64u << 10;
// After an error answer the rest of the upload is read and dropped, up to
// this many bytes (or the read timeout), so the client sees the answer.
constexpr uint64_t kMaxDrainBytes = 256ull << 20;

bool peer_closed(beast::error_code error) {
  return error == http::error::end_of_stream || error == net::error::eof ||
         error == net::error::connection_reset || error == http::error::partial_message ||
         error == net::error::operation_aborted;
}

}  // namespace

HttpSession::HttpSession(tcp::socket socket, const HttpServerOptions& options,
                         const RequestHandler& handler, Closed on_closed)
    : socket_(std::move(socket)),
      deadline_(socket_.get_executor()),
      options_(options),
      handler_(handler),
      on_closed_(std::move(on_closed)) {}

HttpSession::~HttpSession() = default;

void HttpSession::start() {
  net::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->read_header(); });
}

void HttpSession::reject(int status, const std::string& message) {
  net::dispatch(socket_.get_executor(), [self = shared_from_this(), status, message] {
    self->fail_request(status, message);
  });
}

void HttpSession::close_from_server() {
  net::post(socket_.get_executor(), [self = shared_from_this()] { self->close(); });
}

void HttpSession::post_output(std::string bytes, bool ends_response) {
  net::post(socket_.get_executor(),
            [self = shared_from_this(), bytes = std::move(bytes), ends_response]() mutable {
              self->enqueue(std::move(bytes), ends_response);
            });
}

void HttpSession::arm_deadline(std::chrono::steady_clock::duration after) {
  const uint64_t generation = ++deadline_generation_;
  timed_out_ = false;
  deadline_.expires_after(after);
  deadline_.async_wait([self = shared_from_this(), generation](beast::error_code error) {
    if (error || generation != self->deadline_generation_ || self->phase_ == Phase::Closed) return;
    self->timed_out_ = true;
    beast::error_code ignored;
    self->socket_.cancel(ignored);
  });
}

void HttpSession::disarm_deadline() {
  ++deadline_generation_;
  timed_out_ = false;
  deadline_.cancel();
}

bool HttpSession::take_timeout() {
  bool timed_out = timed_out_;
  timed_out_ = false;
  return timed_out;
}

void HttpSession::read_header() {
  if (phase_ == Phase::Closed) return;
  phase_ = Phase::Idle;
  parser_.emplace();
  parser_->body_limit(options_.max_body_bytes);
  parser_->header_limit(options_.max_header_bytes);
  // Waiting for the next request on a kept-alive connection: the idle timeout.
  arm_deadline(options_.idle_timeout);
  parse_header();
}

// The header read of http::async_read_header (read, feed the parser, repeat)
// with one check more. Beast's parser waits for more bytes when a start line's
// version field is shorter than "HTTP/1.1", even once the blank line that ends
// the header has arrived ("GARBAGE a b\r\n\r\n"): a client that then waits for
// the answer would hang until the idle timeout. A header that has ended and
// still wants more is malformed: 400 now.
void HttpSession::parse_header() {
  if (phase_ == Phase::Closed) return;
  while (buffer_.size() > 0 && !parser_->is_header_done()) {
    beast::error_code error;
    const size_t used = parser_->put(buffer_.data(), error);
    buffer_.consume(used);
    if (error == http::error::need_more) break;
    if (error) return on_header(error);
  }
  if (parser_->is_header_done()) return on_header({});
  const std::string_view pending(static_cast<const char*>(buffer_.data().data()), buffer_.size());
  if (pending.find("\r\n\r\n") != std::string_view::npos) {
    return fail_request(400, "malformed HTTP request: the header ended inside its start line");
  }
  socket_.async_read_some(buffer_.prepare(kReadChunk),
                          [self = shared_from_this()](beast::error_code error, size_t bytes) {
                            self->buffer_.commit(bytes);
                            if (error) return self->on_header(error);
                            self->parse_header();
                          });
}

void HttpSession::on_header(beast::error_code error) {
  if (phase_ == Phase::Closed) return;
  const bool timed_out = take_timeout();
  if (error) {
    if (error == http::error::body_limit)
      return fail_request(
          413, "request body larger than " + std::to_string(options_.max_body_bytes) + " bytes");
    if (error == http::error::header_limit)
      return fail_request(431, "request headers larger than " +
                                   std::to_string(options_.max_header_bytes) + " bytes");
    // An idle keep-alive connection that times out is closed quietly; one that
    // started a request and stalled is told so.
    if (timed_out)
      return parser_->got_some() ? fail_request(408, "timed out reading the request headers")
                                 : close();
    if (peer_closed(error)) return close();
    return fail_request(400, "malformed HTTP request: " + error.message());
  }
  phase_ = Phase::Reading;
  const auto& header = parser_->get();
  auto expect = header.find(http::field::expect);
  if (expect != header.end() && beast::iequals(expect->value(), "100-continue")) {
    // curl and others wait for this before sending a large body.
    auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    arm_deadline(options_.write_timeout);
    net::async_write(socket_, net::buffer(*interim),
                     [self = shared_from_this(), interim](beast::error_code error, size_t) {
                       if (self->phase_ == Phase::Closed) return;
                       if (error) return self->close();
                       self->read_body();
                     });
    return;
  }
  read_body();
}

void HttpSession::read_body() {
  arm_deadline(options_.read_timeout);
  http::async_read(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code error, size_t) { self->on_body(error); });
}

void HttpSession::on_body(beast::error_code error) {
  if (phase_ == Phase::Closed) return;
  const bool timed_out = take_timeout();
  if (error) {
    if (timed_out) return fail_request(408, "timed out reading the request body");
    if (error == http::error::body_limit)
      return fail_request(
          413, "request body larger than " + std::to_string(options_.max_body_bytes) + " bytes");
    if (peer_closed(error)) return close();
    return fail_request(400, "malformed HTTP request: " + error.message());
  }
  disarm_deadline();
  dispatch();
}

void HttpSession::fail_request(int status, const std::string& message) {
  if (phase_ == Phase::Closed) return;
  // The stream position is unknown after a protocol error: answer and close.
  keep_alive_ = false;
  phase_ = Phase::Answering;
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
  phase_ = Phase::Answering;

  channel_ =
      std::make_shared<SessionChannel>(weak_from_this(), keep_alive_, request.method == "HEAD");
  watch_peer();
  auto channel = channel_;
  try {
    handler_(request, channel);
  } catch (const std::exception& error) {
    // The router already turns handler errors into responses; this is a last guard.
    channel->respond(error_response(500, std::string("internal error: ") + error.what()));
  }
}

void HttpSession::enqueue(std::string bytes, bool ends_response) {
  if (phase_ == Phase::Closed) return;
  if (ends_response) channel_.reset();
  outgoing_.push_back(Piece{std::move(bytes), ends_response});
  if (!writing_) write_next();
}

void HttpSession::write_next() {
  if (outgoing_.empty()) {
    // A stream waiting for the engine has no write deadline.
    writing_ = false;
    disarm_deadline();
    return;
  }
  writing_ = true;
  arm_deadline(options_.write_timeout);
  net::async_write(socket_, net::buffer(outgoing_.front().bytes),
                   [self = shared_from_this()](beast::error_code error, size_t) {
                     bool ends = !self->outgoing_.empty() && self->outgoing_.front().ends_response;
                     self->on_write(error, ends);
                   });
}

void HttpSession::on_write(beast::error_code error, bool ends_response) {
  writing_ = false;
  if (phase_ == Phase::Closed) {
    outgoing_.clear();
    return;
  }
  // A failed or timed-out write: the client stopped reading or went away.
  if (error) return close();
  outgoing_.pop_front();
  if (ends_response) return response_done();
  write_next();
}

void HttpSession::response_done() {
  disarm_deadline();
  if (!keep_alive_) {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    phase_ = Phase::Draining;
    drained_bytes_ = 0;
    arm_deadline(options_.read_timeout);
  } else {
    phase_ = Phase::Idle;
  }
  // The peer read still open finishes first (cancelled, or with bytes that
  // belong to the next request); its handler continues in the new phase.
  if (watching_) {
    beast::error_code ignored;
    socket_.cancel(ignored);
    return;
  }
  if (phase_ == Phase::Draining) return drain_and_close();
  read_header();
}

void HttpSession::watch_peer() {
  if (watching_ || phase_ != Phase::Answering || buffer_.size() >= kMaxPipelinedBytes) return;
  watching_ = true;
  socket_.async_read_some(buffer_.prepare(kReadChunk),
                          [self = shared_from_this()](beast::error_code error, size_t bytes) {
                            self->on_peer_read(error, bytes);
                          });
}

void HttpSession::on_peer_read(beast::error_code error, size_t bytes) {
  watching_ = false;
  // Bytes read while answering are the start of the next request.
  buffer_.commit(bytes);
  switch (phase_) {
    case Phase::Closed:
    case Phase::Reading:
      return;
    case Phase::Draining:
      return drain_and_close();
    case Phase::Idle:
      return read_header();
    case Phase::Answering:
      // Cancelled by a write deadline: the write's handler closes.
      if (error == net::error::operation_aborted) return;
      // End of stream or reset while the answer is not complete: the client
      // went away, and its engine request is aborted by close().
      if (error) return close();
      return watch_peer();
  }
}

void HttpSession::drain_and_close() {
  if (phase_ != Phase::Draining) return;
  buffer_.consume(buffer_.size());
  drain_scratch_.resize(kReadChunk);
  socket_.async_read_some(net::buffer(drain_scratch_),
                          [self = shared_from_this()](beast::error_code error, size_t bytes) {
                            self->on_drain(error, bytes);
                          });
}

void HttpSession::on_drain(beast::error_code error, size_t bytes) {
  if (phase_ != Phase::Draining) return;
  drained_bytes_ += bytes;
  if (error || drained_bytes_ > kMaxDrainBytes) return close();
  drain_and_close();
}

void HttpSession::close() {
  if (phase_ == Phase::Closed) return;
  phase_ = Phase::Closed;
  disarm_deadline();
  // A write in flight still reads its buffer; on_write drops the queue then.
  if (!writing_) outgoing_.clear();
  if (channel_) {
    auto channel = std::move(channel_);
    channel->notify_disconnect();
  }
  beast::error_code ignored;
  socket_.close(ignored);
  if (on_closed_) on_closed_(this);
}

}  // namespace megactx::server
