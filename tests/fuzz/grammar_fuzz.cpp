// Fuzzes the grammar compilers and the matcher. The first byte picks the
// front end (regex, GBNF, JSON Schema with various options); the text up to
// the first NUL is the grammar, the rest is fed to a matcher as bytes and as
// tokens of a small vocabulary. Compile errors are fine (megactx::Error);
// crashes, hangs and sanitizer reports are not, and neither is a mask bit
// that disagrees with accept_token or a rollback that does not restore the
// mask: those abort.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/grammar_compiler.h"
#include "grammar/matcher.h"

namespace {

using namespace megactx::grammar;

std::shared_ptr<const Vocabulary> fuzz_vocabulary() {
  std::vector<std::string> bytes = {"<eos>", "<|tool|>", ""};
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"", "\":", "\",", "\"}", "true", "null", "12", "-0.5", "ab", "\xC3",
                        "\xA9", "\xC3\xA9", "  ", "\n", "[]", "\\u00", "<|tool|>", "e+"}) {
    bytes.push_back(t);
  }
  return std::make_shared<const Vocabulary>(std::move(bytes), std::vector<int32_t>{0, 1},
                                            std::vector<int32_t>{0}, 320);
}

GrammarCompiler& compiler() {
  static GrammarCompiler* c = [] {
    CompileOptions options;
    options.limits.max_nfa_nodes = 20'000;
    options.limits.max_dfa_states = 4'000;
    options.max_stack_depth = 64;
    options.precompute_threads = 1;
    return new GrammarCompiler(fuzz_vocabulary(), options, 0);
  }();
  return *c;
}

bool bit(const std::vector<uint32_t>& mask, int32_t id) {
  return (mask[id >> 5] >> (id & 31)) & 1;
}

void check_mask(GrammarMatcher& m, std::vector<uint32_t>& mask) {
  m.fill_next_token_bitmask(mask.data());
  const Vocabulary& vocab = m.grammar().vocabulary();
  for (int32_t id = 0; id < vocab.mask_size(); ++id) {
    const bool ok = id < vocab.size() && m.accept_token(id);
    if (ok) m.rollback(1);
    if (ok != bit(mask, id)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t cut = input.find('\0');
  const std::string text = input.substr(0, cut);
  const std::string feed = cut == std::string::npos ? "" : input.substr(cut + 1);
  std::shared_ptr<const CompiledGrammar> g;
  try {
    JsonSchemaOptions options;
    options.limits = {20'000, 4'000};
    options.max_schema_depth = 16;
    switch (data[0] % 6) {
      case 0:
        g = compiler().compile_regex(text);
        break;
      case 1:
        g = compiler().compile_ebnf(text);
        break;
      case 2:
        g = compiler().compile_json_schema(text, options);
        break;
      case 3:
        options.strict = false;
        options.any_property_order = true;
        options.any_whitespace = false;
        g = compiler().compile_json_schema(text, options);
        break;
      case 4:
        options.draft = JsonSchemaDraft::draft4;
        options.allow_unknown_keywords = true;
        options.max_whitespace = 2;
        g = compiler().compile_json_schema(text, options);
        break;
      default:
        g = compiler().compile_json_object(options);
        break;
    }
  } catch (const megactx::Error&) {
    return 0;
  }
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(m.mask_words());
  // Bytes, then the same bytes again as tokens where the mask allows them.
  (void)m.accept_string(feed.substr(0, feed.size() / 2));
  (void)m.find_jump_forward_string(64);
  check_mask(m, mask);
  const std::vector<uint32_t> before = mask;
  const int32_t steps_before = m.num_steps();
  const Vocabulary& vocab = g->vocabulary();
  for (size_t i = feed.size() / 2; i < feed.size(); ++i) {
    const int32_t token = static_cast<uint8_t>(feed[i]) % vocab.size();
    m.fill_next_token_bitmask(mask.data());
    if (m.accept_token(token) != bit(mask, token)) std::abort();
  }
  check_mask(m, mask);
  m.rollback(m.num_steps() - steps_before);
  m.fill_next_token_bitmask(mask.data());
  if (mask != before) std::abort();
  return 0;
}
