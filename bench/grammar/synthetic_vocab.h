// A synthetic byte-level BPE-like vocabulary of GLM-5's size (154,880 ids):
// the 256 single bytes, words with and without a leading space and capital,
// numbers, punctuation runs (JSON pieces like `":"` or `"},` among them),
// indentation and whitespace runs, CJK and Cyrillic text, fragments that end
// inside a UTF-8 character, and special tokens. Deterministic for a seed.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "grammar/grammar_ir.h"
#include "grammar/vocabulary.h"

namespace megactx::grammar::bench {

struct SyntheticVocab {
  std::shared_ptr<const Vocabulary> vocab;
  int32_t eos = 0;
};

inline SyntheticVocab make_synthetic_vocab(int32_t size = 154'880, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::vector<std::string> tokens;
  std::unordered_set<std::string> seen;
  auto add = [&](const std::string& t) {
    if (t.empty() || static_cast<int32_t>(tokens.size()) >= size) return;
    if (seen.insert(t).second) tokens.push_back(t);
  };
  const int specials = 100;
  for (int i = 0; i < specials; ++i) tokens.push_back("<|special_" + std::to_string(i) + "|>");
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  for (int n = 0; n < 1000; ++n) add(std::to_string(n));
  for (int n = 1; n <= 64; ++n) {
    add(std::string(n, ' '));
    add("\n" + std::string(n, ' '));
    if (n <= 16) add(std::string(n, '\t'));
    if (n <= 8) add(std::string(n, '\n'));
  }
  const std::string punct = "{}[]():;,.\"'!?-_=+*/\\<>@#$%&|~^`";
  auto pick = [&](const std::string& from) { return from[rng() % from.size()]; };
  auto word = [&](int min, int max) {
    static const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";
    // Skewed letter frequencies, like English.
    std::string w;
    const int n = min + static_cast<int>(rng() % (max - min + 1));
    for (int i = 0; i < n; ++i) {
      const size_t k = std::min<size_t>(letters.size() - 1, (rng() % 26) * (rng() % 26) / 26);
      w += letters[k];
    }
    return w;
  };
  auto cjk = [&](int count) {
    std::string s;
    for (int i = 0; i < count; ++i) append_utf8(0x4E00 + rng() % (0x9FFF - 0x4E00), s);
    return s;
  };
  while (static_cast<int32_t>(tokens.size()) < size) {
    const uint32_t kind = rng() % 100;
    if (kind < 55) {
      std::string w = word(2, 10);
      if (rng() % 4 == 0) w[0] = static_cast<char>(std::toupper(w[0]));
      add(rng() % 2 ? " " + w : w);
    } else if (kind < 65) {
      std::string p;
      const int n = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) p += pick(punct);
      if (rng() % 3 == 0) p = " " + p;
      if (rng() % 5 == 0) p += "\n";
      add(p);
    } else if (kind < 72) {
      // JSON and code shapes: quotes around words, key separators.
      const std::string w = word(2, 8);
      static const char* shapes[] = {"\"%\"",  "\"%", "%\"", " \"%", "\":", "\",", "\"}", "\"]",
                                     "\": \"", "{\"", "[\"", "%\":", "%(",  ".%",  "_%",  "%_"};
      std::string s = shapes[rng() % 16];
      const size_t at = s.find('%');
      if (at != std::string::npos) s.replace(at, 1, w);
      add(s);
    } else if (kind < 86) {
      add(cjk(1 + static_cast<int>(rng() % 3)));
    } else if (kind < 90) {
      // A fragment ending inside a character (byte-level BPE merges these).
      std::string c = cjk(1 + static_cast<int>(rng() % 2));
      add(c.substr(0, c.size() - 1 - rng() % 2));
    } else if (kind < 95) {
      std::string s;
      const int n = 2 + static_cast<int>(rng() % 6);
      for (int i = 0; i < n; ++i) append_utf8(0x430 + rng() % 32, s);  // Cyrillic
      add(rng() % 2 ? " " + s : s);
    } else {
      std::string d = std::to_string(rng() % 100000);
      if (rng() % 2) d = " " + d;
      if (rng() % 3 == 0) d += ".";
      add(d);
    }
  }
  std::vector<int32_t> special_ids;
  for (int i = 0; i < specials; ++i) special_ids.push_back(i);
  SyntheticVocab out;
  out.eos = 0;
  out.vocab =
      std::make_shared<const Vocabulary>(std::move(tokens), special_ids, std::vector<int32_t>{0});
  return out;
}

}  // namespace megactx::grammar::bench
