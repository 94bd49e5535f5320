// Subcommands of the megactx binary register themselves here. Each lives in
// its own cmd_<name>.cpp:
//
//   static CommandRegistration registration{"inspect", "Describe a checkpoint",
//       [](CLI::App& command) -> std::function<int()> {
//         auto options = std::make_shared<InspectOptions>();
//         command.add_option("--model", options->model_dir)->required();
//         return [options] { return run_inspect(*options); };
//       }};
//
// The setup function declares the options and returns the action to run when
// that subcommand is chosen. Errors thrown as megactx::Error are printed as one
// line by main() with exit code 1.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace megactx::cli {

using CommandAction = std::function<int()>;
using CommandSetup = std::function<CommandAction(CLI::App&)>;

struct Command {
  std::string name;
  std::string description;
  CommandSetup setup;
};

std::vector<Command>& command_registry();

struct CommandRegistration {
  CommandRegistration(std::string name, std::string description, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

}  // namespace megactx::cli
