// megactx render-chat: renders an OpenAI chat request through a chat template
// exactly as HF's apply_chat_template would, printing the prompt and nothing
// else (no trailing newline), for byte-for-byte comparison with the reference.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "chat/chat_template.h"
#include "cli/command_registry.h"
#include "core/error.h"
#include "io/bounded_json.h"

namespace megactx::cli {

namespace {

struct RenderChatOptions {
  std::string template_path;
  std::string request_path;
  std::string tokenizer_config_path;
  bool decode_arguments = false;
};

std::string read_file(const std::string& path, const char* what) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("cannot open {} '{}'", what, path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

nlohmann::ordered_json read_json(const std::string& path, const char* what) {
  std::string text = read_file(path, what);
  try {
    return parse_ordered_json(text);
  } catch (const nlohmann::json::exception& error) {
    fail("{} '{}' is not valid JSON: {}", what, path, error.what());
  }
}

int run_render_chat(const RenderChatOptions& options) {
  // ordered_json keeps key order as Python's json.load does (tools render with tojson).
  nlohmann::ordered_json tokenizer_config = nlohmann::ordered_json::object();
  if (!options.tokenizer_config_path.empty())
    tokenizer_config = read_json(options.tokenizer_config_path, "tokenizer config");
  std::string source;
  if (!options.template_path.empty()) {
    source = read_file(options.template_path, "template");
  } else if (tokenizer_config.contains("chat_template") &&
             tokenizer_config["chat_template"].is_string()) {
    source = tokenizer_config["chat_template"].get<std::string>();
  } else {
    fail("no chat template: pass --template or a --tokenizer-config with \"chat_template\"");
  }
  nlohmann::ordered_json request = read_json(options.request_path, "request");
  if (options.decode_arguments) decode_tool_call_arguments(request);
  ChatTemplate chat_template(source);
  std::string prompt = chat_template.render(chat_template_context(request, tokenizer_config));
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  return 0;
}

CommandRegistration registration{
    "render-chat", "Render an OpenAI chat request through a Jinja chat template",
    [](CLI::App& command) -> CommandAction {
      auto options = std::make_shared<RenderChatOptions>();
      command.add_option("--template", options->template_path, "chat template (.jinja)");
      command.add_option("--request", options->request_path, "OpenAI chat request JSON")
          ->required();
      command.add_option(
          "--tokenizer-config", options->tokenizer_config_path,
          "tokenizer_config.json (special tokens; chat_template when no --template)");
      command.add_flag(
          "--decode-tool-arguments", options->decode_arguments,
          "decode JSON-string tool call arguments into objects first, as a server does");
      return [options] { return run_render_chat(*options); };
    }};

}  // namespace

}  // namespace megactx::cli
