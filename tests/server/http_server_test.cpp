// HttpServer over real loopback sockets: keep-alive, pipelining, chunked
// streaming, size limits (413, 431), timeouts (408), malformed requests
// (400), 100-continue, the connection limit (503), a client disconnect
// cancelling its request, and thousands of short requests all answered.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <random>
#include <thread>

#include "server/http_server.h"
#include "server/json_text.h"
#include "server/session_channel.h"
#include "server_fixture.h"

namespace megactx::server::testing {
namespace {

using nlohmann::json;

// A blocking loopback client that reads with a deadline.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawClient() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }
  void send(const std::string& bytes) { send_all(bytes); }
  // Returns how many bytes went out before an error (EPIPE, ECONNRESET).
  size_t send_all(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    return sent;
  }
  void clear() { buffer_.clear(); }
  // Reads until `done(buffer)` or EOF or 10 s; returns everything read.
  std::string read_until(const std::function<bool(const std::string&)>& done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done(buffer_) && std::chrono::steady_clock::now() < deadline) {
      pollfd poll_fd{fd_, POLLIN, 0};
      if (::poll(&poll_fd, 1, 100) <= 0) continue;
      char chunk[65536];
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) {
        eof_ = true;
        break;
      }
      buffer_.append(chunk, static_cast<size_t>(n));
    }
    return buffer_;
  }
  // One complete response with Content-Length (removed from the buffer).
  std::string read_response() {
    read_until([](const std::string& b) {
      size_t head = b.find("\r\n\r\n");
      if (head == std::string::npos) return false;
      size_t length_at = b.find("Content-Length: ");
      if (length_at == std::string::npos || length_at > head) return true;
      size_t length = std::stoul(b.substr(length_at + 16));
      return b.size() >= head + 4 + length;
    });
    size_t head = buffer_.find("\r\n\r\n");
    if (head == std::string::npos) return std::exchange(buffer_, {});
    size_t length_at = buffer_.find("Content-Length: ");
    size_t end = head + 4;
    if (length_at != std::string::npos && length_at < head)
      end += std::stoul(buffer_.substr(length_at + 16));
    end = std::min(end, buffer_.size());
    std::string response = buffer_.substr(0, end);
    buffer_.erase(0, end);
    return response;
  }
  bool eof() {
    read_until([](const std::string&) { return false; });
    return eof_;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string buffer_;
};

std::string post(const std::string& path, const std::string& body, const std::string& extra = {}) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}

int status_of(const std::string& response) {
  if (response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

std::string body_of(const std::string& response) {
  size_t head = response.find("\r\n\r\n");
  return head == std::string::npos ? std::string() : response.substr(head + 4);
}

struct LiveServer {
  explicit LiveServer(HttpServerOptions options = {}) {
    options.port = 0;
    server = std::make_unique<HttpServer>(
        options, [this](const HttpRequest& request, std::shared_ptr<ResponseChannel> channel) {
          fixture.router.handle(request, std::move(channel));
        });
    server->start();
  }
  ~LiveServer() { server->stop(); }
  uint16_t port() const { return server->port(); }
  ServerFixture fixture;
  std::unique_ptr<HttpServer> server;
};

TEST(HttpServer, KeepAliveServesManyRequestsOnOneConnection) {
  LiveServer live;
  RawClient client(live.port());
  ASSERT_TRUE(client.connected());
  for (int i = 0; i < 3; ++i) {
    client.send("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string response = client.read_response();
    EXPECT_EQ(status_of(response), 200) << response;
    EXPECT_NE(response.find("Connection: keep-alive"), std::string::npos);
    EXPECT_EQ(json::parse(body_of(response))["data"][0]["id"], "test-model");
  }
}

TEST(HttpServer, PipelinedRequestsAnsweredInOrder) {
  LiveServer live;
  RawClient client(live.port());
  std::string generate =
      post("/generate", R"({"input_ids":[1],"sampling_params":{"max_new_tokens":2}})");
  client.send(generate + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
              "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string first = client.read_response();
  EXPECT_EQ(status_of(first), 200);
  EXPECT_EQ(json::parse(body_of(first))["text"], "He");
  EXPECT_EQ(status_of(client.read_response()), 200);
  EXPECT_EQ(status_of(client.read_response()), 404);
}

TEST(HttpServer, StreamsChunkedSse) {
  LiveServer live;
  RawClient client(live.port());
  client.send(post("/generate",
                   R"({"input_ids":[1],"stream":true,"sampling_params":{"max_new_tokens":2}})"));
  std::string all = client.read_until(
      [](const std::string& b) { return b.find("0\r\n\r\n") != std::string::npos; });
  EXPECT_EQ(status_of(all), 200);
  EXPECT_NE(all.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_NE(all.find("Content-Type: text/event-stream"), std::string::npos);
  // De-chunk and check the SSE events.
  std::string body = body_of(all), events;
  size_t position = 0;
  while (true) {
    size_t line_end = body.find("\r\n", position);
    size_t size = std::stoul(body.substr(position, line_end - position), nullptr, 16);
    if (size == 0) break;
    events += body.substr(line_end + 2, size);
    position = line_end + 2 + size + 2;
  }
  EXPECT_EQ(events.substr(events.size() - 14), "data: [DONE]\n\n");
  EXPECT_NE(events.find("\"text\":\"He\""), std::string::npos);
  // The connection stays usable after a stream.
  client.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string rest = client.read_until([](const std::string& b) {
    return b.find("HTTP/1.1 200", b.find("0\r\n\r\n")) != std::string::npos;
  });
  EXPECT_NE(rest.find("HTTP/1.1 200", rest.find("0\r\n\r\n")), std::string::npos);
}

TEST(HttpServer, BodyOverLimitIs413) {
  HttpServerOptions options;
  options.max_body_bytes = 1000;
  LiveServer live(options);
  RawClient client(live.port());
  client.send(post("/generate", std::string(5000, ' ')));
  std::string response = client.read_response();
  EXPECT_EQ(status_of(response), 413) << response;
  EXPECT_EQ(json::parse(body_of(response))["error"]["code"], 413);
  EXPECT_TRUE(client.eof());  // closed after a protocol-level error
}

TEST(HttpServer, UploadOverLimitStillReadsThe413) {
  // The client sends its whole body before it reads (as Node's http client
  // does); closing with the upload unread would reset the connection and the
  // client would see EPIPE or ECONNRESET instead of the answer.
  HttpServerOptions options;
  options.max_body_bytes = 1000;
  LiveServer live(options);
  RawClient client(live.port());
  std::string request = post("/generate", std::string(8u << 20, ' '));
  EXPECT_EQ(client.send_all(request), request.size());
  std::string response = client.read_response();
  EXPECT_EQ(status_of(response), 413) << response;
  EXPECT_TRUE(client.eof());
}

TEST(HttpServer, HugeHeaderIs431) {
  HttpServerOptions options;
  options.max_header_bytes = 2048;
  LiveServer live(options);
  RawClient client(live.port());
  client.send("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4096, 'a') + "\r\n\r\n");
  std::string response = client.read_response();
  EXPECT_EQ(status_of(response), 431) << response;
  EXPECT_EQ(json::parse(body_of(response))["error"]["code"], 431);
}

TEST(HttpServer, SlowBodyGets408) {
  HttpServerOptions options;
  options.read_timeout = std::chrono::seconds(1);
  LiveServer live(options);
  RawClient client(live.port());
  client.send("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"input");
  std::string response = client.read_response();
  EXPECT_EQ(status_of(response), 408) << response;
  EXPECT_EQ(json::parse(body_of(response))["error"]["code"], 408);
  EXPECT_TRUE(client.eof());
}

TEST(HttpServer, StalledHeadersGet408) {
  HttpServerOptions options;
  options.idle_timeout = std::chrono::seconds(1);
  LiveServer live(options);
  RawClient client(live.port());
  client.send("GET /health HTTP/1.1\r\nHost: x\r\n");  // never finishes the headers
  EXPECT_EQ(status_of(client.read_response()), 408);
  EXPECT_TRUE(client.eof());
}

// Every one of many short requests gets a whole answer. A wake-up for a
// readable socket whose bytes the next request had already taken used to be
// read as a closed peer: the request was aborted and its connection closed
// with nothing written (about 1 in 2,000 requests through the real server).
TEST(HttpServer, ThousandsOfShortRequestsAllAnswered) {
  LiveServer live;
  constexpr int kClients = 8, kRequestsPerClient = 1500;
  std::atomic<int> complete{0};
  std::vector<std::string> failures;
  std::mutex failures_mutex;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c)
    clients.emplace_back([&, c] {
      auto client = std::make_unique<RawClient>(live.port());
      for (int i = 0; i < kRequestsPerClient; ++i) {
        // Half the clients reuse their connection, half open one per request.
        if (c % 2 && i > 0) client = std::make_unique<RawClient>(live.port());
        bool stream = i % 3 == 0;
        client->send(post("/generate", std::string(R"({"input_ids":[1],"stream":)") +
                                           (stream ? "true" : "false") +
                                           R"(,"sampling_params":{"max_new_tokens":1}})"));
        std::string response = stream ? client->read_until([](const std::string& b) {
          return b.find("0\r\n\r\n") != std::string::npos;
        })
                                      : client->read_response();
        if (stream) client->clear();
        bool ok = status_of(response) == 200 &&
                  (stream ? response.find("[DONE]") != std::string::npos
                          : response.find("\"text\":\"H\"") != std::string::npos);
        if (ok) {
          ++complete;
        } else {
          std::lock_guard lock(failures_mutex);
          failures.push_back("client " + std::to_string(c) + " request " + std::to_string(i) +
                             ": '" + response.substr(0, 200) + "'");
          client = std::make_unique<RawClient>(live.port());
        }
      }
    });
  for (auto& thread : clients) thread.join();
  EXPECT_EQ(complete.load(), kClients * kRequestsPerClient);
  for (size_t i = 0; i < std::min<size_t>(failures.size(), 5); ++i) ADD_FAILURE() << failures[i];
  EXPECT_TRUE(live.fixture.engine.aborted().empty())
      << live.fixture.engine.aborted().size() << " requests were aborted";
}

TEST(HttpServer, MalformedRequestsGet400AndServerSurvives) {
  LiveServer live;
  std::vector<std::string> garbage = {
      "NOT HTTP AT ALL\r\n\r\n",
      "GET / HTTP/9.9\r\n\r\n",
      "POST /generate HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
      "POST /generate HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
      "POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      std::string("GET /\0 HTTP/1.1\r\n\r\n", 19),
      // A version field shorter than "HTTP/1.1" before the blank line: the
      // parser wanted more bytes and the client waited for the idle timeout.
      "GARBAGE a b\r\n\r\n",
      "GET / HTTP/1\r\n\r\n",
      "GARBAGE ^6Pf\x9f\xe1\x88\xb0"
      "6^\x9c'\xf1n\xf1\xe6 \x1b\xb0~\r\n\r\n",
  };
  for (const auto& bytes : garbage) {
    RawClient client(live.port());
    client.send(bytes);
    std::string response = client.read_response();
    EXPECT_EQ(status_of(response), 400) << bytes;
  }
  // Random bytes: any answer or a close, never a crash.
  std::mt19937 random(7);
  for (int i = 0; i < 50; ++i) {
    RawClient client(live.port());
    std::string bytes(1 + random() % 300, '\0');
    for (char& c : bytes) c = static_cast<char>(random() % 256);
    if (i % 2)
      bytes = "POST /generate HTTP/1.1\r\nContent-Length: " + std::to_string(bytes.size()) +
              "\r\n\r\n" + bytes;
    client.send(bytes);
    client.close();
  }
  RawClient healthy(live.port());
  healthy.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(status_of(healthy.read_response()), 200);
}

TEST(HttpServer, ChunkedRequestBodyAndExpectContinue) {
  LiveServer live;
  RawClient client(live.port());
  std::string body = R"({"input_ids":[1],"sampling_params":{"max_new_tokens":1}})";
  client.send("POST /generate HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
              std::to_string(body.size()) + "\r\n\r\n");
  std::string interim = client.read_until(
      [](const std::string& b) { return b.find("\r\n\r\n") != std::string::npos; });
  EXPECT_EQ(interim.rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u);
  client.read_response();  // drops the interim response
  client.send(body);
  EXPECT_EQ(json::parse(body_of(client.read_response()))["text"], "H");

  char size[16];
  std::snprintf(size, sizeof(size), "%zx", body.size());
  client.send("POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
              std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n");
  std::string chunked = client.read_response();
  EXPECT_EQ(status_of(chunked), 200) << chunked;
}

TEST(HttpServer, ConnectionCloseIsHonoured) {
  LiveServer live;
  RawClient client(live.port());
  client.send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  std::string response = client.read_response();
  EXPECT_EQ(status_of(response), 200);
  EXPECT_NE(response.find("Connection: close"), std::string::npos);
  EXPECT_TRUE(client.eof());
}

TEST(HttpServer, ConnectionLimitGives503) {
  HttpServerOptions options;
  options.max_connections = 2;
  LiveServer live(options);
  RawClient a(live.port()), b(live.port());
  a.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  b.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(status_of(a.read_response()), 200);
  EXPECT_EQ(status_of(b.read_response()), 200);
  RawClient c(live.port());
  EXPECT_EQ(status_of(c.read_response()), 503);
}

TEST(HttpServer, ClientDisconnectAbortsEngineRequest) {
  LiveServer live;
  live.fixture.engine.hold_after = 2;
  {
    RawClient client(live.port());
    client.send(post("/generate", R"({"input_ids":[1],"rid":"streaming","stream":true})"));
    client.read_until([](const std::string& b) { return b.find("\"He\"") != std::string::npos; });
    ASSERT_TRUE(live.fixture.engine.wait_for_held(1));
  }  // closes the socket mid-stream
  auto wait_for_aborts = [&](size_t count) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (live.fixture.engine.aborted().size() < count &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  wait_for_aborts(1);
  EXPECT_EQ(live.fixture.engine.aborted(), std::vector<std::string>{"streaming"});
  {
    RawClient client(live.port());
    client.send(post("/generate", R"({"input_ids":[1],"rid":"blocking"})"));
    ASSERT_TRUE(live.fixture.engine.wait_for_held(1));
  }  // closes while waiting for a non-streamed answer
  wait_for_aborts(2);
  auto aborted = live.fixture.engine.aborted();
  std::sort(aborted.begin(), aborted.end());
  EXPECT_EQ(aborted, (std::vector<std::string>{"blocking", "streaming"}));
}

TEST(HttpServer, IdleConnectionTimesOut) {
  HttpServerOptions options;
  options.idle_timeout = std::chrono::seconds(1);
  LiveServer live(options);
  RawClient client(live.port());
  client.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(status_of(client.read_response()), 200);
  // Then nothing: the server closes the kept-alive connection without a word
  // (read_until waits up to 10 s).
  EXPECT_TRUE(client.eof());
  EXPECT_EQ(client.read_until([](const std::string&) { return true; }), "");
}

TEST(Framing, ChunksAndHeads) {
  EXPECT_EQ(format_chunk("hello"), "5\r\nhello\r\n");
  EXPECT_EQ(format_chunk(std::string(26, 'x')), "1a\r\n" + std::string(26, 'x') + "\r\n");
  std::string head = format_response_head(404, "application/json", 12, false, {{"Allow", "GET"}});
  EXPECT_EQ(head.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u);
  EXPECT_NE(head.find("Content-Length: 12\r\n"), std::string::npos);
  EXPECT_NE(head.find("Connection: close\r\n"), std::string::npos);
  EXPECT_NE(head.find("Allow: GET\r\n"), std::string::npos);
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n");
}

}  // namespace
}  // namespace megactx::server::testing
