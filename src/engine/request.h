// What a client asks of the engine and what the engine streams back. The HTTP
// layer translates OpenAI and SGLang-native JSON into GenerationRequest and
// RequestUpdate back into JSON; the engine never sees HTTP.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace megactx {

namespace grammar {
class CompiledGrammar;
}

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;
  int64_t top_k = -1;  // -1 = off
  double min_p = 0.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  std::optional<uint64_t> seed;  // reproducible sampling when set
  int64_t max_new_tokens = 128;
  int64_t min_new_tokens = 0;
  std::vector<std::string> stop;        // stop strings (matched across token boundaries)
  std::vector<int32_t> stop_token_ids;  // in addition to the model's eos ids
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
  // Added to the logits before penalties and sampling (OpenAI logit_bias):
  // (token id, bias in [-100, 100]), ids distinct. Logprobs stay those of
  // the unmodified logits.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Structured output (null: free text): every generated token is one the
  // grammar allows next, applied as a mask after penalties and before
  // temperature; the output ends when the grammar's stop token (a model eos
  // id) is sampled, so ignore_eos and min_new_tokens cannot come with it.
  // Compiled by the server over the engine's vocabulary
  // (EngineApi::grammar_compiler); logprobs stay those of the unmodified logits.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

// What is wrong with a request's sampling parameters, if anything: the one
// validation the server (a 400 naming `param`) and the engine (an error
// update) both apply. Names are the SGLang-native ones.
struct SamplingProblem {
  std::string param;
  std::string message;
};
std::optional<SamplingProblem> check_sampling(const SamplingParams& params, int64_t vocab_size);

struct GenerationRequest {
  std::string rid;  // unique; the engine makes one when empty
  std::vector<int32_t> input_ids;
  SamplingParams sampling;
  bool return_logprob = false;
  int64_t top_logprobs_num = 0;
  // Input-token logprobs (scoring) from this prompt position on; -1 = none.
  int64_t logprob_start_len = -1;
  // Also the logprobs of these ids at every scored position, input and
  // output (on-policy distillation's teacher side: SGLang token_ids_logprob).
  std::vector<int32_t> token_ids_logprob;
  // Logprobs of the temperature-scaled distribution (logits / temperature)
  // instead of the raw one (SGLang temp_scaled_logprobs).
  bool temp_scaled_logprobs = false;
  // The routed experts of every token but the last, in the final update
  // (SGLang return_routed_experts; needs EngineConfig::record_routed_experts).
  bool return_routed_experts = false;
  // The final hidden state (after the model's last norm: the input of
  // lm_head) of every token but the last, in the final update (SGLang
  // return_hidden_states; needs EngineConfig::record_hidden_states). Such a
  // request computes its whole prompt (no prefix-cache reuse).
  bool return_hidden_states = false;
};

enum class FinishReason { None, Stop, Length, Abort, Error };

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;        // top_logprobs_num alternatives
  std::vector<std::pair<int32_t, float>> token_ids;  // token_ids_logprob, in request order
};

// One update per engine step that produced something for the request, and a
// last one with finish != None. Text is the newly completed UTF-8 text.
struct RequestUpdate {
  std::string rid;
  std::vector<int32_t> new_token_ids;
  std::string new_text;
  std::vector<TokenLogprob> new_logprobs;    // parallel to new_token_ids when asked
  std::vector<TokenLogprob> input_logprobs;  // once, in the first update, when asked
  FinishReason finish = FinishReason::None;
  std::string finish_detail;  // matched stop string / token, or error text
  // FinishReason::Error from the engine's side (a failed step: the device, a
  // parallel group), not from the request: HTTP 500 rather than 400.
  bool server_error = false;
  std::optional<int32_t> matched_stop_token;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  // Speculative decoding counters (0 without MTP).
  int64_t spec_accept_token_num = 0;
  int64_t spec_draft_token_num = 0;
  int64_t spec_verify_ct = 0;
  // The weights that produced this update's tokens (update_weights' version).
  std::string weight_version;
  // Final update of a return_routed_experts request: [tokens - 1, layers,
  // top_k] expert ids, -1 at dense layers.
  std::vector<int32_t> routed_experts;
  // Final update of a return_hidden_states request: [tokens - 1, hidden]
  // float32, position by position.
  std::vector<float> hidden_states;
};

// Called on the engine thread; must be quick (hand off to the I/O thread).
using UpdateCallback = std::function<void(const RequestUpdate&)>;

}  // namespace megactx
