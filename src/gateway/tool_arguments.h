// What the guard reads of one tool call: its name, its arguments as JSON
// (when they parse) and as text, every string value with the top-level field
// it came from, and the file paths it names (path-like fields, and path-like
// words inside commands and code).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megactx::gateway {

struct ToolCallView {
  std::string name;
  std::string arguments_text;  // as the model wrote them (a JSON string in OpenAI's shape)
  nlohmann::json arguments;    // parsed object, or null
  // (top-level field, value) for every string (and scalar, as text) inside.
  std::vector<std::pair<std::string, std::string>> values;
  std::vector<std::string> paths;  // normalized: no leading "./", no doubled '/'
};

// From an OpenAI tool call {"function": {"name", "arguments"}} (or the flat
// {"name", "arguments"} form); arguments may be a JSON string or an object.
ToolCallView view_tool_call(const nlohmann::json& call);
ToolCallView view_tool_call(std::string name, const nlohmann::json& arguments);

// Shell-style glob over a path: '**' spans directories, '*' and '?' stay in
// one; matched case-insensitively against the whole path and against every
// suffix that starts after a '/', so a glob of a tests folder also finds it
// inside a checkout's folder. A pattern starting with '/' matches absolute
// paths from their root only.
bool path_glob_match(std::string_view pattern, std::string_view path);

}  // namespace megactx::gateway
