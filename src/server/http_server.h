// An asynchronous HTTP/1.1 server on Boost.Beast: a fixed number of I/O
// threads share one io_context; every connection runs on its own strand.
// Keep-alive, pipelined requests answered in order, request size limits
// (413, 431), read/idle/write timeouts (408), chunked streaming responses, and
// disconnect detection while a request is being answered.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/http_types.h"

namespace megactx::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0 = any free port (see HttpServer::port())
  int io_threads = 2;
  uint64_t max_body_bytes = 32ull << 20;   // larger bodies get 413
  uint32_t max_header_bytes = 64u << 10;   // larger headers get 431
  int64_t max_connections = 8192;          // beyond: 503 and close
  std::chrono::seconds read_timeout{30};   // one request, headers to body
  std::chrono::seconds idle_timeout{120};  // keep-alive wait for the next request
  std::chrono::seconds write_timeout{60};  // a client that stops reading
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, RequestHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts the I/O threads; throws megactx::Error when the address
  // cannot be bound.
  void start();
  // Stops accepting, closes connections and joins the threads.
  void stop();
  uint16_t port() const;
  int64_t open_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace megactx::server
