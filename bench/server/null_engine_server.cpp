// null_engine_server --port P [--step-us 2000] [--io-threads 2]
// The real HttpServer, router and endpoints over a null engine: every step
// (default 2 ms, like a fast decode step) each live request gets one token,
// one byte of a fixed text. No model runs, so what the load generator
// measures against it is the HTTP/JSON/SSE layer: connections, parsing,
// chunk framing, engine-update hand-off. Loopback only.
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "engine/engine_api.h"
#include "io/model_config.h"
#include "server/endpoints.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

namespace megactx::bench {
namespace {

// One token per byte; 256 = <eos>.
class ByteTokenizer : public Tokenizer {
 public:
  std::vector<TokenId> encode(std::string_view text, bool) const override {
    return {text.begin(), text.end()};
  }
  std::string decode(const std::vector<TokenId>& ids, bool) const override {
    std::string out;
    for (TokenId id : ids)
      if (id < 256) out += static_cast<char>(id);
    return out;
  }
  int64_t vocab_size() const override { return 8192; }
  std::optional<TokenId> token_to_id(std::string_view) const override { return std::nullopt; }
  std::string id_to_token(TokenId id) const override { return decode({id}, false); }
  bool is_special(TokenId id) const override { return id >= 256; }
  std::string token_bytes(TokenId id) const override { return decode({id}, false); }
};

class NullEngine : public EngineApi {
 public:
  explicit NullEngine(std::chrono::microseconds step) : step_(step), thread_([this] { loop(); }) {
    config_.model_type_name = "glm_moe_dsa";
  }
  ~NullEngine() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void submit(GenerationRequest request, UpdateCallback on_update) override {
    std::lock_guard lock(mutex_);
    std::string rid = request.rid;
    live_[rid] = Live{std::move(request), std::move(on_update), 0, false};
    wake_.notify_all();
  }
  bool abort(const std::string& rid) override {
    std::lock_guard lock(mutex_);
    auto it = live_.find(rid);
    if (it == live_.end()) return false;
    it->second.aborted = true;
    return true;
  }
  void abort_all() override {
    std::lock_guard lock(mutex_);
    for (auto& [rid, live] : live_) live.aborted = true;
  }
  bool flush_cache() override { return true; }
  EngineStats stats() const override {
    std::lock_guard lock(mutex_);
    EngineStats stats;
    stats.running_requests = static_cast<int64_t>(live_.size());
    return stats;
  }
  const Tokenizer& tokenizer() const override { return tokenizer_; }
  const ModelConfig& model_config() const override { return config_; }
  int64_t max_context_tokens() const override { return 1 << 20; }
  // The HTTP benchmark never drives the RL control routes.
  void pause(PauseMode) override { fail("the null engine does not pause"); }
  void resume() override {}
  bool paused() const override { return false; }
  WeightUpdateResult update_weights(const WeightUpdateRequest&) override {
    fail("the null engine has no weights");
  }
  std::string weight_version() const override { return "default"; }
  void set_weight_version(const std::string&) override {}
  Tensor weight_by_name(const std::string& name) override {
    fail("the null engine has no tensor '{}'", name);
  }
  void release_memory(const MemoryTags&) override { fail("the null engine holds no memory"); }
  void resume_memory(const MemoryTags&) override {}

 private:
  struct Live {
    GenerationRequest request;
    UpdateCallback callback;
    int64_t generated = 0;
    bool aborted = false;
  };
  void loop() {
    static const std::string text = "The quick brown fox jumps over the lazy dog. ";
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      wake_.wait(lock, [&] { return stopping_ || !live_.empty(); });
      if (stopping_) return;
      std::vector<std::pair<UpdateCallback, RequestUpdate>> out;
      out.reserve(live_.size());
      for (auto it = live_.begin(); it != live_.end();) {
        Live& live = it->second;
        RequestUpdate update;
        update.rid = it->first;
        update.prompt_tokens = static_cast<int64_t>(live.request.input_ids.size());
        if (live.aborted) {
          update.finish = FinishReason::Abort;
        } else {
          TokenId token = static_cast<unsigned char>(text[live.generated % text.size()]);
          update.new_token_ids = {token};
          update.new_text = std::string(1, static_cast<char>(token));
          if (live.request.return_logprob) update.new_logprobs = {{token, -0.25f, {}, {}}};
          live.generated += 1;
          if (live.generated >= live.request.sampling.max_new_tokens)
            update.finish = FinishReason::Length;
        }
        update.completion_tokens = live.generated;
        bool done = update.finish != FinishReason::None;
        out.emplace_back(live.callback, std::move(update));
        it = done ? live_.erase(it) : std::next(it);
      }
      lock.unlock();
      for (auto& [callback, update] : out) callback(update);
      std::this_thread::sleep_for(step_);
      lock.lock();
    }
  }

  std::chrono::microseconds step_;
  ByteTokenizer tokenizer_;
  ModelConfig config_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::string, Live> live_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace
}  // namespace megactx::bench

int main(int argc, char** argv) {
  using namespace megactx;
  CLI::App app{"HTTP server over a null engine (benchmark of the HTTP layer)"};
  int port = 30001, io_threads = 2, step_us = 2000;
  app.add_option("--port", port)->capture_default_str();
  app.add_option("--io-threads", io_threads)->capture_default_str();
  app.add_option("--step-us", step_us, "engine step period")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  bench::NullEngine engine{std::chrono::microseconds(step_us)};
  server::ServerConfig config;
  config.served_model_name = "default";
  config.model_path = "null";
  config.max_waiting_requests = 1 << 20;
  server::ServerState state(engine, config, server::ChatSetup{});
  server::Router router = server::make_router(state);
  server::HttpServerOptions options;
  options.host = "127.0.0.1";  // loopback only
  options.port = static_cast<uint16_t>(port);
  options.io_threads = io_threads;
  server::HttpServer http(options, [&router](const server::HttpRequest& request,
                                             std::shared_ptr<server::ResponseChannel> channel) {
    router.handle(request, std::move(channel));
  });
  http.start();
  std::printf("null engine serving at http://127.0.0.1:%u\n", http.port());
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  http.stop();
  engine.abort_all();
  state.drain();
  return 0;
}
