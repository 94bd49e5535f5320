// POST /v1/completions: `prompt` as a string, a list of strings, a list of
// token ids or a list of lists; `echo`; `logprobs` (an integer: how many
// alternatives); `n`; streaming with an optional usage chunk; structured
// output by response_format or SGLang's json_schema / regex / ebnf
// (structured_output.h).
#include <algorithm>

#include "io/bounded_json.h"
#include "server/api_error.h"
#include "server/endpoints.h"
#include "server/generation_output.h"
#include "server/json_text.h"
#include "server/logprob_json.h"
#include "server/openai_choices.h"
#include "server/openai_common.h"
#include "server/prompt_limits.h"
#include "server/request_fields.h"
#include "server/sampling_json.h"
#include "server/sse.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace megactx::server {

namespace {

// Per choice, what streaming the echo and the logprobs needs.
struct CompletionChoice {
  std::string echo_text;  // the prompt, when echo is on
  bool sent_echo = false;
  size_t streamed_logprobs = 0;
};

class CompletionJob : public OpenAiChoiceJob {
 public:
  CompletionJob(ServerState& state_in, std::shared_ptr<ResponseChannel> channel_in)
      : OpenAiChoiceJob(state_in, std::move(channel_in), state_in.new_id("cmpl-"),
                        "text_completion", "text_completion") {}

  bool echo = false;
  std::optional<int64_t> logprobs;        // number of alternatives; absent: no logprobs
  std::vector<CompletionChoice> choices;  // [choices], beside `requests`

 private:
  const Tokenizer& tokenizer() const { return state.engine().tokenizer(); }

  // Echoed prompt logprobs come first (the first prompt token has none).
  std::vector<TokenLogprob> all_logprobs(size_t index) const {
    const GenerationOutput& output = outputs[index];
    std::vector<TokenLogprob> out;
    if (echo) out = align_input_logprobs(output.input_logprobs, requests[index].input_ids, 0);
    out.insert(out.end(), output.output_logprobs.begin(), output.output_logprobs.end());
    return out;
  }

  nlohmann::json text_chunk(size_t index, std::string text, nlohmann::json logprobs_json,
                            nlohmann::json finish) const {
    return chunk({{"index", index},
                  {"text", sanitize_utf8(text)},
                  {"logprobs", std::move(logprobs_json)},
                  {"finish_reason", std::move(finish)}});
  }

  nlohmann::json whole_choice(size_t index) const override {
    const GenerationOutput& output = outputs[index];
    nlohmann::json logprobs_json = nullptr;
    if (logprobs)
      logprobs_json = completion_logprobs(tokenizer(), all_logprobs(index), *logprobs, 0);
    return {{"index", index},
            {"text", sanitize_utf8(choices[index].echo_text + output.text)},
            {"logprobs", std::move(logprobs_json)},
            {"finish_reason", openai_finish_reason(output, false)},
            {"matched_stop", matched_stop_json(output)}};
  }

  void stream_choice(size_t index, const RequestUpdate& update, bool finished_now) override {
    CompletionChoice& choice = choices[index];
    std::string text = update.new_text;
    if (!choice.sent_echo) {
      text = choice.echo_text + text;
      choice.sent_echo = true;
    }
    nlohmann::json logprobs_json = nullptr;
    if (logprobs) {
      auto all = all_logprobs(index);
      std::vector<TokenLogprob> fresh(
          all.begin() + static_cast<long>(std::min(choice.streamed_logprobs, all.size())),
          all.end());
      choice.streamed_logprobs = all.size();
      logprobs_json = completion_logprobs(tokenizer(), fresh, *logprobs, 0);
    }
    if (!text.empty() || logprobs)
      channel->write(sse_event(text_chunk(index, text, std::move(logprobs_json), nullptr)));
    if (finished_now)
      channel->write(
          sse_event(text_chunk(index, "", nullptr, openai_finish_reason(outputs[index], false))));
  }
};

}  // namespace

void handle_completions(ServerState& state, const HttpRequest& request,
                        std::shared_ptr<ResponseChannel> channel) {
  nlohmann::json body = parse_request_json(request.body);
  check_model_name(state, body);
  refuse_generate_only_fields(body);
  const Tokenizer& tokenizer = state.engine().tokenizer();
  if (!has_field(body, "prompt")) throw_invalid("prompt", "'prompt' is required");
  if (has_field(body, "suffix")) throw_invalid("suffix", "'suffix' is not supported");
  refuse_unsupported_constraints(body, /*chat=*/false);
  // response_format, or SGLang's json_schema / regex / ebnf: the whole
  // completion (keys in the client's order, so schemas keep their property order).
  const std::shared_ptr<const grammar::CompiledGrammar> grammar =
      completion_grammar(state.engine(), parse_ordered_json(request.body));

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
  job->stream = get_bool(body, "stream").value_or(false);
  job->include_usage = parse_include_usage(body, job->stream);
  job->echo = get_bool(body, "echo").value_or(false);
  if (auto value = get_integer(body, "logprobs")) {
    check_range("logprobs", static_cast<double>(*value), 0, 20);
    job->logprobs = *value;
  }
  const size_t n = static_cast<size_t>(parse_choice_count(body));
  job->choices_per_prompt = n;
  if (auto best_of = get_integer(body, "best_of"); best_of && *best_of != static_cast<int64_t>(n))
    throw_invalid("best_of", "'best_of' other than n is not supported");
  OpenAiSampling sampling = parse_openai_sampling(body, state.config().default_sampling);
  sampling.params.grammar = grammar;
  // The legacy completions API defaults to 16 new tokens.
  std::optional<int64_t> requested =
      sampling.max_tokens ? sampling.max_tokens : std::optional<int64_t>(16);

  for (auto& [ids, text] : prompts) {
    int64_t max_new = resolve_max_new_tokens(static_cast<int64_t>(ids.size()), requested,
                                             state.engine().max_context_tokens(), false,
                                             {"prompt", "max_tokens"});
    if (max_new == 0 && !job->echo)
      throw_invalid("max_tokens", "'max_tokens' 0 is only useful with 'echo'");
    for (size_t k = 0; k < n; ++k) {
      GenerationRequest request;
      request.rid = job->id + "-" + std::to_string(job->requests.size());
      request.input_ids = ids;
      request.sampling = sampling.params;
      request.sampling.max_new_tokens = max_new;
      check_sampling_request(request.sampling, vocab, /*openai_names=*/true);
      if (sampling.params.seed) request.sampling.seed = *sampling.params.seed + k;
      request.return_logprob = job->logprobs.has_value();
      request.top_logprobs_num = job->logprobs.value_or(0);
      if (job->echo && job->logprobs) request.logprob_start_len = 0;
      job->requests.push_back(std::move(request));
      CompletionChoice choice;
      if (job->echo) choice.echo_text = text;
      job->choices.push_back(std::move(choice));
    }
  }
  state.check_capacity();
  OpenAiChoiceJob::submit(job);
}

}  // namespace megactx::server
