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

  void split(std::string_view piece, const PieceSink& sink) const override {
    auto emit = [&](size_t begin, size_t end) {
      if (end > begin) sink(piece.substr(begin, end - begin));
    };
    if (behavior_ == Behavior::kIsolated) {  // the common case: stream without a list
      size_t previous = 0;
      for_each_match(piece, [&](size_t start, size_t end) {
        emit(previous, start);
        emit(start, end);
        previous = end;
      });
      emit(previous, piece.size());
      return;
    }
    std::vector<Span> spans;
    size_t previous = 0;
    for_each_match(piece, [&](size_t start, size_t end) {
      if (previous != start) spans.push_back({{previous, start}, invert_});
      spans.push_back({{start, end}, !invert_});
      previous = end;
    });
    if (previous != piece.size()) spans.push_back({{previous, piece.size()}, invert_});
    apply_behavior(behavior_, spans);
    for (const auto& s : spans)
      if (!s.is_match) emit(s.offsets.first, s.offsets.second);
  }

 private:
  template <typename OnMatch>
  void for_each_match(std::string_view text, OnMatch&& on_match) const {
    if (regex_) {
      regex_->for_each_match(text, on_match);
      return;
    }
    if (literal_.empty()) return;
    for (size_t pos = text.find(literal_); pos != std::string_view::npos;
         pos = text.find(literal_, pos + literal_.size()))
      on_match(pos, pos + literal_.size());
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

  void split(std::string_view piece, const PieceSink& sink) const override {
    std::string prefixed;
    if (add_prefix_space_ && !piece.empty() && piece[0] != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(piece);
      piece = prefixed;
    }
    auto emit = [&](std::string_view sub) {
      if (!map_bytes_) {
        sink(sub);
        return;
      }
      std::string mapped;
      ByteLevelAlphabet::get().encode(sub, mapped);
      sink(mapped);
    };
    if (split_) {
      split_->split(piece, emit);
    } else if (!piece.empty()) {
      emit(piece);
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
  void split(std::string_view piece, const PieceSink& sink) const override { run(0, piece, sink); }

 private:
  // Depth-first: each sub-piece of step i goes through steps i+1.. at once.
  void run(size_t step, std::string_view piece, const PieceSink& sink) const {
    if (step == steps_.size()) {
      sink(piece);
      return;
    }
    auto next = [&](std::string_view sub) { run(step + 1, sub, sink); };
    steps_[step]->split(piece, next);
  }

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
