#include "server/openai_common.h"

#include "server/api_error.h"
#include "server/json_text.h"
#include "server/request_fields.h"

namespace megactx::server {

void check_model_name(const ServerState& state, const nlohmann::json& body) {
  auto model = get_string(body, "model");
  if (!model || model->empty()) return;
  if (*model == state.config().served_model_name || *model == state.config().model_path) return;
  throw ApiError(404,
                 "the model '" + *model + "' does not exist; this server serves '" +
                     state.config().served_model_name + "'",
                 "model");
}

void refuse_generate_only_fields(const nlohmann::json& body) {
  for (const char* name : {"return_routed_experts", "return_hidden_states"}) {
    const auto it = body.find(name);
    if (it != body.end() && !(it->is_boolean() && !it->get<bool>()))
      throw_invalid(name, std::string("'") + name + "' is served by /generate only");
  }
}

int64_t parse_choice_count(const nlohmann::json& body) {
  int64_t n = get_integer(body, "n").value_or(1);
  if (n < 1 || n > 128) throw_invalid("n", "'n' must be between 1 and 128");
  return n;
}

bool parse_include_usage(const nlohmann::json& body, bool stream) {
  if (!has_field(body, "stream_options")) return false;
  const auto& options = body["stream_options"];
  if (!options.is_object()) throw_invalid("stream_options", "'stream_options' must be an object");
  if (!stream)
    throw_invalid("stream_options", "'stream_options' is only allowed when 'stream' is true");
  return get_bool(options, "include_usage").value_or(false);
}

nlohmann::json openai_finish_reason(const GenerationOutput& output, bool made_tool_calls) {
  switch (output.finish) {
    case FinishReason::None:
      return nullptr;
    case FinishReason::Stop:
      return made_tool_calls ? "tool_calls" : "stop";
    case FinishReason::Length:  // complete tool calls win, as in vLLM's OpenAI server
      return made_tool_calls ? "tool_calls" : "length";
    case FinishReason::Abort:
    case FinishReason::Error:
      return "abort";
  }
  return nullptr;
}

nlohmann::json matched_stop_json(const GenerationOutput& output) {
  if (output.finish != FinishReason::Stop) return nullptr;
  if (output.matched_stop_token) return *output.matched_stop_token;
  if (!output.finish_detail.empty()) return sanitize_utf8(output.finish_detail);
  return nullptr;
}

nlohmann::json usage_json(const std::vector<const GenerationOutput*>& outputs,
                          size_t choices_per_prompt) {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (choices_per_prompt > 0 && i % choices_per_prompt == 0) {
      prompt += outputs[i]->prompt_tokens;
      cached += outputs[i]->cached_tokens;
    }
    completion += outputs[i]->completion_tokens;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

}  // namespace megactx::server
