// A ResponseChannel that records what a handler sends, for tests that call
// the router directly (no sockets).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/http_types.h"

namespace megactx::server::testing {

class RecordingChannel : public ResponseChannel {
 public:
  void respond(HttpResponse response) override {
    std::lock_guard lock(mutex_);
    if (done_ || streaming_) {
      ++misuse;
      return;
    }
    status = response.status;
    content_type = response.content_type;
    body = response.body;
    headers = response.headers;
    done_ = true;
    cv_.notify_all();
  }
  void begin_stream(int status_in, const std::string& type) override {
    std::lock_guard lock(mutex_);
    if (done_ || streaming_) {
      ++misuse;
      return;
    }
    status = status_in;
    content_type = type;
    streaming_ = true;
  }
  void write(std::string piece) override {
    std::lock_guard lock(mutex_);
    if (!streaming_ || done_) {
      ++misuse;
      return;
    }
    pieces.push_back(piece);
    body += piece;
  }
  void end_stream() override {
    std::lock_guard lock(mutex_);
    if (!streaming_ || done_) {
      ++misuse;
      return;
    }
    done_ = true;
    cv_.notify_all();
  }
  void on_disconnect(std::function<void()> callback) override {
    std::lock_guard lock(mutex_);
    disconnect_ = std::move(callback);
  }
  bool disconnected() const override { return false; }

  // Simulates the client going away.
  void disconnect() {
    std::function<void()> callback;
    {
      std::lock_guard lock(mutex_);
      callback = disconnect_;
    }
    if (callback) callback();
  }
  bool wait(std::chrono::seconds timeout = std::chrono::seconds(10)) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return done_; });
  }
  nlohmann::json json() const { return nlohmann::json::parse(body); }
  // The JSON payloads of "data: ..." events, without [DONE].
  std::vector<nlohmann::json> events() const {
    std::vector<nlohmann::json> out;
    size_t position = 0;
    while ((position = body.find("data: ", position)) != std::string::npos) {
      size_t end = body.find("\n\n", position);
      std::string data = body.substr(position + 6, end - position - 6);
      if (data != "[DONE]") out.push_back(nlohmann::json::parse(data));
      position = end;
    }
    return out;
  }
  bool ends_with_done() const {
    const std::string tail = "data: [DONE]\n\n";
    return body.size() >= tail.size() &&
           body.compare(body.size() - tail.size(), tail.size(), tail) == 0;
  }

  int status = 0;
  std::string content_type;
  std::string body;
  std::map<std::string, std::string> headers;
  std::vector<std::string> pieces;
  int misuse = 0;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false, streaming_ = false;
  std::function<void()> disconnect_;
};

}  // namespace megactx::server::testing
