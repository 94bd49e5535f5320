// Pre-tokenizers of tokenizer.json: Split (regex or string pattern, with HF's
// five delimiter behaviours and invert), ByteLevel, and Sequence of them. They
// cut a normalized string into the pieces ("words") the BPE model encodes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace megactx {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their sub-pieces (empty pieces are dropped, as HF does).
  virtual void split(std::vector<std::string>& pieces) const = 0;
};

struct PreTokenizerPipeline {
  std::unique_ptr<PreTokenizer> root;  // null: the whole string is one piece
  // True when the last step is ByteLevel: its byte -> character mapping is then
  // left to the BPE model, which maps raw bytes straight to ids (faster).
  bool output_raw_bytes = false;
};

// Builds the pipeline from the "pre_tokenizer" JSON value (null allowed).
// Throws megactx::Error on unknown types or bad fields.
PreTokenizerPipeline make_pre_tokenizer(const nlohmann::json& spec);

}  // namespace megactx
