#include "server/sampling_json.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "server/api_error.h"
#include "server/request_fields.h"

namespace megactx::server {

namespace {

// The fields both APIs spell the same way.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const nlohmann::json& value) {
  if (!value.is_object())
    throw_invalid("logit_bias", "'logit_bias' must be an object of token id strings to numbers");
  std::vector<std::pair<int32_t, float>> bias;
  for (const auto& [key, amount] : value.items()) {
    int64_t id = -1;
    auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (error != std::errc() || end != key.data() + key.size() || id < 0 ||
        id > std::numeric_limits<int32_t>::max())
      throw_invalid("logit_bias", "'logit_bias' key '" + key + "' is not a token id");
    if (!amount.is_number())
      throw_invalid("logit_bias", "'logit_bias' of token " + key + " must be a number");
    bias.emplace_back(static_cast<int32_t>(id), amount.get<float>());
  }
  std::sort(bias.begin(), bias.end());
  return bias;
}

// The fields both APIs spell the same way. Types are checked here, ranges by
// check_sampling once the request is complete (check_sampling_request).
void parse_common(const nlohmann::json& object, SamplingParams& params) {
  if (auto value = get_number(object, "temperature")) params.temperature = *value;
  if (auto value = get_number(object, "top_p")) params.top_p = *value;
  if (auto value = get_integer(object, "top_k")) {
    params.top_k = *value == 0 ? -1 : *value;  // 0 means off, as in vLLM
  }
  if (auto value = get_number(object, "min_p")) params.min_p = *value;
  if (auto value = get_number(object, "presence_penalty")) params.presence_penalty = *value;
  if (auto value = get_number(object, "frequency_penalty")) params.frequency_penalty = *value;
  if (auto value = get_number(object, "repetition_penalty")) params.repetition_penalty = *value;
  params.stop = get_string_or_list(object, "stop");
  for (const auto& stop : params.stop)
    if (stop.empty()) throw_invalid("stop", "'stop' strings must not be empty");
  if (has_field(object, "stop_token_ids"))
    params.stop_token_ids = get_token_list(object.at("stop_token_ids"), "stop_token_ids");
  if (auto value = get_bool(object, "ignore_eos")) params.ignore_eos = *value;
  if (auto value = get_bool(object, "skip_special_tokens")) params.skip_special_tokens = *value;
  if (has_field(object, "logit_bias"))
    params.logit_bias = parse_logit_bias(object.at("logit_bias"));
}

std::optional<uint64_t> parse_seed(const nlohmann::json& object, const std::string& name) {
  auto value = get_integer(object, name);
  if (!value) return std::nullopt;
  // Any int64 (as vLLM); negative seeds wrap, still reproducible.
  return static_cast<uint64_t>(*value);
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
  if (auto value = get_integer(body, "min_tokens")) out.params.min_new_tokens = *value;
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
  parse_common(sampling_params, params);
  if (auto value = get_integer(sampling_params, "max_new_tokens")) params.max_new_tokens = *value;
  if (auto value = get_integer(sampling_params, "min_new_tokens")) params.min_new_tokens = *value;
  if (auto value = get_bool(sampling_params, "no_stop_trim"))
    params.include_stop_str_in_output = *value;
  if (auto seed = parse_seed(sampling_params, "sampling_seed"))
    params.seed = seed;
  else if (auto plain = parse_seed(sampling_params, "seed"))
    params.seed = plain;
  // "n" (parallel samples) is read by /generate itself, which submits n requests.
  return params;
}

void check_sampling_request(const SamplingParams& params, int64_t vocab_size, bool openai_names) {
  auto problem = check_sampling(params, vocab_size);
  if (!problem) return;
  std::string param = problem->param;
  if (openai_names && param == "max_new_tokens") param = "max_tokens";
  if (openai_names && param == "min_new_tokens") param = "min_tokens";
  throw_invalid(param, problem->message);
}

}  // namespace megactx::server
