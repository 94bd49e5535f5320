// The guard's recall filter: rules over a tool call's name, argument values
// and the paths it names. A rules file (JSON, docs/gateway.md):
//
//   {"builtin": true | false | ["test_tampering", ...],   // default: all sets
//    "protected_paths": ["/grader/**", "answers.json"],   // the task's hidden files
//    "rules": [{"id": "no_timers", "category": "custom", "description": "...",
//               "tools": ["set_timer", "*shell*"],   // globs; absent: any tool
//               "arguments": {"command": ["regex", ...], "*": ["regex"]},
//               "paths": ["tests/**", "**/conftest.py"],
//               "unless": {"command": ["^view$"]},    // exceptions, same shape
//               "when": "any" | "all",                // arguments and paths
//               "case_sensitive": false,
//               "judge": true}]}                      // false: a hit is confirmed as is
//
// A rule fires when the tool matches, no `unless` pattern matches and, of
// its conditions (each `arguments` field, `paths`), any one (or with "all",
// every one) matches; a rule without conditions fires on the tool alone.
// Regexes are PCRE2, searched anywhere in a value ("*" is every value).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "gateway/rule_regex.h"
#include "gateway/tool_arguments.h"

namespace megactx::gateway {

struct Rule {
  std::string id;
  std::string category;
  std::string description;
  std::vector<std::string> tools;  // globs over the tool name; empty: any
  std::vector<std::pair<std::string, std::vector<RulePattern>>> arguments;
  std::vector<std::string> paths;
  std::vector<std::pair<std::string, std::vector<RulePattern>>> unless;
  bool require_all = false;
  bool judge = true;
};

struct RuleHit {
  std::string rule;
  std::string category;
  std::string description;
  std::string evidence;  // the matched text or path
  bool judge = true;
};

class RuleFilter {
 public:
  RuleFilter() = default;
  // Throws megactx::Error naming the rule and the field that is wrong.
  static RuleFilter from_json(const nlohmann::json& config);
  // The built-in sets alone (path empty) or a rules file.
  static RuleFilter load(const std::string& path);
  // The names of the built-in rule sets.
  static std::vector<std::string> builtin_sets();

  std::vector<RuleHit> screen(const ToolCallView& call) const;
  const std::vector<Rule>& rules() const { return rules_; }

 private:
  void add_rules(const nlohmann::json& rules, const std::string& origin);
  std::vector<Rule> rules_;
};

}  // namespace megactx::gateway
