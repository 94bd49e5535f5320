// POST /v1/chat/completions: the model's chat template renders the messages
// (and tools), the engine generates, and the OutputParser splits the output
// into content, reasoning_content and tool_calls — whole, or as streamed
// deltas: a role chunk, content/reasoning/tool-call deltas, a finish chunk
// per choice, a usage chunk when stream_options.include_usage, then [DONE].
// response_format and tool_choice required / named (and strict tools)
// constrain the output with a grammar (structured_output.h).
#include <memory>

#include "chat/chat_template.h"
#include "chat/output_parser.h"
#include "io/bounded_json.h"
#include "io/model_config.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
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

nlohmann::json delta_json(const ParsedDelta& delta) {
  nlohmann::json out = nlohmann::json::object();
  if (!delta.content.empty()) out["content"] = sanitize_utf8(delta.content);
  if (!delta.reasoning_content.empty())
    out["reasoning_content"] = sanitize_utf8(delta.reasoning_content);
  if (!delta.tool_calls.empty()) {
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& call : delta.tool_calls) {
      nlohmann::json item = {{"index", call.index},
                             {"function", {{"arguments", sanitize_utf8(call.arguments)}}}};
      if (!call.id.empty()) {
        item["id"] = call.id;
        item["type"] = "function";
        item["function"]["name"] = call.name;
      }
      calls.push_back(std::move(item));
    }
    out["tool_calls"] = std::move(calls);
  }
  return out;
}

// Per choice, what streaming needs: the incremental parser (made only when
// streaming) and what was sent.
struct ChatChoice {
  std::unique_ptr<OutputParser> parser;
  bool sent_role = false;
  bool made_tool_calls = false;
};

class ChatJob : public OpenAiChoiceJob {
 public:
  ChatJob(ServerState& state_in, std::shared_ptr<ResponseChannel> channel_in)
      : OpenAiChoiceJob(state_in, std::move(channel_in), state_in.new_id("chatcmpl-"),
                        "chat.completion", "chat.completion.chunk") {}

  bool logprobs = false;
  int64_t top_logprobs = 0;
  OutputParserOptions parser_options;
  std::vector<ChatChoice> choices;  // [choices], beside `requests`

 private:
  const Tokenizer& tokenizer() const { return state.engine().tokenizer(); }

  nlohmann::json delta_chunk(size_t index, nlohmann::json delta, nlohmann::json logprobs_json,
                             nlohmann::json finish) const {
    return chunk({{"index", index},
                  {"delta", std::move(delta)},
                  {"logprobs", std::move(logprobs_json)},
                  {"finish_reason", std::move(finish)}});
  }

  nlohmann::json whole_choice(size_t index) const override {
    const GenerationOutput& output = outputs[index];
    ParsedMessage parsed = parse_output(output.text, parser_options);
    bool made_calls = !parsed.tool_calls.empty();
    nlohmann::json message = {
        {"role", "assistant"},
        {"content", parsed.content.empty() && made_calls
                        ? nlohmann::json(nullptr)
                        : nlohmann::json(sanitize_utf8(parsed.content))},
        {"reasoning_content", parsed.reasoning_content.empty()
                                  ? nlohmann::json(nullptr)
                                  : nlohmann::json(sanitize_utf8(parsed.reasoning_content))}};
    if (made_calls) message["tool_calls"] = parsed.tool_calls;
    nlohmann::json logprobs_json = nullptr;
    if (logprobs)
      logprobs_json = {
          {"content", chat_logprob_entries(tokenizer(), output.output_logprobs, top_logprobs)}};
    return {{"index", index},
            {"message", std::move(message)},
            {"logprobs", std::move(logprobs_json)},
            {"finish_reason", openai_finish_reason(output, made_calls)},
            {"matched_stop", matched_stop_json(output)}};
  }

  void stream_choice(size_t index, const RequestUpdate& update, bool finished_now) override {
    ChatChoice& choice = choices[index];
    if (!choice.sent_role) {
      choice.sent_role = true;
      channel->write(sse_event(
          delta_chunk(index, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)));
    }
    ParsedDelta delta = choice.parser->push(update.new_text);
    if (finished_now) {
      ParsedDelta rest = choice.parser->finish();
      delta.content += rest.content;
      delta.reasoning_content += rest.reasoning_content;
      delta.tool_calls.insert(delta.tool_calls.end(), rest.tool_calls.begin(),
                              rest.tool_calls.end());
    }
    if (!delta.tool_calls.empty()) choice.made_tool_calls = true;
    nlohmann::json logprobs_json = nullptr;
    if (logprobs && !update.new_logprobs.empty())
      logprobs_json = {
          {"content", chat_logprob_entries(tokenizer(), update.new_logprobs, top_logprobs)}};
    if (!delta.empty() || !logprobs_json.is_null())
      channel->write(
          sse_event(delta_chunk(index, delta_json(delta), std::move(logprobs_json), nullptr)));
    if (finished_now)
      channel->write(
          sse_event(delta_chunk(index, nlohmann::json::object(), nullptr,
                                openai_finish_reason(outputs[index], choice.made_tool_calls))));
  }
};

}  // namespace

void handle_chat_completions(ServerState& state, const HttpRequest& request,
                             std::shared_ptr<ResponseChannel> channel) {
  nlohmann::json body = parse_request_json(request.body);
  check_model_name(state, body);
  refuse_unsupported_constraints(body, /*chat=*/true);
  const ChatPrompt rendered = render_chat_prompt(state.chat(), body, request.body);
  const std::string& prompt = rendered.text;
  // response_format, tool_choice required / named and strict tools, in the
  // model's own format; the keys in the client's order (schemas keep their
  // property order).
  const std::shared_ptr<const grammar::CompiledGrammar> grammar =
      chat_grammar(state.engine(), parse_ordered_json(request.body), prompt, rendered.tools,
                   state.chat().tool_call_format);
  const nlohmann::json& tools = rendered.tools;
  const Tokenizer& tokenizer = state.engine().tokenizer();
  std::vector<int32_t> ids = tokenizer.encode(prompt, false);

  auto job = std::make_shared<ChatJob>(state, channel);
  job->stream = get_bool(body, "stream").value_or(false);
  job->include_usage = parse_include_usage(body, job->stream);
  job->logprobs = get_bool(body, "logprobs").value_or(false);
  if (auto top = get_integer(body, "top_logprobs")) {
    check_range("top_logprobs", static_cast<double>(*top), 0, 20);
    if (*top > 0 && !job->logprobs)
      throw_invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    job->top_logprobs = *top;
  }
  const size_t n = static_cast<size_t>(parse_choice_count(body));
  job->choices_per_prompt = n;
  OpenAiSampling sampling = parse_openai_sampling(body, state.config().default_sampling);
  int64_t max_new = resolve_max_new_tokens(static_cast<int64_t>(ids.size()), sampling.max_tokens,
                                           state.engine().max_context_tokens(), false,
                                           {"messages", "max_tokens"});
  if (max_new == 0) throw_invalid("max_tokens", "'max_tokens' must be at least 1");
  sampling.params.max_new_tokens = max_new;
  sampling.params.grammar = grammar;
  check_sampling_request(sampling.params, tokenizer.vocab_size(), /*openai_names=*/true);

  job->parser_options.format = state.chat().tool_call_format;
  job->parser_options.tools = tools;
  // Markup is always parsed: a call of a function the request did not offer
  // (or markup that does not parse) reaches content without its markup.
  job->parser_options.parse_tool_calls = true;
  job->parser_options.known_tools_only = true;
  job->parser_options.strip_unparsed_markup = true;
  if (auto parallel = get_bool(body, "parallel_tool_calls"); parallel && !*parallel)
    job->parser_options.max_tool_calls = 1;
  job->parser_options.parse_reasoning = true;
  job->parser_options.starts_in_reasoning = prompt_opens_reasoning(prompt);

  for (size_t k = 0; k < n; ++k) {
    GenerationRequest request;
    request.rid = job->id + "-" + std::to_string(k);
    request.input_ids = ids;
    request.sampling = sampling.params;
    // Reasoning and tool-call markers (<think>, <tool_call>, <arg_key>, ...) are
    // special tokens in GLM and DeepSeek tokenizers and the output parser must see
    // them, so chat keeps special tokens in the text unless the request says
    // otherwise (as vLLM's GLM tool parser and SGLang do). Stop tokens never reach
    // the text.
    if (!has_field(body, "skip_special_tokens")) request.sampling.skip_special_tokens = false;
    request.sampling.max_new_tokens = max_new;
    if (sampling.params.seed) request.sampling.seed = *sampling.params.seed + k;
    request.return_logprob = job->logprobs;
    request.top_logprobs_num = job->top_logprobs;
    job->requests.push_back(std::move(request));
    ChatChoice choice;
    if (job->stream) choice.parser = std::make_unique<OutputParser>(job->parser_options);
    job->choices.push_back(std::move(choice));
  }
  state.check_capacity();
  OpenAiChoiceJob::submit(job);
}

}  // namespace megactx::server
