// Structured output under MTP speculation through the Engine: drafts come
// from the masked draft logits and are checked against the automaton,
// verification runs over the masked target rows, the matcher rolls back the
// rejected drafts.
//
//  * Greedy (models/default, a trained MTP layer, its tokenizer): with a
//    grammar, k = 1 and 3 give exactly the tokens of plain decoding with the
//    same grammar, drafts are accepted, and every output is valid under its
//    JSON Schema (the spec-written validator of tests/grammar). Both with
//    masked drafts and with unmasked ones (EngineConfig::
//    speculative_masked_drafts false: checked against the automaton, rejected
//    from the first it does not allow).
//  * Sampled (the glm_schedule fixture, random MTP weights so drafts are
//    often rejected): a vocabulary of two-hex-digit tokens and a regex that
//    allows ids 128..255 at even positions and 0..127 at odd ones; 3000
//    seeded requests (temperature 1, top-k 2 of the masked logits) generate
//    5 tokens; their 32 continuations are compared by Pearson's chi-square
//    with the exact masked target distribution (enumerated with
//    SequenceRunner and apply_token_mask, no engine or MTP code). Fails
//    below p = 1e-6, as the unconstrained test (speculative_sampled_engine_test).
//    Masked and unmasked drafts (half of the unmasked ones break the grammar).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "../grammar/json_validator.h"
#include "chi_square_check.h"
#include "grammar/grammar_compiler.h"

namespace megactx::testing {
namespace {

using Json = nlohmann::ordered_json;

const char* kSchema = R"({"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "alerts": {"type": "array", "items": {"type": "boolean"}, "maxItems": 4}},
  "required": ["city", "days", "unit"], "additionalProperties": false})";
const char* kRegex = R"([A-Z][a-z]{1,7}(, [A-Z][a-z]{1,7}){0,3}\.)";

grammar::JsonSchemaOptions compact_whitespace() {
  grammar::JsonSchemaOptions options;
  options.max_whitespace = 2;
  return options;
}

// Runs every prompt with the schema and the regex (greedy) on an engine
// speculating `steps`.
std::map<std::string, SpecResult> run_greedy(int64_t steps, bool masked_drafts = true) {
  SpecEngineOptions options;
  options.steps = steps;
  options.masked_drafts = masked_drafts;
  options.real_tokenizer = true;
  options.pages = 256;
  SpecEngine spec(source_path("models/default"), options);
  grammar::GrammarCompiler& compiler = *spec.engine->grammar_compiler();
  auto schema = compiler.compile_json_schema(kSchema, compact_whitespace());
  auto regex = compiler.compile_regex(kRegex);
  SpecModelCase trained{"default", source_path("models/default"), 0, true};
  const auto prompts = spec_prompts_for(trained, spec.vocab);
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (const bool json : {true, false}) {
      GenerationRequest request =
          make_request((json ? "json" : "regex") + std::to_string(p), prompts[p], 200);
      request.sampling.ignore_eos = false;
      request.sampling.grammar = json ? schema : regex;
      spec.submit(std::move(request));
    }
  }
  spec.run();
  return spec.results;
}

TEST(SpeculativeGrammar, GreedyWithAGrammarEqualsPlainDecoding) {
  const auto plain = run_greedy(0);
  const Json schema = Json::parse(kSchema);
  for (const auto& [steps, masked] :
       {std::pair{1, true}, std::pair{3, true}, std::pair{3, false}}) {
    const auto speculated = run_greedy(steps, masked);
    int64_t accepted = 0;
    for (const auto& [rid, want] : plain) {
      const SpecResult& got = speculated.at(rid);
      EXPECT_EQ(got.tokens, want.tokens) << rid << " with k = " << steps << " masked " << masked;
      EXPECT_EQ(got.finish, FinishReason::Stop) << rid << ": " << got.finish_detail;
      accepted += got.accepted_tokens;
      if (rid.starts_with("json")) {
        ASSERT_TRUE(nlohmann::json::accept(got.text)) << rid << ": " << got.text;
        EXPECT_TRUE(grammar::test::JsonValidator(schema).valid(Json::parse(got.text)))
            << rid << ": " << got.text;
      }
    }
    EXPECT_GT(accepted, 0) << "k = " << steps;
  }
}

TEST(SpeculativeGrammar, SampledJsonOutputsAreValid) {
  SpecEngineOptions options;
  options.steps = 3;
  options.real_tokenizer = true;
  options.pages = 256;
  SpecEngine spec(source_path("models/default"), options);
  auto grammar =
      spec.engine->grammar_compiler()->compile_json_schema(kSchema, compact_whitespace());
  const std::vector<int32_t> text = default_text_tokens();
  const std::vector<int32_t> prompt(text.begin(), text.begin() + 40);
  for (uint64_t seed = 0; seed < 16; ++seed) {
    GenerationRequest request = make_request("s" + std::to_string(seed), prompt, 200, 0.9);
    request.sampling.ignore_eos = false;
    request.sampling.seed = seed;
    request.sampling.top_p = 0.95;
    request.sampling.grammar = grammar;
    spec.submit(std::move(request));
  }
  spec.run();
  const Json schema = Json::parse(kSchema);
  int64_t verifications = 0;
  for (const auto& [rid, r] : spec.results) {
    EXPECT_EQ(r.finish, FinishReason::Stop) << rid << ": " << r.finish_detail;
    ASSERT_TRUE(nlohmann::json::accept(r.text)) << rid << ": " << r.text;
    EXPECT_TRUE(grammar::test::JsonValidator(schema).valid(Json::parse(r.text))) << rid;
    verifications += r.verify_ct;
  }
  EXPECT_GT(verifications, 16);
}

// ---- the masked distribution (glm_schedule, vocabulary 256) ----

// Token i is the two hex digits of i; id 1 is the fixture's eos.
std::shared_ptr<const grammar::Vocabulary> hex_vocabulary() {
  std::vector<std::string> bytes;
  for (int i = 0; i < 256; ++i) {
    char text[3];
    std::snprintf(text, sizeof(text), "%02x", i);
    bytes.emplace_back(text);
  }
  return std::make_shared<const grammar::Vocabulary>(std::move(bytes), std::vector<int32_t>{},
                                                     std::vector<int32_t>{1}, 256);
}

// The regex's mask at output position `depth`: 128..255 when even, 0..127 (but eos) when odd.
std::vector<uint32_t> position_mask(int64_t depth) {
  std::vector<uint32_t> words(8, 0);
  const bool low = depth % 2 == 1;
  for (int32_t id = low ? 0 : 128; id < (low ? 128 : 256); ++id)
    if (id != 1) words[static_cast<size_t>(id >> 5)] |= 1u << (id & 31);
  return words;
}

SamplingParams masked_top2(uint64_t seed) {
  SamplingParams params = top2_params(seed);
  params.ignore_eos = false;
  return params;
}

void enumerate_masked(LanguageModel& model, std::vector<int32_t> tokens, int64_t depth, double mass,
                      std::vector<int32_t>& path, std::map<std::vector<int32_t>, double>& out) {
  if (depth == kNewTokens) {
    out[path] += mass;
    return;
  }
  SequenceRunner runner(model, KvDType::F32, static_cast<int64_t>(tokens.size()) + 1);
  const Tensor logits = runner.feed(tokens, false);
  std::vector<float> row(logits.data<float>(), logits.data<float>() + logits.dim(1));
  apply_token_mask(position_mask(depth), row);
  const std::vector<float> p = sampling_distribution(masked_top2(0), row);
  for (size_t v = 0; v < p.size(); ++v) {
    if (p[v] <= 0.0f) continue;
    tokens.push_back(static_cast<int32_t>(v));
    path.push_back(static_cast<int32_t>(v));
    enumerate_masked(model, tokens, depth + 1, mass * p[v], path, out);
    tokens.pop_back();
    path.pop_back();
  }
}

void expect_masked_target_distribution(bool masked_drafts) {
  const std::string dir = source_path("tests/fixtures/mtp/glm_schedule");
  SpecEngineOptions options;
  options.steps = 3;
  options.masked_drafts = masked_drafts;
  options.max_running_requests = 256;
  options.pages = 512;
  SpecEngine spec(dir, options);
  ASSERT_EQ(spec.vocab, 256);
  grammar::GrammarCompiler compiler(hex_vocabulary());
  const auto grammar = compiler.compile_regex("([89a-f][0-9a-f][0-7][0-9a-f]){2}[89a-f][0-9a-f]");
  const std::vector<int32_t> prompt = hashed_prompt(2, 10, spec.vocab);

  auto model = load_language_model(dir, ModelLoadOptions{});
  std::map<std::vector<int32_t>, double> expected;
  std::vector<int32_t> path;
  enumerate_masked(*model, prompt, 0, 1.0, path, expected);

  const int64_t requests = 3000;
  for (int64_t i = 0; i < requests; ++i) {
    GenerationRequest request = make_request("s" + std::to_string(i), prompt, kNewTokens);
    request.sampling = masked_top2(static_cast<uint64_t>(i) * 7 + 1);
    request.sampling.grammar = grammar;
    spec.submit(std::move(request));
  }
  spec.run();
  std::map<std::vector<int32_t>, int64_t> observed;
  int64_t rejections = 0, accepted = 0;
  for (const auto& [rid, r] : spec.results) {
    ASSERT_EQ(static_cast<int64_t>(r.tokens.size()), kNewTokens) << rid << ": " << r.finish_detail;
    ++observed[r.tokens];
    rejections += r.draft_tokens - r.accepted_tokens;
    accepted += r.accepted_tokens;
  }
  // All requests share the prompt, so whether the masked draft and target
  // supports overlap is the prompt's: this one (prompt seed 2) has both.
  EXPECT_GT(rejections, requests / 4);
  EXPECT_GT(accepted, requests / 20);

  const ChiSquare test = chi_square(expected, std::move(observed), requests);
  std::printf("chi2 %.2f over %ld cells, p-value %.3g; %ld drafts accepted, %ld rejected\n",
              test.chi2, static_cast<long>(test.cells), test.p_value, static_cast<long>(accepted),
              static_cast<long>(rejections));
  EXPECT_GT(test.p_value, 1e-6);
}

TEST(SpeculativeGrammar, RejectionSamplingKeepsTheMaskedTargetDistribution) {
  expect_masked_target_distribution(true);
}

TEST(SpeculativeGrammar, UnmaskedDraftsRejectedByTheGrammarKeepItToo) {
  expect_masked_target_distribution(false);
}

}  // namespace
}  // namespace megactx::testing
