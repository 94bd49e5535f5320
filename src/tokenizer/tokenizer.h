// Tokenizer: Hugging Face `tokenizer.json` (byte-level BPE as GLM and DeepSeek
// ship it). Encoding and decoding match HF `tokenizers` exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megactx {

using TokenId = int32_t;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads DIR/tokenizer.json; throws megactx::Error on a missing or malformed file.
  static std::unique_ptr<Tokenizer> load(const std::string& model_dir);
  static std::unique_ptr<Tokenizer> from_json(const std::string& tokenizer_json_text);

  // Text -> ids. Special added tokens that appear literally in the text are
  // recognized (as HF does with split_special_tokens=false). Invalid UTF-8 is
  // never a crash: HF only takes valid str, so each maximal ill-formed byte
  // sequence is first replaced by U+FFFD (as Python's
  // bytes.decode("utf-8", "replace") does) and that text is encoded.
  // add_special_tokens applies the post-processor (BOS etc.) when the file has one.
  virtual std::vector<TokenId> encode(std::string_view text,
                                      bool add_special_tokens = false) const = 0;
  // Ids -> text (ByteLevel decoder). Invalid UTF-8 produced by the ids is
  // replaced by U+FFFD as HF does.
  virtual std::string decode(const std::vector<TokenId>& ids,
                             bool skip_special_tokens = false) const = 0;

  virtual int64_t vocab_size() const = 0;  // including added tokens
  virtual std::optional<TokenId> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(TokenId id) const = 0;  // "" when out of range
  virtual bool is_special(TokenId id) const = 0;
  // The raw bytes a token stands for (after the byte-level mapping is undone).
  virtual std::string token_bytes(TokenId id) const = 0;
};

// Turns a stream of ids into text without ever emitting a partial UTF-8
// character: bytes of an unfinished character are held until it completes.
class StreamingDetokenizer {
 public:
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  // Returns the text that became complete with this token (may be empty).
  std::string push(TokenId id);
  // Returns whatever is held back (as U+FFFD for incomplete characters).
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace megactx
