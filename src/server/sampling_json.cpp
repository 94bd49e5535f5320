#include "server/sampling_json.h"

#include "server/api_error.h"
#include "server/request_fields.h"

namespace megactx::server {

namespace {

// The fields both APIs spell the same way.
void parse_common(const nlohmann::json& object, SamplingParams& params) {
  if (auto value = get_number(object, "temperature")) {
    check_range("temperature", *value, 0.0, 100.0);
    params.temperature = *value;
  }
  if (auto value = get_number(object, "top_p")) {
    if (*value <= 0.0 || *value > 1.0) throw_invalid("top_p", "'top_p' must be in (0, 1]");
    params.top_p = *value;
  }
  if (auto value = get_integer(object, "top_k")) {
    if (*value < -1) throw_invalid("top_k", "'top_k' must be -1 (off) or a positive integer");
    params.top_k = *value == 0 ? -1 : *value;  // 0 means off, as in vLLM
  }
  if (auto value = get_number(object, "min_p")) {
    check_range("min_p", *value, 0.0, 1.0);
    params.min_p = *value;
  }
  if (auto value = get_number(object, "presence_penalty")) {
    check_range("presence_penalty", *value, -2.0, 2.0);
    params.presence_penalty = *value;
  }
  if (auto value = get_number(object, "frequency_penalty")) {
    check_range("frequency_penalty", *value, -2.0, 2.0);
    params.frequency_penalty = *value;
  }
  if (auto value = get_number(object, "repetition_penalty")) {
    if (*value <= 0.0)
      throw_invalid("repetition_penalty", "'repetition_penalty' must be greater than 0");
    params.repetition_penalty = *value;
  }
  params.stop = get_string_or_list(object, "stop");
  for (const auto& stop : params.stop)
    if (stop.empty()) throw_invalid("stop", "'stop' strings must not be empty");
  if (has_field(object, "stop_token_ids"))
    params.stop_token_ids = get_token_list(object.at("stop_token_ids"), "stop_token_ids");
  if (auto value = get_bool(object, "ignore_eos")) params.ignore_eos = *value;
  if (auto value = get_bool(object, "skip_special_tokens")) params.skip_special_tokens = *value;
}

std::optional<uint64_t> parse_seed(const nlohmann::json& object, const std::string& name) {
  auto value = get_integer(object, name);
  if (!value) return std::nullopt;
  return static_cast<uint64_t>(*value);  // negative seeds wrap, still reproducible
}

}  // namespace

OpenAiSampling parse_openai_sampling(const nlohmann::json& body, const SamplingParams& defaults) {
  OpenAiSampling out;
  out.params = defaults;
  parse_common(body, out.params);
  if (auto seed = parse_seed(body, "seed")) out.params.seed = seed;
  // max_completion_tokens is the newer spelling; it wins when both are given.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (auto value = get_integer(body, name)) {
      if (*value < 0) throw_invalid(name, std::string("'") + name + "' must be >= 0");
      out.max_tokens = *value;
    }
  }
  if (auto value = get_integer(body, "min_tokens")) {
    if (*value < 0) throw_invalid("min_tokens", "'min_tokens' must be >= 0");
    out.params.min_new_tokens = *value;
  }
  if (auto value = get_bool(body, "include_stop_str_in_output"))
    out.params.include_stop_str_in_output = *value;
  return out;
}

SamplingParams parse_sglang_sampling(const nlohmann::json& sampling_params,
                                     const SamplingParams& defaults) {
  SamplingParams params = defaults;
  if (sampling_params.is_null()) return params;
  if (!sampling_params.is_object())
    throw_invalid("sampling_params", "'sampling_params' must be an object");
  for (const char* constrained : {"regex", "json_schema", "ebnf", "structural_tag"})
    if (has_field(sampling_params, constrained))
      throw_invalid(constrained, std::string("constrained decoding ('") + constrained +
                                     "') is not supported by megactx");
  parse_common(sampling_params, params);
  if (auto value = get_integer(sampling_params, "max_new_tokens")) {
    if (*value < 0) throw_invalid("max_new_tokens", "'max_new_tokens' must be >= 0");
    params.max_new_tokens = *value;
  }
  if (auto value = get_integer(sampling_params, "min_new_tokens")) {
    if (*value < 0) throw_invalid("min_new_tokens", "'min_new_tokens' must be >= 0");
    params.min_new_tokens = *value;
  }
  if (auto value = get_bool(sampling_params, "no_stop_trim"))
    params.include_stop_str_in_output = *value;
  if (auto seed = parse_seed(sampling_params, "sampling_seed"))
    params.seed = seed;
  else if (auto plain = parse_seed(sampling_params, "seed"))
    params.seed = plain;
  if (auto n = get_integer(sampling_params, "n"); n && *n != 1)
    throw_invalid("n", "sampling_params.n must be 1; send a batch of prompts instead");
  return params;
}

}  // namespace megactx::server
