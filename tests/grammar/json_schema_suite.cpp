// The official JSON-Schema-Test-Suite (npm package json-schema-test-suite,
// draft 4: the only draft that package ships) against the grammar automaton.
// Every test group's schema is compiled; groups whose schema uses an
// unsupported keyword must fail to compile with an error naming it; for the
// others, the automaton's accept decision on each instance, serialized
// compactly and indented, must equal the suite's "valid". Prints the pass
// rates; exits non-zero on any mismatch in tests/draft4 (the optional/
// folder is reported, not required).
//
//   json_schema_suite [SUITE_DIR]   (default: node_modules under this folder)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/grammar_compiler.h"
#include "grammar/matcher.h"
#include "json_validator.h"

namespace fs = std::filesystem;
using megactx::Error;
using namespace megactx::grammar;
using Json = nlohmann::ordered_json;

namespace {

// The automaton decides on bytes; a byte vocabulary is enough.
std::shared_ptr<const Vocabulary> byte_vocabulary() {
  std::vector<std::string> bytes = {"<eos>"};
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  return std::make_shared<const Vocabulary>(std::move(bytes), std::vector<int32_t>{0},
                                            std::vector<int32_t>{0});
}

bool accepts(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_string(text) && m.can_terminate();
}

struct Tally {
  int passed = 0;
  int failed = 0;
  int unsupported_groups = 0;
  int unsupported_tests = 0;
};

}  // namespace

int main(int argc, char** argv) {
  fs::path suite = argc > 1 ? fs::path(argv[1])
                            : fs::path(MEGACTX_SOURCE_DIR) /
                                  "tests/grammar/node_modules/json-schema-test-suite/tests/draft4";
  if (!fs::is_directory(suite)) {
    std::fprintf(stderr, "no suite at %s (run npm ci in tests/grammar)\n", suite.c_str());
    return 1;
  }
  CompileOptions compile;
  compile.precompute_token_classes = false;  // only accept decisions are needed
  GrammarCompiler compiler(byte_vocabulary(), compile);
  JsonSchemaOptions options;
  options.strict = false;             // the JSON Schema default for additionalProperties
  options.any_property_order = true;  // instances list properties in any order
  options.draft = JsonSchemaDraft::draft4;
  options.allow_unknown_keywords = true;  // the specification ignores them

  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(suite)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  Tally required, optional;
  std::map<std::string, int> unsupported_reasons;
  int validator_failures = 0;
  for (const fs::path& file : files) {
    const bool is_optional = file.parent_path().filename() == "optional";
    Tally& tally = is_optional ? optional : required;
    std::ifstream in(file);
    const Json groups = Json::parse(in);
    Tally here;
    for (const Json& group : groups) {
      const std::string name =
          file.filename().string() + ": " + group["description"].get<std::string>();
      std::shared_ptr<const CompiledGrammar> g;
      try {
        g = compiler.compile_json_schema(group["schema"].dump(), options);
      } catch (const Error& e) {
        const std::string message = e.what();
        const bool names_unsupported = message.find("not supported") != std::string::npos ||
                                       message.find("outside this schema") != std::string::npos;
        if (!names_unsupported) {
          std::printf("FAIL %s: unexpected compile error: %s\n", name.c_str(), e.what());
          here.failed += static_cast<int>(group["tests"].size());
          continue;
        }
        ++here.unsupported_groups;
        here.unsupported_tests += static_cast<int>(group["tests"].size());
        ++unsupported_reasons[message.substr(message.find(": ") + 2)];
        continue;
      }
      // The walk tests' reference validator must agree with the suite too.
      const megactx::grammar::test::JsonValidator validator(group["schema"], true);
      for (const Json& test : group["tests"]) {
        const bool valid = test["valid"].get<bool>();
        if (!is_optional && validator.valid(test["data"]) != valid) {
          ++validator_failures;
          std::printf("VALIDATOR FAIL %s / %s\n", name.c_str(),
                      test["description"].get<std::string>().c_str());
        }
        for (const std::string& text : {test["data"].dump(), test["data"].dump(2)}) {
          const bool got = accepts(g, text);
          if (got == valid) {
            ++here.passed;
          } else {
            ++here.failed;
            std::printf("FAIL %s / %s: expected %s for %s\n", name.c_str(),
                        test["description"].get<std::string>().c_str(), valid ? "accept" : "reject",
                        text.c_str());
          }
        }
      }
    }
    std::printf(
        "%-45s %4d/%-4d checks pass, %d groups (%d tests) unsupported\n",
        (is_optional ? "optional/" + file.filename().string() : file.filename().string()).c_str(),
        here.passed, here.passed + here.failed, here.unsupported_groups, here.unsupported_tests);
    tally.passed += here.passed;
    tally.failed += here.failed;
    tally.unsupported_groups += here.unsupported_groups;
    tally.unsupported_tests += here.unsupported_tests;
  }
  std::printf("\nunsupported (compile errors, as required):\n");
  for (const auto& [reason, count] : unsupported_reasons) {
    std::printf("  %3dx %s\n", count, reason.c_str());
  }
  auto report = [](const char* what, const Tally& t) {
    const int total = t.passed + t.failed;
    std::printf("%s: %d/%d checks pass (%.1f%%); %d groups / %d tests use unsupported keywords\n",
                what, t.passed, total, total ? 100.0 * t.passed / total : 100.0,
                t.unsupported_groups, t.unsupported_tests);
  };
  report("draft4", required);
  report("draft4/optional", optional);
  std::printf("reference validator: %d disagreements with the suite (compiled groups)\n",
              validator_failures);
  // The plain closing line the test runners read.
  std::printf("%d passed, %d failed\n", required.passed, required.failed);
  return required.failed == 0 && validator_failures == 0 ? 0 : 1;
}
