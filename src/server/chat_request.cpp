#include "server/chat_request.h"

#include "io/bounded_json.h"
#include "server/api_error.h"
#include "server/json_text.h"
#include "server/openai_common.h"
#include "server/prompt_limits.h"
#include "server/request_fields.h"
#include "server/sampling_json.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace megactx::server {

namespace {

int64_t resolve_chat_max_new(ServerState& state, const ChatRequestPlan& plan) {
  int64_t max_new = resolve_max_new_tokens(static_cast<int64_t>(plan.prompt_ids.size()),
                                           plan.max_tokens, state.engine().max_context_tokens(),
                                           false, {"messages", "max_tokens"});
  if (max_new == 0) throw_invalid("max_tokens", "'max_tokens' must be at least 1");
  return max_new;
}

}  // namespace

ChatRequestPlan plan_chat_request(ServerState& state, const HttpRequest& request) {
  ChatRequestPlan plan;
  plan.body = parse_request_json(request.body);
  const nlohmann::json& body = plan.body;
  check_model_name(state, body);
  refuse_generate_only_fields(body);
  refuse_unsupported_constraints(body, /*chat=*/true);
  plan.rendered = render_chat_prompt(state.chat(), body, request.body);
  const std::string& prompt = plan.rendered.text;
  // response_format, tool_choice required / named and strict tools, in the
  // model's own format; the keys in the client's order (schemas keep their
  // property order).
  const std::shared_ptr<const grammar::CompiledGrammar> grammar =
      chat_grammar(state.engine(), parse_ordered_json(request.body), prompt, plan.rendered.tools,
                   state.chat().tool_call_format);
  const Tokenizer& tokenizer = state.engine().tokenizer();
  plan.prompt_ids = tokenizer.encode(prompt, false);

  plan.stream = get_bool(body, "stream").value_or(false);
  plan.include_usage = parse_include_usage(body, plan.stream);
  plan.logprobs = get_bool(body, "logprobs").value_or(false);
  if (auto top = get_integer(body, "top_logprobs")) {
    check_range("top_logprobs", static_cast<double>(*top), 0, 20);
    if (*top > 0 && !plan.logprobs)
      throw_invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    plan.top_logprobs = *top;
  }
  plan.n = static_cast<size_t>(parse_choice_count(body));
  OpenAiSampling sampling = parse_openai_sampling(body, state.config().default_sampling);
  plan.max_tokens = sampling.max_tokens;
  plan.sampling = sampling.params;
  plan.sampling.max_new_tokens = resolve_chat_max_new(state, plan);
  plan.sampling.grammar = grammar;
  check_sampling_request(plan.sampling, tokenizer.vocab_size(), /*openai_names=*/true);
  plan.skip_special_tokens_given = has_field(body, "skip_special_tokens");

  OutputParserOptions& parser = plan.parser_options;
  parser.format = state.chat().tool_call_format;
  parser.tools = plan.rendered.tools;
  // Markup is always parsed: a call of a function the request did not offer
  // (or markup that does not parse) reaches content without its markup.
  parser.parse_tool_calls = true;
  parser.known_tools_only = true;
  parser.strip_unparsed_markup = true;
  if (auto parallel = get_bool(body, "parallel_tool_calls"); parallel && !*parallel)
    parser.max_tool_calls = 1;
  parser.parse_reasoning = true;
  parser.starts_in_reasoning = prompt_opens_reasoning(prompt);
  return plan;
}

void set_plan_prompt_ids(ServerState& state, ChatRequestPlan& plan, std::vector<int32_t> ids) {
  plan.prompt_ids = std::move(ids);
  plan.sampling.max_new_tokens = resolve_chat_max_new(state, plan);
}

GenerationRequest chat_generation_request(const ChatRequestPlan& plan, size_t k,
                                          const std::string& rid) {
  GenerationRequest request;
  request.rid = rid;
  request.input_ids = plan.prompt_ids;
  request.sampling = plan.sampling;
  // Reasoning and tool-call markers (<think>, <tool_call>, <arg_key>, ...) are
  // special tokens in GLM and DeepSeek tokenizers and the output parser must see
  // them, so chat keeps special tokens in the text unless the request says
  // otherwise (as vLLM's GLM tool parser and SGLang do). Stop tokens never reach
  // the text.
  if (!plan.skip_special_tokens_given) request.sampling.skip_special_tokens = false;
  if (plan.sampling.seed) request.sampling.seed = *plan.sampling.seed + k;
  request.return_logprob = plan.logprobs;
  request.top_logprobs_num = plan.top_logprobs;
  return request;
}

nlohmann::json chat_message_json(const ParsedMessage& parsed) {
  const bool made_calls = !parsed.tool_calls.empty();
  nlohmann::json message = {
      {"role", "assistant"},
      {"content", parsed.content.empty() && made_calls
                      ? nlohmann::json(nullptr)
                      : nlohmann::json(sanitize_utf8(parsed.content))},
      {"reasoning_content", parsed.reasoning_content.empty()
                                ? nlohmann::json(nullptr)
                                : nlohmann::json(sanitize_utf8(parsed.reasoning_content))}};
  if (made_calls) message["tool_calls"] = parsed.tool_calls;
  return message;
}

}  // namespace megactx::server
