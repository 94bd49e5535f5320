// GrammarCompiler: the front door of structured outputs. Holds the
// vocabulary once; compiles JSON Schemas, "any JSON object", regexes and GBNF
// grammars into CompiledGrammars over it, cached by (kind, options, text) in
// an LRU so repeated requests with the same schema compile once. Thread-safe;
// concurrent requests for the same text wait for one compilation.
//
//   GrammarCompiler compiler(Vocabulary::from_tokenizer(tokenizer, {eos_id}, logit_count));
//   auto grammar = compiler.compile_json_schema(schema_text);
//   GrammarMatcher matcher(grammar);          // per request
//   matcher.fill_next_token_bitmask(words);    // per step, then sample, then
//   matcher.accept_token(sampled);
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/json_schema.h"
#include "grammar/vocabulary.h"

namespace megactx::grammar {

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const Vocabulary> vocabulary,
                           CompileOptions options = {}, size_t cache_capacity = 256);

  // Throws megactx::Error for text that is not valid JSON or a schema using
  // an unsupported keyword (the message names it and where).
  std::shared_ptr<const CompiledGrammar> compile_json_schema(std::string_view schema_text,
                                                             const JsonSchemaOptions& options = {});
  // Property order comes from the ordered_json (nlohmann::json sorts keys;
  // pass the text or an ordered_json to keep the schema's order).
  std::shared_ptr<const CompiledGrammar> compile_json_schema_object(
      const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});
  // Any JSON object (OpenAI response_format json_object).
  std::shared_ptr<const CompiledGrammar> compile_json_object(const JsonSchemaOptions& options = {});
  // Any JSON value.
  std::shared_ptr<const CompiledGrammar> compile_json_value(const JsonSchemaOptions& options = {});
  // The whole output matches `pattern` (PCRE syntax, see regex_parser.h).
  std::shared_ptr<const CompiledGrammar> compile_regex(std::string_view pattern);
  // GBNF (see ebnf_parser.h); <token> references resolve against the vocabulary.
  std::shared_ptr<const CompiledGrammar> compile_ebnf(std::string_view text,
                                                      std::string_view root_rule = "root");

  // A grammar the caller lowers into the IR itself (a chat model's output
  // format around a schema, tool calls in a model's markup), cached under
  // `key`, which must name everything `build` reads. `build` sets the root.
  using Builder = std::function<void(Grammar& grammar, const Vocabulary& vocabulary)>;
  std::shared_ptr<const CompiledGrammar> compile_built(std::string_view key, const Builder& build);

  const Vocabulary& vocabulary() const { return *vocabulary_; }
  const std::shared_ptr<const Vocabulary>& vocabulary_ptr() const { return vocabulary_; }

  struct CacheStats {
    size_t hits = 0;
    size_t misses = 0;
    size_t entries = 0;
  };
  CacheStats cache_stats() const;
  void clear_cache();

 private:
  using Result = std::shared_ptr<const CompiledGrammar>;
  template <typename Build>
  Result cached(std::string key, Build build);

  std::shared_ptr<const Vocabulary> vocabulary_;
  CompileOptions options_;
  size_t capacity_;

  mutable std::mutex mutex_;
  struct Entry {
    std::shared_future<Result> result;
    std::list<std::string>::iterator lru;
  };
  std::unordered_map<std::string, Entry> cache_;
  std::list<std::string> lru_;  // front: most recent
  size_t hits_ = 0;
  size_t misses_ = 0;
};

}  // namespace megactx::grammar
