// POST /v1/chat/completions: the model's chat template renders the messages
// (and tools), the engine generates, and the OutputParser splits the output
// into content, reasoning_content and tool_calls — whole, or as streamed
// deltas: a role chunk, content/reasoning/tool-call deltas, a finish chunk
// per choice, a usage chunk when stream_options.include_usage, then [DONE].
// response_format and tool_choice required / named (and strict tools)
// constrain the output with a grammar (structured_output.h).
#include <memory>

#include "chat/output_parser.h"
#include "server/chat_hook.h"
#include "server/chat_request.h"
#include "server/endpoints.h"
#include "server/generation_output.h"
#include "server/json_text.h"
#include "server/logprob_json.h"
#include "server/openai_choices.h"
#include "server/openai_common.h"
#include "server/sse.h"
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
    const bool made_calls = !parsed.tool_calls.empty();
    nlohmann::json message = chat_message_json(parsed);
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
  // A request of a recorded agent session goes to the gateway (chat_hook.h).
  if (ChatSessionHook* hook = state.chat_hook(); hook != nullptr && hook->claims(request))
    return hook->handle_chat(state, request, std::move(channel));
  const ChatRequestPlan plan = plan_chat_request(state, request);
  auto job = std::make_shared<ChatJob>(state, channel);
  job->stream = plan.stream;
  job->include_usage = plan.include_usage;
  job->logprobs = plan.logprobs;
  job->top_logprobs = plan.top_logprobs;
  job->choices_per_prompt = plan.n;
  job->parser_options = plan.parser_options;
  for (size_t k = 0; k < plan.n; ++k) {
    job->requests.push_back(chat_generation_request(plan, k, job->id + "-" + std::to_string(k)));
    ChatChoice choice;
    if (job->stream) choice.parser = std::make_unique<OutputParser>(job->parser_options);
    job->choices.push_back(std::move(choice));
  }
  state.check_capacity();
  OpenAiChoiceJob::submit(job);
}

}  // namespace megactx::server
