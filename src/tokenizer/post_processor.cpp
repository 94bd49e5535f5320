#include "tokenizer/post_processor.h"

#include <nlohmann/json.hpp>

#include <string>

#include "core/error.h"
#include "tokenizer/json_util.h"

namespace megactx {
namespace {

using json = nlohmann::json;

TokenId checked_id(const json& value, const char* context) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
      value.get<int64_t>() >= (int64_t{1} << 30))
    fail("tokenizer.json: {} id is not a valid integer", context);
  return static_cast<TokenId>(value.get<int64_t>());
}

void template_processing(const json& spec, PostProcessor& out) {
  const json& single = json_array(spec, "single", "TemplateProcessing");
  const json& specials = spec.contains("special_tokens") ? spec["special_tokens"] : json::object();
  bool seen_sequence = false;
  for (const auto& piece : single) {
    if (piece.is_object() && piece.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!piece.is_object() || !piece.contains("SpecialToken"))
      fail("tokenizer.json: TemplateProcessing piece is neither Sequence nor SpecialToken");
    const std::string name = json_string(piece["SpecialToken"], "id", "SpecialToken");
    if (!specials.is_object() || !specials.contains(name))
      fail("tokenizer.json: TemplateProcessing special token '{}' is not in special_tokens", name);
    auto& target = seen_sequence ? out.suffix : out.prefix;
    for (const auto& id : json_array(specials[name], "ids", "TemplateProcessing special token"))
      target.push_back(checked_id(id, "TemplateProcessing special token"));
  }
}

// Bert / Roberta: {"cls": [token, id], "sep": [token, id]} -> cls A sep.
void cls_sep(const json& spec, PostProcessor& out) {
  for (const char* key : {"cls", "sep"}) {
    const json& pair = json_array(spec, key, "Bert/Roberta post_processor");
    if (pair.size() != 2) fail("tokenizer.json: post_processor '{}' is not [token, id]", key);
    (std::string(key) == "cls" ? out.prefix : out.suffix)
        .push_back(checked_id(pair[1], "post_processor"));
  }
}

constexpr int kMaxNesting = 32;  // real files nest once; bounds recursion on bad input

void apply(const json& spec, PostProcessor& out, int depth) {
  if (spec.is_null()) return;
  if (depth > kMaxNesting) fail("tokenizer.json: post_processor Sequences nest too deeply");
  const std::string type = json_string(spec, "type", "post_processor");
  if (type == "TemplateProcessing") {
    template_processing(spec, out);
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    cls_sep(spec, out);
  } else if (type == "Sequence") {
    // Each processor wraps the result of the previous one.
    for (const auto& step : json_array(spec, "processors", "Sequence post_processor")) {
      PostProcessor inner;
      apply(step, inner, depth + 1);
      out.prefix.insert(out.prefix.begin(), inner.prefix.begin(), inner.prefix.end());
      out.suffix.insert(out.suffix.end(), inner.suffix.begin(), inner.suffix.end());
    }
  } else if (type != "ByteLevel") {
    fail("tokenizer.json: unsupported post_processor type '{}'", type);
  }
}

}  // namespace

PostProcessor make_post_processor(const json& spec) {
  PostProcessor out;
  apply(spec, out, 0);
  return out;
}

}  // namespace megactx
