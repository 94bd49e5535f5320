#include "server/http_server.h"

#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>

#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "server/http_session.h"

namespace megactx::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

struct HttpServer::Impl {
  HttpServerOptions options;
  RequestHandler handler;
  net::io_context io;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::mutex sessions_mutex;
  // The server owns its sessions; channels hold them weakly.
  std::unordered_map<const HttpSession*, std::shared_ptr<HttpSession>> sessions;
  std::atomic<bool> running{false};
  uint16_t bound_port = 0;

  Impl(HttpServerOptions options_in, RequestHandler handler_in)
      : options(std::move(options_in)),
        handler(std::move(handler_in)),
        io(std::max(1, options.io_threads)),
        acceptor(net::make_strand(io)) {}

  void accept() {
    acceptor.async_accept(
        net::make_strand(io), [this](boost::system::error_code error, tcp::socket socket) {
          if (!running.load()) return;
          if (error) {
            // Out of file descriptors and the like: keep serving the others.
            spdlog::warn("accept failed: {}", error.message());
          } else {
            boost::system::error_code ignored;
            socket.set_option(tcp::no_delay(true), ignored);
            auto session = std::make_shared<HttpSession>(std::move(socket), options, handler,
                                                         [this](const HttpSession* closed) {
                                                           std::lock_guard lock(sessions_mutex);
                                                           sessions.erase(closed);
                                                         });
            bool over_limit;
            {
              std::lock_guard lock(sessions_mutex);
              over_limit = static_cast<int64_t>(sessions.size()) >= options.max_connections;
              sessions.emplace(session.get(), session);
            }
            if (over_limit)
              session->reject(503, "too many open connections");
            else
              session->start();
          }
          accept();
        });
  }
};

HttpServer::HttpServer(HttpServerOptions options, RequestHandler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::start() {
  auto& impl = *impl_;
  boost::system::error_code error;
  auto address = net::ip::make_address(impl.options.host, error);
  if (error) fail("invalid --host '{}': {}", impl.options.host, error.message());
  tcp::endpoint endpoint(address, impl.options.port);
  impl.acceptor.open(endpoint.protocol(), error);
  if (!error) impl.acceptor.set_option(net::socket_base::reuse_address(true), error);
  if (!error) impl.acceptor.bind(endpoint, error);
  if (!error) impl.acceptor.listen(net::socket_base::max_listen_connections, error);
  if (error)
    fail("cannot listen on {}:{}: {}", impl.options.host, impl.options.port, error.message());
  impl.bound_port = impl.acceptor.local_endpoint().port();
  impl.running = true;
  impl.accept();
  for (int i = 0; i < std::max(1, impl.options.io_threads); ++i)
    impl.threads.emplace_back([&impl] { impl.io.run(); });
}

void HttpServer::stop() {
  auto& impl = *impl_;
  if (!impl.running.exchange(false)) return;
  net::post(impl.acceptor.get_executor(), [&impl] {
    boost::system::error_code ignored;
    impl.acceptor.close(ignored);
  });
  {
    std::lock_guard lock(impl.sessions_mutex);
    for (auto& [pointer, session] : impl.sessions) session->close_from_server();
  }
  impl.io.stop();
  for (auto& thread : impl.threads) thread.join();
  impl.threads.clear();
  std::lock_guard lock(impl.sessions_mutex);
  impl.sessions.clear();
}

uint16_t HttpServer::port() const {
  return impl_->bound_port;
}

int64_t HttpServer::open_connections() const {
  std::lock_guard lock(impl_->sessions_mutex);
  return static_cast<int64_t>(impl_->sessions.size());
}

}  // namespace megactx::server
