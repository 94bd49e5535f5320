// megactx tokenize --model DIR (--text TEXT | --text-file FILE | --decode IDS)
//                  [--add-special-tokens] [--skip-special-tokens] [--tokens]
// Text -> comma-separated ids with the model's tokenizer.json (as HF
// tokenizers encodes it); --decode turns comma-separated ids back into text,
// printed exactly, with nothing added.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command_registry.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace megactx::cli {
namespace {

struct TokenizeOptions {
  std::string model_dir;
  std::string text;
  std::string text_file;
  std::string decode;
  bool add_special_tokens = false;
  bool skip_special_tokens = false;
  bool tokens = false;
};

std::vector<TokenId> parse_ids(const std::string& list, int64_t vocab_size) {
  std::vector<TokenId> ids;
  std::stringstream stream(list);
  std::string item;
  while (std::getline(stream, item, ',')) {
    const auto first = item.find_first_not_of(" \t\n");
    if (first == std::string::npos) continue;
    const auto last = item.find_last_not_of(" \t\n");
    const std::string number = item.substr(first, last - first + 1);
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != number.size()) fail("--decode: '{}' is not a token id", number);
    if (value < 0 || value >= vocab_size)
      fail("--decode: token id {} is outside the vocabulary [0, {})", value, vocab_size);
    ids.push_back(static_cast<TokenId>(value));
  }
  return ids;
}

int run_tokenize(const TokenizeOptions& options) {
  const auto tokenizer = Tokenizer::load(options.model_dir);
  if (!options.decode.empty()) {
    const auto ids = parse_ids(options.decode, tokenizer->vocab_size());
    const std::string text = tokenizer->decode(ids, options.skip_special_tokens);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::string text = options.text;
  if (!options.text_file.empty()) {
    std::ifstream file(options.text_file, std::ios::binary);
    if (!file) fail("cannot read --text-file {}", options.text_file);
    std::stringstream buffer;
    buffer << file.rdbuf();
    text = buffer.str();
  }
  const auto ids = tokenizer->encode(text, options.add_special_tokens);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ',';
    line += std::to_string(ids[i]);
  }
  std::printf("%s\n", line.c_str());
  if (options.tokens) {
    for (TokenId id : ids) std::printf("%d\t%s\n", id, tokenizer->id_to_token(id).c_str());
  }
  return 0;
}

CommandRegistration registration{
    "tokenize", "Encode text to token ids (or decode ids) with the model's tokenizer",
    [](CLI::App& command) -> CommandAction {
      auto options = std::make_shared<TokenizeOptions>();
      command.add_option("--model", options->model_dir, "Model directory with tokenizer.json")
          ->required();
      auto* text = command.add_option("--text", options->text, "Text to encode");
      auto* file = command.add_option("--text-file", options->text_file, "File to encode");
      auto* decode = command.add_option("--decode", options->decode, "Comma-separated ids");
      text->excludes(file)->excludes(decode);
      file->excludes(decode);
      command.add_flag("--add-special-tokens", options->add_special_tokens,
                       "Apply the post-processor (BOS etc.)");
      command.add_flag("--skip-special-tokens", options->skip_special_tokens,
                       "With --decode: leave special tokens out");
      command.add_flag("--tokens", options->tokens, "Also print each id with its token");
      return [options, text, file, decode] {
        if (text->count() + file->count() + decode->count() == 0)
          fail("tokenize needs --text, --text-file or --decode");
        return run_tokenize(*options);
      };
    }};

}  // namespace
}  // namespace megactx::cli
