// Normalizers of tokenizer.json: what GLM / DeepSeek / Qwen-style files use
// (none, an empty or non-empty Sequence, NFC), plus NFD, Prepend and Replace.
// Anything else is refused at load time with a megactx::Error.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace megactx {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;  // in place, valid UTF-8 in and out
};

// Null when the spec is null or an empty Sequence (nothing to do).
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec);

}  // namespace megactx
