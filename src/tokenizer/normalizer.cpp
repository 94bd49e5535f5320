#include "tokenizer/normalizer.h"

#include <nlohmann/json.hpp>

#include <vector>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode_normalization.h"

namespace megactx {
namespace {

using json = nlohmann::json;

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(bool compose) : compose_(compose) {}
  void normalize(std::string& text) const override {
    text = compose_ ? unicode::nfc(text) : unicode::nfd(text);
  }

 private:
  bool compose_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);  // HF prepends to non-empty strings only
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(const json& pattern, std::string content) : content_(std::move(content)) {
    if (pattern.contains("Regex")) {
      regex_ = std::make_unique<Regex>(json_string(pattern, "Regex", "Replace pattern"));
    } else {
      literal_ = json_string(pattern, "String", "Replace pattern");
    }
  }
  void normalize(std::string& text) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    if (regex_) {
      regex_->find_all(text, matches);
    } else if (!literal_.empty()) {
      for (size_t p = text.find(literal_); p != std::string::npos;
           p = text.find(literal_, p + literal_.size()))
        matches.emplace_back(p, p + literal_.size());
    }
    if (matches.empty()) return;
    std::string out;
    size_t previous = 0;
    for (const auto& [start, end] : matches) {
      out.append(text, previous, start - previous);
      out += content_;
      previous = end;
    }
    out.append(text, previous, std::string::npos);
    text = std::move(out);
  }

 private:
  std::unique_ptr<Regex> regex_;
  std::string literal_;
  std::string content_;
};

constexpr int kMaxNesting = 32;  // real files nest once; bounds recursion on bad input

std::unique_ptr<Normalizer> make(const json& spec, int depth) {
  if (spec.is_null()) return nullptr;
  if (depth > kMaxNesting) fail("tokenizer.json: normalizer Sequences nest too deeply");
  const std::string type = json_string(spec, "type", "normalizer");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : json_array(spec, "normalizers", "Sequence normalizer"))
      if (auto made = make(step, depth + 1)) steps.push_back(std::move(made));
    if (steps.empty()) return nullptr;
    if (steps.size() == 1) return std::move(steps[0]);
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(true);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(false);
  if (type == "Prepend")
    return std::make_unique<PrependNormalizer>(json_string(spec, "prepend", "Prepend normalizer"));
  if (type == "Replace")
    return std::make_unique<ReplaceNormalizer>(json_object(spec, "pattern", "Replace normalizer"),
                                               json_string(spec, "content", "Replace normalizer"));
  fail("tokenizer.json: unsupported normalizer type '{}'", type);
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& spec) {
  return make(spec, 0);
}

}  // namespace megactx
