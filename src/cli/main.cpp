// megactx: the command-line entry point. Subcommands are in cmd_*.cpp.
#include <algorithm>
#include <cstdio>
#include <map>

#include "cli/command_registry.h"
#include "core/error.h"
#include "core/logging.h"

namespace megactx::cli {
std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace megactx::cli

int main(int argc, char** argv) {
  using namespace megactx;
  CLI::App app{"megactx: a serving engine for million-token sparse-attention LLMs"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error")->capture_default_str();

  auto& commands = cli::command_registry();
  std::sort(commands.begin(), commands.end(),
            [](const cli::Command& a, const cli::Command& b) { return a.name < b.name; });
  std::map<CLI::App*, cli::CommandAction> actions;
  for (auto& command : commands) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    actions[sub] = command.setup(*sub);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  setup_logging(log_level);
  try {
    for (auto& [sub, action] : actions)
      if (sub->parsed()) return action();
  } catch (const Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 1;
}
