#include "gateway/session_turn.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "chat/output_parser.h"
#include "gateway/gateway.h"
#include "gateway/history_match.h"
#include "gateway/message_fingerprint.h"
#include "gateway/turn_response.h"
#include "io/bounded_json.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/chat_request.h"
#include "server/endpoints.h"
#include "server/generation_output.h"
#include "server/json_text.h"
#include "server/logprob_json.h"
#include "server/openai_common.h"
#include "server/request_fields.h"
#include "tokenizer/tokenizer.h"

namespace megactx::gateway {

namespace {

using server::ApiError;
using server::throw_invalid;

constexpr size_t kMaxIdLength = 256;

// A session, parent or rollout id: printable ASCII without spaces, bounded.
std::string checked_id(std::string value, const char* param) {
  if (value.size() > kMaxIdLength)
    throw_invalid(param, std::string("'") + param + "' is longer than 256 characters");
  for (unsigned char c : value)
    if (c < 0x21 || c > 0x7e)
      throw_invalid(param, std::string("'") + param + "' must be printable ASCII without spaces");
  return value;
}

struct Identity {
  std::string session, parent, rollout;
};

Identity identity_of(const server::HttpRequest& request, const nlohmann::json& body) {
  Identity id;
  id.session = checked_id(request.header(kSessionHeader), "X-Session-Id");
  if (id.session.empty()) throw_invalid("X-Session-Id", "'X-Session-Id' must not be empty");
  id.parent = checked_id(request.header(kParentSessionHeader), "X-Parent-Session-Id");
  if (id.parent == id.session)
    throw_invalid("X-Parent-Session-Id", "a session cannot be its own parent");
  id.rollout = checked_id(request.header(kRolloutHeader), "X-Rollout-Id");
  if (server::has_field(body, "rollout_id")) {
    if (!body["rollout_id"].is_string())
      throw_invalid("rollout_id", "'rollout_id' must be a string");
    std::string field = checked_id(body["rollout_id"].get<std::string>(), "rollout_id");
    if (!id.rollout.empty() && field != id.rollout)
      throw_invalid("rollout_id", "'rollout_id' differs from the X-Rollout-Id header");
    id.rollout = std::move(field);
  }
  return id;
}

const char* finish_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Abort:
      return "abort";
    case FinishReason::Error:
      return "error";
    case FinishReason::None:
      break;
  }
  return "";
}

std::string dump_ordered(const nlohmann::ordered_json& value) {
  return value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// The prompt `body` renders to with its messages replaced by `messages`.
std::string render_with_messages(const server::ServerState& state,
                                 const nlohmann::ordered_json& body,
                                 const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json copy = body;
  copy["messages"] = messages;
  const std::string raw = dump_ordered(copy);
  return server::render_chat_prompt(state.chat(), parse_json(raw), raw).text;
}

std::string content_as_text(const nlohmann::ordered_json& message) {
  if (!message.is_object() || !message.contains("content")) return {};
  const auto& content = message["content"];
  if (content.is_string()) return content.get<std::string>();
  std::string text;
  if (content.is_array())
    for (const auto& part : content)
      if (part.is_object() && part.contains("text") && part["text"].is_string())
        text += part["text"].get<std::string>();
  return text;
}

// Where the content of messages[index] begins in `rendered`: the first
// difference from a rendering in which only that content changed. No cut
// between recorded and new tokens can lie beyond it.
size_t content_start(const server::ServerState& state, const nlohmann::ordered_json& body,
                     const nlohmann::ordered_json& messages, size_t index,
                     const std::string& rendered) {
  if (!messages.is_array() || index >= messages.size()) return rendered.size();
  try {
    nlohmann::ordered_json changed = messages;
    changed[index]["content"] = "\x1f\x1e" + content_as_text(messages[index]);
    const std::string other = render_with_messages(state, body, changed);
    size_t i = 0;
    while (i < rendered.size() && i < other.size() && rendered[i] == other[i]) ++i;
    return i;
  } catch (const std::exception&) {
    return rendered.size();
  }
}

std::vector<int32_t> slice(const std::vector<int32_t>& ids, size_t begin, size_t end) {
  return {ids.begin() + static_cast<std::ptrdiff_t>(begin),
          ids.begin() + static_cast<std::ptrdiff_t>(end)};
}

class TurnJob : public std::enable_shared_from_this<TurnJob> {
 public:
  TurnJob(Gateway& gateway, std::shared_ptr<server::ResponseChannel> channel)
      : gateway_(gateway),
        state_(gateway.state()),
        tokenizer_(gateway.state().engine().tokenizer()),
        channel_(std::move(channel)),
        id_(state_.new_id("chatcmpl-")),
        created_(server::unix_time_seconds()) {}

  ~TurnJob() { release(); }

  // Everything that can be refused, then the first generation.
  void start(const server::HttpRequest& request) {
    plan_ = server::plan_chat_request(state_, request);
    if (plan_.n != 1) throw_invalid("n", "a gateway session turn has one choice ('n' must be 1)");
    identity_ = identity_of(request, plan_.body);
    body_ = parse_ordered_json(request.body);
    messages_ = body_["messages"];
    judge_messages_ = plan_.body["messages"];
    fingerprints_ = history_fingerprints(plan_.body);
    stored_ = gateway_.store().open(identity_.session, identity_.parent, identity_.rollout);
    build_prompt();
    server::set_plan_prompt_ids(state_, plan_, tokens_);
    const size_t new_tokens =
        tokens_.size() - (kind_ == "append" || kind_ == "realign" ? base_end_ : 0);
    gateway_.store().reserve((new_tokens + static_cast<size_t>(plan_.sampling.max_new_tokens)) *
                                 (sizeof(int32_t) + sizeof(float)) +
                             4096);
    state_.check_capacity();
    std::weak_ptr<TurnJob> weak = weak_from_this();
    channel_->on_disconnect([weak] {
      if (auto job = weak.lock()) job->cancel();
    });
    submit_generation();  // last: its callbacks may run at once on another thread
  }

 private:
  // The turn is over for the store (evictable again); before answering, so
  // that whatever the client does next sees it.
  void release() {
    if (stored_ && !released_.exchange(true)) stored_->in_flight -= 1;
  }

  void cancel() {
    std::string rid;
    {
      std::lock_guard lock(mutex_);
      cancelled_ = true;
      rid = current_rid_;
    }
    if (!rid.empty()) state_.engine().abort(rid);
  }

  // Matches the request against the session and builds the prompt ids.
  void build_prompt() {
    const std::string& rendered = plan_.rendered.text;
    std::vector<int32_t> prefix;
    std::vector<float> prefix_logprobs;
    std::vector<int32_t> last_output;
    int32_t stop_token = -1;
    bool has_turns = false;
    {
      std::lock_guard lock(stored_->mutex);
      const Session& session = stored_->session;
      has_turns = !session.turns.empty();
      match_ = match_history(session, fingerprints_);
      if (match_.found) {
        const Trace& trace = session.traces[static_cast<size_t>(match_.trace)];
        prefix = slice(trace.tokens, 0, match_.token_end);
        prefix_logprobs.assign(
            trace.logprobs.begin(),
            trace.logprobs.begin() + static_cast<std::ptrdiff_t>(match_.token_end));
        for (const Span& span : trace.spans)
          if (span.end <= match_.token_end) spans_.push_back(span);
        for (size_t j = 0; j < trace.turns.size(); ++j) {
          parent_turns_.push_back(trace.turns[j]);
          parent_history_end_.push_back(trace.turn_history_end[j]);
          parent_token_end_.push_back(trace.turn_token_end[j]);
          if (trace.turns[j] == match_.turn) break;
        }
        const Generation& last = session.turns[static_cast<size_t>(match_.turn)].generations.back();
        last_output = slice(trace.tokens, last.begin, last.end);
        stop_token = last.stop_token;
      }
    }
    if (match_.found) {
      const std::string recorded = tokenizer_.decode(prefix, false);
      size_t stop_chars = 0;
      if (stop_token >= 0 && !last_output.empty() && last_output.back() == stop_token) {
        stop_chars = tokenizer_.decode({stop_token}, false).size();
        last_output.pop_back();
      }
      const size_t output_chars = tokenizer_.decode(last_output, false).size();
      Alignment alignment;
      if (rendered.compare(0, recorded.size(), recorded) == 0) {
        alignment = align_history(rendered, recorded, stop_chars, output_chars, rendered.size());
      } else {
        // The first message the client added since the matched turn.
        const size_t upper =
            content_start(state_, body_, messages_, match_.history_end - 1, rendered);
        alignment = align_history(rendered, recorded, stop_chars, output_chars, upper);
      }
      if (alignment.aligned) {
        kind_ = !match_.latest ? "fork" : alignment.exact ? "append" : "realign";
        if (!alignment.exact) diverges_at_ = token_at(prefix, alignment.diverges_at);
        tokens_ = std::move(prefix);
        logprobs_ = std::move(prefix_logprobs);
        base_end_ = tokens_.size();
        const std::vector<int32_t> tail = tokenizer_.encode(rendered.substr(alignment.cut), false);
        context_begin_ = tokens_.size();
        tokens_.insert(tokens_.end(), tail.begin(), tail.end());
        logprobs_.resize(tokens_.size(), 0.0f);
        context_end_ = tokens_.size();
        if (context_end_ > context_begin_)
          spans_.push_back({SpanKind::Context, context_begin_, context_end_, -1, -1, false});
        return;
      }
      spdlog::debug(
          "gateway session {}: the recorded tokens could not be found in the new "
          "rendering; starting a new trace",
          identity_.session);
    }
    // A new session, a rewritten history, or one the recorded tokens do not fit.
    match_ = HistoryMatch();
    spans_.clear();
    parent_turns_.clear();
    parent_history_end_.clear();
    parent_token_end_.clear();
    kind_ = has_turns ? "compaction" : "start";
    tokens_ = plan_.prompt_ids;
    logprobs_.assign(tokens_.size(), 0.0f);
    base_end_ = 0;
    context_begin_ = 0;
    context_end_ = tokens_.size();
    spans_.push_back({SpanKind::Prompt, 0, tokens_.size(), -1, -1, false});
  }

  // The token holding character `offset` of the decoded ids.
  int64_t token_at(const std::vector<int32_t>& ids, size_t offset) const {
    size_t chars = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      chars += tokenizer_.token_bytes(ids[i]).size();
      if (chars > offset) return static_cast<int64_t>(i);
    }
    return static_cast<int64_t>(ids.size());
  }

  void submit_generation() {
    GenerationRequest request = server::chat_generation_request(
        plan_, generations_.size(), id_ + "-" + std::to_string(generations_.size()));
    request.return_logprob = true;  // the trajectory needs them whatever the client asked
    request.top_logprobs_num = plan_.top_logprobs;
    bool cancelled = false;
    {
      std::lock_guard lock(mutex_);
      current_rid_ = request.rid;
      cancelled = cancelled_;
    }
    auto output = std::make_shared<server::GenerationOutput>();
    std::shared_ptr<TurnJob> self = shared_from_this();
    const std::string rid = request.rid;
    state_.submit(std::move(request), [self, output](const RequestUpdate& update) {
      output->add(update);
      if (update.finish == FinishReason::None) return;
      self->guarded([&] { self->on_generated(*output); });
    });
    if (cancelled) state_.engine().abort(rid);  // the client left before this generation
  }

  // Runs a step of the turn; a failure is answered, never thrown into the engine.
  template <typename Step>
  void guarded(Step step) {
    try {
      step();
    } catch (const std::exception& error) {
      spdlog::error("gateway session {}: turn failed: {}", identity_.session, error.what());
      release();
      channel_->respond(server::error_response(500, std::string("gateway: ") + error.what()));
    }
  }

  void on_generated(const server::GenerationOutput& output) {
    if (output.finish == FinishReason::Error) {
      ++gateway_.metrics().turns_failed;
      release();
      channel_->respond(
          server::error_response(server::error_status(output.server_error), output.finish_detail));
      return;
    }
    Generation generation;
    generation.begin = tokens_.size();
    tokens_.insert(tokens_.end(), output.output_ids.begin(), output.output_ids.end());
    for (size_t i = 0; i < output.output_ids.size(); ++i)
      logprobs_.push_back(i < output.output_logprobs.size() ? output.output_logprobs[i].logprob
                                                            : 0.0f);
    generation.end = tokens_.size();
    generation.finish_reason = finish_name(output.finish);
    generation.weight_version = output.weight_versions.empty() ? state_.engine().weight_version()
                                                               : output.weight_versions.back();
    generation.cached_tokens = output.cached_tokens;
    if (output.matched_stop_token && !output.output_ids.empty() &&
        output.output_ids.back() == *output.matched_stop_token)
      generation.stop_token = *output.matched_stop_token;
    parsed_ = parse_output(output.text, plan_.parser_options);
    generation.tool_calls = parsed_.tool_calls;
    spans_.push_back({SpanKind::Model, generation.begin, generation.end, -1,
                      static_cast<int64_t>(generations_.size()), false});
    generations_.push_back(std::move(generation));
    outputs_.push_back(output);
    bool cancelled = false;
    {
      std::lock_guard lock(mutex_);
      cancelled = cancelled_;
    }
    if (output.finish == FinishReason::Abort || cancelled ||
        gateway_.guard().mode() == GuardMode::Off || parsed_.tool_calls.empty())
      return finish();
    std::shared_ptr<TurnJob> self = shared_from_this();
    gateway_.guard().review(parsed_.tool_calls, judge_messages_,
                            [self](std::vector<CallReview> reviews) {
                              self->guarded([&] { self->on_reviewed(std::move(reviews)); });
                            });
  }

  void on_reviewed(std::vector<CallReview> reviews) {
    const int64_t generation = static_cast<int64_t>(generations_.size()) - 1;
    std::vector<GuardEvent> events;
    bool confirmed = false;
    for (size_t i = 0; i < reviews.size(); ++i) {
      const CallReview& review = reviews[i];
      GuardEvent event;
      event.generation = generation;
      event.call = static_cast<int64_t>(i);
      event.tool = review.call.name;
      event.arguments = review.call.arguments_text;
      for (const RuleHit& hit : review.hits) event.rules.push_back(hit.rule);
      if (!review.hits.empty()) {
        event.verdict = review.judged ? verdict_name(review.verdict.kind) : "not_judged";
        event.reason = review.verdict.reason;
        event.judge_seconds = review.verdict.seconds;
      }
      event.confirmed = review.confirmed;
      event.action = review.hits.empty() ? "passed" : "flagged";
      confirmed = confirmed || review.confirmed;
      events.push_back(std::move(event));
    }
    const bool intercept = gateway_.guard().mode() == GuardMode::Intercept && confirmed;
    auto mark = [&](const char* action) {
      for (GuardEvent& event : events)
        if (event.confirmed) event.action = action;
      guard_events_.insert(guard_events_.end(), events.begin(), events.end());
    };
    if (!intercept) {
      mark("flagged");
      return finish();
    }
    if (intercepts_ >= gateway_.config().max_intercepts_per_turn) {
      mark("intercept_limit");
      return finish();
    }
    if (!prepare_interception(reviews)) {
      mark("intercept_failed");
      return finish();
    }
    mark("intercepted");
    submit_generation();  // last: the next generation's callbacks run on another thread
  }

  // Appends the virtual tool results of the last generation's calls; false
  // (nothing changed) when they cannot be rendered or do not fit.
  bool prepare_interception(const std::vector<CallReview>& reviews) {
    const GatewayConfig& config = gateway_.config();
    const nlohmann::json reply = server::chat_message_json(parsed_);
    nlohmann::ordered_json messages = messages_;
    nlohmann::json judge_messages = judge_messages_;
    messages.push_back(parse_ordered_json(server::dump_json(reply)));
    judge_messages.push_back(reply);
    const size_t first_result = messages.size();
    size_t blocked = 0;
    for (size_t i = 0; i < reviews.size() && i < parsed_.tool_calls.size(); ++i) {
      const nlohmann::json& call = parsed_.tool_calls[i];
      const std::string call_id = call.contains("id") && call["id"].is_string()
                                      ? call["id"].get<std::string>()
                                      : std::string();
      const std::string& text = reviews[i].confirmed ? config.intercept_text : config.sibling_text;
      blocked += reviews[i].confirmed ? 1 : 0;
      nlohmann::json result = {{"role", "tool"}, {"tool_call_id", call_id}, {"content", text}};
      messages.push_back(parse_ordered_json(server::dump_json(result)));
      judge_messages.push_back(std::move(result));
    }
    std::string rendered;
    try {
      rendered = render_with_messages(state_, body_, messages);
    } catch (const std::exception& error) {
      spdlog::warn("gateway session {}: the virtual tool result does not render: {}",
                   identity_.session, error.what());
      return false;
    }
    const Generation& last = generations_.back();
    std::vector<int32_t> output = slice(tokens_, last.begin, last.end);
    size_t stop_chars = 0;
    if (last.stop_token >= 0 && !output.empty() && output.back() == last.stop_token) {
      stop_chars = tokenizer_.decode({last.stop_token}, false).size();
      output.pop_back();
    }
    const std::string recorded = tokenizer_.decode(tokens_, false);
    const Alignment alignment =
        align_history(rendered, recorded, stop_chars, tokenizer_.decode(output, false).size(),
                      content_start(state_, body_, messages, first_result, rendered));
    if (!alignment.aligned) return false;
    const std::vector<int32_t> virtual_ids =
        tokenizer_.encode(rendered.substr(alignment.cut), false);
    if (virtual_ids.empty()) return false;
    std::vector<int32_t> next = tokens_;
    next.insert(next.end(), virtual_ids.begin(), virtual_ids.end());
    try {
      server::set_plan_prompt_ids(state_, plan_, next);
    } catch (const ApiError&) {
      return false;  // no room left in the context for another generation
    }
    for (auto it = spans_.rbegin(); it != spans_.rend(); ++it)
      if (it->kind == SpanKind::Model) {
        it->intercepted = true;
        break;
      }
    generations_.back().intercepted = true;
    spans_.push_back({SpanKind::Virtual, tokens_.size(), next.size(), -1, -1, false});
    tokens_ = std::move(next);
    logprobs_.resize(tokens_.size(), 0.0f);
    messages_ = std::move(messages);
    judge_messages_ = std::move(judge_messages);
    ++intercepts_;
    gateway_.metrics().calls_intercepted += blocked;
    return true;
  }

  void finish() {
    const nlohmann::json reply = server::chat_message_json(parsed_);
    const int64_t turn_index = record(reply);
    respond(reply, turn_index);
  }

  // Stores the turn; returns its index.
  int64_t record(const nlohmann::json& reply) {
    std::vector<uint64_t> history = fingerprints_;
    history.push_back(message_fingerprint(reply));
    int64_t turn_index = 0;
    {
      std::lock_guard lock(stored_->mutex);
      Session& session = stored_->session;
      turn_index = static_cast<int64_t>(session.turns.size());
      for (Span& span : spans_)
        if (span.turn < 0) span.turn = turn_index;
      Trace* trace = nullptr;
      if (match_.found) {
        Trace& base = session.traces[static_cast<size_t>(match_.trace)];
        const bool unchanged = !base.turns.empty() && base.turns.back() == match_.turn &&
                               base.tokens.size() == base_end_;
        if (match_.latest && unchanged) {
          trace = &base;
          trace_index_ = match_.trace;
          for (const Span& span : spans_)
            if (span.begin >= base_end_) trace->spans.push_back(span);
        } else {
          if (kind_ != "fork") kind_ = "fork";  // another turn continued the trace meanwhile
          session.traces.emplace_back();
          trace = &session.traces.back();
          trace_index_ = static_cast<int64_t>(session.traces.size()) - 1;
          trace->start = "fork";
          trace->forked_from_trace = match_.trace;
          trace->forked_from_turn = match_.turn;
          trace->turns = parent_turns_;
          trace->turn_history_end = parent_history_end_;
          trace->turn_token_end = parent_token_end_;
          trace->spans = spans_;
        }
      } else {
        session.traces.emplace_back();
        trace = &session.traces.back();
        trace_index_ = static_cast<int64_t>(session.traces.size()) - 1;
        trace->start = kind_;
        trace->spans = spans_;
      }
      trace->index = trace_index_;
      trace->tokens = tokens_;
      trace->logprobs = logprobs_;
      trace->history = history;
      trace->turns.push_back(turn_index);
      trace->turn_history_end.push_back(history.size());
      trace->turn_token_end.push_back(tokens_.size());

      Turn turn;
      turn.index = turn_index;
      turn.trace = trace_index_;
      turn.kind = kind_;
      turn.diverges_at = diverges_at_;
      turn.request_id = id_;
      turn.created = created_;
      turn.context_begin = context_begin_;
      turn.context_end = context_end_;
      turn.generations = generations_;
      turn.guard = guard_events_;
      turn.reply = reply;
      session.turns.push_back(std::move(turn));
    }
    release();
    gateway_.store().update_size(stored_);
    gateway_.metrics().count_turn(kind_);
    return turn_index;
  }

  void respond(const nlohmann::json& reply, int64_t turn_index) {
    const server::GenerationOutput& output = outputs_.back();
    TurnReply answer;
    answer.id = id_;
    answer.created = created_;
    answer.model = state_.config().served_model_name;
    answer.message = reply;
    answer.finish_reason = server::openai_finish_reason(output, !parsed_.tool_calls.empty());
    answer.matched_stop = server::matched_stop_json(output);
    if (plan_.logprobs)
      answer.logprobs = {{"content", server::chat_logprob_entries(
                                         tokenizer_, output.output_logprobs, plan_.top_logprobs)}};
    answer.usage = server::usage_json({&output}, 1);
    int64_t generated = 0;
    for (const auto& item : outputs_) generated += item.completion_tokens;
    int64_t flagged = 0;
    for (const GuardEvent& event : guard_events_) flagged += event.rules.empty() ? 0 : 1;
    answer.gateway = {{"session_id", identity_.session},
                      {"rollout_id", stored_->session.rollout_id},
                      {"turn", turn_index},
                      {"trace", trace_index_},
                      {"kind", kind_},
                      {"flagged_calls", flagged},
                      {"interceptions", intercepts_},
                      {"generated_tokens", generated}};
    if (plan_.stream)
      stream_turn(*channel_, answer, plan_.include_usage);
    else
      channel_->respond(turn_response(answer));
  }

  Gateway& gateway_;
  server::ServerState& state_;
  const Tokenizer& tokenizer_;
  std::shared_ptr<server::ResponseChannel> channel_;
  const std::string id_;
  const int64_t created_;

  server::ChatRequestPlan plan_;
  Identity identity_;
  nlohmann::ordered_json body_;
  nlohmann::ordered_json messages_;  // grows by the virtual exchanges
  nlohmann::json judge_messages_;    // the same, for the judge's context
  std::vector<uint64_t> fingerprints_;
  std::shared_ptr<StoredSession> stored_;

  HistoryMatch match_;
  std::string kind_;
  int64_t diverges_at_ = -1;
  std::vector<int32_t> tokens_;
  std::vector<float> logprobs_;
  std::vector<Span> spans_;
  size_t base_end_ = 0;  // tokens [0, base_end_) come from the matched trace
  std::vector<int64_t> parent_turns_;
  std::vector<size_t> parent_history_end_, parent_token_end_;
  size_t context_begin_ = 0, context_end_ = 0;
  int64_t trace_index_ = -1;

  std::vector<Generation> generations_;
  std::vector<server::GenerationOutput> outputs_;
  std::vector<GuardEvent> guard_events_;
  ParsedMessage parsed_;
  int64_t intercepts_ = 0;

  std::atomic<bool> released_{false};
  std::mutex mutex_;  // the disconnect callback's state
  std::string current_rid_;
  bool cancelled_ = false;
};

}  // namespace

void run_session_turn(Gateway& gateway, const server::HttpRequest& request,
                      std::shared_ptr<server::ResponseChannel> channel) {
  auto job = std::make_shared<TurnJob>(gateway, std::move(channel));
  job->start(request);
}

}  // namespace megactx::gateway
