// The composition root: the one place that turns a model directory and the
// runtime choices into a running Engine. It loads the tokenizer, the
// generation defaults and the model for the chosen device; on a device it
// checks that the weights can fit before the load, measures what the load
// took (the MTP layer's weights included), and plans the KV pages from what
// is left (engine/kv_capacity.h plan_device_kv); then it builds the Engine,
// whose model makes its own pools, sampler and MTP layer. `serve` and
// `generate` both start here.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "model/model_loader.h"

namespace megactx {

struct EngineLoadOptions {
  std::string model_dir;
  ModelLoadOptions load;  // device, KV dtype, the CUDA switches
  // kv_memory_bytes > 0: exactly this KV budget; 0: the device's plan (the
  // fraction below) or 2 GiB on the CPU.
  EngineConfig engine;
  double gpu_memory_utilization = 0.9;  // vLLM's --gpu-memory-utilization
  // Already loaded (the caller needed it first); null: loaded here. A
  // directory without tokenizer.json then gets a tokenizer that knows only
  // token ids when `ids_only_without_tokenizer` (generate --format ids over
  // test fixtures); else that is an Error. `skip_tokenizer` never loads one
  // (serve --skip-tokenizer-init, SGLang's name: token ids in and out).
  std::shared_ptr<const Tokenizer> tokenizer;
  bool ids_only_without_tokenizer = false;
  bool skip_tokenizer = false;
  // load.group of more than one rank: called once when the group fails (a
  // worker rank exited), from the engine's thread (model/group_model.h).
  std::function<void(const std::string&)> on_group_failure;
};

struct LoadedEngine {
  std::shared_ptr<const Tokenizer> tokenizer;
  GenerationDefaults defaults;
  std::string device_kv_plan;  // the device's memory plan, one line (empty on the CPU)
  std::unique_ptr<Engine> engine;
};

LoadedEngine load_engine(const EngineLoadOptions& options);

}  // namespace megactx
