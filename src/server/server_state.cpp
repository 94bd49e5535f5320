#include "server/server_state.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

#include <chrono>
#include <random>

#include "server/api_error.h"

namespace megactx::server {

ServerState::ServerState(EngineApi& engine, ServerConfig config, ChatSetup chat)
    : engine_(engine), config_(std::move(config)), chat_(std::move(chat)) {
  std::random_device device;
  id_salt_ = (static_cast<uint64_t>(device()) << 32) ^ device() ^
             static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  workers_.emplace(static_cast<size_t>(std::max(1, config_.worker_threads)));
  control_.emplace(1);
  weight_groups_ = std::make_unique<WeightGroups>(config_.weight_groups);
}

void ServerState::run_control(std::function<void()> task) {
  if (!control_) return;  // shut down: the request's connection is going too
  boost::asio::post(*control_, std::move(task));
}

ServerState::~ServerState() {
  drain();
}

std::string ServerState::new_id(const std::string& prefix) {
  uint64_t n = next_id_.fetch_add(1);
  // A 64-bit mix of salt and counter: distinct per request, not guessable.
  uint64_t x = id_salt_ + n * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return fmt::format("{}{:016x}{:x}", prefix, x, n);
}

void ServerState::check_capacity() const {
  EngineStats stats = engine_.stats();
  if (stats.waiting_requests >= config_.max_waiting_requests)
    throw ApiError(503,
                   fmt::format("server overloaded: {} requests waiting (limit {}); retry later",
                               stats.waiting_requests, config_.max_waiting_requests));
}

void ServerState::submit(GenerationRequest request,
                         std::function<void(const RequestUpdate&)> on_update) {
  auto strand = std::make_shared<boost::asio::strand<boost::asio::thread_pool::executor_type>>(
      boost::asio::make_strand(workers_->get_executor()));
  auto timer = std::make_shared<RequestTimer>(metrics_);
  auto handler = std::make_shared<std::function<void(const RequestUpdate&)>>(std::move(on_update));
  engine_.submit(std::move(request),
                 [gate = gate_, strand, timer, handler](const RequestUpdate& update) {
                   std::lock_guard lock(gate->mutex);
                   if (!gate->open) return;
                   boost::asio::post(*strand, [timer, handler, update] {
                     try {
                       timer->observe(update);
                       (*handler)(update);
                     } catch (const std::exception& error) {
                       spdlog::error("request {}: failed to handle an engine update: {}",
                                     update.rid, error.what());
                     }
                   });
                 });
}

void ServerState::post(std::function<void()> task) {
  std::lock_guard lock(gate_->mutex);
  if (!gate_->open || !workers_) return;
  boost::asio::post(*workers_, [task = std::move(task)] {
    try {
      task();
    } catch (const std::exception& error) {
      spdlog::error("a server task failed: {}", error.what());
    }
  });
}

void ServerState::drain() {
  {
    std::lock_guard lock(gate_->mutex);
    gate_->open = false;
  }
  if (chat_hook_) chat_hook_->shutdown();
  // Before the control thread: a group's last answer may still go through it.
  weight_groups_.reset();
  if (control_) {
    control_->join();
    control_.reset();
  }
  if (!workers_) return;
  workers_->join();  // also waits for handlers posted meanwhile
  workers_.reset();
}

}  // namespace megactx::server
