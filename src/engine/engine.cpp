#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>

#include "core/error.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "engine/cpu_sampler.h"
#include "engine/cuda_sampler.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

namespace {

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

std::unique_ptr<Engine> Engine::create(EngineConfig config, std::unique_ptr<LanguageModel> model,
                                       std::shared_ptr<const Tokenizer> tokenizer,
                                       GenerationDefaults defaults) {
  MEGACTX_CHECK(model != nullptr, "engine: no model");
  MEGACTX_CHECK(tokenizer != nullptr, "engine: no tokenizer");
  std::unique_ptr<Engine> engine(
      new Engine(std::move(config), std::move(model), std::move(tokenizer), std::move(defaults)));
  if (engine->config_.run_thread) {
    engine->thread_ = std::thread([raw = engine.get()] { raw->thread_main(); });
  }
  return engine;
}

Engine::Engine(EngineConfig config, std::unique_ptr<LanguageModel> model,
               std::shared_ptr<const Tokenizer> tokenizer, GenerationDefaults defaults)
    : config_(std::move(config)),
      model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      defaults_(std::move(defaults)),
      weights_(config_.model_dir) {
  const ModelConfig& model_config = model_->config();
  MEGACTX_CHECK(config_.speculative_steps >= 0, "speculative_steps must be >= 0, got {}",
                config_.speculative_steps);
  // Data-parallel attention: each rank's pages hold its own requests (MTP
  // runs too: the group leader sends each rank its own sequences' rows), and
  // so do its offload pages with the live host tier.
  const int ranks = model_->data_parallel_ranks();
  if (config_.speculative_steps > 0) speculator_ = std::make_unique<Speculator>(config_, *model_);
  capacity_ = plan_kv_capacity(
      model_config, config_.kv_dtype, config_.kv_memory_bytes, config_.page_size,
      config_.speculative_steps > 0,
      [this](const KvCacheSpec& whole) { return model_->kv_cache_shares(whole); }, ranks);
  capacity_.spec.device = model_->device();
  if (config_.host_latent_memory_bytes > 0) plan_offload_pages();
  spdlog::info("{}", capacity_.summary());
  int64_t context =
      config_.context_length > 0 ? config_.context_length : model_config.max_position_embeddings;
  if (context <= 0) context = capacity_.max_tokens;
  max_total_tokens_ = std::min(context, capacity_.max_tokens);
  if (capacity_.spec.offload_pages > 0) {
    // A request may hold every offload page and all but two device pages
    // (its unmoved tail and a chunk: Scheduler shortens chunks to fit), of
    // its rank with data-parallel attention.
    const KvCacheSpec& spec = capacity_.spec;
    const int64_t offload_per_rank = spec.offload_pages / ranks;
    max_total_tokens_ =
        std::min(context, (offload_per_rank + std::max<int64_t>(capacity_.pages_per_rank - 2, 0)) *
                              spec.page_size);
    max_total_tokens_ = std::max(max_total_tokens_, std::min(context, capacity_.max_tokens));
  }
  vocab_size_ = model_config.vocab_size;
  MEGACTX_CHECK(vocab_size_ > 0, "model config has no vocab_size");

  cache_ = model_->make_kv_cache(capacity_.spec);
  MEGACTX_CHECK(cache_->spec().device == model_->device(),
                "engine: the KV cache is on the {} but the model on the {}",
                cache_->spec().device == Device::CUDA ? "GPU" : "host",
                model_->device() == Device::CUDA ? "GPU" : "host");
  allocator_ = std::make_unique<PageAllocator>(capacity_.spec.num_pages,
                                               capacity_.spec.offload_pages, ranks);
  if (config_.record_routed_experts) {
    const int64_t host_pages =
        config_.host_kv_memory_bytes / capacity_.bytes_per_page * capacity_.data_parallel_ranks;
    routed_ = std::make_unique<RoutedExpertsTable>(
        capacity_.spec.total_pages(), host_pages, config_.page_size, model_config.num_hidden_layers,
        std::max<int64_t>(model_config.num_experts_per_tok, 1));
  }
  if (capacity_.spec.offload_pages > 0) {
    offload_copy_ = model_->kv_page_copy();
    if (routed_) offload_copy_ = routed_->wrap(std::move(offload_copy_), *cache_);
  }
  if (config_.host_kv_memory_bytes > 0) create_host_tier();
  std::vector<PrefixCache*> prefix_caches;
  for (int rank = 0; rank < ranks; ++rank) {
    prefix_caches_.push_back(
        std::make_unique<PrefixCache>(*allocator_, config_.page_size, host_tier_.get(), rank));
    prefix_caches.push_back(prefix_caches_.back().get());
  }
  SchedulerConfig scheduler_config;
  scheduler_config.max_running_requests = config_.max_running_requests;
  scheduler_config.max_prefill_tokens = config_.max_prefill_tokens;
  scheduler_config.page_size = config_.page_size;
  scheduler_config.enable_prefix_cache = config_.enable_prefix_cache;
  scheduler_config.max_logit_rows = step_logit_rows(config_);
  scheduler_config.dp_load_balance = config_.dp_load_balance;
  scheduler_ = std::make_unique<Scheduler>(scheduler_config, *allocator_, std::move(prefix_caches));
  sampler_ = make_sampler(*model_, config_.deterministic);
  // MEGACTX_DP_GATHER_LOGITS=1: every step gathers its logits on rank 0 as
  // before the ranks sampled their own rows (A/B runs).
  const char* gather = std::getenv("MEGACTX_DP_GATHER_LOGITS");
  if (RankRows* rows = model_->rank_rows(); rows && !(gather && gather[0] == '1'))
    rank_sampler_ = std::make_unique<RankSampler>(*rows);
  update_stats();
}

Engine::~Engine() {
  {
    std::lock_guard lock(inbox_mutex_);
    stopping_ = true;
  }
  inbox_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Whoever still waits gets a final update.
  std::lock_guard lock(engine_mutex_);
  process_commands();
  std::vector<RequestState*> left;
  for (auto& [rid, request] : requests_) left.push_back(request.get());
  for (RequestState* request : left) finish(*request, FinishReason::Abort, "engine shut down");
  deliver_updates();
}

std::optional<Engine::HeldSequence> Engine::held_sequence(const std::string& rid) const {
  std::lock_guard lock(engine_mutex_);
  auto it = requests_.find(rid);
  if (it == requests_.end()) return std::nullopt;
  const RequestState& request = *it->second;
  return HeldSequence{request.tokens, request.page_table, request.num_computed};
}

grammar::GrammarCompiler* Engine::grammar_compiler() {
  std::call_once(grammar_once_, [this] {
    // Masks cover the model's logits (vocab_size_ may pad past the tokenizer's ids).
    grammar_compiler_ =
        std::make_unique<grammar::GrammarCompiler>(grammar::Vocabulary::from_tokenizer(
            *tokenizer_, defaults_.eos_token_ids, static_cast<int32_t>(vocab_size_)));
  });
  return grammar_compiler_.get();
}

void Engine::set_sampler(std::unique_ptr<Sampler> sampler) {
  std::lock_guard lock(engine_mutex_);
  sampler_ = std::move(sampler);
}

std::string Engine::validate(const GenerationRequest& request) const {
  const SamplingParams& s = request.sampling;
  const auto prompt = static_cast<int64_t>(request.input_ids.size());
  if (prompt == 0) return "the prompt is empty";
  for (const int32_t id : request.input_ids) {
    if (id < 0 || id >= vocab_size_) {
      return fmt::format("input token id {} is outside the vocabulary [0, {})", id, vocab_size_);
    }
  }
  const int64_t context = config_.context_length > 0 ? config_.context_length
                                                     : model_->config().max_position_embeddings;
  const int64_t needed = prompt + (s.max_new_tokens > 0 ? 1 : 0);
  if (context > 0 && needed > context) {
    return fmt::format(
        "the input ({} tokens) is longer than the model's context length ({} tokens)", prompt,
        context);
  }
  if (needed > max_total_tokens_) {
    return fmt::format("the input ({} tokens) is longer than the KV cache capacity ({} tokens{})",
                       prompt, max_total_tokens_,
                       capacity_.spec.offload_pages > 0 ? ", live host tier included" : "");
  }
  if (auto problem = check_sampling(s, vocab_size_)) return problem->message;
  if (s.grammar && s.grammar->vocabulary().mask_size() != vocab_size_) {
    return fmt::format("the grammar was compiled for {} logits, the model has {}",
                       s.grammar->vocabulary().mask_size(), vocab_size_);
  }
  if (request.top_logprobs_num < 0 || request.top_logprobs_num > vocab_size_) {
    return fmt::format("top_logprobs_num must be in [0, {}], got {}", vocab_size_,
                       request.top_logprobs_num);
  }
  if (request.return_routed_experts && !routed_) {
    return "return_routed_experts needs the server started with --enable-return-routed-experts";
  }
  if (request.return_hidden_states) {
    if (!config_.record_hidden_states)
      return "return_hidden_states needs the server started with --enable-return-hidden-states";
    // Host memory (and the JSON answer) grow with tokens x hidden floats.
    const int64_t rows =
        std::min(prompt + std::max<int64_t>(s.max_new_tokens, 0), max_total_tokens_);
    const int64_t bytes = rows * model_->config().hidden_size * 4;
    if (bytes > config_.max_hidden_states_bytes) {
      return fmt::format(
          "return_hidden_states of {} tokens x {} floats needs {} MiB, more than the {} MiB a "
          "request may hold",
          rows, model_->config().hidden_size, bytes >> 20, config_.max_hidden_states_bytes >> 20);
    }
  }
  for (const int32_t id : request.token_ids_logprob) {
    if (id < 0 || id >= vocab_size_) {
      return fmt::format("token_ids_logprob id {} is outside the vocabulary [0, {})", id,
                         vocab_size_);
    }
  }
  if (request.logprob_start_len < -1 || request.logprob_start_len >= prompt) {
    return fmt::format("logprob_start_len must be -1 or in [0, {}), got {}", prompt,
                       request.logprob_start_len);
  }
  return {};
}

void Engine::submit(GenerationRequest request, UpdateCallback on_update) {
  if (request.rid.empty()) request.rid = fmt::format("req-{}", rid_counter_.fetch_add(1));
  std::string error = validate(request);
  if (error.empty()) {
    std::lock_guard lock(inbox_mutex_);
    if (stopping_) {
      error = "the engine is shutting down";
    } else if (!live_rids_.insert(request.rid).second) {
      error = fmt::format("request id '{}' is already in use", request.rid);
    } else {
      inbox_.push_back(Submit{std::move(request), std::move(on_update)});
    }
  }
  if (!error.empty()) {
    RequestUpdate update;
    update.rid = request.rid;
    update.finish = FinishReason::Error;
    update.finish_detail = std::move(error);
    update.prompt_tokens = static_cast<int64_t>(request.input_ids.size());
    if (on_update) on_update(update);
    return;
  }
  inbox_cv_.notify_one();
}

void Engine::push_command(Command command) {
  {
    std::lock_guard lock(inbox_mutex_);
    inbox_.push_back(std::move(command));
  }
  inbox_cv_.notify_one();
}

bool Engine::abort(const std::string& rid) {
  {
    std::lock_guard lock(inbox_mutex_);
    if (rid.empty() || !live_rids_.contains(rid)) return false;
    inbox_.push_back(Abort{rid});
  }
  inbox_cv_.notify_one();
  return true;
}

void Engine::abort_all() {
  push_command(Abort{});
}

bool Engine::flush_cache() {
  std::lock_guard lock(engine_mutex_);
  {
    std::lock_guard inbox_lock(inbox_mutex_);
    if (!live_rids_.empty()) return false;
  }
  for (const auto& prefix_cache : prefix_caches_) prefix_cache->flush();
  update_stats();
  return true;
}

EngineStats Engine::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

int64_t Engine::num_preemptions() const {
  std::lock_guard lock(engine_mutex_);
  return scheduler_->num_preemptions();
}

void Engine::check_integrity() const {
  std::lock_guard lock(engine_mutex_);
  check_integrity_locked();
}

void Engine::check_integrity_locked() const {
  scheduler_->check_integrity();
  for (const auto& [rid, request] : requests_) {
    // Drafts live only inside a step.
    MEGACTX_CHECK(request->num_draft_tokens == 0, "integrity: request {} holds {} drafts", rid,
                  request->num_draft_tokens);
    if (speculator_) speculator_->check_integrity(rid, *request);
  }
  MEGACTX_CHECK(requests_.size() == scheduler_->running().size() + scheduler_->waiting().size(),
                "integrity: {} live requests but {} running + {} waiting", requests_.size(),
                scheduler_->running().size(), scheduler_->waiting().size());
}

void Engine::thread_main() {
  while (true) {
    {
      std::unique_lock lock(inbox_mutex_);
      // Paused (or memory released): commands are taken, no step runs.
      inbox_cv_.wait(lock, [&] {
        return stopping_ || !inbox_.empty() || (may_step() && !live_rids_.empty());
      });
      if (stopping_) return;
    }
    std::lock_guard lock(engine_mutex_);
    try {
      step_locked();
    } catch (const std::exception& error) {
      // Only a failed integrity check (debug option) gets here.
      spdlog::error("engine: {}", error.what());
    }
  }
}

bool Engine::step() {
  MEGACTX_CHECK(!config_.run_thread, "Engine::step() is for engines without their own thread");
  std::lock_guard lock(engine_mutex_);
  return step_locked();
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

bool Engine::step_locked() {
  bool worked = false;
  bool runnable;
  {
    std::lock_guard inbox_lock(inbox_mutex_);
    runnable = may_step();
  }
  try {
    process_commands();
    if (runnable && (!scheduler_->running().empty() || !scheduler_->waiting().empty())) {
      const auto step_start = std::chrono::steady_clock::now();
      {
        EnginePhaseTimes::Scope timed(phase_times_, EnginePhaseTimes::Schedule);
        if (speculator_) speculator_->append_draft_slots(scheduler_->running());
        scheduler_->schedule(plan_);
        if (speculator_) speculator_->drop_unscheduled_drafts(plan_, requests_);
      }
      if (!plan_.empty()) {
        run_plan();
        worked = true;
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - step_start;
        if (speculator_) speculator_->record_step(plan_, took.count());
        ++steps_run_;
        step_tokens_ += plan_.prefill_tokens + plan_.decode_tokens;
        step_microseconds_ += static_cast<int64_t>(took.count() * 1e6);
      }
      phase_times_.end_step(!plan_.empty(), plan_.prefill_tokens == 0 && plan_.decode_tokens > 0);
    }
  } catch (const std::exception& error) {
    // A failed forward leaves the cache contents of this step undefined:
    // every request in flight ends with the error; the engine stays usable.
    spdlog::error("engine step failed: {}", error.what());
    std::vector<RequestState*> all;
    for (auto& [rid, request] : requests_) all.push_back(request.get());
    for (RequestState* request : all) {
      // One that finished earlier in this step keeps its own final update.
      if (request->phase == RequestPhase::Finished) continue;
      finish(*request, FinishReason::Error, error.what());
      update_of(*request).server_error = true;
    }
    worked = true;
  }
  // The stats first: a client that reads /metrics as soon as its last token
  // arrives sees the step that produced it (mtp_serve_bench's accepted length
  // once missed a final verification that way).
  update_stats();
  deliver_updates();
  if (config_.check_integrity_every_step) check_integrity_locked();
  return worked || (runnable && !requests_.empty());
}

void Engine::process_commands() {
  std::deque<Command> commands;
  {
    std::lock_guard lock(inbox_mutex_);
    commands.swap(inbox_);
  }
  for (Command& command : commands) {
    if (auto* submit = std::get_if<Submit>(&command)) {
      start_request(std::move(*submit));
    } else {
      const std::string& rid = std::get<Abort>(command).rid;
      if (rid.empty()) {
        std::vector<RequestState*> all;
        for (auto& [id, request] : requests_) all.push_back(request.get());
        for (RequestState* request : all) abort_request(*request);
      } else if (auto it = requests_.find(rid); it != requests_.end()) {
        abort_request(*it->second);
      }
    }
  }
}

void Engine::start_request(Submit submit) {
  auto state = std::make_unique<RequestState>();
  RequestState& request = *state;
  request.request = std::move(submit.request);
  request.callback = std::move(submit.callback);
  request.arrival = next_arrival_++;
  request.tokens = request.request.input_ids;
  request.prompt_len = static_cast<int64_t>(request.tokens.size());
  request.max_total_tokens = max_total_tokens_;
  const SamplingParams& sampling = request.request.sampling;
  if (sampling.seed) {
    request.seed = *sampling.seed;
  } else {
    static thread_local std::mt19937_64 generator{std::random_device{}()};
    request.seed = generator();
  }
  if (sampling.repetition_penalty != 1.0) {
    request.prompt_distinct = request.tokens;
    std::sort(request.prompt_distinct.begin(), request.prompt_distinct.end());
    request.prompt_distinct.erase(
        std::unique(request.prompt_distinct.begin(), request.prompt_distinct.end()),
        request.prompt_distinct.end());
  }
  if (sampling.min_new_tokens > 0) {
    if (!sampling.ignore_eos) request.min_tokens_mask = defaults_.eos_token_ids;
    for (const int32_t id : sampling.stop_token_ids) request.min_tokens_mask.push_back(id);
  }
  if (sampling.grammar)
    request.matcher = std::make_unique<grammar::GrammarMatcher>(sampling.grammar);
  request.stop = StopStringMatcher(sampling.stop, sampling.include_stop_str_in_output);
  request.detokenizer.emplace(*tokenizer_, sampling.skip_special_tokens);
  const std::string rid = request.request.rid;
  scheduler_->enqueue(&request);
  requests_.emplace(rid, std::move(state));
}

void Engine::abort_request(RequestState& request) {
  finish(request, FinishReason::Abort, "aborted");
}

RequestUpdate& Engine::update_of(RequestState& request) {
  if (!request.has_update) {
    request.has_update = true;
    // Cleared field by field: the buffers keep their capacity across steps.
    RequestUpdate& update = request.update;
    if (update.rid.empty()) update.rid = request.request.rid;
    update.new_token_ids.clear();
    update.new_text.clear();
    update.new_logprobs.clear();
    update.input_logprobs.clear();
    update.finish = FinishReason::None;
    update.finish_detail.clear();
    update.server_error = false;
    update.matched_stop_token.reset();
    update.routed_experts.clear();
    update.hidden_states.clear();
    updated_.push_back(&request);
  }
  return request.update;
}

// One step after scheduling, in the order the data flows (nano-vllm's step()):
// drafts -> target forward -> grammar masks (overlapping a device forward) ->
// StepOutputs -> MTP refill -> commit -> apply.
void Engine::run_plan() {
  using Timed = EnginePhaseTimes::Scope;
  if (speculator_) {
    Timed timed(phase_times_, EnginePhaseTimes::Drafts);
    // Drafts read the matchers: they take their pending tokens first (a
    // refused one shows in fill_grammar_masks, which fails the request).
    for (const ScheduledChunk& chunk : plan_.chunks) {
      if (chunk.request->spec.verifying) accept_pending_tokens(*chunk.request);
    }
    speculator_->draft(plan_, *cache_);
  }
  ForwardOutput output;
  {
    Timed timed(phase_times_, EnginePhaseTimes::Forward);
    output = forward_plan();
  }
  {
    // After the forward's launch: on a device the forward runs asynchronously
    // (its logits are read in collect_outputs), so the masks are filled while
    // it runs. Only the sampler reads them.
    Timed timed(phase_times_, EnginePhaseTimes::GrammarMasks);
    fill_grammar_masks();
  }
  {
    Timed timed(phase_times_, EnginePhaseTimes::Collect);
    collect_outputs(output);
  }
  // The MTP layer writes its entries of this step's rows before commit()
  // shares newly full pages, so no request ever writes into a shared page.
  if (speculator_) {
    Timed timed(phase_times_, EnginePhaseTimes::Refill);
    speculator_->refill(plan_, output.hidden_states, outputs_.samples, *cache_);
  }
  Timed timed(phase_times_, EnginePhaseTimes::Apply);
  scheduler_->commit(plan_);
  apply_outputs();
  offload_latents();
}

ForwardOutput Engine::forward_plan() {
  const std::vector<ScheduledChunk>& chunks = plan_.chunks;
  batch_.sequences.resize(chunks.size());
  // MTP refills read every row; return_hidden_states only its requests' rows,
  // so other steps skip the copy (and on a device the wait for it).
  batch_.want_hidden_states =
      speculator_ != nullptr ||
      (config_.record_hidden_states &&
       std::any_of(chunks.begin(), chunks.end(), [](const ScheduledChunk& chunk) {
         return chunk.request->request.return_hidden_states;
       }));
  // Every forward, not only those of requests that ask: a later request may
  // find these pages in the prefix cache.
  batch_.want_routed_experts = routed_ != nullptr;
  // Data-parallel attention: the ranks sample, score and verify their own
  // rows (greedy verification takes each row's argmax from its rank,
  // target-only verification each row's draw, rejection sampling each
  // request's accept tests and one distribution row per rejected draft:
  // Speculator::check_drafts_at_ranks); rank 0 never reads a row of another
  // rank's logits.
  batch_.logits_at_ranks = rank_sampler_ != nullptr;
  // Only the A/B switch (MEGACTX_DP_GATHER_LOGITS=1) gathers them now.
  if (rank_sampler_ == nullptr && model_->rank_rows() != nullptr) ++gathered_logit_steps_;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ScheduledChunk& chunk = chunks[i];
    const RequestState& request = *chunk.request;
    SequenceInput& input = batch_.sequences[i];
    input.tokens = std::span<const int32_t>(request.tokens.data() + chunk.start,
                                            static_cast<size_t>(chunk.count));
    input.start_position = chunk.start;
    input.page_table = std::span<const int32_t>(request.page_table);
    input.logits_from = chunk.logits_from;
  }
  ForwardOutput output = model_->forward(batch_, *cache_);
  if (routed_ && output.routed_experts.defined()) {
    int64_t row = 0;
    for (const ScheduledChunk& chunk : chunks) {
      routed_->record(output.routed_experts, row, chunk.start, chunk.count,
                      chunk.request->page_table);
      row += chunk.count;
    }
  }
  if (config_.record_hidden_states && output.hidden_states.defined()) {
    int64_t row = 0;
    for (const ScheduledChunk& chunk : chunks) {
      if (chunk.request->request.return_hidden_states)
        record_hidden_states(chunk, output.hidden_states, row);
      row += chunk.count;
    }
  }
  return output;
}

void Engine::record_hidden_states(const ScheduledChunk& chunk, const Tensor& hidden, int64_t row) {
  RequestState& request = *chunk.request;
  const int64_t H = hidden.dim(1);
  const auto end = static_cast<size_t>((chunk.start + chunk.count) * H);
  if (request.hidden_states.size() < end) request.hidden_states.resize(end);
  model_->final_norm(hidden.data<float>() + row * H, chunk.count,
                     request.hidden_states.data() + chunk.start * H);
}

namespace {

bool any_allowed(const uint32_t* words, size_t count) {
  return std::any_of(words, words + count, [](uint32_t w) { return w != 0; });
}

}  // namespace

bool Engine::accept_pending_tokens(RequestState& request) {
  if (!request.grammar_error.empty()) return false;
  if (!request.matcher) return true;
  for (const int32_t token : request.grammar_pending) {
    if (!request.matcher->accept_token(token)) {
      // The sampler only picks allowed tokens; this is a broken invariant.
      request.grammar_error =
          fmt::format("structured output: token {} was sampled but the grammar rejects it", token);
      break;
    }
  }
  request.grammar_pending.clear();
  return request.grammar_error.empty();
}

bool Engine::fill_grammar_mask(const ScheduledChunk& chunk) {
  RequestState& request = *chunk.request;
  // The tokens of the last step, taken while this step's forward runs.
  if (!accept_pending_tokens(request)) return false;
  if (request.spec.verifying) {
    // The Speculator's drafts made the masks of its rows; row 0 is this state's.
    const auto words = static_cast<size_t>(request.matcher->mask_words());
    return any_allowed(request.spec.masks.data(), words);
  }
  if (!chunk.samples) return true;
  request.grammar_mask.resize(static_cast<size_t>(request.matcher->mask_words()));
  request.matcher->fill_next_token_bitmask(request.grammar_mask.data());
  return any_allowed(request.grammar_mask.data(), request.grammar_mask.size());
}

void Engine::fill_grammar_masks() {
  std::vector<RequestState*>& failed = outputs_.grammar_failed;
  failed.clear();
  grammar_chunks_.clear();
  for (const ScheduledChunk& chunk : plan_.chunks)
    if (chunk.request->matcher) grammar_chunks_.push_back(&chunk);
  const auto count = static_cast<int64_t>(grammar_chunks_.size());
  grammar_allowed_.assign(grammar_chunks_.size(), 1);
  auto fill = [this](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      grammar_allowed_[i] = fill_grammar_mask(*grammar_chunks_[i]);
  };
  // Matchers are per request and compiled grammars shared read-only, so with
  // EngineConfig::parallel_grammar_rows set, many constrained rows fill their
  // masks on the process's worker threads (idle while a device forward runs;
  // the CPU forward has finished by now). Off by default: slower on the H200.
  const int64_t parallel_rows = config_.parallel_grammar_rows;
  if (parallel_rows > 0 && count >= parallel_rows && ThreadPool::global().size() > 1) {
    ThreadPool::global().parallel_for(count, fill);
  } else {
    fill(0, count);
  }
  for (int64_t i = 0; i < count; ++i)
    if (!grammar_allowed_[i]) failed.push_back(grammar_chunks_[i]->request);
}

void Engine::collect_outputs(const ForwardOutput& output) {
  const Tensor& logits = output.logits;
  StepOutputs& out = outputs_;
  out.clear_collected();
  // Data-parallel attention with the logits left at their ranks: every
  // sampler call of the step goes to the rows' ranks.
  const bool at_ranks = !output.logits_ranks.empty();
  std::optional<StepRankSampler> ranks;
  if (at_ranks) ranks.emplace(*rank_sampler_, *sampler_, output.logits_ranks, sampled_by_rank_);
  Sampler& sampler = at_ranks ? static_cast<Sampler&>(*ranks) : *sampler_;
  if (speculator_) speculator_->begin_verification(plan_, logits, out, sampler, at_ranks);
  int64_t row = 0;
  for (const ScheduledChunk& chunk : plan_.chunks) {
    RequestState& request = *chunk.request;
    request.spec.sample_index = -1;
    const int64_t rows = chunk.logits_rows();
    const int64_t first_position =
        chunk.logits_from >= 0 ? chunk.start + chunk.logits_from : chunk.start + chunk.count - 1;
    const int64_t end = chunk.start + chunk.count;
    if (request.wants_input_logprobs()) {
      // Row at position q scores prompt token q + 1.
      const int64_t first_scored = std::max<int64_t>(request.request.logprob_start_len, 1);
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t scored = first_position + j + 1;
        if (scored < first_scored || scored >= request.prompt_len) continue;
        out.logprob_queries.push_back(LogprobQuery{
            row + j, request.tokens[static_cast<size_t>(scored)], request.request.top_logprobs_num,
            request.request.token_ids_logprob, logprob_temperature(request.request)});
        out.logprob_requests.push_back(&request);
      }
      if (end >= request.prompt_len) out.scored_through_prompt.push_back(&request);
    }
    if (out.grammar_failed_for(request)) {
      // Nothing to sample: apply_outputs ends the request with an error.
    } else if (request.spec.verifying) {
      speculator_->verify_chunk(request, logits, row, sampler);
      out.verifying.push_back(&request);
    } else if (chunk.samples) {
      SamplingRow sampling_row;
      sampling_row.logits_row = row + rows - 1;
      sampling_row.params = &request.request.sampling;
      if (uses_penalties(request.request.sampling))
        sampling_row.output_counts = &request.output_counts;
      sampling_row.prompt_tokens = request.prompt_distinct;
      if (request.num_generated() < request.request.sampling.min_new_tokens) {
        sampling_row.masked_tokens = request.min_tokens_mask;
      }
      if (request.matcher) sampling_row.allowed = request.grammar_mask;
      sampling_row.seed = request.seed;
      sampling_row.draw_index = static_cast<uint64_t>(request.num_generated());
      sampling_row.want_logprob = request.request.return_logprob;
      sampling_row.top_logprobs =
          request.request.return_logprob ? request.request.top_logprobs_num : 0;
      if (request.request.return_logprob) {
        sampling_row.logprob_token_ids = request.request.token_ids_logprob;
        sampling_row.logprob_temperature = logprob_temperature(request.request);
      }
      request.spec.sample_index = static_cast<int64_t>(out.sampling_rows.size());
      out.sampling_rows.push_back(sampling_row);
      out.sampling_requests.push_back(&request);
    } else if (end == static_cast<int64_t>(request.tokens.size()) &&
               request.num_generated() >= request.request.sampling.max_new_tokens) {
      // Scoring (max_new_tokens 0): the prefill was all it asked for.
      out.scoring_done.push_back(&request);
    }
    row += rows;
  }
  if (!out.logprob_queries.empty()) {
    out.logprob_results.resize(out.logprob_queries.size());
    sampler.score(logits, out.logprob_queries, out.logprob_results);
    for (size_t i = 0; i < out.logprob_queries.size(); ++i) {
      out.logprob_requests[i]->input_logprobs.push_back(std::move(out.logprob_results[i]));
    }
  }
  out.samples.resize(out.sampling_rows.size());
  if (!out.sampling_rows.empty()) sampler.sample(logits, out.sampling_rows, out.samples);
}

void Engine::apply_outputs() {
  const StepOutputs& out = outputs_;
  for (RequestState* request : out.scoring_done) finish(*request, FinishReason::Length);
  for (RequestState* request : out.grammar_failed) {
    finish(*request, FinishReason::Error,
           !request->grammar_error.empty()
               ? request->grammar_error
               : fmt::format(
                     "structured output: the grammar allows no token after {} generated tokens",
                     request->num_generated()));
  }
  for (RequestState* request : out.scored_through_prompt) {
    // The first prompt token has no logprob (nothing precedes it): NaN, which
    // the HTTP layer writes as null like SGLang.
    RequestUpdate& update = update_of(*request);
    if (request->request.logprob_start_len == 0) {
      TokenLogprob first;
      first.token_id = request->tokens[0];
      first.logprob = std::numeric_limits<float>::quiet_NaN();
      update.input_logprobs.push_back(first);
    }
    for (auto& entry : request->input_logprobs) update.input_logprobs.push_back(std::move(entry));
    request->input_logprobs.clear();
    request->input_logprobs_done = true;
  }
  for (size_t i = 0; i < out.sampling_rows.size(); ++i) {
    append_token(*out.sampling_requests[i], out.samples[i]);
  }
  for (RequestState* request : out.verifying) {
    for (const SampleResult& sample : speculator_->apply_verification(*request, *scheduler_)) {
      append_token(*request, sample);
      if (request->phase == RequestPhase::Finished) break;
    }
  }
}

void Engine::append_token(RequestState& request, const SampleResult& sample) {
  const SamplingParams& sampling = request.request.sampling;
  const int32_t token = sample.token;
  // The matcher takes it at the next step that reads the matcher
  // (accept_pending_tokens), overlapping that step's forward.
  if (request.matcher) request.grammar_pending.push_back(token);
  request.tokens.push_back(token);
  RequestUpdate& update = update_of(request);
  update.new_token_ids.push_back(token);
  if (request.request.return_logprob) {
    update.new_logprobs.push_back(
        TokenLogprob{token, sample.logprob, sample.top, sample.token_ids});
  }
  if (uses_penalties(sampling)) ++request.output_counts[token];
  const int64_t generated = request.num_generated();
  const bool checks_stop = generated >= sampling.min_new_tokens;
  if (checks_stop) {
    const bool eos = !sampling.ignore_eos && contains(defaults_.eos_token_ids, token);
    if (eos || contains(sampling.stop_token_ids, token)) {
      update.matched_stop_token = token;
      finish(request, FinishReason::Stop, tokenizer_->id_to_token(token));
      return;
    }
  }
  std::string text = request.detokenizer->push(token);
  if (checks_stop && request.stop.active()) {
    StopStringMatcher::Result result = request.stop.push(text);
    update.new_text += result.text;
    if (result.stopped) {
      finish(request, FinishReason::Stop, result.matched, /*release_held_text=*/false);
      return;
    }
  } else {
    update.new_text += text;
  }
  if (generated >= sampling.max_new_tokens ||
      static_cast<int64_t>(request.tokens.size()) >= request.max_total_tokens) {
    finish(request, FinishReason::Length);
  }
}

void Engine::finish(RequestState& request, FinishReason reason, std::string detail,
                    bool release_held_text) {
  if (request.phase == RequestPhase::Finished) return;
  Speculator::drop_drafts(request);  // a failed step can leave them
  RequestUpdate& update = update_of(request);
  if (release_held_text) {
    // Nothing stops the text now: release what was held back.
    update.new_text += request.stop.push(request.detokenizer->flush()).text;
    update.new_text += request.stop.flush();
  }
  update.finish = reason;
  update.finish_detail = std::move(detail);
  if (routed_ && request.request.return_routed_experts) {
    // SGLang's rows: every token but the last (whose forward never ran).
    update.routed_experts = routed_->gather(
        request.page_table, std::max<int64_t>(static_cast<int64_t>(request.tokens.size()) - 1, 0));
  }
  if (request.request.return_hidden_states) {
    // Every token but the last (whose forward never ran), as computed.
    const int64_t H = model_->config().hidden_size;
    const int64_t rows =
        std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(request.tokens.size()) - 1, 0),
                          static_cast<int64_t>(request.hidden_states.size()) / H);
    update.hidden_states.assign(request.hidden_states.begin(),
                                request.hidden_states.begin() + rows * H);
  }
  try {
    scheduler_->remove(&request);
  } catch (const std::exception& error) {
    // Only a broken invariant gets here (check_integrity reports it); the
    // client still gets its final update.
    spdlog::error("request {}: releasing its cache failed: {}", request.request.rid, error.what());
    request.phase = RequestPhase::Finished;
  }
  auto it = requests_.find(request.request.rid);
  finished_.push_back(std::move(it->second));
  requests_.erase(it);
}

void Engine::deliver_updates() {
  for (RequestState* request : updated_) {
    RequestUpdate& update = request->update;
    update.prompt_tokens = request->prompt_len;
    update.completion_tokens = request->num_generated();
    update.cached_tokens = request->cached_tokens;
    update.spec_verify_ct = request->spec.verify_count;
    update.spec_draft_token_num = request->spec.draft_tokens;
    update.spec_accept_token_num = request->spec.accepted_tokens;
    update.weight_version = weight_version_;  // engine thread: only update_weights writes it
    request->has_update = false;
    if (update.finish != FinishReason::None) {
      std::lock_guard lock(inbox_mutex_);
      live_rids_.erase(request->request.rid);
    }
    if (request->callback) {
      try {
        request->callback(update);
      } catch (const std::exception& error) {
        spdlog::error("update callback of request {} threw: {}", request->request.rid,
                      error.what());
      }
    }
  }
  updated_.clear();
  finished_.clear();
}

void Engine::update_stats() {
  EngineStats stats;
  stats.running_requests = static_cast<int64_t>(scheduler_->running().size());
  stats.waiting_requests = static_cast<int64_t>(scheduler_->waiting().size());
  stats.kv_pages_total = allocator_->device_pages();
  stats.kv_pages_used = allocator_->num_used();
  stats.max_context_tokens = max_total_tokens_;
  for (const auto& prefix_cache : prefix_caches_) {
    stats.prefix_cache_queries += prefix_cache->queried_tokens();
    stats.prefix_cache_hits += prefix_cache->hit_tokens();
    stats.prefix_cache_pages += prefix_cache->cached_pages();
    stats.prefix_cache_host_hits += prefix_cache->host_hit_tokens();
  }
  stats.kv_page_size = config_.page_size;
  if (scheduler_->ranks() > 1) {
    for (int rank = 0; rank < scheduler_->ranks(); ++rank) {
      DataParallelRankStats& r = stats.data_parallel_ranks.emplace_back();
      r.running_requests = scheduler_->running_on(rank);
      r.admissions = scheduler_->admissions(rank);
      r.sampled_rows = static_cast<size_t>(rank) < sampled_by_rank_.size()
                           ? sampled_by_rank_[static_cast<size_t>(rank)]
                           : 0;
      r.kv_pages_total = allocator_->pages_per_rank();
      r.kv_pages_free = allocator_->num_free(rank);
      r.prefix_cache_pages = prefix_caches_[static_cast<size_t>(rank)]->cached_pages();
      r.host_latent_pages_total = allocator_->offload_pages_per_rank();
      r.host_latent_pages_used = allocator_->num_used_offload(rank);
      r.host_latent_moved_pages = static_cast<size_t>(rank) < offloaded_by_rank_.size()
                                      ? offloaded_by_rank_[static_cast<size_t>(rank)]
                                      : 0;
    }
  }
  if (host_tier_) {
    stats.host_kv_pages_total = host_tier_->num_pages();
    stats.host_kv_pages_used = host_tier_->allocator().num_used();
    stats.host_kv_saved_pages = host_tier_->saved_pages();
    stats.host_kv_loaded_pages = host_tier_->loaded_pages();
  }
  stats.host_latent_pages_total = allocator_->offload_pages();
  stats.host_latent_pages_used = allocator_->num_used_offload();
  stats.host_latent_moved_pages =
      std::accumulate(offloaded_by_rank_.begin(), offloaded_by_rank_.end(), int64_t{0});
  stats.host_latent_moved_bytes = stats.host_latent_moved_pages * capacity_.bytes_per_page;
  stats.host_latent_parked = scheduler_->num_parked();
  stats.host_latent_dropped = scheduler_->num_dropped_parked();
  if (capacity_.spec.offload_pages > 0) {
    const OffloadReadStats reads = model_->offload_read_stats();
    stats.host_latent_selected_entries = reads.selected_entries;
    stats.host_latent_hot_hits = reads.hot_hits;
    stats.host_latent_copied_bytes = reads.copied_bytes;
    stats.host_latent_read_steps = reads.read_steps;
  }
  stats.preemptions = scheduler_->num_preemptions();
  stats.dp_gathered_logit_steps = gathered_logit_steps_;
  const CudaGraphStats graphs = model_->graph_stats(), mtp_graphs = model_->graph_stats(true);
  stats.graph_replays = graphs.replays;
  stats.graph_eager_steps = graphs.eager_steps;
  stats.graph_captures = graphs.captures;
  stats.graph_failed_captures = graphs.failed_captures;
  stats.mtp_graph_replays = mtp_graphs.replays;
  stats.mtp_graph_eager_steps = mtp_graphs.eager_steps;
  stats.mtp_graph_captures = mtp_graphs.captures;
  stats.mtp_graph_failed_captures = mtp_graphs.failed_captures;
  stats.steps = steps_run_;
  stats.step_tokens = step_tokens_;
  stats.step_microseconds = step_microseconds_;
  if (speculator_) {
    stats.spec_accepted_tokens = speculator_->accepted_tokens();
    stats.spec_verify_steps = speculator_->verify_steps();
    stats.spec_off_steps = speculator_->off_steps();
  }
  std::lock_guard lock(stats_mutex_);
  stats_ = stats;
}

}  // namespace megactx
