// Structured-output cost at GLM-5's vocabulary size (154,880 synthetic
// byte-level BPE tokens, bench/grammar/synthetic_vocab.h): compile time of
// each grammar (the automaton plus the token classes of every node), and the
// time of fill_next_token_bitmask per decode step while a fixed target
// document is emitted token by token (at each step the longest allowed token
// that continues the target, as a model writing it would), one thread.
// Printed beside xgrammar's published target: well under 40 us per token for
// JSON schemas on a 128K vocabulary.
//
//   grammar_bench [--vocab-size N] [--repeat R]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar_compiler.h"
#include "grammar/matcher.h"
#include "synthetic_vocab.h"

namespace {

using namespace megactx::grammar;
using Clock = std::chrono::steady_clock;

struct Case {
  const char* name;
  const char* kind;  // json_schema, json_object, regex, ebnf
  std::string text;
  std::string target;
};

std::vector<Case> cases() {
  return {
      {"nested objects", "json_schema",
       R"({"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string"},"email":{"type":"string","format":"email"},"address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"},"geo":{"type":"object","properties":{"lat":{"type":"number","minimum":-90,"maximum":90},"lon":{"type":"number","minimum":-180,"maximum":180}},"required":["lat","lon"]}},"required":["street","city"]},"active":{"type":"boolean"}},"required":["id","name","address"]})",
       R"({"id": 4211, "name": "Margaret Hamilton", "email": "margaret.hamilton@example.org", "address": {"street": "12 Apollo Way", "city": "Cambridge", "zip": "02139", "geo": {"lat": 42.3601, "lon": -71.0942}}, "active": true})"},
      {"array of objects", "json_schema",
       R"({"type":"object","properties":{"items":{"type":"array","minItems":1,"maxItems":20,"items":{"type":"object","properties":{"sku":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{4}$"},"qty":{"type":"integer","minimum":1,"maximum":999},"price":{"type":"number","exclusiveMinimum":0},"tags":{"type":"array","items":{"type":"string"}}},"required":["sku","qty","price"]}},"total":{"type":"number"}},"required":["items","total"]})",
       R"({"items": [{"sku": "ABC-1234", "qty": 2, "price": 19.99, "tags": ["blue", "cotton"]}, {"sku": "XYZ-0007", "qty": 1, "price": 5.5, "tags": []}, {"sku": "QRS-4242", "qty": 12, "price": 0.75, "tags": ["bulk"]}], "total": 54.48})"},
      {"enums", "json_schema",
       R"({"type":"object","properties":{"sentiment":{"enum":["positive","negative","neutral","mixed"]},"language":{"enum":["en","de","fr","es","zh","ja","ko","ru","pt","it"]},"confidence":{"enum":[0.25,0.5,0.75,1]},"topics":{"type":"array","items":{"enum":["billing","shipping","quality","support","pricing","other"]},"maxItems":4}},"required":["sentiment","language","confidence","topics"],"additionalProperties":false})",
       R"({"sentiment": "mixed", "language": "de", "confidence": 0.75, "topics": ["shipping", "quality", "support"]})"},
      {"tool-call arguments", "json_schema",
       R"({"type":"object","properties":{"origin":{"type":"string","description":"IATA code","pattern":"^[A-Z]{3}$"},"destination":{"type":"string","pattern":"^[A-Z]{3}$"},"departure_date":{"type":"string","format":"date"},"return_date":{"type":"string","format":"date"},"passengers":{"type":"array","items":{"type":"object","properties":{"type":{"type":"string","enum":["adult","child","infant"]},"age":{"type":"integer","minimum":0,"maximum":120}},"required":["type"]},"minItems":1,"maxItems":9},"cabin":{"type":"string","enum":["economy","premium_economy","business","first"]},"max_stops":{"type":"integer","minimum":0,"maximum":3},"notes":{"type":"string","maxLength":200}},"required":["origin","destination","departure_date","passengers"],"additionalProperties":false})",
       R"({"origin": "SFO", "destination": "NRT", "departure_date": "2025-03-14", "return_date": "2025-03-28", "passengers": [{"type": "adult", "age": 41}, {"type": "child", "age": 9}], "cabin": "premium_economy", "max_stops": 1, "notes": "Window seats if possible; one passenger is vegetarian."})"},
      {"json_object", "json_object", "",
       R"({"title": "Quarterly report", "pages": 42, "ratio": 0.618, "authors": [{"name": "Ada", "roles": ["editor", "reviewer"]}, {"name": "Grace", "roles": []}], "draft": false, "meta": {"tags": ["finance", "q3"], "checksum": null}})"},
      {"regex (phone + email)", "regex",
       R"(\(\d{3}\) \d{3}-\d{4}, [a-z0-9._%+-]+@[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,6})",
       "(415) 555-0199, grace.hopper@navy-research.example.com"},
      {"GBNF json", "ebnf",
       R"(root ::= value
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= [ \t\n\r]*
)",
       R"({"title": "Quarterly report", "pages": 42, "ratio": 0.618, "authors": [{"name": "Ada", "roles": ["editor", "reviewer"]}, {"name": "Grace", "roles": []}], "draft": false})"},
  };
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("grammar_bench: structured-output mask cost");
  int vocab_size = 154'880;
  int repeat = 5;
  bool stats = false;
  app.add_flag("--stats", stats, "print the token classes of the nodes with most uncertain tokens");
  app.add_option("--vocab-size", vocab_size, "synthetic vocabulary size")
      ->check(CLI::Range(1000, 1 << 22));
  app.add_option("--repeat", repeat, "generations of each target")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const auto t0 = Clock::now();
  const bench::SyntheticVocab synthetic = bench::make_synthetic_vocab(vocab_size);
  const Vocabulary& vocab = *synthetic.vocab;
  std::unordered_map<std::string, int32_t> by_bytes;
  for (int32_t id = 0; id < vocab.size(); ++id) {
    if (vocab.is_matchable(id)) by_bytes.emplace(vocab.bytes(id), id);
  }
  std::printf(
      "vocabulary: %d tokens (%d matchable, longest %d bytes, trie %d nodes), built in %.0f ms\n",
      vocab.size(), vocab.num_matchable(), vocab.max_token_bytes(), vocab.trie_size(),
      std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  std::printf(
      "target (xgrammar, published): well under 40 us per token for JSON schemas, 128K vocab\n\n");
  std::printf("%-24s %10s %7s %7s %9s %9s %9s %9s\n", "grammar", "compile ms", "nodes", "tokens",
              "mean us", "p50 us", "p99 us", "max us");

  GrammarCompiler compiler(synthetic.vocab);
  std::vector<uint32_t> mask(vocab.mask_words());
  for (const Case& c : cases()) {
    compiler.clear_cache();
    const auto c0 = Clock::now();
    std::shared_ptr<const CompiledGrammar> g;
    const std::string kind = c.kind;
    if (kind == "json_schema") g = compiler.compile_json_schema(c.text);
    if (kind == "json_object") g = compiler.compile_json_object();
    if (kind == "regex") g = compiler.compile_regex(c.text);
    if (kind == "ebnf") g = compiler.compile_ebnf(c.text);
    const double compile_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
    if (stats) {
      std::vector<std::pair<size_t, int32_t>> by_uncertain;
      for (int32_t n = 0; n < g->num_nodes(); ++n) {
        if (g->reads_bytes(n)) by_uncertain.push_back({g->token_classes(n).uncertain.size(), n});
      }
      std::sort(by_uncertain.rbegin(), by_uncertain.rend());
      for (size_t i = 0; i < std::min<size_t>(5, by_uncertain.size()); ++i) {
        const TokenClasses& tc = g->token_classes(by_uncertain[i].second);
        std::printf("  node %d (%s): accepted %d rejected %d uncertain %zu, e.g.",
                    by_uncertain[i].second,
                    g->rule_name(g->rule_of(by_uncertain[i].second)).c_str(), tc.num_accepted,
                    tc.num_rejected, tc.uncertain.size());
        for (size_t k = 0; k < std::min<size_t>(8, tc.uncertain.size()); ++k) {
          std::printf(" [%s]", vocab.bytes(tc.uncertain[k * tc.uncertain.size() / 8]).c_str());
        }
        std::printf("\n");
      }
    }
    std::vector<double> step_us;
    int tokens = 0;
    for (int r = 0; r < repeat; ++r) {
      GrammarMatcher m(g);
      std::string_view rest = c.target;
      tokens = 0;
      while (true) {
        const auto s0 = Clock::now();
        m.fill_next_token_bitmask(mask.data());
        step_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s0).count());
        if (rest.empty()) break;
        int32_t chosen = -1;
        for (size_t len = std::min<size_t>(rest.size(), vocab.max_token_bytes()); len > 0; --len) {
          auto it = by_bytes.find(std::string(rest.substr(0, len)));
          if (it != by_bytes.end() && ((mask[it->second >> 5] >> (it->second & 31)) & 1)) {
            chosen = it->second;
            break;
          }
        }
        if (chosen < 0 || !m.accept_token(chosen)) {
          std::fprintf(stderr, "%s: the target is not derivable at '%.20s'\n", c.name,
                       std::string(rest).c_str());
          return 1;
        }
        rest.remove_prefix(vocab.bytes(chosen).size());
        ++tokens;
      }
      if (!((mask[synthetic.eos >> 5] >> (synthetic.eos & 31)) & 1) ||
          !m.accept_token(synthetic.eos)) {
        std::fprintf(stderr, "%s: the stop token is not allowed after the target\n", c.name);
        return 1;
      }
    }
    double sum = 0;
    for (double v : step_us) sum += v;
    std::printf("%-24s %10.1f %7d %7d %9.1f %9.1f %9.1f %9.1f\n", c.name, compile_ms,
                g->num_nodes(), tokens, sum / step_us.size(), percentile(step_us, 0.5),
                percentile(step_us, 0.99), percentile(step_us, 1.0));
  }
  return 0;
}
