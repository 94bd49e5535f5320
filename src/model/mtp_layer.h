// MtpLayer: the multi-token-prediction layer `model.layers.{L}.*` (L =
// num_hidden_layers) of a glm_moe_dsa / deepseek_v32 checkpoint, run on the
// target DsaModel's backend and KV cache (cache layer L):
//
//   x   = eh_proj(cat[enorm(embed(token_{t+1})), hnorm(h_t)])      [rows, H]
//   x   = decoder layer L (MLA + its own indexer + MLP/MoE)       [rows, H]
//   out = shared_head.norm(x); logits = lm_head(out)              [rows, V]
//
// Row t (position t) reads token_{t+1} and the target's hidden state h_t
// *after* model.norm, and predicts token_{t+2}.
//
// Step 0 ("refill"): rows of accepted positions write the MTP layer's latent
// and indexer-key cache entries and run its indexer. Steps j >= 1 ("draft"):
// one row per sequence at position t + j whose hidden input is the previous
// step's hand-off; with sharing (IndexShare + KVShare) the row writes nothing
// and attends over step 0's cache entries [0, t] through step 0's top-k of
// row t; without sharing it writes its own entry at t + j and runs the
// indexer (those entries are overwritten by the next refill).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/dsa_model.h"

namespace megactx {

// What a draft step passes as `h` to the next step.
//  * NormedOutput (GLM): shared_head.norm(x). SGLang's nextn models
//    (deepseek_nextn / glm4_moe_nextn) return the shared_head.norm-ed state
//    and the EAGLE worker chains it; the project's default model is trained
//    that way (tools/train/model.py mtp_forward).
//  * RawOutput (DeepSeek): the decoder layer's output x before
//    shared_head.norm, as vLLM's deepseek_mtp chains it (its compute_logits
//    applies shared_head itself).
enum class MtpHandOff : uint8_t { NormedOutput, RawOutput };

struct MtpWeights {
  Tensor enorm;      // [H]
  Tensor hnorm;      // [H]
  Tensor eh_proj;    // [H, 2H]: input is [enorm(embed) | hnorm(h)]
  Tensor head_norm;  // [H] shared_head.norm
  Tensor embed;      // [V, H] own copy (DeepSeek) or the target's (GLM)
  Tensor lm_head;    // [V, H] shared_head.head (DeepSeek) or the target's lm_head (GLM)
  LayerWeights layer;
};

// Loads `model.layers.{L}.*` from `source`. `embed` / `lm_head` stay empty
// when the checkpoint has no own copy (GLM shares the target's); they must
// exist for deepseek_v32.
MtpWeights load_mtp_weights(const ModelConfig& config, WeightSource& source);
// As above, with the target's embedding and head filled in where shared.
MtpWeights load_mtp_weights(const DsaModel& target, WeightSource& source);
// The same from the checkpoint at `model_dir` (random weights from `seed`
// when `random_weights`). Error when the config has no MTP layer
// (num_nextn_predict_layers == 0).
MtpWeights read_mtp_weights(const ModelConfig& config, const std::string& model_dir,
                            bool random_weights = false, uint64_t seed = 0);
// The hand-off of the model family (see MtpHandOff).
MtpHandOff mtp_hand_off(const ModelConfig& config);

// The MTP layer behind the drafter (engine/mtp_drafter.h): one
// implementation per device, both over the target's PagedKvCache (cache
// layer L = num_hidden_layers). CpuMtpLayer runs DsaModel's decoder layer on
// its backend; the CUDA one (model/cuda/cuda_model.h, make_cuda_mtp_layer) runs
// CudaDsaModel's on device buffers.
class MtpLayer {
 public:
  virtual ~MtpLayer() = default;

  // The CPU MTP layer of `target`, from the checkpoint at `model_dir`.
  static std::unique_ptr<MtpLayer> load(DsaModel& target, const std::string& model_dir,
                                        bool random_weights = false, uint64_t seed = 0);

  int64_t cache_layer() const { return cache_layer_; }
  int64_t hidden_size() const { return hidden_; }
  int64_t vocab_size() const { return vocab_; }
  int64_t index_topk() const { return index_topk_; }
  MtpHandOff hand_off() const { return hand_off_; }

  struct Rows {
    int64_t start = 0;  // position of the first row
    int64_t count = 0;
    std::span<const int32_t> pages;
    std::span<const int32_t> next_tokens;  // [count] token_{t+1} of each row
    // [count, H] host rows of the hand-off input: the target's hidden states
    // (before model.norm, as the models return them; normed here) at step 0,
    // the previous step's hand_off at later steps.
    const float* hidden = nullptr;
    bool target_hidden = true;  // step 0: apply model.norm to `hidden` first
    // Draft steps with sharing: attend over [0, shared_context) via shared_topk.
    bool shared = false;
    int64_t shared_context = 0;
    std::span<const int32_t> shared_topk;
    int64_t shared_count = 0;
    // The row whose outputs are returned (-1: the last). Rows after it are
    // run and write their cache entries, which hold nothing yet: the next
    // step 0 rewrites them before any row reads them. A verification refills
    // its k + 1 rows this way whatever it accepted, so every verifying
    // sequence has the same row count and the step runs as a CUDA Graph.
    int64_t output_row = -1;
    // Step 0 only: this many greedy drafts right after the step (d_1 = argmax
    // of the output row's logits, d_2.. from draft steps with IndexShare +
    // KVShare, each the argmax of the previous one's logits), on the device
    // without a host round trip per draft where the layer runs on one.
    int64_t greedy_drafts = 0;
    // Whether the caller reads this sequence's logits (a device layer copies
    // them back only when some sequence does).
    bool want_logits = true;
    // With want_logits: the caller reads only their argmax (lowest id on
    // ties), so a group that gathers the outputs on one rank may send the id
    // instead of the row (Output::argmax; data-parallel attention: 4 bytes
    // against vocab x 4). A layer that returns logits may ignore it.
    bool want_argmax = false;
    int64_t last_row() const { return output_row >= 0 ? output_row : count - 1; }
  };
  struct Output {
    Tensor logits;    // [sequences, V] host, of each sequence's output row; undefined
                      // when no sequence wants logits
    Tensor hand_off;  // [sequences, H] host, of each sequence's output row
    // Per sequence, the indexer's top-k positions of the output row (unshared runs).
    std::vector<std::vector<int32_t>> last_topk;
    std::vector<int64_t> last_count;
    // Per sequence, its Rows::greedy_drafts drafts.
    std::vector<std::vector<int32_t>> drafts;
    // Per sequence, the argmax of its logits row when the run sent ids
    // instead of rows (Rows::want_argmax); empty otherwise: read `logits`.
    std::vector<int32_t> argmax;
    // The argmax of sequence i's logits row, from whichever of the two the run gave.
    int32_t argmax_of(size_t i, int64_t vocab) const;
  };
  // One MTP application over every sequence's rows (batched).
  virtual Output run(std::span<const Rows> sequences, PagedKvCache& cache) = 0;
  // Data-parallel attention: the shape of a whole group run, the same on
  // every rank (group_run_shape), beside each rank's share of its rows.
  struct GroupRun {
    int64_t max_sequences = 0;      // the most sequences of any rank's share
    int64_t rows_per_sequence = 0;  // every sequence's rows; 0 when they differ
    bool shared = false;            // draft steps with sharing (Rows::shared)
    bool target_hidden = true;      // step 0 (Rows::target_hidden)
  };
  // One rank's share `own` (maybe empty) of a group run shaped `whole`
  // (run_mtp_share). A layer that pads runs to a shape all ranks agree on (a
  // device layer's CUDA Graphs, whose MoE exchanges must meet) reads `whole`;
  // by default the share runs alone.
  virtual Output run_share(std::span<const Rows> own, const GroupRun& whole, PagedKvCache& cache) {
    (void)whole;
    return run(own, cache);
  }
  // Whether a run costs less when every sequence has the same row count (a
  // device layer replays one CUDA Graph per shape), so the caller may give
  // placeholder rows (Rows::output_row) instead of fewer rows.
  virtual bool prefers_uniform_rows() const { return false; }

 protected:
  MtpLayer(const ModelConfig& config, int64_t index_topk, MtpHandOff hand_off);
  // Clear errors for malformed rows (token ids, counts, hidden, shared
  // selections, output rows, draft chains); returns the total row count.
  int64_t check_rows(std::span<const Rows> sequences) const;
  // Rows::greedy_drafts of a step 0 that `out` holds, one batched run() per
  // draft step: the host loop for layers without a device chain.
  void greedy_drafts_on_host(std::span<const Rows> sequences, PagedKvCache& cache, Output& out);

 private:
  MtpHandOff hand_off_;
  int64_t cache_layer_ = 0;
  int64_t hidden_ = 0;
  int64_t vocab_ = 0;
  int64_t index_topk_ = 0;
};

// The shape of a group run of `whole`'s sequences, sequence s on rank
// (share) ranks[s].
MtpLayer::GroupRun group_run_shape(std::span<const MtpLayer::Rows> whole,
                                   const std::vector<int>& ranks);

// The MTP layer on the CPU: DsaModel::run_layer on the target's backend.
class CpuMtpLayer final : public MtpLayer {
 public:
  CpuMtpLayer(DsaModel& target, MtpWeights weights, MtpHandOff hand_off);
  Output run(std::span<const Rows> sequences, PagedKvCache& cache) override;

 private:
  DsaModel& target_;
  MtpWeights weights_;
};

}  // namespace megactx
