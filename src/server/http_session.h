// One client connection (internal to HttpServer). Reads a request, hands it
// to the handler with a SessionChannel, writes what the channel produces, and
// then reads the next request (keep-alive) or closes. Everything that touches
// the socket runs on the connection's strand.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

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
  // Answers 503 and closes (the server is at its connection limit).
  void reject(int status, const std::string& message);
  // Closes the connection from the server side (shutdown).
  void close_from_server();

  // Called by SessionChannel from any thread; the work is posted to the strand.
  void post_output(std::string bytes, bool ends_response);

 private:
  void read_header();
  void on_header(boost::beast::error_code error);
  void read_body();
  void on_body(boost::beast::error_code error);
  void fail_request(int status, const std::string& message);
  void dispatch();
  void enqueue(std::string bytes, bool ends_response);
  void write_next();
  void on_write(boost::beast::error_code error, bool ends_response);
  void watch_disconnect();
  void on_readable(boost::beast::error_code error);
  void close(bool client_went_away);

  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  const HttpServerOptions& options_;
  const RequestHandler& handler_;
  Closed on_closed_;

  struct Piece {
    std::string bytes;
    bool ends_response = false;
  };
  std::deque<Piece> outgoing_;
  bool writing_ = false;
  bool keep_alive_ = true;
  bool closed_ = false;
  bool watching_ = false;
  bool response_pending_ = false;  // a request is being answered
  std::shared_ptr<SessionChannel> channel_;
};

}  // namespace megactx::server
