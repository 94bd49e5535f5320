// Pre-tokenizers of tokenizer.json: Split (regex or string pattern, with HF's
// five delimiter behaviours and invert), ByteLevel, and Sequence of them. They
// cut a normalized string into the pieces ("words") the BPE model encodes.
// Pieces are streamed depth-first to a sink as string views, so encoding a
// long prompt never materializes the list of all its pieces.
#pragma once

#include <memory>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace megactx {

// A non-owning callable `void(std::string_view piece)`; cheaper than
// std::function for the per-piece calls.
class PieceSink {
 public:
  template <typename F>
  PieceSink(F& callable)  // NOLINT: implicit by design, like function_ref
      : context_(&callable),
        call_([](void* c, std::string_view piece) { (*static_cast<F*>(c))(piece); }) {}
  void operator()(std::string_view piece) const { call_(context_, piece); }

 private:
  void* context_;
  void (*call_)(void*, std::string_view);
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Hands every non-empty sub-piece of `piece` to `sink`, in order. The views
  // are valid only during the call.
  virtual void split(std::string_view piece, const PieceSink& sink) const = 0;
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
