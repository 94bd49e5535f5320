// The tokenizer.json pipeline, in HF's order: cut out added tokens (raw
// text), normalize the rest, cut out normalized added tokens, pre-tokenize,
// BPE each piece; optionally wrap with the post-processor's special tokens.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

class HfTokenizer final : public Tokenizer {
 public:
  explicit HfTokenizer(const std::string& tokenizer_json_text);

  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const override;
  int64_t vocab_size() const override { return end_id_; }
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  std::string id_to_token(TokenId id) const override;
  bool is_special(TokenId id) const override;
  std::string token_bytes(TokenId id) const override;

 private:
  void encode_normalized(std::string_view text, std::vector<TokenId>& ids) const;
  void encode_model(std::string_view text, std::vector<TokenId>& ids) const;
  const AddedToken* added(TokenId id) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;
  PreTokenizerPipeline pre_tokenizer_;
  PostProcessor post_processor_;
  bool byte_level_decoder_ = false;
  std::vector<AddedToken> added_tokens_;
  std::unordered_map<TokenId, size_t> added_by_id_;
  StringIdMap added_by_content_;
  AddedTokenMatcher raw_matcher_;         // tokens with normalized = false
  AddedTokenMatcher normalized_matcher_;  // tokens with normalized = true
  TokenId end_id_ = 0;
};

}  // namespace megactx
