// Sampling parameters from request JSON: OpenAI's top-level fields
// (temperature, top_p, max_tokens, stop, seed, ... plus the vLLM/SGLang
// extensions top_k, min_p, repetition_penalty, ignore_eos, stop_token_ids) and
// SGLang's `sampling_params` object (max_new_tokens, no_stop_trim, ...).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>

#include "engine/request.h"

namespace megactx::server {

struct OpenAiSampling {
  SamplingParams params;
  std::optional<int64_t> max_tokens;  // absent: the caller picks a default
};

// `defaults` carries generation_config.json's sampling defaults; fields the
// request sets override them.
OpenAiSampling parse_openai_sampling(const nlohmann::json& body, const SamplingParams& defaults);

// SGLang's defaults: max_new_tokens 128, temperature 1. Throws ApiError 400 on
// wrong types. Structured output (json_schema, regex, ebnf) is read by
// structured_output.h's sglang_grammar.
SamplingParams parse_sglang_sampling(const nlohmann::json& sampling_params,
                                     const SamplingParams& defaults);

// The ranges of a complete request's sampling parameters (engine's
// check_sampling): ApiError 400 naming the parameter, in OpenAI's spelling
// (max_tokens, min_tokens) when `openai_names`.
void check_sampling_request(const SamplingParams& params, int64_t vocab_size, bool openai_names);

}  // namespace megactx::server
