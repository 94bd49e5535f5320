// One client connection (internal to HttpServer). Reads a request, hands it
// to the handler with a SessionChannel, writes what the channel produces, and
// then reads the next request (keep-alive) or closes. Everything that touches
// the socket runs on the connection's strand.
//
// While a request is being answered the connection keeps one read open: a
// clean end of stream or a reset means the client went away (its engine
// request is aborted), bytes are the next, pipelined request and are kept for
// it. Reads and writes have deadlines of their own (a timer, not the stream's
// built-in timeout, which would close the socket before a 408 can be sent).
// A connection that closes after an error answer first drains what the client
// is still sending, so the client reads the answer instead of a reset.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "server/http_server.h"

namespace megactx::server {

class SessionChannel;

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  using Closed = std::function<void(const HttpSession*)>;
  HttpSession(boost::asio::ip::tcp::socket socket, const HttpServerOptions& options,
              const RequestHandler& handler, Closed on_closed);
  ~HttpSession();

  void start();
  // Answers `status` and closes (e.g. 503: the server is at its connection limit).
  void reject(int status, const std::string& message);
  // Closes the connection from the server side (shutdown).
  void close_from_server();

  // Called by SessionChannel from any thread; the work is posted to the strand.
  void post_output(std::string bytes, bool ends_response);

 private:
  // What the connection is doing: decides what a deadline and a read end mean.
  enum class Phase { Idle, Reading, Answering, Draining, Closed };

  void read_header();
  // Feeds the bytes read so far to the parser; reads more until the header is
  // done (then on_header) or cannot be (400).
  void parse_header();
  void on_header(boost::beast::error_code error);
  void read_body();
  void on_body(boost::beast::error_code error);
  void fail_request(int status, const std::string& message);
  void dispatch();
  void enqueue(std::string bytes, bool ends_response);
  void write_next();
  void on_write(boost::beast::error_code error, bool ends_response);
  void response_done();
  void watch_peer();
  void on_peer_read(boost::beast::error_code error, size_t bytes);
  void drain_and_close();  // reads and drops the rest of the upload, then closes
  void on_drain(boost::beast::error_code error, size_t bytes);
  // Deadlines: expiry cancels the socket's operations, whose handlers then
  // see timed_out_ and answer (408) or close.
  void arm_deadline(std::chrono::steady_clock::duration after);
  void disarm_deadline();
  bool take_timeout();
  void close();

  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer deadline_;
  uint64_t deadline_generation_ = 0;  // a timer that fired after being re-armed is stale
  bool timed_out_ = false;
  boost::beast::flat_buffer buffer_;  // bytes read past the current request
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  const HttpServerOptions& options_;
  const RequestHandler& handler_;
  Closed on_closed_;

  struct Piece {
    std::string bytes;
    bool ends_response = false;
  };
  std::deque<Piece> outgoing_;
  Phase phase_ = Phase::Idle;
  bool writing_ = false;
  bool keep_alive_ = true;
  bool watching_ = false;            // the peer read of watch_peer() is open
  bool resume_after_watch_ = false;  // the response ended while that read was open
  uint64_t drained_bytes_ = 0;
  std::string drain_scratch_;
  std::shared_ptr<SessionChannel> channel_;
};

}  // namespace megactx::server
