// What a checkpoint says about prompting and stopping, outside tokenizer.json:
// tokenizer_config.json (special tokens, chat template in string or list
// form), chat_template.jinja (takes precedence, as in transformers) and
// additional_chat_templates/*.jinja, generation_config.json (eos ids and
// sampling defaults). Fields mirror the HF keys.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace megactx {

struct ModelMetadata {
  // tokenizer_config.json; a token given as an AddedToken dict keeps its content.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  std::optional<int64_t> model_max_length;

  // The template used when a request names none ("" when the model has none),
  // and every named one (the list form and additional_chat_templates/).
  std::string chat_template;
  std::map<std::string, std::string> named_chat_templates;

  // generation_config.json; eos_token_id may be an int or a list there.
  std::vector<TokenId> eos_token_ids;
  std::optional<TokenId> bos_token_id;
  std::optional<TokenId> pad_token_id;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<bool> do_sample;
  std::optional<int64_t> max_new_tokens;

  // The template named `name` ("" or "default": chat_template); throws
  // megactx::Error naming the available ones when there is no such template.
  const std::string& template_named(const std::string& name) const;
};

// Reads whichever of the files exist in model_dir (none is required); a file
// that exists but is malformed throws megactx::Error naming it.
ModelMetadata load_model_metadata(const std::string& model_dir);

// Ids that end generation: generation_config's eos ids, plus the
// tokenizer_config eos_token when the tokenizer knows it. Order kept, no repeats.
std::vector<TokenId> stop_token_ids(const ModelMetadata& metadata, const Tokenizer& tokenizer);

}  // namespace megactx
