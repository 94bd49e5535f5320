// Logprobs in the three dialects the server speaks:
//  * OpenAI chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}
//  * OpenAI completions: {"tokens", "token_logprobs", "top_logprobs": [{token: lp}], "text_offset"}
//  * SGLang: [logprob, token_id, text-or-null] triples; the first prompt
//    token has no logprob (null), as SGLang returns it.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "engine/request.h"

namespace megactx {
class Tokenizer;
}

namespace megactx::server {

nlohmann::json chat_logprob_entries(const Tokenizer& tokenizer,
                                    const std::vector<TokenLogprob>& logprobs, int64_t top_n);

// `text_offset_start` is the character offset of the first token in the
// returned text (the echoed prompt length when echo is on).
nlohmann::json completion_logprobs(const Tokenizer& tokenizer,
                                   const std::vector<TokenLogprob>& logprobs, int64_t top_n,
                                   size_t text_offset_start);

// A logprob value as JSON: null for NaN or -inf-less "no value" markers.
nlohmann::json logprob_value(float logprob);

nlohmann::json sglang_token_logprobs(const Tokenizer& tokenizer,
                                     const std::vector<TokenLogprob>& logprobs, bool with_text);
nlohmann::json sglang_top_logprobs(const Tokenizer& tokenizer,
                                   const std::vector<TokenLogprob>& logprobs, bool with_text);
// token_ids_logprob: per position, [logprob, id, text] of each asked id.
nlohmann::json sglang_token_ids_logprobs(const Tokenizer& tokenizer,
                                         const std::vector<TokenLogprob>& logprobs,
                                         bool with_text);

// Input-token logprobs for prompt positions [start, prompt_len): when the
// engine leaves out position 0 (it has no logprob), a null entry is put back
// so the list lines up with the prompt as SGLang's does.
std::vector<TokenLogprob> align_input_logprobs(const std::vector<TokenLogprob>& logprobs,
                                               const std::vector<int32_t>& input_ids,
                                               int64_t logprob_start_len);

}  // namespace megactx::server
