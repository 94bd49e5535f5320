// megactx indexer-recall --model DIR --input-ids IDS|@FILE --lengths 1024,8192 [--rows 64]
//                        [--kv-dtype f32|bf16|fp8] [--chunk N] [--index-topk K]
// The indexer's recall against the dense attention by prompt length, on the
// CPU model as it serves (sparse attention): for each length L, the first L
// ids are prefilled and the last --rows rows of every layer measured
// (model/indexer_recall.h: the share of the dense attention's top-k the
// selection holds, and the attention mass inside it), then averaged over the
// layers that share one indexer's selection. Prints a table; --json writes it.
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command_registry.h"
#include "core/error.h"
#include "model/dsa_model.h"
#include "model/indexer_recall.h"
#include "model/model_loader.h"
#include "model/sequence_runner.h"

namespace megactx::cli {
namespace {

struct RecallOptions {
  std::string model_dir;
  std::string input_ids;  // "1,2,3" or "@file" holding that
  std::string lengths;
  int64_t rows = 64;
  std::string kv_dtype = "f32";
  int64_t chunk = 0;
  int64_t index_topk = 0;  // 0: the config's
  std::string json;
};

std::vector<int32_t> read_ids(const std::string& value) {
  if (value.empty() || value.front() != '@') return parse_token_ids(value);
  std::ifstream file(value.substr(1));
  MEGACTX_CHECK(file.good(), "cannot read '{}'", value.substr(1));
  std::stringstream text;
  text << file.rdbuf();
  std::string ids = text.str();
  while (!ids.empty() && (ids.back() == '\n' || ids.back() == ' ')) ids.pop_back();
  return parse_token_ids(ids);
}

int run_indexer_recall(const RecallOptions& options) {
  const std::vector<int32_t> ids = read_ids(options.input_ids);
  std::vector<int32_t> lengths;
  try {
    lengths = parse_token_ids(options.lengths);
  } catch (const Error&) {
    fail("--lengths '{}': expected comma-separated token counts", options.lengths);
  }
  for (const int32_t length : lengths)
    MEGACTX_CHECK(length > 0 && length <= static_cast<int64_t>(ids.size()),
                  "--lengths {}: the prompt has {} ids", length, ids.size());
  MEGACTX_CHECK(options.rows > 0, "--rows must be positive");
  ModelLoadOptions load;
  load.kv_dtype = parse_kv_dtype(options.kv_dtype);
  if (options.index_topk > 0) load.index_topk_override = options.index_topk;
  const std::unique_ptr<LanguageModel> model = load_language_model(options.model_dir, load);
  auto* dsa = dynamic_cast<DsaModel*>(model.get());
  MEGACTX_CHECK(dsa != nullptr && model->device() == Device::CPU,
                "indexer-recall needs a DSA model on the CPU");
  nlohmann::json report = nlohmann::json::array();
  std::printf(
      "| length | layer | attends through the indexer of layer | rows | recall | attention "
      "mass in the selection |\n|---|---|---|---|---|---|\n");
  for (const int64_t length : lengths) {
    IndexerRecall recall(length - options.rows);
    dsa->set_attention_probe([&](const AttentionProbeLayer& view) { recall.observe(view); });
    SequenceRunner runner(*model, load.kv_dtype, length);
    runner.feed(std::span<const int32_t>(ids.data(), static_cast<size_t>(length)),
                /*all_logits=*/false, options.chunk);
    dsa->set_attention_probe({});
    // Per indexer: the mean over the layers that attend through its selection.
    struct Group {
      double recall = 0.0, mass = 0.0;
      int64_t layers = 0;
    };
    std::map<int64_t, Group> groups;
    for (const IndexerRecall::Layer& layer : recall.layers()) {
      std::printf("| %lld | %lld | %lld | %lld | %.4f | %.4f |\n", static_cast<long long>(length),
                  static_cast<long long>(layer.layer), static_cast<long long>(layer.indexer_source),
                  static_cast<long long>(layer.rows), layer.recall, layer.mass);
      Group& group = groups[layer.indexer_source];
      group.recall += layer.recall;
      group.mass += layer.mass;
      ++group.layers;
      report.push_back({{"length", length},
                        {"layer", layer.layer},
                        {"indexer_source", layer.indexer_source},
                        {"rows", layer.rows},
                        {"recall", layer.recall},
                        {"attention_mass", layer.mass}});
    }
    for (const auto& [source, group] : groups)
      std::fprintf(stderr,
                   "length %lld, indexer of layer %lld (%lld layers): recall %.4f, mass %.4f\n",
                   static_cast<long long>(length), static_cast<long long>(source),
                   static_cast<long long>(group.layers), group.recall / group.layers,
                   group.mass / group.layers);
  }
  if (!options.json.empty()) {
    std::ofstream file(options.json);
    MEGACTX_CHECK(file.good(), "cannot write '{}'", options.json);
    file << report.dump(1) << "\n";
  }
  return 0;
}

CommandRegistration registration{
    "indexer-recall",
    "The indexer's recall against the dense attention by prompt length (CPU model, as served)",
    [](CLI::App& command) -> CommandAction {
      auto options = std::make_shared<RecallOptions>();
      command.add_option("--model", options->model_dir, "Hugging Face model directory")->required();
      command
          .add_option("--input-ids", options->input_ids,
                      "comma-separated token ids, or @FILE holding them")
          ->required();
      command.add_option("--lengths", options->lengths, "prompt lengths (prefixes of the ids)")
          ->required();
      command.add_option("--rows", options->rows, "rows measured at the end of each prompt")
          ->capture_default_str();
      command.add_option("--kv-dtype", options->kv_dtype, "f32|bf16|fp8")->capture_default_str();
      command.add_option("--chunk", options->chunk, "prefill chunk size (0: one forward)")
          ->capture_default_str();
      command.add_option("--index-topk", options->index_topk, "top-k (0: the config's)")
          ->capture_default_str();
      command.add_option("--json", options->json, "also write the table here");
      return [options] { return run_indexer_recall(*options); };
    }};

}  // namespace
}  // namespace megactx::cli
