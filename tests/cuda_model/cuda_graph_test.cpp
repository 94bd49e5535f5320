// CUDA-graph decode (model/cuda/decode_graph.h) against the same weights
// launching every kernel one by one (cuda_graphs = false), each over its own
// device cache, fed the same tokens step by step:
//  * batches that are exactly a bucket (no padding rows): logits and the KV
//    pools bit-identical -- the replay runs the same kernels with the same
//    shapes in the same order as the eager step;
//  * any batch size (padded to its bucket), sequences joining and leaving,
//    contexts of different lengths crossing the context buckets (256, 512,
//    1024), MTP-verification-shaped steps (3 tokens per sequence, every
//    row's logits, hidden states; dense selection, see run_scenario):
//    logits within 1e-5 relative (padding changes the GEMMs' row count, so
//    cuBLAS may pick another kernel; the share of bit-identical rows is
//    printed), and every KV slot no real position owns still zero (padding
//    rows wrote nothing);
//  * dense-only and MoE (device dispatch) models, F32 and FP8 caches;
//  * graphs really replay (counters), and are not used when off, past the
//    largest bucket, with host-dispatched MoE layers, or with the phase timer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../model/hf_fixture.h"
#include "model/cuda/cuda_model.h"
#include "model/dsa_model.h"
#include "model/model_loader.h"

namespace megactx::testing {
namespace {

// glm_schedule's shapes (hidden 32, kv_lora 32, rope 8) with room for 4096
// positions, 4 layers (full, shared, full, shared indexers), MoE from
// `first_dense` on, and `index_topk` (16: any context past 16 tokens is
// sparse; 2048: every visible position is selected).
std::string write_config(const std::string& name, int64_t first_dense, int64_t index_topk) {
  std::ifstream in(fixture_dir("glm_schedule") + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["max_position_embeddings"] = 4096;
  config["num_hidden_layers"] = 4;
  config["first_k_dense_replace"] = first_dense;
  config["indexer_types"] = {"full", "shared", "full", "shared"};
  config["index_topk"] = index_topk;
  // A model directory holding only config.json (the weights are random).
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("megactx_cuda_graph_test_" + name + "_" +
                                     std::to_string(index_topk));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  return dir.string();
}

struct ModelPair {
  std::unique_ptr<LanguageModel> graphed, eager;
};

ModelPair make_models(const std::string& config_path, CudaModelOptions options) {
  ModelLoadOptions load;
  load.random_weights = true;
  load.seed = 11;
  auto host = load_language_model(config_path, load);
  const auto& dsa = static_cast<const DsaModel&>(*host);
  ModelPair pair;
  options.cuda_graphs = true;
  pair.graphed = make_cuda_dsa_model(dsa, options);
  options.cuda_graphs = false;
  pair.eager = make_cuda_dsa_model(dsa, options);
  return pair;
}

// The bytes of a device pool.
std::vector<uint8_t> pool_bytes(const Tensor& pool) {
  std::vector<uint8_t> bytes(pool.nbytes());
  EXPECT_EQ(cudaMemcpy(bytes.data(), pool.raw(), bytes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return bytes;
}

struct Sequence {
  std::vector<int32_t> pages;  // its own pages, never shared or reused
  int64_t length = 0;          // tokens in the cache
};

// Drives both models over their own caches with identical batches and
// records how their outputs compare.
class Lockstep {
 public:
  Lockstep(ModelPair pair, KvDType dtype, int64_t pages) : pair_(std::move(pair)), rng_(5) {
    const KvCacheSpec spec = make_kv_cache_spec(pair_.graphed->config(), pages, dtype);
    graphed_cache_ = make_cuda_kv_cache(spec);
    eager_cache_ = make_cuda_kv_cache(spec);
    for (int64_t p = pages - 1; p >= 0; --p) free_pages_.push_back(static_cast<int32_t>(p));
    std::shuffle(free_pages_.begin(), free_pages_.end(), rng_);
  }

  LanguageModel& graphed() { return *pair_.graphed; }
  int64_t vocab() const { return pair_.graphed->config().vocab_size; }

  // A new sequence of `prompt` random tokens, prefilled (one forward), with
  // pages for `capacity` tokens.
  int64_t join(int64_t prompt, int64_t capacity) {
    Sequence s;
    const int64_t pages = (capacity + 63) / 64;
    EXPECT_LE(pages, static_cast<int64_t>(free_pages_.size())) << "test cache too small";
    for (int64_t p = 0; p < pages; ++p) {
      s.pages.push_back(free_pages_.back());
      free_pages_.pop_back();
    }
    sequences_.push_back(s);
    const int64_t id = static_cast<int64_t>(sequences_.size()) - 1;
    step({id}, prompt, /*all_logits=*/false, /*hidden=*/false);
    return id;
  }

  // One forward of `per_sequence` new random tokens for each of `ids`.
  void step(const std::vector<int64_t>& ids, int64_t per_sequence, bool all_logits, bool hidden) {
    std::vector<std::vector<int32_t>> tokens(ids.size());
    std::uniform_int_distribution<int32_t> token(2, static_cast<int32_t>(vocab() - 1));
    ForwardBatch batch;
    batch.want_hidden_states = hidden;
    for (size_t i = 0; i < ids.size(); ++i) {
      Sequence& s = sequences_[static_cast<size_t>(ids[i])];
      for (int64_t t = 0; t < per_sequence; ++t) tokens[i].push_back(token(rng_));
      batch.sequences.push_back({tokens[i], s.length, s.pages, all_logits ? 0 : -1});
    }
    const ForwardOutput a = pair_.graphed->forward(batch, *graphed_cache_);
    const ForwardOutput b = pair_.eager->forward(batch, *eager_cache_);
    for (size_t i = 0; i < ids.size(); ++i)
      sequences_[static_cast<size_t>(ids[i])].length += per_sequence;
    compare(to_host(a.logits), to_host(b.logits), static_cast<int64_t>(ids.size()));
    if (hidden) compare_hidden(a.hidden_states, b.hidden_states);
  }

  void compare(const Tensor& a, const Tensor& b, int64_t batch) {
    ASSERT_EQ(a.numel(), b.numel()) << "step " << steps_;
    const int64_t rows = a.numel() / vocab();
    const float* x = a.data<float>();
    const float* y = b.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const bool same = std::memcmp(x + r * vocab(), y + r * vocab(), vocab() * 4) == 0;
      identical_rows_ += same;
      if (!same && first_difference_ < 0) first_difference_ = steps_;
      agree_ += argmax(x + r * vocab(), vocab()) == argmax(y + r * vocab(), vocab());
    }
    rows_ += rows;
    max_error_ = std::max(max_error_, relative_error(x, y, static_cast<size_t>(a.numel())));
    ++steps_;
    batch_sizes_[batch] += 1;
  }

  void compare_hidden(const Tensor& a, const Tensor& b) {
    ASSERT_EQ(a.numel(), b.numel());
    hidden_error_ = std::max(hidden_error_, relative_error(a.data<float>(), b.data<float>(),
                                                           static_cast<size_t>(a.numel())));
    hidden_identical_ &= std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  }

  // Pools of both caches: `identical` asks for equal bytes everywhere;
  // otherwise every slot no real position owns must still be zero in both
  // (the pools start zeroed), and owned F32 entries within `tolerance`.
  void check_pools(bool identical, double tolerance) {
    const KvCacheSpec& spec = graphed_cache_->spec();
    std::vector<bool> owned(static_cast<size_t>(spec.num_pages * spec.page_size), false);
    for (const Sequence& s : sequences_) {
      for (int64_t p = 0; p < s.length; ++p) {
        owned[static_cast<size_t>(s.pages[static_cast<size_t>(p / 64)] * 64 + p % 64)] = true;
      }
    }
    const ModelConfig& config = pair_.graphed->config();
    for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
      for (int which = 0; which < 2; ++which) {
        if (which == 1 && !graphed_cache_->has_indexer(layer)) continue;
        const Tensor& a =
            which == 0 ? graphed_cache_->latent_pool(layer) : graphed_cache_->indexer_pool(layer);
        const Tensor& b =
            which == 0 ? eager_cache_->latent_pool(layer) : eager_cache_->indexer_pool(layer);
        const std::vector<uint8_t> x = pool_bytes(a), y = pool_bytes(b);
        const std::string where = std::string(which == 0 ? "latent" : "indexer") +
                                  " pool of layer " + std::to_string(layer);
        ASSERT_EQ(x.size(), y.size()) << where;
        const size_t entry = x.size() / owned.size();
        if (identical) {
          size_t differing = 0;
          for (size_t i = 0; i < x.size(); ++i) differing += x[i] != y[i];
          EXPECT_EQ(differing, 0u) << where << ": bytes differ between graph and eager decode";
        }
        size_t stray = 0, owned_count = 0;
        double diff = 0.0, scale = 0.0;
        for (size_t slot = 0; slot < owned.size(); ++slot) {
          const uint8_t* ex = x.data() + slot * entry;
          const uint8_t* ey = y.data() + slot * entry;
          if (!owned[slot]) {
            for (size_t i = 0; i < entry; ++i) stray += (ex[i] != 0) + (ey[i] != 0);
            continue;
          }
          ++owned_count;
          if (spec.dtype != KvDType::F32) continue;
          for (size_t i = 0; i < entry / 4; ++i) {
            float u, v;
            std::memcpy(&u, ex + 4 * i, 4);
            std::memcpy(&v, ey + 4 * i, 4);
            diff = std::max(diff, std::fabs(static_cast<double>(u) - v));
            scale = std::max(scale, std::fabs(static_cast<double>(v)));
          }
        }
        EXPECT_EQ(stray, 0u) << where << ": " << stray
                             << " non-zero bytes in slots no real position owns (a padding row "
                                "wrote into the cache)";
        EXPECT_GT(owned_count, 0u) << where;
        if (spec.dtype == KvDType::F32 && scale > 0.0) {
          EXPECT_LE(diff / scale, tolerance) << where << ": owned entries differ";
        }
      }
    }
  }

  void report(const char* name) const {
    const CudaGraphStats g = cuda_graph_stats(*pair_.graphed);
    std::string sizes;
    for (const auto& [size, count] : batch_sizes_) sizes += " " + std::to_string(size);
    std::printf(
        "%s: %lld forwards (batch sizes%s), %lld logits rows: %lld bit-identical (first "
        "difference at forward %lld), argmax agreement %lld/%lld, max relative error %.3g, "
        "hidden states error %.3g; graphs: %lld captures, %lld replays, %lld eager bucketed "
        "steps, %lld invalidations, %lld failed captures, %lld held\n",
        name, static_cast<long long>(steps_), sizes.c_str(), static_cast<long long>(rows_),
        static_cast<long long>(identical_rows_), static_cast<long long>(first_difference_),
        static_cast<long long>(agree_), static_cast<long long>(rows_), max_error_, hidden_error_,
        static_cast<long long>(g.captures), static_cast<long long>(g.replays),
        static_cast<long long>(g.eager_steps), static_cast<long long>(g.invalidations),
        static_cast<long long>(g.failed_captures), static_cast<long long>(g.cached));
  }

  int64_t sequences() const { return static_cast<int64_t>(sequences_.size()); }
  const Sequence& sequence(int64_t id) const { return sequences_[static_cast<size_t>(id)]; }
  int64_t rows() const { return rows_; }
  int64_t identical_rows() const { return identical_rows_; }
  double max_error() const { return max_error_; }
  double hidden_error() const { return hidden_error_; }
  bool hidden_identical() const { return hidden_identical_; }

 private:
  ModelPair pair_;
  std::mt19937 rng_;
  std::vector<int32_t> free_pages_;
  std::unique_ptr<PagedKvCache> graphed_cache_, eager_cache_;
  std::vector<Sequence> sequences_;
  int64_t steps_ = 0, rows_ = 0, identical_rows_ = 0, agree_ = 0, first_difference_ = -1;
  double max_error_ = 0.0, hidden_error_ = 0.0;
  bool hidden_identical_ = true;
  std::map<int64_t, int64_t> batch_sizes_;
};

TEST(CudaGraphs, BucketSizedBatchesAreBitIdentical) {
  // Batches of exactly 1, 2, 4, 8, 16 and 24 sequences: no padding row, so
  // a replay runs the same launches as the eager step. Prompts of 240..263
  // tokens decode across the 256 context bucket.
  CudaModelOptions options;
  Lockstep run(make_models(write_config("dense", 4, 16), options), KvDType::F32, 24 * 6);
  std::vector<int64_t> active;
  for (int64_t size : {1, 2, 4, 8, 16, 24}) {
    while (static_cast<int64_t>(active.size()) < size) {
      active.push_back(run.join(240 + static_cast<int64_t>(active.size()), 360));
    }
    for (int step = 0; step < 6; ++step) run.step(active, 1, false, false);
  }
  run.report("bucket-sized batches, dense, F32 KV");
  const CudaGraphStats g = cuda_graph_stats(run.graphed());
  EXPECT_GT(g.replays, 0) << "no decode step replayed a graph";
  EXPECT_EQ(g.failed_captures, 0);
  EXPECT_EQ(run.identical_rows(), run.rows())
      << "graph replay changed logits (max relative error " << run.max_error() << ")";
  run.check_pools(/*identical=*/true, 0.0);
}

// The general scenario: batch sizes that are not buckets, joins and leaves,
// prompts of different lengths crossing the 256 / 512 / 1024 context
// buckets, short prompts (graph-shaped prefills of up to 8 tokens) and
// MTP-verification-shaped steps. Dense selection (index_topk 2048 >= every
// context): should padding change a GEMM's last bits, a sparse top-k could
// swap a near-tied key and the two runs would diverge for a reason that is
// not the graphs' (BucketSizedBatchesAreBitIdentical covers sparse
// selection, bit for bit).
void run_scenario(const char* name, const std::string& config, KvDType dtype, double tolerance,
                  bool logits_on_device) {
  CudaModelOptions options;
  options.logits_on_device = logits_on_device;
  Lockstep run(make_models(config, options), dtype, 48 * 20);
  const std::vector<int64_t> prompts = {3, 250, 17,  500, 90,   1000, 5, 255, 505, 130,
                                        7, 600, 240, 40,  1010, 300,  2, 511, 64,  700};
  const std::vector<int64_t> targets = {1,  2,  3,  3,  5,  6,  9,  12, 17, 20, 25, 31,
                                        33, 40, 40, 37, 30, 24, 18, 9,  5,  3,  2,  1};
  std::vector<int64_t> active;
  int64_t joined = 0;
  int forward = 0;
  for (int64_t target : targets) {
    while (static_cast<int64_t>(active.size()) < target) {
      const int64_t prompt = prompts[static_cast<size_t>(joined++ % prompts.size())];
      active.push_back(run.join(prompt, prompt + 200));
    }
    // Leaving: every other sequence from the front, so the survivors' order
    // (and their page tables' offsets in the packed block) changes.
    for (size_t i = 0; static_cast<int64_t>(active.size()) > target; ++i) {
      active.erase(active.begin() + static_cast<int64_t>(i % active.size()));
    }
    for (int step = 0; step < 4; ++step, ++forward) {
      if (forward % 5 == 4) {
        run.step(active, 3, /*all_logits=*/true, /*hidden=*/true);  // MTP verification shape
      } else {
        run.step(active, 1, false, forward % 7 == 0);
      }
    }
  }
  run.report(name);
  const CudaGraphStats g = cuda_graph_stats(run.graphed());
  EXPECT_GT(g.replays, 0) << name << ": no step replayed a graph";
  EXPECT_GT(g.captures, 8) << name << ": batch, context and shape buckets should give many keys";
  EXPECT_EQ(g.failed_captures, 0) << name << ": a decode step could not be captured";
  EXPECT_GT(g.invalidations, 0)
      << name << ": long prompts joining mid-run grow the scratch; graphs must be re-captured";
  EXPECT_LE(run.max_error(), tolerance) << name;
  EXPECT_LE(run.hidden_error(), tolerance) << name;
  run.check_pools(/*identical=*/false, tolerance);
}

TEST(CudaGraphs, PaddedBucketsMatchEagerDense) {
  run_scenario("dense, F32 KV, logits on the device", write_config("dense", 4, 2048), KvDType::F32,
               1e-5, true);
}

TEST(CudaGraphs, PaddedBucketsMatchEagerMoe) {
  // Layers 1-3 MoE on the grouped device dispatch (capturable up to 128 rows).
  run_scenario("MoE, F32 KV", write_config("moe", 1, 2048), KvDType::F32, 1e-5, false);
}

TEST(CudaGraphs, PaddedBucketsMatchEagerFp8Cache) {
  // An FP8 cache amplifies a last-bit difference of a GEMM into a flipped
  // e4m3 rounding, hence the quantized-cache tolerance of cuda_model_test.
  run_scenario("dense, FP8 KV", write_config("dense", 4, 2048), KvDType::FP8, 2e-2, false);
}

TEST(CudaGraphs, NotUsedPastTheLargestBucketWithHostMoeOrTimed) {
  const std::string config = write_config("dense", 4, 16);
  CudaModelOptions options;
  options.cuda_graph_max_batch = 4;
  Lockstep run(make_models(config, options), KvDType::F32, 64);
  std::vector<int64_t> active;
  for (int i = 0; i < 5; ++i) active.push_back(run.join(20 + i, 100));
  run.step(active, 1, false, false);  // 5 sequences > the largest bucket (4)
  run.step(active, 1, false, false);
  EXPECT_EQ(cuda_graph_stats(run.graphed()).replays + cuda_graph_stats(run.graphed()).eager_steps,
            0)
      << "a batch past cuda_graph_max_batch took the graph path";
  active.pop_back();
  run.step(active, 1, false, false);  // 4: eager once, then captured
  run.step(active, 1, false, false);  // replayed
  EXPECT_EQ(cuda_graph_stats(run.graphed()).replays, 1);
  EXPECT_EQ(run.identical_rows(), run.rows());

  // MoE layers on the host dispatch (device_moe off) read expert ids back:
  // such steps are not capturable and run eagerly.
  CudaModelOptions host_moe;
  host_moe.device_moe = false;
  Lockstep moe(make_models(write_config("moe", 1, 16), host_moe), KvDType::F32, 16);
  std::vector<int64_t> moe_active;
  for (int i = 0; i < 3; ++i) moe_active.push_back(moe.join(30 + i, 100));
  for (int step = 0; step < 3; ++step) moe.step(moe_active, 1, false, false);
  const CudaGraphStats host = cuda_graph_stats(moe.graphed());
  EXPECT_EQ(host.replays + host.eager_steps + host.captures + host.failed_captures, 0)
      << "a step with host-dispatched MoE layers took the graph path";
  EXPECT_EQ(moe.identical_rows(), moe.rows());

  // The phase timer (read at construction) turns graphs off.
  ::setenv("MEGACTX_CUDA_PHASE_TIMES", "1", 1);
  ModelPair timed = make_models(config, CudaModelOptions{});
  ::unsetenv("MEGACTX_CUDA_PHASE_TIMES");
  auto cache = make_cuda_kv_cache(make_kv_cache_spec(timed.graphed->config(), 2, KvDType::F32));
  const std::vector<int32_t> pages = {1, 0};
  std::vector<int32_t> token = {5};
  for (int64_t position = 0; position < 4; ++position) {
    ForwardBatch batch;
    batch.sequences.push_back({token, position, pages, -1});
    timed.graphed->forward(batch, *cache);
  }
  const CudaGraphStats g = cuda_graph_stats(*timed.graphed);
  EXPECT_EQ(g.replays + g.eager_steps + g.captures, 0) << "graphs used with the phase timer on";
  EXPECT_EQ(cuda_graph_stats(*timed.eager).captures, 0);
}

}  // namespace
}  // namespace megactx::testing
