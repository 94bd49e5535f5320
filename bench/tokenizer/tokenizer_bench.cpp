// Tokenizer encode throughput (MB/s of UTF-8 input) on English and Chinese
// text, single thread. "cold" is the first encode with a fresh tokenizer (the
// piece cache empty), "warm" the best of three later encodes. zh-unique is
// made of random clauses so that nearly every piece misses the cache.
//
//   tokenizer_bench [--model DIR] [--megabytes N] [--input en|zh|zh-unique] [--dump DIR]
//
// --dump writes the inputs so bench/tokenizer/hf_baseline.py can time HF
// tokenizers on exactly the same text (the peer baseline).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream stream(text);
  for (std::string line; std::getline(stream, line);)
    if (!line.empty()) lines.push_back(line + "\n");
  return lines;
}

// Paragraphs in shuffled order until `bytes` is reached.
std::string shuffled(const std::string& text, size_t bytes, uint32_t seed) {
  auto lines = lines_of(text);
  std::mt19937 rng(seed);
  std::string out;
  while (out.size() < bytes) {
    std::shuffle(lines.begin(), lines.end(), rng);
    for (const auto& line : lines) out += line;
  }
  return out;
}

// Random clauses of characters drawn from the text (frequency-weighted).
std::string random_clauses(const std::string& text, size_t bytes, uint32_t seed) {
  std::vector<std::string> chars;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = std::max<size_t>(1, megactx::utf8::sequence_length(text, pos));
    if (n == 3) chars.push_back(text.substr(pos, n));  // CJK characters only
    pos += n;
  }
  const char* punctuation[] = {"，", "。", "、", "；", "\n"};
  std::mt19937 rng(seed);
  std::string out;
  while (out.size() < bytes) {
    const int length = 4 + static_cast<int>(rng() % 17);
    for (int i = 0; i < length; ++i) out += chars[rng() % chars.size()];
    out += punctuation[rng() % 5];
  }
  return out;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/tokenizer/glm";
  std::string dump, only;
  double megabytes = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") model = argv[i + 1];
    if (flag == "--megabytes") megabytes = std::atof(argv[i + 1]);
    if (flag == "--dump") dump = argv[i + 1];
    if (flag == "--input") only = argv[i + 1];
  }
  const std::string here = std::string(MEGACTX_SOURCE_DIR) + "/bench/tokenizer/";
  const size_t bytes = static_cast<size_t>(megabytes * 1e6);
  const std::string en = read_file(here + "text_en.txt"), zh = read_file(here + "text_zh.txt");
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"en", shuffled(en, bytes, 1)},
      {"zh", shuffled(zh, bytes, 2)},
      {"zh-unique", random_clauses(zh, bytes, 3)},
  };
  std::printf("tokenizer %s\n", model.c_str());
  std::printf("%-10s %8s %10s %8s %10s %10s\n", "input", "MB", "tokens", "B/token", "cold MB/s",
              "warm MB/s");
  for (const auto& [name, text] : inputs) {
    if (!only.empty() && name != only) continue;
    if (!dump.empty()) std::ofstream(dump + "/" + name + ".txt", std::ios::binary) << text;
    const auto tokenizer = megactx::Tokenizer::load(model);
    auto start = Clock::now();
    const size_t tokens = tokenizer->encode(text).size();
    const double cold = seconds_since(start);
    double warm = 1e30;
    for (int round = 0; round < 3; ++round) {
      start = Clock::now();
      if (tokenizer->encode(text).size() != tokens) return 1;
      warm = std::min(warm, seconds_since(start));
    }
    const double mb = text.size() / 1e6;
    std::printf("%-10s %8.2f %10zu %8.2f %10.1f %10.1f\n", name.c_str(), mb, tokens,
                static_cast<double>(text.size()) / tokens, mb / cold, mb / warm);
  }
  return 0;
}
