#include "grammar/grammar_compiler.h"

#include "core/error.h"
#include "grammar/ebnf_parser.h"
#include "grammar/regex_parser.h"

namespace megactx::grammar {

GrammarCompiler::GrammarCompiler(std::shared_ptr<const Vocabulary> vocabulary,
                                 CompileOptions options, size_t cache_capacity)
    : vocabulary_(std::move(vocabulary)), options_(options), capacity_(cache_capacity) {
  MEGACTX_CHECK(vocabulary_ != nullptr, "GrammarCompiler needs a vocabulary");
}

template <typename Build>
GrammarCompiler::Result GrammarCompiler::cached(std::string key, Build build) {
  std::promise<Result> promise;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      std::shared_future<Result> result = it->second.result;
      lock.unlock();
      return result.get();  // may wait for a compilation in flight
    }
    ++misses_;
    lru_.push_front(key);
    cache_.emplace(key, Entry{promise.get_future().share(), lru_.begin()});
    while (capacity_ > 0 && cache_.size() > capacity_) {
      cache_.erase(lru_.back());
      lru_.pop_back();
    }
  }
  try {
    Result result = build();
    promise.set_value(result);
    return result;
  } catch (...) {
    // Errors are not cached: the next request with the same text retries.
    promise.set_exception(std::current_exception());
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      lru_.erase(it->second.lru);
      cache_.erase(it);
    }
    throw;
  }
}

GrammarCompiler::Result GrammarCompiler::compile_json_schema(std::string_view schema_text,
                                                             const JsonSchemaOptions& options) {
  return cached("json_schema\n" + options.cache_key() + "\n" + std::string(schema_text), [&]() {
    nlohmann::ordered_json schema;
    try {
      schema = nlohmann::ordered_json::parse(schema_text);
    } catch (const nlohmann::json::exception& e) {
      fail("JSON Schema is not valid JSON: {}", e.what());
    }
    Grammar grammar;
    lower_json_schema(grammar, schema, options);
    return compile_grammar(grammar, vocabulary_, options_);
  });
}

GrammarCompiler::Result GrammarCompiler::compile_json_schema_object(
    const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  const std::string text = schema.dump();
  return compile_json_schema(std::string_view(text), options);
}

GrammarCompiler::Result GrammarCompiler::compile_json_object(const JsonSchemaOptions& options) {
  return cached("json_object\n" + options.cache_key(), [&]() {
    Grammar grammar;
    lower_any_json(grammar, options, true);
    return compile_grammar(grammar, vocabulary_, options_);
  });
}

GrammarCompiler::Result GrammarCompiler::compile_json_value(const JsonSchemaOptions& options) {
  return cached("json_value\n" + options.cache_key(), [&]() {
    Grammar grammar;
    lower_any_json(grammar, options, false);
    return compile_grammar(grammar, vocabulary_, options_);
  });
}

GrammarCompiler::Result GrammarCompiler::compile_regex(std::string_view pattern) {
  return cached("regex\n" + std::string(pattern), [&]() {
    Grammar grammar;
    const int32_t root = grammar.add_rule("root");
    grammar.set_body(root, parse_regex(grammar, pattern));
    grammar.root = root;
    return compile_grammar(grammar, vocabulary_, options_);
  });
}

GrammarCompiler::Result GrammarCompiler::compile_ebnf(std::string_view text,
                                                      std::string_view root_rule) {
  return cached("ebnf\n" + std::string(root_rule) + "\n" + std::string(text), [&]() {
    Grammar grammar;
    const Vocabulary& vocab = *vocabulary_;
    parse_ebnf(grammar, text, root_rule,
               [&](std::string_view token) { return vocab.find_token(token); });
    CompileOptions options = options_;
    options.inline_small_rules = true;
    return compile_grammar(grammar, vocabulary_, options);
  });
}

GrammarCompiler::Result GrammarCompiler::compile_built(std::string_view key, const Builder& build) {
  return cached("built\n" + std::string(key), [&]() {
    Grammar grammar;
    build(grammar, *vocabulary_);
    return compile_grammar(grammar, vocabulary_, options_);
  });
}

GrammarCompiler::CacheStats GrammarCompiler::cache_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {hits_, misses_, cache_.size()};
}

void GrammarCompiler::clear_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  cache_.clear();
  lru_.clear();
}

}  // namespace megactx::grammar
