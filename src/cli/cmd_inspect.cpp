// megactx inspect --model DIR [--memory 80GiB] [--json] [--check-weights]
// Describes a model from its config.json alone (a directory holding only
// config.json is enough); with --check-weights it also opens the safetensors
// files and lists missing and unexpected tensors.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cli/command_registry.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/model_summary.h"
#include "io/tensor_layout.h"

namespace megactx::cli {
namespace {

struct InspectOptions {
  std::string model_dir;
  std::string memory;
  bool json = false;
  bool check_weights = false;
};

int run_inspect(const InspectOptions& options) {
  const ModelConfig config = load_model_config(options.model_dir);
  std::optional<uint64_t> budget;
  if (!options.memory.empty()) budget = parse_memory_size(options.memory);
  const ModelSummary summary = summarize_model(config, budget);

  nlohmann::json weights;
  if (options.check_weights) {
    auto checkpoint = Checkpoint::open(options.model_dir);
    const LayoutCheck check = check_layout(config, checkpoint->names());
    weights = {{"tensors", checkpoint->names().size()},
               {"missing", check.missing},
               {"unexpected", check.unexpected}};
  }

  if (options.json) {
    nlohmann::json j = summary_to_json(summary);
    if (options.check_weights) j["weights"] = weights;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::fputs(summary_to_text(summary).c_str(), stdout);
    if (options.check_weights) {
      std::printf("weights               %zu tensors, %zu missing, %zu unexpected\n",
                  weights["tensors"].get<size_t>(), weights["missing"].size(),
                  weights["unexpected"].size());
      for (const auto& name : weights["missing"])
        std::printf("  missing     %s\n", name.get<std::string>().c_str());
      for (const auto& name : weights["unexpected"])
        std::printf("  unexpected  %s\n", name.get<std::string>().c_str());
    }
  }
  return options.check_weights && !weights["missing"].empty() ? 1 : 0;
}

CommandRegistration registration{
    "inspect", "Describe a model: layer schedule, parameters, KV bytes per token",
    [](CLI::App& command) -> CommandAction {
      auto options = std::make_shared<InspectOptions>();
      command.add_option("--model", options->model_dir, "model directory (config.json)")
          ->required();
      command.add_option("--memory", options->memory,
                         "KV-cache memory budget, e.g. 80GiB: prints how many tokens fit");
      command.add_flag("--json", options->json, "print the facts as JSON");
      command.add_flag("--check-weights", options->check_weights,
                       "open the safetensors files and list missing/unexpected tensors");
      return [options] { return run_inspect(*options); };
    }};

}  // namespace
}  // namespace megactx::cli
