// Structured output through the Engine with the default model (its real
// tokenizer and CPU forward): every output of a constrained request is
// checked by an independent reference -- JSON Schemas by the spec-written
// validator of tests/grammar (json_validator.h), regexes by PCRE2 -- in
// batches that mix constrained and free requests, greedy and sampled, many
// requests sharing one compiled grammar (as n > 1 does), and through
// preemption. Free requests in a mixed batch give the tokens they give alone.
#include <gtest/gtest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <map>
#include <set>

#include "../grammar/json_validator.h"
#include "engine/engine_builder.h"
#include "grammar/grammar_compiler.h"
#include "tokenizer/tokenizer.h"

namespace megactx {
namespace {

using Json = nlohmann::ordered_json;

struct Output {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::None;
  std::string detail;
  std::optional<int32_t> stop_token;
};

class ConstrainedEngine {
 public:
  explicit ConstrainedEngine(int64_t kv_bytes = int64_t{64} << 20, int64_t max_running = 64,
                             int64_t parallel_grammar_rows = 0) {
    EngineLoadOptions options;
    options.engine.parallel_grammar_rows = parallel_grammar_rows;
    options.model_dir = std::string(MEGACTX_SOURCE_DIR) + "/models/default";
    options.engine.run_thread = false;
    options.engine.check_integrity_every_step = true;
    options.engine.kv_memory_bytes = kv_bytes;
    options.engine.max_running_requests = max_running;
    loaded = load_engine(options);
  }
  Engine& engine() { return *loaded.engine; }
  grammar::GrammarCompiler& compiler() { return *engine().grammar_compiler(); }

  void submit(GenerationRequest request) {
    engine().submit(std::move(request), [this](const RequestUpdate& update) {
      Output& out = outputs[update.rid];
      out.tokens.insert(out.tokens.end(), update.new_token_ids.begin(), update.new_token_ids.end());
      out.text += update.new_text;
      out.finish = update.finish;
      out.detail = update.finish_detail;
      if (update.matched_stop_token) out.stop_token = update.matched_stop_token;
    });
  }
  void run() {
    while (engine().step()) {
    }
    engine().check_integrity();
  }
  GenerationRequest request(const std::string& rid, const std::string& prompt, double temperature,
                            uint64_t seed, int64_t max_new = 300) {
    GenerationRequest r;
    r.rid = rid;
    r.input_ids = loaded.tokenizer->encode(prompt, true);
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.sampling.max_new_tokens = max_new;
    return r;
  }

  LoadedEngine loaded;
  std::map<std::string, Output> outputs;
};

// Bounded schemas: every valid output ends within the token budget.
const char* kPerson = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "role": {"enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"},
             "maxItems": 3}},
  "required": ["name", "age", "role"], "additionalProperties": false})";
const char* kPoint = R"({"type": "object", "properties": {
    "x": {"type": "integer", "minimum": -10, "maximum": 10},
    "y": {"type": "integer", "minimum": -10, "maximum": 10},
    "label": {"anyOf": [{"type": "null"}, {"type": "string", "format": "date"}]}},
  "required": ["x", "y", "label"]})";
const std::vector<std::string> kPrompts = {"Give me a person as JSON:", "The record reads", "{",
                                           "Describe a point."};

// At most two whitespace characters between JSON tokens: with the bounded
// schemas below every output fits the token budget.
grammar::JsonSchemaOptions json_options() {
  grammar::JsonSchemaOptions options;
  options.max_whitespace = 2;
  return options;
}

bool valid_json(const std::string& text, const Json& schema) {
  if (!nlohmann::json::accept(text)) return false;
  return grammar::test::JsonValidator(schema).valid(Json::parse(text));
}

bool full_match(const std::string& pattern, const std::string& text) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), PCRE2_ZERO_TERMINATED,
                    PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &error, &offset, nullptr);
  EXPECT_NE(code, nullptr) << pattern;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0,
                             data, nullptr);
  pcre2_match_data_free(data);
  pcre2_code_free(code);
  return rc >= 0;
}

void expect_stopped(const Output& out, const std::string& rid) {
  EXPECT_EQ(out.finish, FinishReason::Stop) << rid << ": " << out.detail << " text " << out.text;
  EXPECT_TRUE(out.stop_token.has_value()) << rid;
}

TEST(StructuredOutputEngine, SchemaOutputsAreValidInAMixedBatch) {
  ConstrainedEngine c;
  const std::vector<const char*> schemas = {kPerson, kPoint};
  std::vector<std::shared_ptr<const grammar::CompiledGrammar>> grammars;
  for (const char* schema : schemas)
    grammars.push_back(c.compiler().compile_json_schema(schema, json_options()));
  // Free requests alone first: the reference for the mixed batch.
  ConstrainedEngine alone;
  for (size_t p = 0; p < kPrompts.size(); ++p)
    alone.submit(alone.request("free" + std::to_string(p), kPrompts[p], 0.0, 0, 40));
  alone.run();

  std::map<std::string, size_t> schema_of;
  for (size_t p = 0; p < kPrompts.size(); ++p) {
    c.submit(c.request("free" + std::to_string(p), kPrompts[p], 0.0, 0, 40));
    for (size_t s = 0; s < schemas.size(); ++s) {
      for (const double temperature : {0.0, 0.7, 1.0}) {
        const std::string rid = "json" + std::to_string(s) + "-" + std::to_string(p) + "-t" +
                                std::to_string(temperature);
        GenerationRequest r = c.request(rid, kPrompts[p], temperature, 7 * p + s);
        r.sampling.grammar = grammars[s];
        c.submit(std::move(r));
        schema_of[rid] = s;
      }
    }
  }
  c.run();
  for (const auto& [rid, s] : schema_of) {
    const Output& out = c.outputs.at(rid);
    expect_stopped(out, rid);
    EXPECT_TRUE(valid_json(out.text, Json::parse(schemas[s]))) << rid << ": " << out.text;
  }
  for (size_t p = 0; p < kPrompts.size(); ++p) {
    const std::string rid = "free" + std::to_string(p);
    EXPECT_EQ(c.outputs.at(rid).tokens, alone.outputs.at(rid).tokens) << rid;
  }
}

TEST(StructuredOutputEngine, ManyRequestsShareOneGrammarLikeNChoices) {
  // 12 rows with the masks filled on the thread pool from 8 rows on.
  ConstrainedEngine c(int64_t{64} << 20, 64, /*parallel_grammar_rows=*/8);
  auto grammar = c.compiler().compile_json_schema(kPerson, json_options());
  for (int i = 0; i < 12; ++i) {
    GenerationRequest r = c.request("n" + std::to_string(i), kPrompts[0], 1.0, 1000 + i);
    r.sampling.grammar = grammar;
    c.submit(std::move(r));
  }
  c.run();
  std::set<std::string> distinct;
  for (const auto& [rid, out] : c.outputs) {
    expect_stopped(out, rid);
    EXPECT_TRUE(valid_json(out.text, Json::parse(kPerson))) << rid << ": " << out.text;
    distinct.insert(out.text);
  }
  EXPECT_GT(distinct.size(), 1u);  // independent matchers, independent draws
}

TEST(StructuredOutputEngine, RegexAndGbnfOutputsMatchTheirLanguage) {
  ConstrainedEngine c;
  const std::vector<std::string> regexes = {R"(\(\d{3}\) \d{3}-\d{4})",
                                            R"([A-Z][a-z]{2,8}( [A-Z][a-z]{2,8}){0,2}\.)",
                                            R"((yes|no|maybe), because [a-z ]{5,20}!)"};
  // GBNF: a list of small sums; PCRE2 checks the same language.
  const std::string gbnf = R"(root ::= "[" sum ("," " "? sum){0,3} "]"
sum ::= num (" + " num){0,2}
num ::= [1-9] [0-9]?)";
  const std::string gbnf_regex =
      R"(\[[1-9][0-9]?( \+ [1-9][0-9]?){0,2}(, ?[1-9][0-9]?( \+ [1-9][0-9]?){0,2}){0,3}\])";
  for (size_t i = 0; i < regexes.size(); ++i) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      GenerationRequest r =
          c.request("re" + std::to_string(i) + "-" + std::to_string(seed),
                    kPrompts[seed % kPrompts.size()], seed == 0 ? 0.0 : 0.9, seed);
      r.sampling.grammar = c.compiler().compile_regex(regexes[i]);
      c.submit(std::move(r));
    }
  }
  for (uint64_t seed = 0; seed < 4; ++seed) {
    GenerationRequest r = c.request("gbnf-" + std::to_string(seed), "Sums:", 0.9, seed);
    r.sampling.grammar = c.compiler().compile_ebnf(gbnf);
    c.submit(std::move(r));
  }
  c.run();
  for (const auto& [rid, out] : c.outputs) {
    expect_stopped(out, rid);
    const std::string& pattern =
        rid.starts_with("gbnf") ? gbnf_regex : regexes[static_cast<size_t>(rid[2] - '0')];
    EXPECT_TRUE(full_match(pattern, out.text)) << rid << ": '" << out.text << "'";
  }
}

TEST(StructuredOutputEngine, PreemptionKeepsTheGrammarState) {
  // Five pages: two prompts of ~120 tokens (two pages each) are admitted with
  // a page of headroom, both need a third page a few tokens in, so one is
  // preempted and recomputed mid-output; greedy outputs equal those of a
  // roomy engine.
  ConstrainedEngine roomy;
  ConstrainedEngine tight(int64_t{5} * 64 * 3072, 8);
  auto grammar = roomy.compiler().compile_json_schema(kPerson, json_options());
  auto tight_grammar = tight.compiler().compile_json_schema(kPerson, json_options());
  std::string filler;
  for (int i = 0; i < 19; ++i) filler += "a record of a person, ";
  for (int i = 0; i < 6; ++i) {
    for (ConstrainedEngine* c : {&roomy, &tight}) {
      // Distinct first tokens: no prefix-cache sharing between them.
      GenerationRequest r = c->request("p" + std::to_string(i),
                                       std::to_string(i) + " " + filler + kPrompts[i % 4], 0.0, 0);
      r.sampling.grammar = c == &roomy ? grammar : tight_grammar;
      c->submit(std::move(r));
    }
  }
  roomy.run();
  tight.run();
  EXPECT_GT(tight.engine().num_preemptions(), 0);
  for (const auto& [rid, out] : roomy.outputs) {
    expect_stopped(out, rid);
    EXPECT_TRUE(valid_json(out.text, Json::parse(kPerson))) << rid << ": " << out.text;
    EXPECT_EQ(tight.outputs.at(rid).tokens, out.tokens) << rid;
  }
}

TEST(StructuredOutputEngine, IgnoreEosAndMinNewTokensCannotComeWithAGrammar) {
  ConstrainedEngine c;
  auto grammar = c.compiler().compile_regex("[ab]{3}");
  GenerationRequest ignore = c.request("ignore", "x", 0.0, 0);
  ignore.sampling.grammar = grammar;
  ignore.sampling.ignore_eos = true;
  c.submit(std::move(ignore));
  GenerationRequest min_tokens = c.request("min", "x", 0.0, 0);
  min_tokens.sampling.grammar = grammar;
  min_tokens.sampling.min_new_tokens = 2;
  c.submit(std::move(min_tokens));
  c.run();
  EXPECT_EQ(c.outputs.at("ignore").finish, FinishReason::Error);
  EXPECT_NE(c.outputs.at("ignore").detail.find("ignore_eos"), std::string::npos);
  EXPECT_EQ(c.outputs.at("min").finish, FinishReason::Error);
  EXPECT_NE(c.outputs.at("min").detail.find("min_new_tokens"), std::string::npos);
}

}  // namespace
}  // namespace megactx
