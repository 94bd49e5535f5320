// Post-processors of tokenizer.json, applied when encoding with
// add_special_tokens: TemplateProcessing (GLM's [gMASK]<sop>, DeepSeek's BOS),
// Bert/Roberta (cls ... sep), ByteLevel (ids unchanged) and Sequence.
#pragma once

#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/tokenizer.h"

namespace megactx {

// The single-sequence template as ids to put before and after the sequence.
struct PostProcessor {
  std::vector<TokenId> prefix;
  std::vector<TokenId> suffix;
};

PostProcessor make_post_processor(const nlohmann::json& spec);

}  // namespace megactx
