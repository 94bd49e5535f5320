#include "server/logprob_json.h"

#include <cmath>
#include <limits>

#include "server/json_text.h"
#include "tokenizer/tokenizer.h"

namespace megactx::server {

namespace {

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  return sanitize_utf8(tokenizer.decode({id}, false));
}

nlohmann::json token_bytes_json(const Tokenizer& tokenizer, int32_t id) {
  nlohmann::json bytes = nlohmann::json::array();
  for (unsigned char byte : tokenizer.token_bytes(id)) bytes.push_back(static_cast<int>(byte));
  return bytes;
}

}  // namespace

nlohmann::json logprob_value(float logprob) {
  if (std::isnan(logprob)) return nullptr;
  // JSON has no -inf; OpenAI clients expect a number, so clamp like vLLM does.
  if (std::isinf(logprob)) return logprob < 0 ? -9999.0 : 0.0;
  return static_cast<double>(logprob);
}

nlohmann::json chat_logprob_entries(const Tokenizer& tokenizer,
                                    const std::vector<TokenLogprob>& logprobs, int64_t top_n) {
  nlohmann::json content = nlohmann::json::array();
  for (const auto& entry : logprobs) {
    nlohmann::json top = nlohmann::json::array();
    for (size_t i = 0; i < entry.top.size() && static_cast<int64_t>(i) < top_n; ++i) {
      auto [id, logprob] = entry.top[i];
      top.push_back({{"token", token_text(tokenizer, id)},
                     {"logprob", logprob_value(logprob)},
                     {"bytes", token_bytes_json(tokenizer, id)}});
    }
    content.push_back({{"token", token_text(tokenizer, entry.token_id)},
                       {"logprob", logprob_value(entry.logprob)},
                       {"bytes", token_bytes_json(tokenizer, entry.token_id)},
                       {"top_logprobs", std::move(top)}});
  }
  return content;
}

nlohmann::json completion_logprobs(const Tokenizer& tokenizer,
                                   const std::vector<TokenLogprob>& logprobs, int64_t top_n,
                                   size_t text_offset_start) {
  nlohmann::json tokens = nlohmann::json::array(), token_logprobs = nlohmann::json::array(),
                 top_logprobs = nlohmann::json::array(), offsets = nlohmann::json::array();
  size_t offset = text_offset_start;
  for (const auto& entry : logprobs) {
    std::string text = token_text(tokenizer, entry.token_id);
    tokens.push_back(text);
    token_logprobs.push_back(logprob_value(entry.logprob));
    offsets.push_back(offset);
    offset += text.size();
    if (top_n >= 0 && !std::isnan(entry.logprob)) {
      // The top_n alternatives and, as vLLM adds it, the chosen token itself
      // (so logprobs 0 still names the chosen token's logprob).
      nlohmann::json top = nlohmann::json::object();
      for (size_t i = 0; i < entry.top.size() && static_cast<int64_t>(i) < top_n; ++i)
        top[token_text(tokenizer, entry.top[i].first)] = logprob_value(entry.top[i].second);
      if (!top.contains(text)) top[text] = logprob_value(entry.logprob);
      top_logprobs.push_back(std::move(top));
    } else {
      top_logprobs.push_back(nullptr);
    }
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

nlohmann::json sglang_token_logprobs(const Tokenizer& tokenizer,
                                     const std::vector<TokenLogprob>& logprobs, bool with_text) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& entry : logprobs)
    out.push_back({logprob_value(entry.logprob), entry.token_id,
                   with_text ? nlohmann::json(token_text(tokenizer, entry.token_id))
                             : nlohmann::json(nullptr)});
  return out;
}

nlohmann::json sglang_top_logprobs(const Tokenizer& tokenizer,
                                   const std::vector<TokenLogprob>& logprobs, bool with_text) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& entry : logprobs) {
    if (std::isnan(entry.logprob) && entry.top.empty()) {
      out.push_back(nullptr);
      continue;
    }
    nlohmann::json top = nlohmann::json::array();
    for (auto [id, logprob] : entry.top)
      top.push_back(
          {logprob_value(logprob), id,
           with_text ? nlohmann::json(token_text(tokenizer, id)) : nlohmann::json(nullptr)});
    out.push_back(std::move(top));
  }
  return out;
}

nlohmann::json sglang_token_ids_logprobs(const Tokenizer& tokenizer,
                                         const std::vector<TokenLogprob>& logprobs,
                                         bool with_text) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& entry : logprobs) {
    if (std::isnan(entry.logprob) && entry.token_ids.empty()) {
      out.push_back(nullptr);
      continue;
    }
    nlohmann::json asked = nlohmann::json::array();
    for (auto [id, logprob] : entry.token_ids)
      asked.push_back(
          {logprob_value(logprob), id,
           with_text ? nlohmann::json(token_text(tokenizer, id)) : nlohmann::json(nullptr)});
    out.push_back(std::move(asked));
  }
  return out;
}

std::vector<TokenLogprob> align_input_logprobs(const std::vector<TokenLogprob>& logprobs,
                                               const std::vector<int32_t>& input_ids,
                                               int64_t logprob_start_len) {
  if (logprob_start_len < 0) return logprobs;
  int64_t start = std::min<int64_t>(logprob_start_len, static_cast<int64_t>(input_ids.size()));
  int64_t expected = static_cast<int64_t>(input_ids.size()) - start;
  if (start == 0 && !input_ids.empty() && static_cast<int64_t>(logprobs.size()) == expected - 1) {
    std::vector<TokenLogprob> out;
    out.reserve(logprobs.size() + 1);
    TokenLogprob first;
    first.token_id = input_ids[0];
    first.logprob = std::numeric_limits<float>::quiet_NaN();
    out.push_back(first);
    out.insert(out.end(), logprobs.begin(), logprobs.end());
    return out;
  }
  return logprobs;
}

}  // namespace megactx::server
