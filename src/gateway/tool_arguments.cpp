#include "gateway/tool_arguments.h"

#include <algorithm>
#include <cctype>

#include "io/bounded_json.h"

namespace megactx::gateway {

namespace {

// Fields whose value is a path (or a list of them) in the tool schemas
// agents use (file editors, readers, patchers, shells with a cwd).
bool path_field(const std::string& field) {
  static const char* kFields[] = {"path",          "file",
                                  "file_path",     "filepath",
                                  "filename",      "paths",
                                  "files",         "target",
                                  "target_file",   "source",
                                  "destination",   "dest",
                                  "src",           "dst",
                                  "old_path",      "new_path",
                                  "directory",     "dir",
                                  "cwd",           "workdir",
                                  "pattern",       "glob",
                                  "uri",           "url",
                                  "notebook_path", "relative_workspace_path"};
  std::string lower = field;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::find(std::begin(kFields), std::end(kFields), lower) != std::end(kFields);
}

void collect(const std::string& field, const nlohmann::json& value, int depth,
             std::vector<std::pair<std::string, std::string>>& out) {
  if (depth > 16) return;
  if (value.is_string()) {
    out.emplace_back(field, value.get<std::string>());
  } else if (value.is_object()) {
    for (const auto& [key, item] : value.items())
      collect(field.empty() ? key : field, item, depth + 1, out);
  } else if (value.is_array()) {
    for (const auto& item : value) collect(field, item, depth + 1, out);
  } else if (!value.is_null()) {
    out.emplace_back(field, value.dump());
  }
}

std::string normalize_path(std::string path) {
  while (path.size() >= 2 && path[0] == '.' && path[1] == '/') path.erase(0, 2);
  std::string out;
  for (char c : path) {
    if (c == '/' && !out.empty() && out.back() == '/') continue;
    out += c;
  }
  return out;
}

// Words of a command or code that look like files: they hold a '/' or end
// in a short extension.
void path_words(std::string_view text, std::vector<std::string>& out) {
  auto separator = [](char c) {
    return std::isspace(static_cast<unsigned char>(c)) || c == ';' || c == '|' || c == '&' ||
           c == '<' || c == '>' || c == '(' || c == ')' || c == '\'' || c == '"' || c == '`' ||
           c == '=' || c == ',' || c == '[' || c == ']' || c == '{' || c == '}';
  };
  size_t i = 0;
  while (i < text.size() && out.size() < 256) {
    while (i < text.size() && separator(text[i])) ++i;
    size_t start = i;
    while (i < text.size() && !separator(text[i])) ++i;
    std::string_view word = text.substr(start, i - start);
    if (word.empty() || word.size() > 512 || word.find("://") != std::string_view::npos) continue;
    const size_t dot = word.rfind('.');
    const bool has_extension = dot != std::string_view::npos && dot > 0 && word.size() - dot >= 2 &&
                               word.size() - dot <= 9 &&
                               std::isalpha(static_cast<unsigned char>(word[dot + 1]));
    if (word.find('/') != std::string_view::npos || has_extension)
      out.push_back(normalize_path(std::string(word)));
  }
}

char lower(char c) {
  return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

// Iterative glob with backtracking to the last star (linear-ish, no recursion).
bool glob_at(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0;
  size_t star_p = std::string_view::npos, star_t = 0;
  bool star_crosses = false;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star_crosses = p + 1 < pattern.size() && pattern[p + 1] == '*';
      p += star_crosses ? 2 : 1;
      // "**/" also matches no directory at all.
      if (star_crosses && p < pattern.size() && pattern[p] == '/') {
        if (glob_at(pattern.substr(p + 1), text.substr(t))) return true;
      }
      star_p = p;
      star_t = t;
      continue;
    }
    if (p < pattern.size() &&
        (pattern[p] == '?' ? text[t] != '/' : lower(pattern[p]) == lower(text[t]))) {
      ++p;
      ++t;
      continue;
    }
    if (star_p != std::string_view::npos && (star_crosses || text[star_t] != '/')) {
      p = star_p;
      t = ++star_t;
      continue;
    }
    return false;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace

bool path_glob_match(std::string_view pattern, std::string_view path) {
  if (pattern.empty() || path.empty()) return false;
  if (pattern.front() == '/') return glob_at(pattern, path);
  if (glob_at(pattern, path)) return true;
  for (size_t i = 0; i < path.size(); ++i)
    if (path[i] == '/' && i + 1 < path.size() && glob_at(pattern, path.substr(i + 1))) return true;
  return false;
}

ToolCallView view_tool_call(std::string name, const nlohmann::json& arguments) {
  ToolCallView view;
  view.name = std::move(name);
  if (arguments.is_string()) {
    view.arguments_text = arguments.get<std::string>();
    view.arguments = try_parse_json(view.arguments_text);
    if (view.arguments.is_discarded()) view.arguments = nullptr;
  } else if (!arguments.is_null()) {
    view.arguments = arguments;
    view.arguments_text = arguments.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (view.arguments.is_null() && !view.arguments_text.empty())
    view.values.emplace_back("", view.arguments_text);  // unparseable: screen the text itself
  else
    collect("", view.arguments, 0, view.values);
  for (const auto& [field, value] : view.values) {
    if (path_field(field) && !value.empty() && value.size() <= 4096 &&
        value.find('\n') == std::string::npos)
      view.paths.push_back(normalize_path(value));
    path_words(value, view.paths);
  }
  std::sort(view.paths.begin(), view.paths.end());
  view.paths.erase(std::unique(view.paths.begin(), view.paths.end()), view.paths.end());
  return view;
}

ToolCallView view_tool_call(const nlohmann::json& call) {
  if (!call.is_object()) return view_tool_call("", nlohmann::json());
  const nlohmann::json& function =
      call.contains("function") && call["function"].is_object() ? call["function"] : call;
  std::string name;
  if (function.contains("name") && function["name"].is_string())
    name = function["name"].get<std::string>();
  return view_tool_call(std::move(name),
                        function.contains("arguments") ? function["arguments"] : nlohmann::json());
}

}  // namespace megactx::gateway
