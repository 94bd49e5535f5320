// What every endpoint shares: the engine, the chat setup, the metrics, the
// server's configuration and a small worker pool. Engine callbacks arrive on
// the engine thread and must return at once, so each request's updates are
// re-posted, in order, to a strand of the worker pool where the JSON is built.
#pragma once

#include <boost/asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "engine/engine_api.h"
#include "server/chat_hook.h"
#include "server/chat_setup.h"
#include "server/metrics.h"
#include "server/weight_groups.h"

namespace megactx::server {

struct ServerConfig {
  std::string served_model_name = "default";
  std::string model_path;
  std::string api_key;                  // empty: no authentication
  int64_t max_waiting_requests = 4096;  // more waiting requests: 503
  int worker_threads = 2;
  nlohmann::json server_info = nlohmann::json::object();  // extra fields for /get_server_info
  // generation_config.json defaults (temperature, top_p, top_k) under every request.
  SamplingParams default_sampling;
  // The trainers' torch.distributed groups for NCCL weight updates.
  WeightGroupSettings weight_groups;
};

class ServerState {
 public:
  ServerState(EngineApi& engine, ServerConfig config, ChatSetup chat);
  ~ServerState();

  EngineApi& engine() { return engine_; }
  const ServerConfig& config() const { return config_; }
  const ChatSetup& chat() const { return chat_; }
  ServerMetrics& metrics() { return metrics_; }
  WeightGroups& weight_groups() { return *weight_groups_; }  // until drain()

  // "chatcmpl-<hex>" etc.: unique within this process and across restarts.
  std::string new_id(const std::string& prefix);
  // Throws ApiError 503 when the engine's queue is full.
  void check_capacity() const;

  // Submits to the engine; `on_update` runs on a worker strand, in order, one
  // call per engine update, the last one with finish != None. Exceptions in
  // `on_update` are logged, never propagated into the engine.
  void submit(GenerationRequest request, std::function<void(const RequestUpdate&)> on_update);

  // Runs `task` on a worker thread (dropped once draining began); an
  // exception it throws is logged.
  void post(std::function<void()> task);

  // Shutdown: stops taking engine updates and waits until every posted one
  // has been handled. No request may be submitted afterwards.
  void drain();

  // Runs a control call that blocks for a while (a weight update, a memory
  // release) on a thread of its own, one at a time, so neither the HTTP I/O
  // threads nor the update workers wait for it. `task` answers its channel.
  void run_control(std::function<void()> task);

  // The agent gateway (chat_hook.h); null: every chat request is a plain one.
  // Set once, before the server starts taking requests.
  void set_chat_hook(std::shared_ptr<ChatSessionHook> hook) { chat_hook_ = std::move(hook); }
  ChatSessionHook* chat_hook() const { return chat_hook_.get(); }

 private:
  EngineApi& engine_;
  ServerConfig config_;
  ChatSetup chat_;
  ServerMetrics metrics_;
  std::atomic<uint64_t> next_id_{0};
  uint64_t id_salt_;
  std::optional<boost::asio::thread_pool> workers_;
  std::optional<boost::asio::thread_pool> control_;  // one thread: run_control
  std::shared_ptr<ChatSessionHook> chat_hook_;
  // Engine callbacks may outlive this object (the engine thread stops later):
  // they post only while the gate is open.
  struct Gate {
    std::mutex mutex;
    bool open = true;
  };
  std::shared_ptr<Gate> gate_ = std::make_shared<Gate>();
  // Last: its threads answer through the control thread and the workers, so
  // it goes first.
  std::unique_ptr<WeightGroups> weight_groups_;
};

}  // namespace megactx::server
