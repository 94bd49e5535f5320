#include "gateway/rule_filter.h"

#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "gateway/builtin_rules.h"
#include "io/bounded_json.h"

namespace megactx::gateway {

namespace {

std::vector<std::string> string_list(const nlohmann::json& rule, const char* field,
                                     const std::string& id) {
  std::vector<std::string> out;
  if (!rule.contains(field) || rule[field].is_null()) return out;
  const nlohmann::json& value = rule[field];
  if (value.is_string()) return {value.get<std::string>()};
  if (!value.is_array()) fail("rule '{}': '{}' must be a string or a list of strings", id, field);
  for (const auto& item : value) {
    if (!item.is_string()) fail("rule '{}': '{}' must hold strings", id, field);
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<RulePattern>>> pattern_map(
    const nlohmann::json& rule, const char* field, const std::string& id, bool case_sensitive) {
  std::vector<std::pair<std::string, std::vector<RulePattern>>> out;
  if (!rule.contains(field) || rule[field].is_null()) return out;
  const nlohmann::json& value = rule[field];
  if (!value.is_object())
    fail("rule '{}': '{}' must map argument fields (or \"*\") to regexes", id, field);
  for (const auto& [name, patterns] : value.items()) {
    std::vector<RulePattern> compiled;
    for (const std::string& pattern : string_list(value, name.c_str(), id)) {
      try {
        compiled.emplace_back(pattern, case_sensitive);
      } catch (const Error& error) {
        fail("rule '{}': {}.{}: {}", id, field, name, error.what());
      }
    }
    out.emplace_back(name, std::move(compiled));
  }
  return out;
}

bool tool_matches(const Rule& rule, const std::string& name) {
  if (rule.tools.empty()) return true;
  for (const std::string& glob : rule.tools)
    if (path_glob_match(glob, name)) return true;
  return false;
}

// The first value of `field` ("*": any) a pattern finds, as evidence.
bool field_matches(const ToolCallView& call, const std::string& field,
                   const std::vector<RulePattern>& patterns, std::string* evidence) {
  for (const auto& [name, value] : call.values) {
    if (field != "*" && name != field) continue;
    for (const RulePattern& pattern : patterns)
      if (pattern.search(value, evidence)) return true;
  }
  return false;
}

std::string truncated(std::string text) {
  if (text.size() > 200) text = text.substr(0, 200) + "...";
  return text;
}

}  // namespace

std::vector<std::string> RuleFilter::builtin_sets() {
  std::vector<std::string> names;
  const nlohmann::json sets = parse_json(builtin_rules_json());
  for (const auto& [name, rules] : sets.items()) names.push_back(name);
  return names;
}

void RuleFilter::add_rules(const nlohmann::json& rules, const std::string& origin) {
  if (!rules.is_array()) fail("{}: 'rules' must be a list", origin);
  for (const auto& item : rules) {
    if (!item.is_object() || !item.contains("id") || !item["id"].is_string())
      fail("{}: every rule must be an object with a string 'id'", origin);
    Rule rule;
    rule.id = item["id"].get<std::string>();
    for (const Rule& existing : rules_)
      if (existing.id == rule.id) fail("{}: two rules have the id '{}'", origin, rule.id);
    static const std::set<std::string> kFields = {
        "id",    "category", "description", "tools",          "arguments",
        "paths", "unless",   "when",        "case_sensitive", "judge"};
    for (const auto& [key, value] : item.items())
      if (!kFields.contains(key)) fail("rule '{}': unknown field '{}'", rule.id, key);
    auto text = [&](const char* field) {
      if (!item.contains(field) || item[field].is_null()) return std::string();
      if (!item[field].is_string()) fail("rule '{}': '{}' must be a string", rule.id, field);
      return item[field].get<std::string>();
    };
    auto flag = [&](const char* field, bool fallback) {
      if (!item.contains(field) || item[field].is_null()) return fallback;
      if (!item[field].is_boolean()) fail("rule '{}': '{}' must be a boolean", rule.id, field);
      return item[field].get<bool>();
    };
    rule.category = text("category");
    if (rule.category.empty()) rule.category = "custom";
    rule.description = text("description");
    const std::string when = text("when");
    if (!when.empty() && when != "any" && when != "all")
      fail("rule '{}': 'when' must be \"any\" or \"all\"", rule.id);
    rule.require_all = when == "all";
    rule.judge = flag("judge", true);
    const bool case_sensitive = flag("case_sensitive", false);
    rule.tools = string_list(item, "tools", rule.id);
    rule.paths = string_list(item, "paths", rule.id);
    rule.arguments = pattern_map(item, "arguments", rule.id, case_sensitive);
    rule.unless = pattern_map(item, "unless", rule.id, case_sensitive);
    rules_.push_back(std::move(rule));
  }
}

RuleFilter RuleFilter::from_json(const nlohmann::json& config) {
  if (!config.is_object()) fail("guard rules: the file must hold a JSON object");
  static const std::set<std::string> kFields = {"builtin", "protected_paths", "rules"};
  for (const auto& [key, value] : config.items())
    if (!kFields.contains(key)) fail("guard rules: unknown field '{}'", key);
  RuleFilter filter;
  const nlohmann::json sets = parse_json(builtin_rules_json());
  std::vector<std::string> chosen;
  const nlohmann::json builtin = config.value("builtin", nlohmann::json(true));
  if (builtin.is_boolean()) {
    if (builtin.get<bool>())
      for (const auto& [name, rules] : sets.items()) chosen.push_back(name);
  } else if (builtin.is_array()) {
    for (const auto& name : builtin) {
      if (!name.is_string() || !sets.contains(name.get<std::string>()))
        fail("guard rules: 'builtin' names an unknown rule set {} (known: {})", name.dump(), [&] {
          std::string known;
          for (const auto& [set, rules] : sets.items()) known += (known.empty() ? "" : ", ") + set;
          return known;
        }());
      chosen.push_back(name.get<std::string>());
    }
  } else {
    fail("guard rules: 'builtin' must be true, false or a list of rule set names");
  }
  for (const std::string& name : chosen) filter.add_rules(sets[name], "built-in set " + name);
  if (config.contains("protected_paths")) {
    const std::vector<std::string> paths =
        string_list(config, "protected_paths", "protected_paths");
    if (!paths.empty())
      filter.add_rules(
          nlohmann::json::array({{{"id", "protected_paths.configured"},
                                  {"category", "protected_paths"},
                                  {"description", "names a path the task marks as protected"},
                                  {"paths", paths}}}),
          "protected_paths");
  }
  if (config.contains("rules")) filter.add_rules(config["rules"], "guard rules");
  return filter;
}

RuleFilter RuleFilter::load(const std::string& path) {
  if (path.empty()) return from_json(nlohmann::json::object());
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("guard rules: cannot read '{}'", path);
  std::stringstream text;
  text << file.rdbuf();
  nlohmann::json config;
  try {
    config = parse_json(text.str());
  } catch (const nlohmann::json::exception& error) {
    fail("guard rules: '{}' is not valid JSON: {}", path, error.what());
  }
  return from_json(config);
}

std::vector<RuleHit> RuleFilter::screen(const ToolCallView& call) const {
  std::vector<RuleHit> hits;
  for (const Rule& rule : rules_) {
    if (!tool_matches(rule, call.name)) continue;
    bool excepted = false;
    for (const auto& [field, patterns] : rule.unless)
      if (field_matches(call, field, patterns, nullptr)) excepted = true;
    if (excepted) continue;
    size_t conditions = 0, met = 0;
    std::string evidence;
    for (const auto& [field, patterns] : rule.arguments) {
      ++conditions;
      std::string found;
      if (field_matches(call, field, patterns, &found)) {
        ++met;
        if (evidence.empty()) evidence = found;
      }
    }
    if (!rule.paths.empty()) {
      ++conditions;
      bool path_met = false;
      for (const std::string& path : call.paths) {
        for (const std::string& glob : rule.paths)
          if (path_glob_match(glob, path)) {
            path_met = true;
            if (evidence.empty()) evidence = path;
            break;
          }
        if (path_met) break;
      }
      if (path_met) ++met;
    }
    const bool fires = conditions == 0 || (rule.require_all ? met == conditions : met > 0);
    if (!fires) continue;
    hits.push_back({rule.id, rule.category, rule.description,
                    truncated(evidence.empty() ? call.name : evidence), rule.judge});
  }
  return hits;
}

}  // namespace megactx::gateway
