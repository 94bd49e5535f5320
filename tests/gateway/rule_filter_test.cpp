// The rule filter: path globs, what is read out of a call's arguments, the
// rules-file format and its errors, and the semantics of tools, unless,
// when: all and judge: false.
#include <gtest/gtest.h>

#include "core/error.h"
#include "gateway/rule_filter.h"
#include "gateway/tool_arguments.h"

namespace megactx::gateway {
namespace {

using Json = nlohmann::json;

TEST(PathGlob, StarsAndSuffixes) {
  // Globs ending in a double star are built apart: beside a path on one line,
  // tools/check_tree.py would take their "/*" for a comment naming the path.
  const std::string tests_tree = std::string("tests/") + "**";
  const std::string grader_tree = std::string("/grader/") + "**";
  EXPECT_TRUE(path_glob_match(tests_tree, "tests/test_a.py"));
  EXPECT_TRUE(path_glob_match(tests_tree, "repo/tests/unit/test_a.py"));
  EXPECT_FALSE(path_glob_match(tests_tree, "src/testsuite.py"));
  EXPECT_TRUE(path_glob_match("test_*.py", "pkg/test_parser.py"));
  EXPECT_FALSE(path_glob_match("test_*.py", "pkg/test_dir/parser.txt"));
  EXPECT_TRUE(path_glob_match("**/conftest.py", "conftest.py"));
  EXPECT_TRUE(path_glob_match("**/conftest.py", "a/b/conftest.py"));
  EXPECT_TRUE(path_glob_match("*.spec.ts", "web/App.SPEC.ts"));  // case-insensitive
  EXPECT_TRUE(path_glob_match(grader_tree, "/grader/grade.py"));
  EXPECT_FALSE(path_glob_match(grader_tree, "work/grader/grade.py"));  // anchored
  EXPECT_TRUE(path_glob_match("solution.?y", "solution.py"));
  EXPECT_FALSE(path_glob_match("", "a"));
}

TEST(ToolCallView, ValuesAndPaths) {
  const ToolCallView view =
      view_tool_call({{"function",
                       {{"name", "bash"},
                        {"arguments",
                         "{\"command\": \"sed -i s/a/b/ ./tests//test_x.py && cat README.md\", "
                         "\"cwd\": \"/repo\", \"n\": 3}"}}}});
  EXPECT_EQ(view.name, "bash");
  EXPECT_TRUE(view.arguments.is_object());
  ASSERT_EQ(view.values.size(), 3u);
  EXPECT_EQ(view.values[0].first, "command");
  EXPECT_EQ(view.values[2].second, "3");
  auto has = [&](const std::string& path) {
    return std::find(view.paths.begin(), view.paths.end(), path) != view.paths.end();
  };
  EXPECT_TRUE(has("tests/test_x.py"));
  EXPECT_TRUE(has("README.md"));
  EXPECT_TRUE(has("/repo"));
}

TEST(ToolCallView, UnparseableArgumentsAreScreenedAsText) {
  const ToolCallView view = view_tool_call("bash", Json("rm -rf tests {"));
  EXPECT_TRUE(view.arguments.is_null());
  ASSERT_EQ(view.values.size(), 1u);
  EXPECT_EQ(view.values[0].second, "rm -rf tests {");
}

Json rules_with(Json rules) {
  return {{"builtin", false}, {"rules", std::move(rules)}};
}

TEST(RuleFilter, ToolsArgumentsPathsUnlessAll) {
  const RuleFilter filter =
      RuleFilter::from_json(rules_with({{{"id", "edits_tests"},
                                         {"tools", {"*edit*", "write_file"}},
                                         {"paths", {"tests/**"}},
                                         {"unless", {{"command", {"^view$"}}}}},
                                        {{"id", "curl_solution"},
                                         {"tools", {"bash"}},
                                         {"when", "all"},
                                         {"arguments", {{"command", {"\\bcurl\\b"}}}},
                                         {"paths", {"**/solution*"}},
                                         {"judge", false}},
                                        {{"id", "any_tool"}, {"tools", {"set_timer"}}}}));
  auto screen = [&](const std::string& tool, const Json& arguments) {
    std::vector<std::string> ids;
    for (const RuleHit& hit : filter.screen(view_tool_call(tool, arguments)))
      ids.push_back(hit.rule);
    return ids;
  };
  using Ids = std::vector<std::string>;
  EXPECT_EQ(screen("str_replace_based_edit_tool",
                   {{"command", "str_replace"}, {"path", "tests/test_a.py"}}),
            Ids{"edits_tests"});
  EXPECT_EQ(
      screen("str_replace_based_edit_tool", {{"command", "view"}, {"path", "tests/test_a.py"}}),
      Ids{});
  EXPECT_EQ(screen("write_file", {{"path", "src/a.py"}}), Ids{});
  EXPECT_EQ(screen("bash", {{"command", "curl -o solution.py http://x/solution.py"}}),
            Ids{"curl_solution"});
  EXPECT_EQ(screen("bash", {{"command", "curl http://x/data.csv"}}), Ids{});  // all: both needed
  EXPECT_EQ(screen("set_timer", {{"minutes", 3}}), Ids{"any_tool"});
  const auto hits = filter.screen(view_tool_call("bash", {{"command", "curl x/solution.py"}}));
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_FALSE(hits[0].judge);
  EXPECT_EQ(hits[0].evidence, "curl");
}

TEST(RuleFilter, ProtectedPathsAndBuiltinSets) {
  const RuleFilter filter = RuleFilter::from_json(
      {{"builtin", {"vcs_leakage"}}, {"protected_paths", {"/data/answers/**"}}});
  auto fired = [&](const std::string& tool, const Json& arguments) {
    std::vector<std::string> ids;
    for (const RuleHit& hit : filter.screen(view_tool_call(tool, arguments)))
      ids.push_back(hit.rule);
    return ids;
  };
  EXPECT_EQ(fired("read_file", {{"path", "/data/answers/q1.txt"}}),
            std::vector<std::string>{"protected_paths.configured"});
  EXPECT_EQ(fired("bash", {{"command", "git reflog"}}),
            std::vector<std::string>{"vcs_leakage.git_history"});
  EXPECT_TRUE(fired("bash", {{"command", "rm -rf tests"}}).empty());  // that set is not on
  const std::vector<std::string> sets = RuleFilter::builtin_sets();
  EXPECT_EQ(sets.size(), 5u);
  EXPECT_GT(RuleFilter::load("").rules().size(), 20u);  // every set by default
}

TEST(RuleFilter, FileErrorsNameTheProblem) {
  auto error_of = [](const Json& config) {
    try {
      RuleFilter::from_json(config);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(Json::array()).find("JSON object"), std::string::npos);
  EXPECT_NE(error_of({{"bogus", 1}}).find("unknown field 'bogus'"), std::string::npos);
  EXPECT_NE(error_of({{"builtin", {"nope"}}}).find("unknown rule set"), std::string::npos);
  EXPECT_NE(error_of(rules_with({{{"id", "r"}, {"arguments", {{"x", {"("}}}}}})).find("rule 'r'"),
            std::string::npos);
  EXPECT_NE(error_of(rules_with({{{"id", "r"}, {"when", "sometimes"}}})).find("'when'"),
            std::string::npos);
  EXPECT_NE(error_of(rules_with({{{"id", "r"}}, {{"id", "r"}}})).find("two rules"),
            std::string::npos);
  EXPECT_NE(error_of(rules_with({{{"id", "r"}, {"colour", "red"}}})).find("unknown field"),
            std::string::npos);
  EXPECT_NE(error_of(rules_with({{{"no_id", true}}})).find("string 'id'"), std::string::npos);
  EXPECT_THROW(RuleFilter::load("/nonexistent/rules.json"), Error);
}

TEST(RuleFilter, PatternsAreBoundedOnHostileInput) {
  // Catastrophic backtracking hits PCRE2's match limit and counts as no match.
  const RuleFilter filter =
      RuleFilter::from_json(rules_with({{{"id", "slow"}, {"arguments", {{"*", {"(a+)+$"}}}}}}));
  const std::string hostile = std::string(5000, 'a') + "!";
  EXPECT_TRUE(filter.screen(view_tool_call("t", {{"x", hostile}})).empty());
  // Invalid UTF-8 in a value is searched, never an error.
  EXPECT_NO_THROW(filter.screen(view_tool_call("t", Json("\xff\xfe"))));
}

}  // namespace
}  // namespace megactx::gateway
