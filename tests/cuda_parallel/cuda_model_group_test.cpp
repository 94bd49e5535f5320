// The CUDA model's parallel layouts with two ranks on ONE GPU
// (CudaModelOptions::gpu_id_step = 0): tensor parallelism, and expert
// parallelism over it, give the logits of the model without a group; with
// data-parallel attention each rank's own rows (steps where the other rank
// has none included) give the logits of one process running them alone. The
// ranks hold their shares of the weights and add up their partial sums
// exactly as ranks on two GPUs do; only the transport differs:
//   * host collectives (parallel/host_staged_communicator.h): device data
//     through host memory over the CPU group, eager steps (no graphs);
//   * NCCL with each rank named a host of its own (NCCL_HOSTID, the loopback
//     socket transport; NcclCommunicatorOptions::ranks_share_device), decode
//     steps replayed as graphs with the NCCL calls inside.
// Each rank runs a prefill in two chunks and greedy decode steps; rank 0 also
// runs the model without a group and compares. The fixtures' checkpoints are
// read by each rank as its share (model/cuda/checkpoint_shares.h); so are
// random fp8 weights of a GLM shape whose cuts keep the e4m3 blocks. This process never touches
// CUDA itself (a forked child cannot use its parent's CUDA context): it
// counts the GPUs with nvidia-smi and skips below one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "../parallel/forked_group.h"
#include "cuda_group_helpers.h"
#include "io/model_config.h"
#include "model/cuda/cuda_model.h"
#include "model/dsa_model.h"
#include "model/model_loader.h"
#include "parallel/nccl_communicator.h"

namespace megactx::testing {
namespace {

struct Layout {
  bool expert_parallel = false;
  bool data_parallel_attention = false;  // with expert_parallel: each rank its own rows
  int data_parallel_size = 0;            // replicas (0: one per rank)
  bool context_parallel = false;         // every step's rows split over the ranks
  int context_parallel_size = 0;         // context shares (0: one per rank)
  bool layer_split = false;              // each layer's KV on one rank
  MoeDispatch moe_dispatch = MoeDispatch::automatic;  // data-parallel attention's
  bool deterministic = false;                         // batch-invariant kernels (--deterministic)
  bool bf16 = false;
  CudaModelOptions::Collectives collectives = CudaModelOptions::Collectives::host;
};

std::unique_ptr<LanguageModel> load(const std::string& fixture, parallel::Communicator* group,
                                    const Layout& layout) {
  ModelLoadOptions options;
  options.device = Device::CUDA;
  options.kv_dtype = KvDType::F32;
  options.cuda.bf16_weights = layout.bf16;
  options.cuda.gpu_id_step = 0;  // every rank on device 0
  options.cuda.collectives = layout.collectives;
  options.group = group;
  options.expert_parallel = group != nullptr && layout.expert_parallel;
  options.data_parallel_attention = group != nullptr && layout.data_parallel_attention;
  options.data_parallel_size = group != nullptr ? layout.data_parallel_size : 0;
  options.context_parallel = group != nullptr && layout.context_parallel;
  options.context_parallel_size = group != nullptr ? layout.context_parallel_size : 0;
  options.layer_split = group != nullptr && layout.layer_split;
  options.moe_dispatch = group != nullptr ? layout.moe_dispatch : MoeDispatch::automatic;
  options.deterministic = layout.deterministic;
  return load_language_model(fixture_dir(fixture), options);
}

// Data-parallel attention: replica r's own sequence (the fixture's prompt,
// or it reversed on replica 1) in steps where the other replica may have no
// rows at all: a prefill of half the prompt on both, the rest on replica 0
// while replica 1 has none, then on replica 1 while replica 0 has none, then
// `steps` greedy decode steps on both. `alone` (no group): the same steps of this rank's sequence,
// without the empty ones. Every logit of this rank's rows, in order. In the
// group each step carries the whole step's shape (ForwardBatch::dp_step, as
// the serving group's leader sends it): both replicas' rows.
std::vector<float> data_parallel_steps(LanguageModel& model, const HfFixture& f, int replica,
                                       int64_t steps, bool alone) {
  std::vector<int32_t> prompt = f.input_ids;
  if (replica == 1) std::reverse(prompt.begin(), prompt.end());
  const auto length = static_cast<int64_t>(prompt.size());
  const int64_t pages = (length + steps + 63) / 64 + 1;
  // The model's own cache: with LayerSplit a rank holds its layers' pools only.
  auto cache = model.make_kv_cache(make_kv_cache_spec(model.config(), pages, KvDType::F32));
  std::vector<int32_t> table;
  for (int64_t p = 0; p < pages; ++p) table.push_back(static_cast<int32_t>(p));
  std::vector<float> out;
  int32_t next = 0;
  // `longest`: the rows of the step's sequences (one per replica, each as long).
  auto step = [&](std::span<const int32_t> tokens, int64_t start, int64_t longest) {
    ForwardBatch batch;
    if (!tokens.empty()) batch.sequences.push_back({tokens, start, table, 0});
    batch.dp_step = {.max_sequences = 1, .max_rows = longest, .tokens_per_sequence = longest};
    if (batch.sequences.empty() && alone) return;
    const Tensor logits = model.to_host(model.forward(batch, *cache).logits);
    if (tokens.empty()) return;
    out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
    next = argmax(logits.data<float>() + logits.numel() - f.vocab, f.vocab);
  };
  const int64_t half = length / 2;
  const std::span<const int32_t> first(prompt.data(), static_cast<size_t>(half));
  const std::span<const int32_t> rest(prompt.data() + half, static_cast<size_t>(length - half));
  const auto rest_rows = static_cast<int64_t>(rest.size());
  step(first, 0, half);
  step(replica == 0 ? rest : std::span<const int32_t>(), half, rest_rows);
  step(replica == 1 ? rest : std::span<const int32_t>(), half, rest_rows);
  for (int64_t i = 0; i < steps; ++i) {
    const std::vector<int32_t> token = {next};
    step(token, length + i, 1);
  }
  return out;
}

// Each rank against one process running its sequence alone.
bool data_parallel_rank_matches_one_process(parallel::Communicator& group, const char* fixture,
                                            const Layout& layout) {
  const HfFixture f = load_fixture(fixture);
  const int replicas = layout.data_parallel_size > 0 ? layout.data_parallel_size : group.size();
  const int replica = group.rank() / (group.size() / replicas);
  std::vector<float> got;
  {
    auto model = load(fixture, &group, layout);
    got = data_parallel_steps(*model, f, replica, 5, /*alone=*/false);
  }
  group.barrier();  // every rank's group model is gone before the plain ones load
  auto plain = load(fixture, nullptr, layout);
  const std::vector<float> expected = data_parallel_steps(*plain, f, replica, 5, /*alone=*/true);
  if (got.size() != expected.size()) {
    std::fprintf(stderr, "rank %d: %zu logits, one process %zu\n", group.rank(), got.size(),
                 expected.size());
    return false;
  }
  const double error = relative_error(got.data(), expected.data(), got.size());
  // The deterministic mode: one process's bits (rollout logprobs equal to
  // scoring's), whichever dispatch.
  const double bound = layout.deterministic ? 0.0 : 1e-5;
  if (error > bound) print_row_errors(fixture, got, expected, f.vocab);
  std::printf(
      "%s, data-parallel attention%s%s%s, rank %d of %d (%d replicas) on one GPU, %s "
      "collectives: relative error %.3g (bound %.0e)\n",
      fixture, layout.layer_split ? " with LayerSplit" : "",
      layout.moe_dispatch == MoeDispatch::gathered ? " (gathered MoE dispatch)" : "",
      layout.deterministic ? ", deterministic" : "", group.rank(), group.size(), replicas,
      layout.collectives == CudaModelOptions::Collectives::nccl ? "NCCL" : "host", error, bound);
  return error <= bound;
}

// One rank's side: its logits; rank 0 compares them with one process's.
// The decode steps feed the prompt's first tokens (not each model's greedy
// choice: a bf16 near tie would compare two different sequences).
bool rank_matches_one_process(parallel::Communicator& group, const char* fixture,
                              const Layout& layout) {
  const HfFixture f = load_fixture(fixture);
  const int64_t steps = 6;
  const std::span<const int32_t> forced(f.input_ids.data(), static_cast<size_t>(steps));
  std::vector<float> got;
  int64_t replays = 0;
  {
    auto model = load(fixture, &group, layout);
    got = prefill_and_decode_logits(*model, f, steps, KvDType::F32, forced);
    replays = cuda_graph_stats(*model).replays;
  }
  if (group.rank() != 0) return true;
  const std::vector<float> expected =
      prefill_and_decode_logits(*load(fixture, nullptr, layout), f, steps, KvDType::F32, forced);
  // Host collectives wait for the stream: no graphs. NCCL's calls are
  // capturable, but ranks that share a GPU (all of these) run eagerly: their
  // first captured step hung (cuda_dsa_model.cpp).
  const bool graphs_as_expected = replays == 0;
  char what[256];
  std::snprintf(
      what, sizeof what, "%s, %d ranks on one GPU, %s%s, %s collectives (%lld graph replays)",
      fixture, group.size(),
      layout.context_parallel
          ? (layout.expert_parallel ? "context parallel, experts split" : "context parallel")
      : layout.layer_split ? (layout.expert_parallel ? "LayerSplit, experts split" : "LayerSplit")
      : layout.expert_parallel ? "experts split"
                               : "tensor parallel",
      layout.bf16 ? ", bf16" : "",
      layout.collectives == CudaModelOptions::Collectives::nccl ? "NCCL" : "host",
      static_cast<long long>(replays));
  if (layout.bf16) {
    // The GEMM inputs are the same bf16 values; the partial products' order moves.
    Layout fp32 = layout;
    fp32.bf16 = false;
    const std::vector<float> reference =
        prefill_and_decode_logits(*load(fixture, nullptr, fp32), f, steps, KvDType::F32, forced);
    return reduced_precision_matches(what, got, expected, reference, f.vocab, 5e-3) &&
           graphs_as_expected;
  }
  if (got.size() != expected.size()) {
    std::fprintf(stderr, "%s: %zu logits, one process %zu\n", what, got.size(), expected.size());
    return false;
  }
  // fp32: the sums over ranks only reorder float32 additions.
  const double error = relative_error(got.data(), expected.data(), got.size());
  if (error > 1e-5) print_row_errors(what, got, expected, f.vocab);
  std::printf("%s: relative error %.3g (bound 1e-5)\n", what, error);
  return error <= 1e-5 && graphs_as_expected;
}

// `ranks` forked ranks on one GPU in `layout`, each checked by `check`.
using RankCheck = bool (*)(parallel::Communicator&, const char*, const Layout&);
void expect_group_matches(int ranks, const char* fixture, const Layout& layout,
                          RankCheck check = rank_matches_one_process) {
  parallel::run_forked_group(
      ranks, [&](parallel::Communicator& group) { return check(group, fixture, layout); },
      std::chrono::milliseconds(300000));
}

class CudaModelGroup : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpus_by_nvidia_smi() < 1) GTEST_SKIP() << "no GPU (nvidia-smi lists none)";
  }
};

TEST_F(CudaModelGroup, TwoRanksOnOneGpuOverHostCollectivesMatchOneProcess) {
  for (const char* fixture : {"glm_schedule", "dsv32_yarn"}) {
    for (const bool experts : {false, true}) {
      for (const bool bf16 : {false, true}) {
        SCOPED_TRACE(std::string(fixture) + (experts ? " experts split" : " tensor parallel") +
                     (bf16 ? " bf16" : " fp32"));
        Layout layout;
        layout.expert_parallel = experts;
        layout.bf16 = bf16;
        expect_group_matches(2, fixture, layout);
      }
    }
  }
}

// Data-parallel attention over 2 ranks, host collectives and NCCL, the MoE
// layers by `dispatch`.
void expect_data_parallel_ranks_match(MoeDispatch dispatch, bool deterministic = false) {
  for (const char* fixture : {"glm_schedule", "dsv32_yarn"}) {
    for (const auto collectives :
         {CudaModelOptions::Collectives::host, CudaModelOptions::Collectives::nccl}) {
      if (collectives == CudaModelOptions::Collectives::nccl && !parallel::nccl_available())
        continue;
      SCOPED_TRACE(fixture);
      Layout layout;
      layout.expert_parallel = true;
      layout.data_parallel_attention = true;
      layout.moe_dispatch = dispatch;
      layout.deterministic = deterministic;
      layout.collectives = collectives;
      expect_group_matches(2, fixture, layout, data_parallel_rank_matches_one_process);
    }
  }
}

TEST_F(CudaModelGroup, DataParallelAttentionRanksMatchOneProcessEach) {
  expect_data_parallel_ranks_match(MoeDispatch::automatic);  // eager here: the all-to-all
}

// The gathered MoE dispatch (model/expert_dispatch.h; what CUDA Graphs of
// data-parallel steps run), here eagerly on every step: each rank's rows
// padded to the step's longest share, a rank with no rows in two steps.
TEST_F(CudaModelGroup, DataParallelAttentionGatheredDispatchMatchesOneProcessEach) {
  expect_data_parallel_ranks_match(MoeDispatch::gathered);
}

// The deterministic mode's gathered dispatch sends each pair's expert output
// back and combines in slot order: one process's logits bit for bit, as the
// all-to-all gives them.
TEST_F(CudaModelGroup, DeterministicDataParallelAttentionIsOneProcessBitForBit) {
  expect_data_parallel_ranks_match(MoeDispatch::gathered, /*deterministic=*/true);
  expect_data_parallel_ranks_match(MoeDispatch::all_to_all, /*deterministic=*/true);
}

// LayerSplit over 2 tensor-parallel ranks on one GPU: each layer's pools on
// its owner, which sends the others its latent pool and, on an indexer
// layer, its selection; the experts split too.
TEST_F(CudaModelGroup, LayerSplitRanksMatchOneProcess) {
  for (const char* fixture : {"glm_schedule", "dsv32_yarn"}) {
    for (const bool experts : {false, true}) {
      SCOPED_TRACE(std::string(fixture) + (experts ? " experts split" : ""));
      Layout layout;
      layout.layer_split = true;
      layout.expert_parallel = experts;
      expect_group_matches(2, fixture, layout);
    }
  }
}

// Context parallelism over 2 ranks on one GPU: each prefill chunk's rows
// split (a decode step's one row runs whole on both), the experts whole or
// sharded and reached by all-to-all.
TEST_F(CudaModelGroup, ContextParallelRanksMatchOneProcess) {
  for (const char* fixture : {"glm_schedule", "dsv32_yarn"}) {
    for (const bool experts : {false, true}) {
      SCOPED_TRACE(std::string(fixture) + (experts ? " experts split" : ""));
      Layout layout;
      layout.context_parallel = true;
      layout.expert_parallel = experts;
      expect_group_matches(2, fixture, layout);
    }
  }
}

// Context shares of tensor-parallel ranks: 2 shares of 2 (4 ranks on one
// GPU), the heads' sums within a share, the rows' gathers across them; the
// experts whole or over each share's 2 ranks.
TEST_F(CudaModelGroup, ContextSharesOfTensorRanksMatchOneProcess) {
  for (const bool experts : {false, true}) {
    SCOPED_TRACE(experts ? "experts split" : "experts whole");
    Layout layout;
    layout.context_parallel = true;
    layout.context_parallel_size = 2;
    layout.expert_parallel = experts;
    expect_group_matches(4, "glm_schedule", layout);
  }
}

// SGLang's --dp-size below --tp-size: 2 replicas of 2 tensor-parallel ranks
// (4 ranks on one GPU), each replica its own sequence.
TEST_F(CudaModelGroup, ReplicasOfTensorRanksMatchOneProcessEach) {
  for (const char* fixture : {"glm_schedule", "dsv32_yarn"}) {
    SCOPED_TRACE(fixture);
    Layout layout;
    layout.expert_parallel = true;
    layout.data_parallel_attention = true;
    layout.data_parallel_size = 2;
    expect_group_matches(4, fixture, layout, data_parallel_rank_matches_one_process);
    // LayerSplit inside each replica: each layer's pools on one of its 2 ranks.
    layout.layer_split = true;
    expect_group_matches(4, fixture, layout, data_parallel_rank_matches_one_process);
  }
}

// NCCL between two ranks of one GPU, each named another host (loopback
// sockets): the partial sums as on GPUs of their own; the steps run eagerly
// (ranks sharing a GPU hung in their first captured step: the CUDA model
// turns graphs off for them).
TEST_F(CudaModelGroup, TwoRanksOnOneGpuOverNcclMatchOneProcess) {
  std::string why;
  if (!parallel::nccl_available("", &why)) GTEST_SKIP() << "NCCL is not available: " << why;
  for (const bool experts : {false, true}) {
    SCOPED_TRACE(experts ? "experts split" : "tensor parallel");
    Layout layout;
    layout.expert_parallel = experts;
    layout.collectives = CudaModelOptions::Collectives::nccl;
    expect_group_matches(2, "glm_schedule", layout);
  }
}

// GLM-shaped random fp8 weights (bench/cuda/configs/glm_1b.json: 16 heads,
// widths that split into whole 128 x 128 scale blocks over 2 ranks), each
// rank reading its share of the e4m3 matrices (checkpoint_shares.h): the
// same fp8 GEMMs on the same bytes as one process (activation groups of 128
// fall on the cuts), so only the order of float32 sums moves.
// bench/cuda/configs/glm_1b.json from the source tree, or from the working
// directory (the GPU machine runs the packed binaries in a copy of the tree).
ModelConfig glm_1b_config() {
  for (const std::string& root : {std::string(MEGACTX_SOURCE_DIR), std::string(".")}) {
    std::ifstream file(root + "/bench/cuda/configs/glm_1b.json");
    if (!file) continue;
    std::stringstream text;
    text << file.rdbuf();
    return parse_model_config(text.str());
  }
  fail("bench/cuda/configs/glm_1b.json: not in {} nor in the working directory",
       MEGACTX_SOURCE_DIR);
}

// With `layer_split` (fp8 KV, the fast attention path): each layer's pools
// on one rank; the prefill chunks get the owner's pool, the decode steps
// (one row whose selection is smaller than its context's pages) only the
// selected entries (dsa_layer_split.cpp), through 30 steps past a page's end.
bool fp8_rank_matches_one_process(parallel::Communicator& group, bool experts,
                                  CudaModelOptions::Collectives collectives,
                                  bool layer_split = false, int64_t layers = 0) {
  ModelConfig config = glm_1b_config();
  if (layers > 0) {
    // The first `layers` decoder layers alone (a dense one first).
    config.num_hidden_layers = layers;
    config.indexer_types.resize(static_cast<size_t>(layers));
    config.mlp_layer_types.resize(static_cast<size_t>(layers));
  }
  HfFixture f;
  f.vocab = config.vocab_size;
  for (int32_t i = 0; i < 40; ++i) f.input_ids.push_back(17 + 31 * i);
  CudaModelOptions options;
  options.fp8_native = true;
  options.gpu_id_step = 0;
  options.collectives = collectives;
  const int64_t steps = layer_split ? 30 : 4;
  const KvDType kv = layer_split ? KvDType::FP8 : KvDType::F32;
  // The decode steps feed fixed tokens (see rank_matches_one_process).
  std::vector<int32_t> forced;
  for (int64_t i = 0; i < steps; ++i) forced.push_back(static_cast<int32_t>(5 + 7 * i));
  std::vector<float> got;
  {
    CudaModelOptions ranked = options;
    ranked.group = &group;
    DsaModelOptions layout;
    layout.group = &group;
    layout.expert_parallel = experts;
    layout.layer_split = layer_split;
    auto model = make_cuda_dsa_model_random_fp8(config, /*seed=*/3, ranked, layout);
    if (cuda_weight_bytes(*model).fp8_parameters == 0) return false;
    got = prefill_and_decode_logits(*model, f, steps, kv, forced);
  }
  if (group.rank() != 0) return true;
  const std::vector<float> expected = prefill_and_decode_logits(
      *make_cuda_dsa_model_random_fp8(config, /*seed=*/3, options), f, steps, kv, forced);
  // The same weights' values in float32 GEMMs (no tf32 either).
  CudaModelOptions exact = options;
  exact.fp8_native = false;
  const std::vector<float> reference = prefill_and_decode_logits(
      *make_cuda_dsa_model_random_fp8(config, /*seed=*/3, exact, {}, /*dequantized=*/true), f,
      steps, kv, forced);
  char what[160];
  std::snprintf(what, sizeof what,
                "glm_1b random fp8 weights, %lld layers, 2 ranks on one GPU, %s%s",
                static_cast<long long>(config.num_hidden_layers),
                experts ? "experts split" : "tensor parallel", layer_split ? ", LayerSplit" : "");
  return reduced_precision_matches(what, got, expected, reference, f.vocab, 1e-3);
}

// One layer (dense), two (a MoE layer after it), all twelve: where a
// mismatch first shows.
TEST_F(CudaModelGroup, Fp8SharesReadFromTheWeightsMatchOneProcess) {
  for (const int64_t layers : {1, 2, 0}) {
    for (const bool experts : {false, true}) {
      if (layers == 1 && experts) continue;  // no experts in the dense layer
      SCOPED_TRACE(std::string(experts ? "experts split" : "tensor parallel") + ", " +
                   std::to_string(layers) + " layers");
      parallel::run_forked_group(
          2,
          [&](parallel::Communicator& group) {
            return fp8_rank_matches_one_process(group, experts, CudaModelOptions::Collectives::host,
                                                /*layer_split=*/false, layers);
          },
          std::chrono::milliseconds(300000));
    }
  }
}

// LayerSplit on the fast attention path (fp8 KV): the decode steps read only
// the entries the owner sent of their selection, on its side stream and
// communicator (NCCL) or on the compute stream (host collectives).
TEST_F(CudaModelGroup, Fp8LayerSplitSendsTheSelectedEntries) {
  for (const auto collectives :
       {CudaModelOptions::Collectives::host, CudaModelOptions::Collectives::nccl}) {
    SCOPED_TRACE(collectives == CudaModelOptions::Collectives::host ? "host" : "nccl");
    parallel::run_forked_group(
        2,
        [&](parallel::Communicator& group) {
          return fp8_rank_matches_one_process(group, /*experts=*/false, collectives,
                                              /*layer_split=*/true);
        },
        std::chrono::milliseconds(300000));
  }
}

}  // namespace
}  // namespace megactx::testing
