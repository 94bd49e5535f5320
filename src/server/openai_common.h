// Pieces both OpenAI endpoints share: the model check, n, usage objects and
// finish reasons.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "server/generation_output.h"
#include "server/server_state.h"

namespace megactx::server {

// 404 when `model` names something this server does not serve (as vLLM does).
void check_model_name(const ServerState& state, const nlohmann::json& body);
// SGLang's /generate-only extras (return_routed_experts, return_hidden_states):
// 400 naming /generate when set, never ignored.
void refuse_generate_only_fields(const nlohmann::json& body);
// n in [1, 128].
int64_t parse_choice_count(const nlohmann::json& body);
// stream_options.include_usage (only valid with stream: true).
bool parse_include_usage(const nlohmann::json& body, bool stream);

// "stop", "length", "tool_calls" or "abort"; null while running.
nlohmann::json openai_finish_reason(const GenerationOutput& output, bool made_tool_calls);
// SGLang's extra `matched_stop`: the stop token id or string, or null.
nlohmann::json matched_stop_json(const GenerationOutput& output);

// `outputs` in prompt-major order, `choices_per_prompt` (n) each: the prompt is
// counted once per prompt, as OpenAI does.
nlohmann::json usage_json(const std::vector<const GenerationOutput*>& outputs,
                          size_t choices_per_prompt);

}  // namespace megactx::server
