// The CPU model spread over 2 and 4 ranks (forked processes on loopback):
// tensor-parallel attention and MLPs (each rank its share of the heads and
// widths), expert parallelism over it, and expert parallelism with
// data-parallel attention (every rank its own tokens, all-to-all dispatch and
// combine) give the single-process model's logits for a prefill then
// token-by-token decoding through the paged cache, on HF fixtures with dense
// and MoE layers (glm_moe_dsa with IndexShare, deepseek_v32 with YaRN); and
// HF's own logits. The MTP layer under tensor and expert parallelism
// matches the PyTorch reference of tests/mtp (step 0, the shared and
// unshared draft steps, greedy draft chains). Context parallelism (every
// prefill's rows split over the group; also with the experts sharded over
// it, or over shares of tensor-parallel ranks) gives the same logits too (and
// the same routed experts), and so does
// LayerSplit (each layer's caches on one rank, the selected entries sent to
// the others) through chunked prefill, decode and a prefix-cache hit; a broken
// broadcast of those entries is caught (also over context shares of
// tensor-parallel ranks). The indexer's heads split over the ranks (scores
// summed) give the same logits too. Shapes that do not divide, CUDA under parallelism
// and LayerSplit with context parallelism over the whole group or
// data-parallel attention are errors (MTP with data-parallel attention runs through the
// group leader: dp_attention_model_test.cpp).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../model/hf_fixture.h"
#include "../mtp/mtp_golden_check.h"
#include "core/error.h"
#include "forked_group.h"
#include "io/checkpoint.h"
#include "model/dsa_model.h"
#include "model/model_loader.h"
#include "model/model_plan.h"
#include "model/mtp_layer.h"
#include "model/sequence_runner.h"
#include "parallel/communicator.h"

namespace megactx::testing {
namespace {

// Prefill of `prompt` (all logits), then `continuation` fed one token at a
// time: [prompt + continuation, vocab].
std::vector<float> prefill_then_decode(LanguageModel& model, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& continuation) {
  SequenceRunner runner(model, KvDType::F32,
                        static_cast<int64_t>(prompt.size() + continuation.size()));
  const Tensor prefill = runner.feed(prompt, true);
  std::vector<float> out(prefill.data<float>(), prefill.data<float>() + prefill.numel());
  for (const int32_t id : continuation) {
    const int32_t token[1] = {id};
    const Tensor logits = runner.feed(token, false);
    out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
  }
  return out;
}

struct Layout {
  bool expert_parallel = false;
  bool data_parallel_attention = false;
  bool context_parallel = false;
  int context_parallel_size = 0;    // with context_parallel: shares of tensor-parallel ranks
  bool split_indexer = false;       // the indexer's heads over the tensor-parallel ranks
  bool experts_over_group = false;  // shares' experts over the whole group, not each share
  MoeDispatch moe_dispatch = MoeDispatch::automatic;  // with the experts' all-to-all
};

// The fixture's prompt through the group (every rank the same prompt with
// tensor-parallel attention; with data-parallel attention rank r drops its
// first r tokens, so that the ranks' batches differ) against one process on
// the same tokens, and (the whole prompt) against HF's prefill logits.
bool matches_the_whole_model(const std::string& name, parallel::Communicator& group,
                             Layout layout = {}) {
  const HfFixture f = load_fixture(name);
  const int skip = layout.data_parallel_attention ? group.rank() : 0;
  const std::vector<int32_t> prompt(f.input_ids.begin() + skip, f.input_ids.end());
  const std::vector<float> whole =
      prefill_then_decode(*load_language_model(f.dir, {}), prompt, f.greedy_ids);
  ModelLoadOptions options;
  options.group = &group;
  options.expert_parallel = layout.expert_parallel;
  options.data_parallel_attention = layout.data_parallel_attention;
  options.context_parallel = layout.context_parallel;
  options.context_parallel_size = layout.context_parallel_size;
  options.split_indexer = layout.split_indexer;
  options.experts_over_group = layout.experts_over_group;
  options.moe_dispatch = layout.moe_dispatch;
  auto model = load_language_model(f.dir, options);
  if (layout.split_indexer) {
    // Each rank scores with its share of the indexer's heads.
    const auto* dsa = dynamic_cast<const DsaModel*>(model.get());
    if (dsa == nullptr || !dsa->plan().indexer_split ||
        dsa->plan().attention.index_heads * dsa->plan().tensor_parallel_size !=
            dsa->config().index_n_heads)
      return false;
  }
  if (layout.context_parallel_size > 1) {
    // Context shares of tensor-parallel ranks, the tensor rank innermost.
    const auto* dsa = dynamic_cast<const DsaModel*>(model.get());
    const int tensor = group.size() / layout.context_parallel_size;
    if (dsa == nullptr || dsa->plan().context_parallel_size != layout.context_parallel_size ||
        dsa->plan().context_parallel_rank != group.rank() / tensor ||
        dsa->plan().tensor_parallel_size != tensor ||
        dsa->plan().tensor_parallel_rank != group.rank() % tensor)
      return false;
  }
  if (layout.expert_parallel) {
    // The routed experts really are sharded (each rank its 1 / size of them;
    // over context shares of tensor-parallel ranks, 1 / ranks per share, or
    // 1 / size over the whole group).
    const int experts_over = layout.context_parallel_size > 1 && !layout.experts_over_group
                                 ? group.size() / layout.context_parallel_size
                                 : group.size();
    const auto* dsa = dynamic_cast<const DsaModel*>(model.get());
    if (dsa == nullptr || dsa->plan().expert_parallel_size != experts_over ||
        dsa->plan().local_experts * experts_over != dsa->config().n_routed_experts ||
        dsa->plan().experts_over_shares != layout.experts_over_group)
      return false;
  }
  const std::vector<float> split = prefill_then_decode(*model, prompt, f.greedy_ids);
  if (split.size() != whole.size()) return false;
  const double error = relative_error(split.data(), whole.data(), whole.size());
  // HF's prefill logits (the whole prompt only): the single-process parity bound.
  const double hf_error =
      skip == 0 ? relative_error(split.data(), f.prefill_logits.data(), f.prefill_logits.size())
                : 0.0;
  std::printf(
      "%s, rank %d of %d%s%s%s%s: max relative logit difference %.3g against one process, "
      "%.3g against HF's prefill\n",
      name.c_str(), group.rank(), group.size(),
      layout.moe_dispatch == MoeDispatch::gathered ? ", gathered MoE dispatch" : "",
      !layout.expert_parallel     ? ""
      : layout.experts_over_group ? ", experts split over the whole group"
                                  : ", experts split",
      layout.data_parallel_attention ? ", data-parallel attention"
      : layout.split_indexer         ? ", indexer split"
                                     : "",
      !layout.context_parallel ? ""
      : layout.context_parallel_size > 1
          ? fmt::format(", {} context shares of {} tensor ranks", layout.context_parallel_size,
                        group.size() / layout.context_parallel_size)
                .c_str()
          : ", context parallel",
      error, hf_error);
  return error <= 1e-5 && hf_error <= 1e-4;
}

TEST(TensorParallelModel, TwoRanksMatchOneProcess) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(
        2, [&](parallel::Communicator& group) { return matches_the_whole_model(name, group); });
}

TEST(TensorParallelModel, FourRanksMatchOneProcess) {
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_pattern", group);
  });
}

// Expert parallelism over tensor-parallel attention (each rank its experts,
// the sum over the group) and over data-parallel attention (every rank its
// own tokens, rows sent to their experts' ranks and back by all-to-all).
TEST(TensorParallelModel, ExpertParallelOverTensorParallelAttention) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_schedule", group, {true, false});
  });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("dsv32_yarn", group, {true, false});
  });
}

TEST(TensorParallelModel, ExpertParallelOverDataParallelAttention) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_schedule", group, {true, true});
  });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_pattern", group, {true, true});
  });
}

// Context parallelism: every rank the whole weights and cache, each its share
// of a prefill's rows (the prompt split across the group), the new latents and
// indexer keys gathered into every rank's cache; decode steps of one row run
// whole on every rank. 2 ranks on both architectures, 3 ranks (shares of
// unequal length) and 4.
TEST(TensorParallelModel, ContextParallelPrefillMatchesOneProcess) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(2, [&](parallel::Communicator& group) {
      return matches_the_whole_model(name, group, {false, false, true});
    });
  parallel::run_forked_group(3, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_pattern", group, {false, false, true});
  });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_schedule", group, {false, false, true});
  });
}

// Context parallelism over tensor parallelism: C shares of T ranks (the heads
// and MLP widths split within a share, the rows across the shares, every
// collective in its own split of the group); 2 x 2 on both architectures,
// 3 x 2 (shares of unequal length), and 2 x 2 with the routed experts sharded
// over each share's tensor-parallel ranks or over the whole group (each MoE
// layer gathers the shares' rows for them; a decode step too small to split
// runs whole on every share, the shared experts then added by one share).
TEST(TensorParallelModel, ContextParallelOverTensorParallelMatchesOneProcess) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(4, [&](parallel::Communicator& group) {
      return matches_the_whole_model(name, group, {false, false, true, 2});
    });
  parallel::run_forked_group(6, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_pattern", group, {false, false, true, 3});
  });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_schedule", group, {true, false, true, 2});
  });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_schedule", group,
                                   {.expert_parallel = true,
                                    .context_parallel = true,
                                    .context_parallel_size = 2,
                                    .experts_over_group = true});
  });
}

// Experts over the whole group is a layout of context shares of
// tensor-parallel ranks only: with tensor parallelism alone it is refused.
TEST(TensorParallelModel, ExpertsOverTheWholeGroupNeedContextShares) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    ModelLoadOptions options;
    options.group = &group;
    options.expert_parallel = true;
    options.experts_over_group = true;
    try {
      load_language_model(fixture_dir("glm_schedule"), options);
    } catch (const megactx::Error& error) {
      return std::string(error.what()).find("experts over the whole group") != std::string::npos;
    }
    return false;
  });
}

// The indexer's heads split over the tensor-parallel ranks (their partial
// scores summed by an all_reduce, the top-k taken from the sums): the same
// logits as the whole indexer's within fp32 rounding of the head sum's order,
// over 2 and 4 ranks, with the experts sharded, and over context shares of
// tensor ranks; with LayerSplit, data-parallel attention or context
// parallelism over the whole group it is refused.
TEST(TensorParallelModel, SplitIndexerMatchesOneProcess) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(2, [&](parallel::Communicator& group) {
      return matches_the_whole_model(name, group, {.split_indexer = true});
    });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_pattern", group, {.split_indexer = true});
  });
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_schedule", group,
                                   {.expert_parallel = true, .split_indexer = true});
  });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model(
        "glm_schedule", group,
        {.context_parallel = true, .context_parallel_size = 2, .split_indexer = true});
  });
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    int refused = 0;
    for (int variant = 0; variant < 3; ++variant) {
      ModelLoadOptions options;
      options.group = &group;
      options.split_indexer = true;
      options.layer_split = variant == 0;
      options.data_parallel_attention = options.expert_parallel = variant == 1;
      options.context_parallel = variant == 2;
      try {
        load_language_model(fixture_dir("glm_schedule"), options);
      } catch (const megactx::Error& error) {
        refused += std::string(error.what()).find("--split-indexer") != std::string::npos;
      }
    }
    return refused == 3;
  });
}

// Context parallelism with the routed experts sharded over the group: each
// rank's share of a prefill's rows goes to their experts' ranks and back by
// all-to-all; a decode step too small to split runs whole on every rank,
// each rank's copy of the row answered alike.
TEST(TensorParallelModel, ExpertParallelOverContextParallelPrefill) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(2, [&](parallel::Communicator& group) {
      return matches_the_whole_model(name, group, {true, false, true});
    });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_pattern", group, {true, false, true});
  });
}

// The same with the gathered MoE dispatch (model/expert_dispatch.h): every
// rank's share of a prefill padded to the longest and gathered by every
// rank; a decode row, whole on every rank, gathered from each.
TEST(TensorParallelModel, GatheredDispatchOverContextParallelPrefill) {
  Layout gathered{.expert_parallel = true, .context_parallel = true};
  gathered.moe_dispatch = MoeDispatch::gathered;
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(2, [&](parallel::Communicator& group) {
      return matches_the_whole_model(name, group, gathered);
    });
  parallel::run_forked_group(4, [&](parallel::Communicator& group) {
    return matches_the_whole_model("glm_pattern", group, gathered);
  });
}

// The routed experts a prefill returns under context parallelism (each rank
// records its share's rows, the group gathers them) are the single process's,
// row for row and layer for layer, and so are the final hidden states; a
// decode row (too small to split) too. With the experts sharded over the
// group as well, and over 3 ranks (shares of unequal length).
bool routed_experts_match_one_process(const std::string& name, parallel::Communicator& group,
                                      bool expert_parallel) {
  const HfFixture f = load_fixture(name);
  ModelLoadOptions options;
  options.group = &group;
  options.context_parallel = true;
  options.expert_parallel = expert_parallel;
  auto split = load_language_model(f.dir, options);
  auto whole = load_language_model(f.dir, {});
  const std::vector<int32_t> tokens(f.input_ids.begin(), f.input_ids.end());
  const KvCacheSpec spec =
      make_kv_cache_spec(whole->config(), 4, KvDType::F32, 64, /*with_mtp_layer=*/false);
  auto split_cache = split->make_kv_cache(spec);
  auto whole_cache = whole->make_kv_cache(spec);
  const std::vector<int32_t> pages = {2, 0, 3, 1};
  bool ok = true;
  int64_t position = 0;
  for (const int64_t count : {static_cast<int64_t>(tokens.size()) - 1, int64_t{1}}) {
    ForwardBatch batch;
    batch.want_hidden_states = batch.want_routed_experts = true;
    batch.sequences.push_back({std::span<const int32_t>(tokens).subspan(
                                   static_cast<size_t>(position), static_cast<size_t>(count)),
                               position, pages, -1});
    const ForwardOutput got = split->forward(batch, *split_cache);
    const ForwardOutput want = whole->forward(batch, *whole_cache);
    position += count;
    const bool shapes = got.routed_experts.shape() == want.routed_experts.shape() &&
                        got.hidden_states.shape() == want.hidden_states.shape();
    const bool routed =
        shapes && std::equal(want.routed_experts.data<int32_t>(),
                             want.routed_experts.data<int32_t>() + want.routed_experts.numel(),
                             got.routed_experts.data<int32_t>());
    // Some layer of every row routed somewhere (the fixture has MoE layers).
    const bool recorded =
        shapes && std::count(want.routed_experts.data<int32_t>(),
                             want.routed_experts.data<int32_t>() + want.routed_experts.numel(),
                             -1) < want.routed_experts.numel();
    const double hidden_error =
        shapes ? relative_error(got.hidden_states.data<float>(), want.hidden_states.data<float>(),
                                static_cast<size_t>(want.hidden_states.numel()))
               : 1.0;
    std::printf("%s, rank %d of %d%s, %lld rows: routed experts %s, hidden states %.3g\n",
                name.c_str(), group.rank(), group.size(), expert_parallel ? ", experts split" : "",
                static_cast<long long>(count), routed ? "equal" : "DIFFER", hidden_error);
    ok &= routed && recorded && hidden_error <= 1e-5;
  }
  return ok;
}

TEST(TensorParallelModel, ContextParallelPrefillReturnsTheRoutedExperts) {
  for (const bool expert_parallel : {false, true})
    parallel::run_forked_group(2, [&](parallel::Communicator& group) {
      return routed_experts_match_one_process("glm_schedule", group, expert_parallel);
    });
  parallel::run_forked_group(3, [](parallel::Communicator& group) {
    return routed_experts_match_one_process("dsv32_yarn", group, false);
  });
}

// ---- LayerSplit: each layer's caches on one rank of the tensor-parallel group ----

// A communicator that passes every call to `inner` and counts the bytes of
// the broadcasts; when `corrupt`, a rank that receives a broadcast adds 0.25
// to every normal float32 in it: latent entries of an f32 cache change, while
// int32 payloads (top-k positions and counts: small integers read as floats
// are zero, denormal or NaN) arrive intact, so the ranks stay in step and only
// the gathered entries are wrong.
class CorruptingCommunicator final : public parallel::Communicator {
 public:
  explicit CorruptingCommunicator(parallel::Communicator& inner, bool corrupt = true)
      : inner_(inner), corrupt_(corrupt) {}
  // A split of `parent`'s group (LayerSplit's entry group): the same
  // corruption, counted in the parent.
  CorruptingCommunicator(std::unique_ptr<parallel::Communicator> owned,
                         CorruptingCommunicator& parent)
      : owned_(std::move(owned)),
        inner_(*owned_),
        corrupt_(parent.corrupt_),
        counts_(parent.counts_) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void all_reduce(float* data, int64_t count, parallel::ReduceOp op) override {
    inner_.all_reduce(data, count, op);
  }
  void all_gather(const void* in, void* out, int64_t bytes) override {
    inner_.all_gather(in, out, bytes);
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    inner_.broadcast(data, bytes, root);
    counts_->broadcast_bytes += bytes;
    if (root == rank() || !corrupt_) return;
    auto* bytes_in = static_cast<unsigned char*>(data);
    for (int64_t at = 0; at + 4 <= bytes; at += 4) {
      float value;
      std::memcpy(&value, bytes_in + at, 4);
      if (!std::isnormal(value)) continue;
      value += 0.25f;
      std::memcpy(bytes_in + at, &value, 4);
      ++counts_->corrupted;
    }
  }
  void all_to_all(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                  const std::vector<int64_t>& recv_bytes) override {
    inner_.all_to_all(in, send_bytes, out, recv_bytes);
  }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<parallel::Communicator> split(int color, int key) override {
    return std::make_unique<CorruptingCommunicator>(inner_.split(color, key), *this);
  }
  int64_t corrupted() const { return counts_->corrupted; }
  int64_t broadcast_bytes() const { return counts_->broadcast_bytes; }

 private:
  struct Counts {
    std::atomic<int64_t> corrupted{0}, broadcast_bytes{0};
  };
  std::unique_ptr<parallel::Communicator> owned_;
  parallel::Communicator& inner_;
  bool corrupt_ = true;
  std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();
};

// One sequence then two through `model`'s own cache (16-token pages, in a
// shuffled order): sequence A's prompt as a chunked prefill (chunks of 24,
// every row's logits), then 8 decode steps; then B, a prefix-cache hit on
// A's first two pages (32 tokens: its page table starts with A's pages, its
// first forward starts at position 32) with 20 tokens of its own, batched
// with A's next decode step; then 4 decode steps of both. Every logit row,
// in order: [prompt + 8 + 1 + 20 + 8 rows, vocab]. `pools` gets the layers
// whose latent pool the cache has.
std::vector<float> layer_split_script(LanguageModel& model, const HfFixture& f, KvDType dtype,
                                      std::vector<int64_t>* pools = nullptr) {
  const ModelConfig& config = model.config();
  const auto cache = model.make_kv_cache(make_kv_cache_spec(config, 16, dtype, 16));
  if (pools != nullptr) {
    pools->clear();
    for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
      if (cache->has_latent(layer)) pools->push_back(layer);
  }
  const std::vector<int32_t> pages_a = {7, 2, 9, 4, 11, 0}, pages_b = {7, 2, 5, 13, 1};
  std::vector<float> out;
  const auto run = [&](ForwardBatch& batch) {
    const ForwardOutput output = model.forward(batch, *cache);
    out.insert(out.end(), output.logits.data<float>(),
               output.logits.data<float>() + output.logits.numel());
  };
  const std::vector<int32_t>& prompt = f.input_ids;  // 64 tokens
  const auto length = static_cast<int64_t>(prompt.size());
  for (int64_t begin = 0; begin < length; begin += 24) {
    ForwardBatch batch;
    SequenceInput in;
    in.tokens = std::span(prompt).subspan(
        static_cast<size_t>(begin), static_cast<size_t>(std::min<int64_t>(24, length - begin)));
    in.start_position = begin;
    in.page_table = pages_a;
    in.logits_from = 0;
    batch.sequences.push_back(in);
    run(batch);
  }
  int64_t position_a = length;
  std::vector<int32_t> tokens_a(f.greedy_ids);  // A's continuation
  for (int step = 0; step < 8; ++step) {
    ForwardBatch batch;
    batch.sequences.push_back({std::span(tokens_a).subspan(step, 1), position_a++, pages_a, -1});
    run(batch);
  }
  // B: A's first 32 tokens (cached), then 20 tokens of its own.
  std::vector<int32_t> suffix_b(prompt.rbegin(), prompt.rbegin() + 20);
  ForwardBatch mixed;
  mixed.sequences.push_back({std::span(tokens_a).subspan(8, 1), position_a++, pages_a, -1});
  mixed.sequences.push_back({suffix_b, 32, pages_b, 0});
  run(mixed);
  int64_t position_b = 52;
  for (int step = 0; step < 4; ++step) {
    ForwardBatch batch;
    batch.sequences.push_back(
        {std::span(tokens_a).subspan(9 + step, 1), position_a++, pages_a, -1});
    batch.sequences.push_back({std::span(prompt).subspan(step, 1), position_b++, pages_b, -1});
    run(batch);
  }
  return out;
}

// LayerSplit's logits (the model on `split_group`: `group` or a wrapper of
// it) against the replicated tensor-parallel run on the same group (the same
// sums: equal within 1e-6 in every cache dtype) and, with an f32 cache,
// against one process and HF's prefill rows; and this rank's pools: exactly
// the layers the plan gives it. False on any difference.
struct LayerSplitCase {
  const char* name = "glm_schedule";
  KvDType dtype = KvDType::F32;
  bool expert_parallel = false;
  // > 1: the group is this many context shares of tensor-parallel ranks,
  // each share's caches split over its ranks.
  int context_parallel_size = 0;
};

bool f32_cache(const LayerSplitCase& c) {
  return c.dtype == KvDType::F32;
}

bool layer_split_matches(const LayerSplitCase& c, parallel::Communicator& group,
                         parallel::Communicator& split_group) {
  const HfFixture f = load_fixture(c.name);
  ModelLoadOptions options;
  options.group = &group;
  options.expert_parallel = c.expert_parallel;
  options.context_parallel = c.context_parallel_size > 1;
  options.context_parallel_size = c.context_parallel_size;
  const std::vector<float> replicated =
      layer_split_script(*load_language_model(f.dir, options), f, c.dtype);
  const std::vector<float> whole = layer_split_script(*load_language_model(f.dir, {}), f, c.dtype);
  options.group = &split_group;
  options.layer_split = true;
  auto model = load_language_model(f.dir, options);
  std::vector<int64_t> pools;
  const std::vector<float> split = layer_split_script(*model, f, c.dtype, &pools);
  const ModelPlan& plan = static_cast<const DsaModel&>(*model).plan();
  // Its pools and its kv_a (and indexer) weights: its own layers' only.
  std::vector<int64_t> owned, weighted;
  for (int64_t layer = 0; layer < model->config().num_hidden_layers; ++layer) {
    if (plan.kv_owner_of(layer) == plan.tensor_parallel_rank) owned.push_back(layer);
    if (static_cast<const DsaModel&>(*model).weights().layers[layer].attention.kv_a.defined())
      weighted.push_back(layer);
  }
  if (pools != owned || weighted != owned || split.size() != whole.size() ||
      split.size() != replicated.size()) {
    std::printf("%s, rank %d: %zu pools for %zu owned layers\n", c.name, group.rank(), pools.size(),
                owned.size());
    return false;
  }
  const double error = relative_error(split.data(), replicated.data(), replicated.size());
  const double whole_error = relative_error(split.data(), whole.data(), whole.size());
  // HF's prefill rows with an f32 cache only (bf16 and fp8 entries round).
  const double hf_error =
      f32_cache(c) ? relative_error(split.data(), f.prefill_logits.data(), f.prefill_logits.size())
                   : 0.0;
  std::string layers;
  for (const int64_t layer : owned) layers += " " + std::to_string(layer);
  // Entries go ahead of their layer (DsaModel::prefetched_entries): a layer
  // that shares the one before it's selection (IndexShare) gets its selected
  // old entries, and the script's later prefill chunks stream every layer's
  // old context ahead. Under context shares a prefill chunk's rows are split
  // (nothing ahead), so dsv32_yarn (an indexer on every layer, so nothing
  // ahead at decode either) gets none there.
  const auto& dsa = static_cast<const DsaModel&>(*model);
  bool any_shared = false;
  for (int64_t layer = 1; layer < model->config().num_hidden_layers; ++layer)
    any_shared = any_shared || !dsa.weights().layers[layer].attention.has_indexer;
  const int64_t prefetched = dsa.prefetched_entries();
  const bool prefetch_ok =
      c.context_parallel_size > 1 && !any_shared ? prefetched == 0 : prefetched > 0;
  const bool f32 = f32_cache(c);
  const char* dtype = f32 ? "f32" : c.dtype == KvDType::BF16 ? "bf16" : "fp8";
  const std::string hf = f32 ? fmt::format(", {:.3g} against HF's prefill", hf_error) : "";
  std::printf(
      "%s, LayerSplit rank %d of %d%s%s, %s cache, layers%s: max relative logit difference "
      "%.3g against the replicated group, %.3g against one process%s; %lld entries sent ahead\n",
      c.name, group.rank(), group.size(), c.expert_parallel ? ", experts split" : "",
      c.context_parallel_size > 1
          ? fmt::format(", {} context shares", c.context_parallel_size).c_str()
          : "",
      dtype, layers.c_str(), error, whole_error, hf.c_str(), static_cast<long long>(prefetched));
  return prefetch_ok && error <= 1e-6 && (!f32 || (whole_error <= 1e-5 && hf_error <= 1e-4));
}

TEST(TensorParallelModel, LayerSplitOwnersBalanceThePools) {
  // The default model's IndexShare schedule (full layers 0, 1, 2, 6): layer %
  // 2 would give rank 0 three of the four indexer pools.
  const ModelConfig config = load_model_config(std::string(MEGACTX_SOURCE_DIR) + "/models/default");
  const ModelPlan plan = plan_model(config);
  EXPECT_EQ(layer_split_owners(plan.layers, plan.attention, 2),
            (std::vector<int>{0, 1, 0, 0, 1, 0, 1, 1}));
  // glm_schedule's (the same schedule) over 4 ranks: one full and one shared layer each.
  EXPECT_EQ(layer_split_owners(plan.layers, plan.attention, 4),
            (std::vector<int>{0, 1, 2, 0, 1, 2, 3, 3}));
  // Every layer alike (DeepSeek-V3.2): layer % size.
  const ModelPlan dsv32 = plan_model(load_model_config(fixture_dir("dsv32_yarn")));
  EXPECT_EQ(layer_split_owners(dsv32.layers, dsv32.attention, 3), (std::vector<int>{0, 1, 2, 0}));
  // Each rank's pools: its layers' and the MTP layer's.
  ModelPlan split = plan;
  split.layer_split = true;
  split.kv_owner = layer_split_owners(plan.layers, plan.attention, 2);
  const KvCacheSpec whole = make_kv_cache_spec(config, 4, KvDType::FP8, 64, true);
  const KvCacheSpec rank1 = layer_split_spec(split, whole, 1);
  EXPECT_EQ(rank1.latent_layers, (std::vector<int64_t>{1, 4, 6, 7, 8}));
  EXPECT_EQ(rank1.indexer_layers, (std::vector<int64_t>{1, 6, 8}));
  EXPECT_EQ(layer_split_spec(plan, whole, 1).latent_layers, whole.latent_layers);
}

// Prefill in chunks, decode, a prefix-cache hit batched with a decode step:
// the logits of one process within fp32 rounding, on both architectures, 2
// and 4 ranks, f32 (and HF's prefill), bf16 and fp8 caches (the entries
// travel in the cache's dtype), and with the experts split too.
TEST(TensorParallelModel, LayerSplitMatchesOneProcess) {
  const auto run = [](int size, const LayerSplitCase& c) {
    parallel::run_forked_group(
        size, [&](parallel::Communicator& group) { return layer_split_matches(c, group, group); });
  };
  run(2, {"glm_schedule"});
  run(2, {"dsv32_yarn"});
  run(2, {"glm_schedule", KvDType::FP8, true});
  run(4, {"glm_pattern"});
  run(4, {"glm_schedule", KvDType::BF16, true});
  // Over context shares of tensor-parallel ranks: each share's caches split
  // over its ranks, the owners' new rows gathered across the shares.
  run(4, {"glm_schedule", KvDType::F32, false, 2});
  run(4, {"dsv32_yarn", KvDType::FP8, false, 2});
  run(6, {"glm_pattern", KvDType::F32, false, 3});
}

// The same parity check catches a broken broadcast of the gathered entries
// (every received latent entry off by 0.25 on each rank that is not its
// layer's owner).
TEST(TensorParallelModel, LayerSplitCatchesABrokenBroadcast) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    CorruptingCommunicator corrupting(group);
    const bool matches = layer_split_matches({"glm_schedule"}, group, corrupting);
    std::printf("rank %d: %lld floats corrupted, %s\n", group.rank(),
                static_cast<long long>(corrupting.corrupted()), matches ? "not caught" : "caught");
    return corrupting.corrupted() > 0 && !matches;
  });
}

// What travels: a decode row (context 65, top-k 16) gets its 16 selected
// entries on each of glm_schedule's 8 layers (16 x 160 B in f32) and the
// selection ((16 + 1) x 4 B) on each of its 4 layers with an indexer:
// 20,752 B per step; the replicated group broadcasts nothing.
TEST(TensorParallelModel, LayerSplitSendsTheSelectedEntries) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    const HfFixture f = load_fixture("glm_schedule");
    const auto bytes_of_a_decode_step = [&](bool layer_split) {
      CorruptingCommunicator counting(group, /*corrupt=*/false);
      ModelLoadOptions options;
      options.group = &counting;
      options.layer_split = layer_split;
      auto model = load_language_model(f.dir, options);
      SequenceRunner runner(*model, KvDType::F32, 128);
      runner.feed(f.input_ids, false);
      const int64_t prefill = counting.broadcast_bytes();
      const int32_t token[1] = {f.greedy_ids[0]};
      runner.feed(token, false);
      std::printf("rank %d%s: %lld B broadcast by the 64-token prefill, %lld B by a decode step\n",
                  group.rank(), layer_split ? ", LayerSplit" : "", static_cast<long long>(prefill),
                  static_cast<long long>(counting.broadcast_bytes() - prefill));
      return counting.broadcast_bytes() - prefill;
    };
    return bytes_of_a_decode_step(true) == 8 * 16 * 160 + 4 * 17 * 4 &&
           bytes_of_a_decode_step(false) == 0;
  });
}

TEST(TensorParallelModel, LayerSplitCombinationsAreErrors) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    int refused = 0;
    for (const bool context : {true, false}) {
      ModelLoadOptions options;
      options.group = &group;
      options.layer_split = true;
      options.context_parallel = context;
      options.expert_parallel = options.data_parallel_attention = !context;
      try {
        load_language_model(fixture_dir("glm_schedule"), options);
      } catch (const megactx::Error& error) {
        refused += std::string(error.what()).find("--enable-layer-split") != std::string::npos;
      }
    }
    return refused == 2;
  });
}

TEST(TensorParallelModel, ShapesThatDoNotDivideAreErrors) {
  // glm_fp8 has 2 heads: a group of 4 cannot split them.
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    ModelLoadOptions options;
    options.group = &group;
    try {
      load_language_model(fixture_dir("glm_fp8"), options);
    } catch (const megactx::Error& error) {
      return std::string(error.what()).find("heads") != std::string::npos;
    }
    return false;
  });
  // glm_schedule's 8 routed experts over a context-parallel group of 3.
  parallel::run_forked_group(3, [](parallel::Communicator& group) {
    ModelLoadOptions options;
    options.group = &group;
    options.context_parallel = options.expert_parallel = true;
    try {
      load_language_model(fixture_dir("glm_schedule"), options);
    } catch (const megactx::Error& error) {
      return std::string(error.what()).find("routed experts do not divide") != std::string::npos;
    }
    return false;
  });
}

// On GPUs the CUDA model runs tensor parallelism (with LayerSplit), expert
// parallelism over it, data-parallel attention (with LayerSplit inside
// replicas of tensor ranks) and context parallelism only
// (tests/cuda_parallel/cuda_model_group_test.cpp): the other layouts are
// refused before anything loads, on any machine.
TEST(TensorParallelModel, CudaRefusesTheLayoutsItDoesNotRunYet) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    for (int layout = 0; layout < 3; ++layout) {
      ModelLoadOptions options;
      options.group = &group;
      options.device = Device::CUDA;
      // 0: the experts over every context share's ranks (one share of both
      // ranks here); 1: LayerSplit with context parallelism over both ranks;
      // 2: the split indexer.
      options.context_parallel = layout <= 1;
      options.context_parallel_size = layout == 0 ? 1 : 0;
      options.experts_over_group = layout == 0;
      options.layer_split = layout == 1;
      options.expert_parallel = layout == 0;
      options.split_indexer = layout == 2;
      try {
        load_language_model(fixture_dir("glm_schedule"), options);
        return false;
      } catch (const megactx::Error& error) {
        if (std::string(error.what()).find("only tensor parallelism") == std::string::npos)
          return false;
      }
    }
    return true;
  });
}

// Every rank runs the same checks on its share (the collectives inside the
// MTP layer's decoder layer then match), against the PyTorch goldens; a
// child's failed expectation makes it exit 1.
bool mtp_matches_reference(const std::string& name, parallel::Communicator& group,
                           bool expert_parallel) {
  const std::string dir = mtp_fixture(name);
  ModelLoadOptions options;
  options.group = &group;
  options.expert_parallel = expert_parallel;
  auto model = load_language_model(dir, options);
  const auto mtp = model->load_mtp_layer(dir);
  const auto fresh_cache = [&] {
    return std::make_unique<PagedKvCache>(
        make_kv_cache_spec(model->config(), 4, KvDType::F32, 64, /*with_mtp_layer=*/true));
  };
  check_mtp_goldens(dir, *mtp, fresh_cache);
  check_greedy_draft_chain(dir, *mtp, fresh_cache);
  std::printf(
      "%s MTP layer, rank %d of %d%s: %s\n", name.c_str(), group.rank(), group.size(),
      expert_parallel ? ", experts split" : "",
      ::testing::Test::HasFailure() ? "differs from the reference" : "matches the reference");
  return !::testing::Test::HasFailure();
}

TEST(TensorParallelModel, MtpLayerMatchesTheReference) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(2, [&](parallel::Communicator& group) {
      return mtp_matches_reference(name, group, false);
    });
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    return mtp_matches_reference("glm_schedule", group, true);
  });
}

}  // namespace
}  // namespace megactx::testing
