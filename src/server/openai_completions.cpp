// POST /v1/completions: `prompt` as a string, a list of strings, a list of
// token ids or a list of lists; `echo`; `logprobs` (an integer: how many
// alternatives); `n`; streaming with an optional usage chunk.
#include <mutex>

#include "server/api_error.h"
#include "server/endpoints.h"
#include "server/generation_output.h"
#include "server/json_text.h"
#include "server/logprob_json.h"
#include "server/openai_common.h"
#include "server/prompt_limits.h"
#include "server/request_fields.h"
#include "server/sampling_json.h"
#include "server/sse.h"
#include "tokenizer/tokenizer.h"

namespace megactx::server {

namespace {

struct CompletionChoice {
  GenerationRequest request;
  GenerationOutput output;
  std::string echo_text;  // the prompt, when echo is on
  bool sent_echo = false;
  size_t streamed_logprobs = 0;
};

struct CompletionJob {
  ServerState& state;
  std::shared_ptr<ResponseChannel> channel;
  std::string id;
  int64_t created = unix_time_seconds();
  bool stream = false, include_usage = false, echo = false;
  std::optional<int64_t> logprobs;  // number of alternatives; absent: no logprobs
  size_t n = 1;
  std::vector<CompletionChoice> choices;
  std::mutex mutex;
  size_t remaining = 0;
  bool stream_started = false;

  CompletionJob(ServerState& state_in, std::shared_ptr<ResponseChannel> channel_in)
      : state(state_in), channel(std::move(channel_in)) {}

  const Tokenizer& tokenizer() const { return state.engine().tokenizer(); }

  // Echoed prompt logprobs come first (the first prompt token has none).
  std::vector<TokenLogprob> all_logprobs(const CompletionChoice& choice) const {
    std::vector<TokenLogprob> out;
    if (echo) out = align_input_logprobs(choice.output.input_logprobs, choice.request.input_ids, 0);
    out.insert(out.end(), choice.output.output_logprobs.begin(),
               choice.output.output_logprobs.end());
    return out;
  }

  nlohmann::json chunk(size_t index, std::string text, nlohmann::json logprobs_json,
                       nlohmann::json finish) const {
    nlohmann::json choice = {{"index", index},
                             {"text", sanitize_utf8(text)},
                             {"logprobs", std::move(logprobs_json)},
                             {"finish_reason", std::move(finish)}};
    nlohmann::json out = {{"id", id},
                          {"object", "text_completion"},
                          {"created", created},
                          {"model", state.config().served_model_name},
                          {"choices", nlohmann::json::array({std::move(choice)})}};
    if (include_usage) out["usage"] = nullptr;
    return out;
  }

  std::vector<const GenerationOutput*> outputs() const {
    std::vector<const GenerationOutput*> out;
    for (const auto& choice : choices) out.push_back(&choice.output);
    return out;
  }

  void on_update(size_t index, const RequestUpdate& update) {
    std::lock_guard lock(mutex);
    CompletionChoice& choice = choices[index];
    choice.output.add(update);
    bool finished_now = update.finish != FinishReason::None;
    if (finished_now) --remaining;
    if (stream) return stream_update(index, update, finished_now);
    if (remaining > 0) return;
    for (const auto& other : choices)
      if (other.output.finish == FinishReason::Error)
        return channel->respond(error_response(400, other.output.finish_detail));
    nlohmann::json list = nlohmann::json::array();
    for (size_t i = 0; i < choices.size(); ++i) {
      const auto& c = choices[i];
      nlohmann::json logprobs_json = nullptr;
      if (logprobs) logprobs_json = completion_logprobs(tokenizer(), all_logprobs(c), *logprobs, 0);
      list.push_back({{"index", i},
                      {"text", sanitize_utf8(c.echo_text + c.output.text)},
                      {"logprobs", std::move(logprobs_json)},
                      {"finish_reason", openai_finish_reason(c.output, false)},
                      {"matched_stop", matched_stop_json(c.output)}});
    }
    channel->respond(json_response({{"id", id},
                                    {"object", "text_completion"},
                                    {"created", created},
                                    {"model", state.config().served_model_name},
                                    {"choices", std::move(list)},
                                    {"usage", usage_json(outputs(), n)}}));
  }

  void stream_update(size_t index, const RequestUpdate& update, bool finished_now) {
    CompletionChoice& choice = choices[index];
    if (!stream_started) {
      if (finished_now && update.finish == FinishReason::Error && choices.size() == 1)
        return channel->respond(error_response(400, update.finish_detail));
      channel->begin_stream(200, kEventStreamType);
      stream_started = true;
    }
    if (finished_now && update.finish == FinishReason::Error) {
      channel->write(sse_event(error_json(400, update.finish_detail)));
    } else {
      std::string text = update.new_text;
      if (!choice.sent_echo) {
        text = choice.echo_text + text;
        choice.sent_echo = true;
      }
      nlohmann::json logprobs_json = nullptr;
      if (logprobs) {
        auto all = all_logprobs(choice);
        std::vector<TokenLogprob> fresh(
            all.begin() + static_cast<long>(std::min(choice.streamed_logprobs, all.size())),
            all.end());
        choice.streamed_logprobs = all.size();
        logprobs_json = completion_logprobs(tokenizer(), fresh, *logprobs, 0);
      }
      if (!text.empty() || logprobs)
        channel->write(sse_event(chunk(index, text, std::move(logprobs_json), nullptr)));
      if (finished_now)
        channel->write(
            sse_event(chunk(index, "", nullptr, openai_finish_reason(choice.output, false))));
    }
    if (remaining > 0) return;
    if (include_usage) {
      nlohmann::json last = {{"id", id},
                             {"object", "text_completion"},
                             {"created", created},
                             {"model", state.config().served_model_name},
                             {"choices", nlohmann::json::array()},
                             {"usage", usage_json(outputs(), n)}};
      channel->write(sse_event(last));
    }
    channel->write(sse_done());
    channel->end_stream();
  }
};

}  // namespace

void handle_completions(ServerState& state, const HttpRequest& request,
                        std::shared_ptr<ResponseChannel> channel) {
  nlohmann::json body = parse_request_json(request.body);
  check_model_name(state, body);
  const Tokenizer& tokenizer = state.engine().tokenizer();
  if (!has_field(body, "prompt")) throw_invalid("prompt", "'prompt' is required");
  if (has_field(body, "suffix")) throw_invalid("suffix", "'suffix' is not supported");

  // Prompts as (ids, text) pairs; the text is what echo returns.
  std::vector<std::pair<std::vector<int32_t>, std::string>> prompts;
  const auto& prompt = body["prompt"];
  auto add_text = [&](const std::string& text) {
    prompts.emplace_back(tokenizer.encode(text, true), text);
  };
  auto add_ids = [&](const nlohmann::json& ids) {
    auto list = get_token_list(ids, "prompt");
    std::string text = tokenizer.decode(list, false);
    prompts.emplace_back(std::move(list), std::move(text));
  };
  if (prompt.is_string()) {
    add_text(prompt.get<std::string>());
  } else if (prompt.is_array() && !prompt.empty()) {
    if (prompt[0].is_string()) {
      for (const auto& item : prompt) {
        if (!item.is_string()) throw_invalid("prompt", "'prompt' mixes strings and other values");
        add_text(item.get<std::string>());
      }
    } else if (prompt[0].is_array()) {
      for (const auto& item : prompt) add_ids(item);
    } else {
      add_ids(prompt);
    }
  } else {
    throw_invalid("prompt", "'prompt' must be a string, a list of strings or token ids");
  }
  int64_t vocab = tokenizer.vocab_size();
  for (const auto& [ids, text] : prompts)
    for (int32_t id : ids)
      if (vocab > 0 && id >= vocab)
        throw_invalid("prompt", "token id " + std::to_string(id) + " is not in the vocabulary");

  auto job = std::make_shared<CompletionJob>(state, channel);
  job->id = state.new_id("cmpl-");
  job->stream = get_bool(body, "stream").value_or(false);
  job->include_usage = parse_include_usage(body, job->stream);
  job->echo = get_bool(body, "echo").value_or(false);
  if (auto value = get_integer(body, "logprobs")) {
    check_range("logprobs", static_cast<double>(*value), 0, 20);
    job->logprobs = *value;
  }
  job->n = static_cast<size_t>(parse_choice_count(body));
  if (auto best_of = get_integer(body, "best_of");
      best_of && *best_of != static_cast<int64_t>(job->n))
    throw_invalid("best_of", "'best_of' other than n is not supported");
  OpenAiSampling sampling = parse_openai_sampling(body, state.config().default_sampling);
  // The legacy completions API defaults to 16 new tokens.
  std::optional<int64_t> requested =
      sampling.max_tokens ? sampling.max_tokens : std::optional<int64_t>(16);

  for (auto& [ids, text] : prompts) {
    int64_t max_new =
        resolve_max_new_tokens(static_cast<int64_t>(ids.size()), requested,
                               state.engine().max_context_tokens(), false, "max_tokens");
    if (max_new == 0 && !job->echo)
      throw_invalid("max_tokens", "'max_tokens' 0 is only useful with 'echo'");
    for (size_t k = 0; k < job->n; ++k) {
      CompletionChoice choice;
      choice.request.rid = job->id + "-" + std::to_string(job->choices.size());
      choice.request.input_ids = ids;
      choice.request.sampling = sampling.params;
      choice.request.sampling.max_new_tokens = max_new;
      if (sampling.params.seed) choice.request.sampling.seed = *sampling.params.seed + k;
      choice.request.return_logprob = job->logprobs.has_value();
      choice.request.top_logprobs_num = job->logprobs.value_or(0);
      if (job->echo && job->logprobs) choice.request.logprob_start_len = 0;
      if (job->echo) choice.echo_text = text;
      job->choices.push_back(std::move(choice));
    }
  }
  state.check_capacity();
  job->remaining = job->choices.size();
  std::vector<std::string> rids;
  for (const auto& choice : job->choices) rids.push_back(choice.request.rid);
  channel->on_disconnect([&state, rids] {
    for (const auto& rid : rids) state.engine().abort(rid);
  });
  for (size_t i = 0; i < job->choices.size(); ++i)
    state.submit(job->choices[i].request,
                 [job, i](const RequestUpdate& update) { job->on_update(i, update); });
}

}  // namespace megactx::server
