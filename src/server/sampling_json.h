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
// wrong types, out-of-range values and constrained decoding (regex,
// json_schema, ebnf), which megactx does not do.
SamplingParams parse_sglang_sampling(const nlohmann::json& sampling_params,
                                     const SamplingParams& defaults);

}  // namespace megactx::server
