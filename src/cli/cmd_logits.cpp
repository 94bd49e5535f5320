// megactx logits --model DIR --input-ids 1,2,3 --out FILE [--device cpu]
//                [--kv-dtype f32|bf16|fp8] [--chunk N] [--cuda-fp8-upcast] [--no-cuda-graphs]
//                [--cuda-fallback-attention] [--cuda-host-moe]
// --device cuda with an fp8 checkpoint keeps its e4m3 weights native (fp8
// GEMMs) unless --cuda-fp8-upcast.
// Prefill logits at every position: FILE gets float32 little-endian [T, vocab].
#include <bit>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "cli/command_registry.h"
#include "cli/cuda_options.h"
#include "core/error.h"
#include "model/model_loader.h"
#include "model/sequence_runner.h"

namespace megactx::cli {
namespace {

struct LogitsOptions {
  std::string model_dir;
  std::string input_ids;
  std::string out;
  std::string device = "cpu";
  std::string kv_dtype = "f32";
  int64_t chunk = 0;
  CudaModelOptions cuda = command_line_cuda_defaults();
};

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::CPU;
  if (name == "cuda") return Device::CUDA;
  fail("unknown --device '{}' (cpu or cuda)", name);
}

int run_logits(const LogitsOptions& options) {
  static_assert(std::endian::native == std::endian::little, "logits files are little-endian");
  const std::vector<int32_t> ids = parse_token_ids(options.input_ids);
  ModelLoadOptions load;
  load.device = parse_device(options.device);
  load.kv_dtype = parse_kv_dtype(options.kv_dtype);
  apply_cuda_options(options.cuda, load);
  const std::unique_ptr<LanguageModel> model = load_language_model(options.model_dir, load);
  SequenceRunner runner(*model, load.kv_dtype, static_cast<int64_t>(ids.size()));
  const Tensor logits = runner.feed(ids, /*all_logits=*/true, options.chunk);
  std::ofstream file(options.out, std::ios::binary);
  MEGACTX_CHECK(file.good(), "cannot write '{}'", options.out);
  file.write(static_cast<const char*>(logits.raw()), static_cast<std::streamsize>(logits.nbytes()));
  MEGACTX_CHECK(file.good(), "writing '{}' failed", options.out);
  std::fprintf(stderr, "wrote %s: float32 [%lld, %lld]\n", options.out.c_str(),
               static_cast<long long>(logits.dim(0)), static_cast<long long>(logits.dim(1)));
  return 0;
}

CommandRegistration registration{
    "logits", "Prefill logits at every position as float32 [T, vocab]",
    [](CLI::App& command) -> CommandAction {
      auto options = std::make_shared<LogitsOptions>();
      command.add_option("--model", options->model_dir, "Hugging Face model directory")->required();
      command.add_option("--input-ids", options->input_ids, "comma-separated token ids")
          ->required();
      command.add_option("--out", options->out, "output file (float32 LE [T, vocab])")->required();
      command.add_option("--device", options->device, "cpu|cuda")->capture_default_str();
      command.add_option("--kv-dtype", options->kv_dtype, "f32|bf16|fp8")->capture_default_str();
      command.add_option("--chunk", options->chunk, "prefill chunk size (0: one forward)")
          ->capture_default_str();
      add_cuda_options(command, options->cuda, /*with_bf16=*/false);
      return [options] { return run_logits(*options); };
    }};

}  // namespace
}  // namespace megactx::cli
