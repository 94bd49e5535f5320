#include "tokenizer/pretokenizer.h"

#include <nlohmann/json.hpp>

#include <string_view>
#include <utility>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"

namespace megactx {
namespace {

using Offsets = std::pair<size_t, size_t>;
using json = nlohmann::json;

constexpr int kMaxNesting = 32;  // real files nest once; bounds recursion on bad input

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& name) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  fail("tokenizer.json: unknown Split behavior '{}'", name);
}

// A pattern's matches as a cover of the whole string: (offsets, is_match).
struct Span {
  Offsets offsets;
  bool is_match;
};

// Applies a delimiter behaviour to the cover (HF NormalizedString::split):
// returns the spans to keep, each marked whether it is removed.
void apply_behavior(Behavior behavior, std::vector<Span>& spans) {
  switch (behavior) {
    case Behavior::kIsolated:
      for (auto& s : spans) s.is_match = false;
      return;
    case Behavior::kRemoved:
      return;
    case Behavior::kContiguous:
    case Behavior::kMergedWithPrevious: {
      std::vector<Span> out;
      bool previous_match = false;
      for (const auto& s : spans) {
        const bool merge = behavior == Behavior::kContiguous ? s.is_match == previous_match
                                                             : s.is_match && !previous_match;
        if (merge && !out.empty()) {
          out.back().offsets.second = s.offsets.second;
        } else {
          out.push_back({s.offsets, false});
        }
        previous_match = s.is_match;
      }
      spans = std::move(out);
      return;
    }
    case Behavior::kMergedWithNext: {
      std::vector<Span> out;
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().offsets.first = it->offsets.first;
        } else {
          out.push_back({it->offsets, false});
        }
        previous_match = it->is_match;
      }
      spans.assign(out.rbegin(), out.rend());
      return;
    }
  }
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> regex, std::string literal, Behavior behavior,
                    bool invert)
      : regex_(std::move(regex)),
        literal_(std::move(literal)),
        behavior_(behavior),
        invert_(invert) {}

  void split(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 2);
    std::vector<Offsets> matches;
    std::vector<Span> spans;
    for (const auto& piece : pieces) {
      find(piece, matches);
      spans.clear();
      size_t previous = 0;
      for (const auto& [start, end] : matches) {
        if (previous != start) spans.push_back({{previous, start}, invert_});
        spans.push_back({{start, end}, !invert_});
        previous = end;
      }
      if (previous != piece.size() || piece.empty())
        spans.push_back({{previous, piece.size()}, invert_});
      apply_behavior(behavior_, spans);
      for (const auto& s : spans)
        if (!s.is_match && s.offsets.second > s.offsets.first)
          out.emplace_back(piece, s.offsets.first, s.offsets.second - s.offsets.first);
    }
    pieces = std::move(out);
  }

 private:
  void find(const std::string& text, std::vector<Offsets>& matches) const {
    if (regex_) {
      regex_->find_all(text, matches);
      return;
    }
    matches.clear();
    if (literal_.empty()) return;
    for (size_t pos = text.find(literal_); pos != std::string::npos;
         pos = text.find(literal_, pos + literal_.size()))
      matches.emplace_back(pos, pos + literal_.size());
  }

  std::unique_ptr<Regex> regex_;  // null: literal pattern
  std::string literal_;
  Behavior behavior_;
  bool invert_;
};

// GPT-2's split regex, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, bool map_bytes)
      : add_prefix_space_(add_prefix_space), map_bytes_(map_bytes) {
    if (use_regex)
      split_ = std::make_unique<SplitPreTokenizer>(std::make_unique<Regex>(kGpt2Pattern), "",
                                                   Behavior::kIsolated, false);
  }

  void split(std::vector<std::string>& pieces) const override {
    if (add_prefix_space_)
      for (auto& piece : pieces)
        if (!piece.empty() && piece[0] != ' ') piece.insert(piece.begin(), ' ');
    if (split_) split_->split(pieces);
    if (map_bytes_) {
      const auto& alphabet = ByteLevelAlphabet::get();
      for (auto& piece : pieces) {
        std::string mapped;
        alphabet.encode(piece, mapped);
        piece = std::move(mapped);
      }
    }
  }

 private:
  bool add_prefix_space_;
  bool map_bytes_;
  std::unique_ptr<SplitPreTokenizer> split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void split(std::vector<std::string>& pieces) const override {
    for (const auto& step : steps_) step->split(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

std::unique_ptr<PreTokenizer> make_step(const json& spec, bool last, bool* raw_bytes, int depth) {
  if (depth > kMaxNesting) fail("tokenizer.json: pre_tokenizer Sequences nest too deeply");
  const std::string type = json_string(spec, "type", "pre_tokenizer");
  if (type == "Sequence") {
    const json& list = json_array(spec, "pretokenizers", "Sequence pre_tokenizer");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(make_step(list[i], last && i + 1 == list.size(), raw_bytes, depth + 1));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    const json& pattern = json_object(spec, "pattern", "Split pre_tokenizer");
    const Behavior behavior = parse_behavior(json_string(spec, "behavior", "Split pre_tokenizer"));
    const bool invert = json_bool(spec, "invert", false);
    if (pattern.contains("Regex"))
      return std::make_unique<SplitPreTokenizer>(
          std::make_unique<Regex>(json_string(pattern, "Regex", "Split pattern")), "", behavior,
          invert);
    if (pattern.contains("String"))
      return std::make_unique<SplitPreTokenizer>(
          nullptr, json_string(pattern, "String", "Split pattern"), behavior, invert);
    fail("tokenizer.json: Split pattern needs 'Regex' or 'String'");
  }
  if (type == "ByteLevel") {
    *raw_bytes = last;
    return std::make_unique<ByteLevelPreTokenizer>(json_bool(spec, "add_prefix_space", true),
                                                   json_bool(spec, "use_regex", true), !last);
  }
  fail("tokenizer.json: unsupported pre_tokenizer type '{}'", type);
}

}  // namespace

PreTokenizerPipeline make_pre_tokenizer(const json& spec) {
  PreTokenizerPipeline pipeline;
  if (spec.is_null()) return pipeline;
  pipeline.root = make_step(spec, true, &pipeline.output_raw_bytes, 0);
  return pipeline;
}

}  // namespace megactx
