// CudaDsaModel: DsaModel's forward pass on the GPU (see model/cuda/cuda_model.h for
// why it is its own LanguageModel). Internal to the CUDA build: included only
// by the dsa_*.cpp files beside it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "kernels/cuda/dsa_fallback/dsa_fallback.h"
#include "kernels/cuda/dsa_glue/dsa_fast_inputs.h"
#include "kernels/cuda/elementwise/elementwise_ops.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/indexer/indexer.h"
#include "kernels/cuda/kv_copy/stage_offload.h"
#include "kernels/cuda/moe/grouped_moe.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/decode_graph.h"
#include "model/cuda/device_buffer.h"
#include "model/cuda/phase_timer.h"
#include "model/cuda/weights.h"
#include "model/model_plan.h"
#include "model/mtp_layer.h"
#include "model/rope.h"
#include "parallel/communicator.h"

namespace megactx::cuda {

class CudaDsaModel final : public LanguageModel {
 public:
  // Both factories (make_cuda_dsa_model from a host DsaModel,
  // make_cuda_dsa_model_from_checkpoint) end here with the config, the top-k
  // width and the weights already on the device.
  // `plan`: a rank's share of a tensor-parallel group (the host model's
  // parallel_plan, whose shares `weights` hold); none: plan_model(config,
  // index_topk), the whole model.
  CudaDsaModel(ModelConfig config, int64_t index_topk, std::unique_ptr<CudaWeights> weights,
               const CudaModelOptions& options, std::optional<ModelPlan> plan = std::nullopt);
  // Selects options.device_ordinal and checks that `config` fits the CUDA
  // paths: the factories call it before uploading any weight.
  static void prepare_device(const ModelConfig& config, int64_t index_topk,
                             const CudaModelOptions& options);
  const CudaWeights& weights() const { return *weights_; }
  ~CudaDsaModel() override;

  const ModelConfig& config() const override { return config_; }
  Device device() const override { return Device::CUDA; }
  ForwardOutput forward(const ForwardBatch& batch, PagedKvCache& cache) override;
  // Device pools, pinned host-tier pools with copies on stream(), the MTP
  // layer on the device (model/cuda/dsa_device_hooks.cpp).
  std::unique_ptr<PagedKvCache> make_kv_cache(const KvCacheSpec& spec) const override;
  // LayerSplit: each rank's pools (layer_split_spec), as the host model's.
  std::vector<KvCacheSpec> kv_cache_shares(const KvCacheSpec& whole) const override;
  std::unique_ptr<PagedKvCache> make_host_kv_cache(const KvCacheSpec& spec) const override;
  KvPageCopy kv_page_copy() const override;
  using LanguageModel::load_mtp_layer;
  std::unique_ptr<MtpLayer> load_mtp_layer(const Checkpoint& checkpoint) override;
  void reload_weights(const Checkpoint& checkpoint) override;
  void release_weights() override;
  void final_norm(const float* x, int64_t rows, float* out) const override;
  Tensor to_host(const Tensor& tensor) const override;
  void* compute_stream() const override { return stream_; }

  int64_t index_topk() const { return index_topk_; }
  // The stream every forward runs on: the engine's CudaSampler runs on it
  // too, so sampling is ordered after the forward without a host sync.
  cudaStream_t stream() const { return stream_; }
  // The MTP layer on the device (model/cuda/dsa_mtp.cpp): its weights are uploaded
  // beside the target's (same precision mode), embedding and lm_head shared
  // with the target unless the checkpoint has its own copies (DeepSeek).
  void load_mtp(const MtpWeights& host, MtpHandOff hand_off);
  bool has_mtp() const { return mtp_ != nullptr; }
  // MtpLayer::run on the GPU (see model/mtp_layer.h), over cache layer
  // num_hidden_layers of `cache`. `group`: data-parallel attention's whole
  // run, of which `sequences` is this rank's share (maybe empty): a run of a
  // shape every rank can pad to replays a CUDA Graph of that shape, its MoE
  // by the gathered dispatch (MtpLayer::run_share).
  MtpLayer::Output run_mtp(std::span<const MtpLayer::Rows> sequences, PagedKvCache& cache,
                           const MtpLayer::GroupRun* group = nullptr);
  // Data-parallel attention: a run in which this rank has no rows still
  // answers the other ranks' expert pairs (the MTP layer's MoE all-to-all);
  // empty host outputs.
  MtpLayer::Output run_mtp_no_rows();
  bool expert_all_to_all() const { return plan_.expert_all_to_all; }

  // Tests: the selection the latest full layer of the last forward() of
  // `tokens` tokens left (positions [tokens, top_k], -1 past counts; in no
  // particular order on the fast path), copied to the host.
  struct Selection {
    int64_t tokens = 0, top_k = 0;
    std::vector<int32_t> positions, counts;
  };
  Selection last_selection(int64_t tokens) const;
  // Bytes the fast attention path's workspaces hold now (grow-only), for the
  // check of cuda_fast_attention_scratch_bytes (model/cuda/fast_attention_plan.h).
  int64_t fast_scratch_bytes() const;
  // The live host tier: offload pages `pages` of `cache` were rewritten (a
  // move to the tier); the hot cache's lines holding their slots are dropped.
  // On the model's stream, after the copy that rewrote them.
  void invalidate_offload_lines(std::span<const int32_t> pages, const PagedKvCache& cache) const;
  // Every hot line emptied (a new KV cache: the tags name slots of the old one).
  void reset_offload_hot() const;
  // The hot cache's counts as of the last forward the caller waited for.
  OffloadReadStats offload_read_stats() const override;

  // CUDA-graph decode so far (model/cuda/decode_graph.h).
  CudaGraphStats graph_stats(bool mtp = false) const override {
    return mtp ? graphs_mtp_.stats() : graphs_.stats();
  }

 private:
  // Per-forward device views: the batch's tokens, paging and RoPE tables.
  struct Step {
    int64_t tokens = 0;
    int64_t max_context = 0;     // largest start + count of the batch
    PagedRows rows;              // device pointers
    const float* cos = nullptr;  // [tokens, rope / 2]
    const float* sin = nullptr;
    CacheLayout latent, indexer;  // per-token entry layouts of the two pools
    int32_t* topk = nullptr;      // [tokens, index_topk]: the latest full layer's selection
    int32_t* counts = nullptr;    // [tokens]
    // MTP draft steps with IndexShare + KVShare: attention writes no cache
    // row and runs no indexer; `topk` / `counts` hold the caller's selection.
    bool shared = false;
    // Fast path (model/cuda/dsa_fast_attention.cpp): built by the step's first full
    // layer, read by the others.
    const int32_t* token_tables = nullptr;  // [tokens, table_stride] page ids of each token
    const int32_t* row_visible = nullptr;   // [tokens] position + 1
    const int32_t* row_ids = nullptr;       // [tokens] 0..tokens-1
    int64_t table_stride = 0;
    // Pages [0, pages_in_use) hold every entry the step reads (its page
    // tables' largest id + 1; 0: unknown, every page): LayerSplit sends that
    // much of a layer's pool.
    int64_t pages_in_use = 0;
    // Rows [first, first + count) as a step of their own, for the attention
    // core of a long step in row blocks: its rows, RoPE tables ([tokens,
    // rope_half]) and selections ([tokens, index_stride]); the fast indexer's
    // tables are left out (the indexer runs on the whole step).
    Step rows_of(int64_t first, int64_t count, int64_t rope_half, int64_t index_stride) const;
  };
  // Rows per block of a step of n rows (CudaModelOptions::row_block; 0: n).
  int64_t row_block(int64_t n) const {
    return options_.row_block > 0 ? std::min(n, options_.row_block) : n;
  }
  // Scratch reused across steps (grow-only).
  struct Scratch {
    DeviceBuffer ids, positions, table_offset, page_tables, cos, sin, logit_rows;
    DeviceBuffer x, h, branch, normed, logits;
    // bf16 copies of GEMM inputs, written with them (gemm_input_copy): the
    // normed hidden rows h, q_resid and the MLPs' activations.
    DeviceBuffer h_bf16, q_resid_bf16, act_bf16;
    // The e4m3 copies of h, q_resid and the dense MLP's activation and their
    // group scales (fp8_copy), decode sizes only.
    DeviceBuffer h_fp8, h_fp8_scales, q_resid_fp8, q_resid_fp8_scales, act_fp8, act_fp8_scales;
    DeviceBuffer q_resid, q, kv, q_latent, o_latent, o;
    DeviceBuffer iq, k_raw, k, iw, scores, topk, counts;
    DeviceBuffer gate_up, act, router_logits, route_ids, route_gates;
    // The fused router's per-row CTA counts [kFusedRouterMaxRows], zero
    // between launches (moe_router_fused).
    DeviceBuffer router_done;
    DeviceBuffer expert_rows, expert_gates, expert_in, expert_out, moe_out;
    // Routed experts of the step [rows, layers, top_k] (want_routed_experts).
    DeviceBuffer routed;
    // The grouped device MoE (kernels/cuda/moe): plan, SwiGLU activations
    // [pairs, I], per-pair expert outputs [rows, top_k, H]; fp8 experts:
    // the quantised inputs (GroupedMoeLayout::fp8_bytes).
    DeviceBuffer moe_plan, moe_act, moe_pair_out, moe_fp8;
    // Data-parallel attention's expert all-to-all (moe_all_to_all): pair
    // counts each way, the rows sent and received with their local expert
    // ids, the experts' results, the results back, gather indices, the
    // shared expert's output.
    DeviceBuffer a2a_counts, a2a_recv_counts, a2a_send, a2a_send_ids, a2a_recv, a2a_recv_ids;
    DeviceBuffer a2a_results, a2a_back, a2a_index, a2a_ones, a2a_shared;
    // Replicas of tensor ranks: this rank's slice of the MoE output and of
    // the routing record, and every slice of the replica (gathered).
    DeviceBuffer a2a_slice, a2a_slices, a2a_slice_ids, a2a_slices_ids;
    // The gathered dispatch (moe_gathered): this rank's padded rows and
    // routing, every rank's, the local ids and gates, the partial sums and
    // the partials received.
    DeviceBuffer gather_mine, gather_routing, gather_rows, gather_every_routing;
    DeviceBuffer gather_local_ids, gather_gates, gather_partial, gather_received;
    // Context parallelism: this rank's rows packed, and every rank's.
    DeviceBuffer context_mine, context_all;
  };

  void check_batch(const ForwardBatch& batch, const PagedKvCache& cache) const;
  // The end of a forward: synchronises only when the outputs need it.
  void finish_forward(const ForwardBatch& batch);
  // The step's graph key when it runs as a CUDA Graph (cuda_graphs on, the
  // timer off, every sequence the same 1..kMaxGraphTokensPerSequence new
  // tokens, a bucket fits, every layer capturable), else nullopt.
  std::optional<DecodeGraphKey> graph_key(const ForwardBatch& batch,
                                          const PagedKvCache& cache) const;
  // Whether the feed-forward of every layer launches without a host sync for
  // `rows` rows: every MoE layer takes the grouped device path.
  bool ffn_capturable(int64_t rows) const;
  // Whether moe() runs layer `w` for `rows` rows on the grouped device path
  // (no host sync): device_moe on, float32/bf16/fp8 stacked experts, a shape the
  // grouped kernels serve. moe() should decide with this too, so the graph
  // decision and the dispatch cannot drift apart.
  bool moe_on_device(const DeviceLayer& w, int64_t rows) const;
  // The rows of one grouped call of moe(): all of them, or in the
  // deterministic mode chunks of the most rows the grouped kernels serve for
  // this layer (0 when they serve none), so that every row count takes the
  // same kernels.
  int64_t grouped_moe_rows(const DeviceLayer& w, int64_t rows) const;
  ForwardOutput forward_eager(const ForwardBatch& batch, PagedKvCache& cache);
  ForwardOutput forward_graph(const ForwardBatch& batch, PagedKvCache& cache,
                              const DecodeGraphKey& key);
  // Embedding, decoder layers, final norm and lm_head of the `logit_count`
  // rows `logit_rows` of the step -> logits [logit_count, vocab]; the residual
  // stream stays in scratch x [step.tokens, hidden]. Launches only.
  void run_layers(Step& step, const int32_t* ids, const int32_t* logit_rows, int64_t logit_count,
                  PagedKvCache& cache, float* logits);
  // One decoder layer on the residual stream x [step.tokens, hidden].
  // input_normed: scratch h already holds input_norm(x) (the previous layer's
  // fused add + norm wrote it); next_norm: end with x += branch and h =
  // next_norm(x) in one kernel (the next layer's input norm) instead of the
  // plain residual add.
  void decoder_layer(const DeviceLayer& w, int64_t layer, Step& step, PagedKvCache& cache, float* x,
                     bool input_normed = false, const float* next_norm = nullptr);
  // The e4m3 copy of scratch h [n, hidden] that its norm writes for the fp8
  // linears reading it (Fp8Copy, Blas::share_fp8_input), when `fp8_readers`
  // and CudaModelOptions::fp8_norm_copy (or MEGACTX_CUDA_FP8_NORM_COPY) and
  // n <= kFp8NormCopyMaxRows (decode and MTP steps: the buffers stay small
  // enough to leave out of the memory plan); else none.
  static constexpr int64_t kFp8NormCopyMaxRows = 256;
  Fp8Copy h_fp8_copy(int64_t n, bool fp8_readers);
  // The same for any [n, width] output, in `codes` and `scales`; a norm's
  // only up to kFp8CopyMaxWidth wide (`norm`).
  Fp8Copy fp8_copy(DeviceBuffer& codes, DeviceBuffer& scales, int64_t n, int64_t width,
                   bool fp8_readers, bool norm = true);
  // Whether layer w's attention (or its MLP) reads h through an fp8 linear.
  static bool reads_fp8_norm(const DeviceLayer& w, bool attention);
  // The bf16 copy of a GEMM input that the kernel writing the input also
  // writes (Blas::share_input): `buffer` grown to `count` bf16 values when the
  // model's matrices are bf16, else null (no copy is made).
  void* gemm_input_copy(DeviceBuffer& buffer, int64_t count);
  // Whether anything reads the float32 output of the norm before layer w's
  // attention (attention) or its MLP / MoE (otherwise); if not, the norm
  // writes only the bf16 copy (Blas::share_input's f32_written).
  bool reads_f32_norm(const DeviceLayer& w, bool attention) const;
  // The same for the q_a norm's output (q_resid): q_b and the indexer's wq_b read it.
  bool reads_f32_q_resid(const DeviceLayer& w) const;
  // data [count] on the device: this rank's partial sum of an attention or
  // feed-forward output, summed over the tensor-parallel group in place (on
  // stream_; nothing without a group).
  void reduce_partial(float* data, int64_t count);
  // Rows [first, last) of the step are this rank's: all of them, or with
  // context parallelism its share (context_rows). Every row's latent and
  // indexer key are written to the cache; the queries, the indexer's scores
  // and the sparse attention are computed for this rank's rows only, into
  // out [n, H] at their places.
  void attention(const DeviceLayer& w, int64_t layer, const float* h, Step& step,
                 PagedKvCache& cache, float* out, int64_t first, int64_t last);
  // q_resid: [n, q_lora] with row stride q_resid_stride (the stacked q_a | kv_a
  // output). Keys for all n rows, scores and top-k for rows [first, last).
  void indexer(const DeviceLayer& w, int64_t layer, const float* h, const float* q_resid,
               int64_t q_resid_stride, Step& step, PagedKvCache& cache, int64_t first,
               int64_t last);
  // Context parallelism (ModelPlan::context_parallel_size > 1, over the whole
  // group; model/cuda/dsa_context_parallel.cpp): this rank's rows of a step of
  // n rows (all of them when n is smaller than the group, as the host model).
  std::pair<int64_t, int64_t> context_rows(int64_t n) const;
  // LayerSplit (ModelPlan::kv_owner, model/cuda/dsa_layer_split.cpp): after
  // the owner of `layer` wrote the step's rows into its pools (and, on a
  // layer that runs its indexer, chose their top-k), its latent pool goes to
  // the other ranks' scratch pool and its selection to their step.topk /
  // counts, so every rank's attention core reads them. No-op without
  // LayerSplit or on the MTP layer (whose pools every rank holds).
  void share_layer_kv(int64_t layer, bool indexer, Step& step, PagedKvCache& cache);
  // The latent pool the attention core of `layer` reads: the cache's, or on a
  // rank that does not own the layer the borrowed pool share_layer_kv filled.
  const void* latent_pool_of(const PagedKvCache& cache, int64_t layer) const;
  // LayerSplit's pool form (steps that do not send selected entries): the
  // owner's pool into borrowed pool layer % 2, ahead of use (the next layer's
  // during this one; at its turn only the new rows), see dsa_layer_split.cpp.
  void share_layer_pool(int64_t layer, int owner, const Step& step, PagedKvCache& cache);
  // Per forward (eager): the slots of the step's new rows (where the pool
  // form's new rows go), and no pool prefetched yet.
  void begin_layer_split_step(const std::vector<int32_t>& new_slots);
  // Before the owner of `layer` writes its new rows: the prefetch that reads
  // its pool is over.
  void before_layer_split_write(int64_t layer);
  // LayerSplit, decode-sized steps on the fast path (sends_selected_entries):
  // instead of the pool, the owner sends only the entries the step's rows
  // selected ([rows x top_k, 656] bytes, kernels/cuda/kv_copy/gather_entries.h),
  // on a side stream and communicator of their own, into one of two dense
  // slots that successive layers take in turn; the attention of a rank that
  // does not own the layer reads them (borrowed_entries) once they are in.
  bool sends_selected_entries(const Step& step, const PagedKvCache& cache) const;
  // The end of a step's layers: the compute stream waits for every side-stream
  // exchange of this step (a captured graph must end joined; the next step
  // then needs no wait on this one's events).
  void join_layer_split_side();
  void share_selected_entries(int64_t layer, int owner, const Step& step, PagedKvCache& cache);
  struct BorrowedEntries {
    const uint8_t* rows = nullptr;   // [rows x top_k, 656]
    const int32_t* slots = nullptr;  // [rows, top_k] into `rows`, -1 = none
  };
  // The entries `layer`'s attention reads on a rank that does not own it
  // (the compute stream then waits for their broadcast); nullopt otherwise.
  std::optional<BorrowedEntries> borrowed_entries(int64_t layer);
  // data: rows of `row_bytes` bytes `pitch` bytes apart, [n] of them, this
  // rank's [first, last) written: every rank's rows gathered into every
  // rank's copy (one all_gather of the longest share, padded).
  void gather_context_rows(void* data, int64_t row_bytes, int64_t pitch, int64_t n, int64_t first,
                           int64_t last);
  // out[rows, H] = down(silu(gate(h)) * up(h)); uses scratch gate_up/act.
  void mlp(const DeviceMlp& w, const float* h, int64_t rows, float* out);
  void moe(const DeviceLayer& w, const float* h, int64_t rows, float* out);
  // The router of a MoE layer: ids (global expert indices) and gates
  // [rows, top_k] into scratch, copied into the routed-expert capture when
  // one runs. rows > 0.
  void route(const DeviceLayer& w, const float* h, int64_t rows, int32_t** ids, float** gates);
  // Scratch::router_done, zeroed when first made.
  int32_t* router_done_counts();
  // Data-parallel attention's MoE layer (ModelPlan::expert_all_to_all;
  // model/cuda/dsa_expert_all_to_all.cpp): this rank's rows h [rows, H]
  // (rows may be 0: a rank without rows still serves the others' pairs)
  // routed, sent to their experts' ranks and back by all-to-all, combined
  // with the shared expert into out [rows, H]. Host-synchronous.
  // with_shared: add the shared expert (whole on this rank); off for a
  // replica of tensor ranks, whose shared expert is split over them.
  void moe_all_to_all(const DeviceLayer& w, const float* h, int64_t rows, float* out,
                      bool with_shared = true);
  // The shared experts of this rank's `rows` rows h [rows, H] whole, into
  // scratch (the combine adds them last); null for a model without them.
  const float* shared_expert(const DeviceLayer& w, const float* h, int64_t rows);
  // Data-parallel attention's MoE layer for this rank's replica's `rows`
  // rows: moe_all_to_all, or with replicas of tensor-parallel ranks
  // (moe_over_slices) moe_over_tensor_slices. rows may be 0.
  void data_parallel_moe(const DeviceLayer& w, const float* h, int64_t rows, float* out);
  // Whether a MoE layer runs moe_over_tensor_slices, whose output is whole
  // on every rank of the replica (no tensor-parallel sum after it).
  bool moe_over_slices() const { return plan_.expert_all_to_all && plan_.tensor_parallel_size > 1; }
  // A replica of tensor ranks (as DsaModel::moe_over_tensor_slices): each
  // tensor rank sends a contiguous slice of the replica's rows through the
  // all-to-all, the slices are gathered back over the replica (its routing
  // record too), and the shared expert's width shares are summed over it.
  void moe_over_tensor_slices(const DeviceLayer& w, const float* h, int64_t rows, float* out);
  // A step in which this rank of a data-parallel group has no rows: every
  // MoE layer's all-to-all, so the other ranks' pairs are answered.
  ForwardOutput forward_no_rows();
  // One grouped device call for `rows` rows (h [rows, H], ids and gates
  // [rows, top_k], shared [rows, H] or null) into out [rows, H]; top_k 0:
  // the config's.
  void grouped_experts(const DeviceLayer& w, const float* h, const int32_t* ids, const float* gates,
                       const float* shared, int64_t rows, float* out, int64_t top_k = 0);
  // The same call without the combine: every pair's expert output
  // [rows, top_k, H] (zeros for pairs whose id is outside [0, E)), in
  // scratch (moe_pair_out) until the next grouped call.
  const float* grouped_pair_outputs(const DeviceLayer& w, const float* h, const int32_t* ids,
                                    int64_t rows);
  // One grouped call's shape, workspaces (scratch) and stacked weights of
  // layer `w`; top_k 0: the config's.
  struct GroupedCall {
    GroupedMoeShape shape;
    GroupedMoeBuffers buffers;
    StackedExperts stacked;
  };
  GroupedCall grouped_call(const DeviceLayer& w, int64_t rows, int64_t top_k);
  // Whether one grouped device call serves `rows` rows of `top_k` slots of
  // layer `w` (the pairs an expert all-to-all brought this rank: each a row
  // of one expert, gate 1, else a GEMM chain per expert over ids read on the
  // host; the gathered dispatch's rows of every rank).
  bool grouped_call_on_device(const DeviceLayer& w, int64_t rows, int64_t top_k) const;
  // Data-parallel attention's MoE layer by the gathered dispatch
  // (model/expert_dispatch.h; model/cuda/dsa_expert_gathered.cpp): this
  // rank's rows h [rows, H] (rows <= gathered_rows_, 0 allowed) padded to
  // gathered_rows_, every rank's gathered, this rank's experts over all of
  // them, the partial sums back to their ranks, out [rows, H] with the
  // shared expert (with_shared: off for a replica of tensor ranks, as
  // moe_all_to_all). No host sync: CUDA Graphs hold it.
  void moe_gathered(const DeviceLayer& w, const float* h, int64_t rows, float* out,
                    bool with_shared = true);
  // Whether the gathered dispatch serves layer `w` with `padded_rows` rows a
  // rank: its layout (gathered_dispatch_layout) and one grouped call over
  // every rank's rows.
  bool gathered_on_device(const DeviceLayer& w, int64_t padded_rows) const;
  // The rows every rank pads to in this forward's gathered dispatch; 0: the
  // all-to-all (set by forward() and run_mtp for their call).
  int64_t gathered_rows_ = 0;
  // The gathered dispatch's rows in a graph step of `rows` rows
  // (gathered_rows_of); 0 where the experts are not reached by all-to-all or
  // --moe-dispatch all-to-all keeps them so.
  int64_t graph_gathered_rows(int64_t rows) const;
  // The routed-expert capture of the running forward: moe() copies its ids
  // into routed_ids_ [rows, layers, top_k] at layer routed_layer_; null
  // outside forwards that want them (the MTP layer never records).
  int32_t* routed_ids_ = nullptr;
  int64_t routed_layer_ = 0;
  // Starts the capture into Scratch::routed for `rows` rows (all -1 first).
  void begin_routed_capture(int64_t rows);
  // The first `rows` rows of the capture, copied to the host (enqueued; the
  // forward's finish_forward syncs), and the capture ended.
  Tensor routed_experts_to_host(int64_t rows);

  // The fp8 DSA kernels instead of the fp32 fallback
  // (model/cuda/dsa_fast_attention.cpp): CudaModelOptions::fast_attention, an FP8
  // cache of 64-token pages, kv_lora 512, rope 64, index dim 128.
  bool use_fast_attention(const Step& step) const;
  // q [n, index_heads, 128] (after RoPE), weights [n, index_heads]
  // (weights_proj(h), times weight_scale = heads^-0.5 here) -> step.topk
  // positions [n, index_topk], step.counts.
  void fast_indexer(const float* q, const float* weights, float weight_scale, int64_t layer,
                    Step& step, PagedKvCache& cache);
  // q_latent [n, heads, 512], q [n, heads, nope | rope] (roped), over step.topk
  // -> o_latent [n, heads, 512].
  IndexerScoreParams indexer_score_rows(const uint8_t* queries_fp8, const float* weights,
                                        int64_t layer, const Step& step, PagedKvCache& cache,
                                        int64_t first, int64_t rows, float* scores) const;
  // fast_indexer's selection in the deterministic mode (position_topk).
  void invariant_indexer_topk(const uint8_t* queries_fp8, const float* weights, int64_t layer,
                              Step& step, PagedKvCache& cache);
  // The columns of a step's selection: min(index_topk, its longest context).
  int64_t selection_top_k(const Step& step) const;
  // step.topk's positions -> physical slots [tokens, top_k] into `slots`.
  PositionsToSlotsParams positions_to_slots_params(const Step& step, int64_t top_k,
                                                   int32_t* slots) const;
  // A step's selected slots [n, top_k] (positions_to_slots once per
  // selection: SlotsKey), and whether this call made them.
  struct LayerSlots {
    const int32_t* slots = nullptr;
    int64_t top_k = 0;
    bool new_selection = false;
  };
  LayerSlots layer_slots(const Step& step);
  // The live host tier (offload pages): the staging of a layer's selected
  // offload entries (kernels/cuda/kv_copy/stage_offload.h): a new selection's
  // hot-line assignment and, on the side stream, every group layer's copies;
  // unless assign_only, then this layer's wait for them and its staging rows.
  // nullopt when the step reads offload entries straight from host memory.
  std::optional<StageOffloadParams> stage_offload(int64_t layer, int64_t n,
                                                  const LayerSlots& selected, PagedKvCache& cache,
                                                  bool assign_only);
  // Steps too large for stage_offload (prefill chunks), before the
  // attention's row blocks: the union of the whole step's selected offload
  // entries (kernels/cuda/kv_copy/offload_union.h), listed once per selection
  // and copied once per layer; each block's fast_sparse_mla then rewrites its
  // slots to the union's rows. false: the step stages per step (decode
  // sizes) or reads its offload entries straight from host memory.
  bool stage_offload_union(int64_t layer, const Step& step, PagedKvCache& cache);
  // A full layer's slots right after its indexer (decode-sized steps): with
  // the host tier, its hot-line assignment; with early inputs, the mapping of
  // its positions to slots, so that it is not the launch right before the
  // attention (SparseMlaParams::inputs_ready_at_launch).
  void map_slots_after_indexer(int64_t layer, const Step& step, PagedKvCache& cache);
  // The sparse MLA of the fast path. q_latent = fp32 [n, heads, lora], or
  // null: w_uk_bf16 has written the latent half of the packed queries
  // (fast_scratch_.q_bf16). The rope columns: q = fp32 [n, heads, nope |
  // rope] rotated, or q16 = bf16 of the same shape unrotated (the pack
  // rotates them with step's tables). o_latent = fp32 [n, heads, lora] out,
  // or null: the output stays bf16 [n, padded heads, lora] in
  // fast_scratch_.out_bf16 (w_uv_bf16's input).
  void fast_sparse_mla(const float* q_latent, const float* q, const uint16_t* q16, int64_t layer,
                       const Step& step, PagedKvCache& cache, float* o_latent);
  // Whether a fast-path block of `rows` rows runs the absorbed products in
  // bf16 (bf16 weights, not the deterministic mode,
  // CudaModelOptions::bf16_absorbed_min_rows), and the two products:
  // W_UK: q16 bf16 [rows, heads, head_stride] (q_nope the first nope of each
  // head) -> fast_scratch_.q_bf16 [rows, padded heads, 0:lora] bf16; W_UV: fast_scratch_.out_bf16
  // -> o [rows, heads * value] (bf16 for bf16 o_proj weights, else fp32 in `o`), then o_proj into
  // out [rows, hidden]; both products read the layer's bf16 copies of W_UK^T / W_UV (rounded once
  // at load: DeviceLayer::w_uk_t_bf16, w_uv_bf16).
  bool bf16_absorbed(int64_t rows) const;
  // Whether a block of `rows` rows keeps the output of `writer` (a bf16 or
  // fp8 weight) in bf16 (CudaModelOptions::bf16_activations).
  bool bf16_activations(int64_t rows, const DeviceMatrix& writer) const;
  void w_uk_bf16(const DeviceLayer& w, const uint16_t* q16, int64_t rows, int64_t head_stride);
  // fast_scratch_.absorb_q_bf16 for `rows` rows: [rows, heads, max(qk, value)] bf16.
  uint16_t* absorb_bf16(int64_t rows);
  void w_uv_bf16(const DeviceLayer& w, int64_t rows, float* o, float* out);
  // Workspaces of the fast path (grow-only; the top-k ones zeroed when grown).
  // fused: the fused indexer + top-k's (kernels/cuda/indexer_topk), for steps
  // too large for the scores matrix (cuda_fused_indexer_chosen).
  // What the slots in FastScratch::slots were made from: a selection
  // (step.topk / counts of `tokens` rows, `top_k` columns) through the rows'
  // page tables and positions, in one selection epoch. IndexShare's shared
  // layers attend through the last full layer's selection with the same
  // rows, so they reuse its slots instead of converting it again.
  struct SlotsKey {
    uint64_t epoch = 0;
    const int32_t* topk = nullptr;
    const int32_t* counts = nullptr;
    const int32_t* page_tables = nullptr;
    const int32_t* table_offset = nullptr;
    const int32_t* positions = nullptr;
    int64_t tokens = 0, top_k = 0;
    const int32_t* slots = nullptr;
    bool operator==(const SlotsKey&) const = default;
  };
  SlotsKey selection_key(const Step& step, int64_t top_k, const int32_t* slots) const;
  struct FastScratch {
    DeviceBuffer tables, visible, row_ids;
    DeviceBuffer iq_fp8, iw_folded, topk_histogram, topk_state;
    DeviceBuffer slots, q_bf16, out_bf16, lse, partial_out, partial_lse;
    // bf16_absorbed: q_nope [rows, heads, nope] (then W_UV's bf16 output [rows,
    // heads, value]), W_UK^T [heads, lora, nope] and W_UV [heads, value, lora] in bf16.
    DeviceBuffer absorb_q_bf16;
    DeviceBuffer fused;
    // The live host tier: staged slots [rows, top_k] and the staged entries
    // of offload pages [rows x top_k, 656] (at most kOffloadStagingRows rows).
    DeviceBuffer staged_slots, staging, offload_copy;
    SlotsKey slots_key;
  };

  // The MTP layer's device weights (load_mtp).
  struct DeviceMtp {
    const float *enorm = nullptr, *hnorm = nullptr, *head_norm = nullptr;
    DeviceMatrix eh_proj;          // [H, 2H]
    const float* embed = nullptr;  // [V, H] own copy or the target's
    DeviceMatrix lm_head;          // [V, H] own copy or the target's
    DeviceLayer layer;
    MtpHandOff hand_off = MtpHandOff::NormedOutput;
  };
  // Scratch of run_mtp (apart from the decoder layer's, shared with forward);
  // its packed inputs live in graphs_mtp_'s staging and input block.
  struct MtpScratch {
    PinnedBuffer readback;  // one readback per run
    DeviceBuffer topk, counts, cat, x, last, normed, logits;
    // The greedy draft chain: step 0's selection of each output row, its
    // hand-off, the draft steps' embeddings and logits, drafts [chain, s].
    DeviceBuffer chain_topk, chain_counts, hand0, embedded, link_logits, drafts;
  };
  // The graph key of an MTP run (every sequence the same row count, a bucket
  // fits, the layer's MoE on the device path), else nullopt. Data-parallel
  // attention: from the whole run's shape `group` (none: no graph), the MoE
  // by the gathered dispatch.
  std::optional<DecodeGraphKey> mtp_graph_key(std::span<const MtpLayer::Rows> sequences,
                                              const PagedKvCache& cache, int64_t chain,
                                              const MtpLayer::GroupRun* group) const;

  ModelConfig config_;
  CudaModelOptions options_;
  ModelPlan plan_;  // the description both forward passes read (model_plan.h)
  int64_t index_topk_ = 0;
  RopeTable rope_;
  DeviceBuffer rope_inv_freq_;  // rope_.inv_freq [rope / 2] for rope_tables (eager forwards)
  float softmax_scale_ = 1.0f;
  cudaStream_t stream_ = nullptr;
  // The NCCL communicator of options.group's ranks, on stream_ (null: none).
  std::unique_ptr<parallel::Communicator> group_;
  // The ranks whose partial sums meet: group_, or with replicas of
  // tensor-parallel ranks a split of it (this replica's tensor ranks).
  std::unique_ptr<parallel::Communicator> tensor_split_;
  parallel::Communicator* tensor_group_ = nullptr;
  // The ranks over which context parallelism splits a step's rows: group_,
  // or with context shares of tensor ranks a split of it (the ranks of this
  // tensor rank in every share).
  std::unique_ptr<parallel::Communicator> context_split_;
  parallel::Communicator* context_group_ = nullptr;
  // LayerSplit: the layer whose latent pool scratch_.borrowed_latent holds
  // (-1: none).
  int64_t borrowed_layer_ = -1;
  // LayerSplit's selected entries (share_selected_entries): two dense slots,
  // the slots table into them, the side stream and its communicator (a
  // split of the tensor group; null with host-staged collectives, which then
  // carry the entries on the compute stream), an event per slot for the
  // gather before its broadcast and for the broadcast's end. Made at first use.
  struct SplitEntries {
    DeviceBuffer rows[2];
    DeviceBuffer slots;
    cudaStream_t side = nullptr;
    std::unique_ptr<parallel::Communicator> group;
    cudaEvent_t gathered[2] = {nullptr, nullptr};
    cudaEvent_t received[2] = {nullptr, nullptr};
    bool made = false;
    // received[s] was recorded in this step (waits are on this step's records
    // only: a graph's capture may not wait on an event from outside it).
    bool received_pending[2] = {false, false};
    int next = 0;        // the slot the next layer takes
    int64_t layer = -1;  // the layer a non-owner's attention reads from slot `slot`
    int slot = 0;
    // The pool form: two borrowed pools (layer l's in pools[l % 2]), the
    // layer each holds ahead of use in this forward (-1: none) and the event
    // that marks it in, the step's new rows' slots and their dense copy.
    DeviceBuffer pools[2];
    int borrowed_pool = 0;  // the pool borrowed_layer_ is in
    int64_t prefetched_layer[2] = {-1, -1};
    cudaEvent_t prefetched[2] = {nullptr, nullptr};
    DeviceBuffer new_slots, new_dense, new_dense_slots;
    int64_t new_rows = 0;
  };
  SplitEntries split_entries_;
  // split_entries_, its side stream, events and communicator made at first use.
  SplitEntries& split_entries();
  std::unique_ptr<Blas> blas_;
  std::unique_ptr<CudaWeights> weights_;
  // final_norm's host copy of weights_->final_norm [H] (empty until first
  // used; dropped with the weights).
  mutable std::vector<float> host_final_norm_;
  Scratch scratch_;
  DeviceTensorPool logits_pool_;  // returned device logits, recycled
  std::unique_ptr<DeviceMtp> mtp_;
  MtpScratch mtp_scratch_;
  PhaseTimer timer_;  // MEGACTX_CUDA_PHASE_TIMES=1
  // CUDA-graph decode: buckets, graphs, the packed-input block.
  std::vector<int64_t> graph_buckets_;
  DecodeGraphCache graphs_;
  DecodeGraphCache graphs_mtp_;           // MTP layer runs (model/cuda/dsa_mtp.cpp)
  std::vector<int64_t> graph_positions_;  // host scratch of forward_graph
  // When captured graphs may hold stale addresses: it changes whenever a
  // DeviceBuffer was freed or Blas regrew a scratch (model/cuda/dsa_graph_forward.cpp).
  uint64_t scratch_epoch() const { return DeviceBuffer::releases() + blas_->reallocations(); }
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  DeviceBuffer cublas_workspace_;  // never grown after construction
  double forward_wall_ms_ = 0.0;
  FastScratch fast_scratch_;
  // The live host tier's hot cache (kernels/cuda/kv_copy/stage_offload.h):
  // per selection group, keyed by the layer whose top-k it is, its tables
  // [3, lines] int32 (tags, claims, hits); per latent layer its hot entries
  // [lines, 656]; `group`: the table the current staged slots were assigned
  // in. Allocated on first use (an eager step: graphs are captured after),
  // never grown; a new KV cache empties the tags (make_kv_cache).
  // `counters`: what the staging did so far (OffloadReadCounters, device),
  // `readback` its copy after each forward (offload_read_stats).
  struct OffloadHot {
    std::map<int64_t, DeviceBuffer> tables;
    std::map<int64_t, DeviceBuffer> entries;
    int64_t group = -1;
    int64_t lines = 0;  // kOffloadHotLines (fewer in tests), fixed at first use
    OffloadLineMap line_map = OffloadLineMap::kRotated;
    DeviceBuffer counters;
    mutable PinnedBuffer readback;
    // The misses' copies into hot lines, for every layer of a group at once
    // on `side` (fill_offload_lines); `pending`: layers whose fills the
    // compute stream has not waited for yet. Made at first use (eager).
    cudaStream_t side = nullptr;
    cudaEvent_t assigned = nullptr;
    std::map<int64_t, cudaEvent_t> filled;
    std::set<int64_t> pending;
  };
  OffloadReadCounters* offload_read_counters();
  void read_back_offload_counters();
  void fill_offload_lines(const StageOffloadParams& assigned, int64_t layer, PagedKvCache& cache);
  void join_offload_fills();
  int64_t first_indexer_layer() const;
  mutable OffloadHot offload_hot_;
  // The union staging's buffers (stage_offload_union): marks (zero at rest)
  // and prefix sums per offload slot, the union's list and rows, the staged
  // slots of a row block, the scan's storage; `capacity` rows, fixed at
  // first use (kOffloadUnionRows, or fewer: the tier's slots,
  // MEGACTX_OFFLOAD_UNION_ROWS; 0: none).
  struct OffloadUnion {
    int64_t capacity = -1;  // -1: not chosen yet
    int64_t offload_slots = 0;
    DeviceBuffer marks, positions, list, rows, staged_slots, scan;
    size_t scan_bytes = 0;
    // The whole step's selection the list was made for (slots: null).
    SlotsKey assigned;
    int64_t layer = -1;  // the layer whose rows the staging holds now (-1: none)
  };
  OffloadUnion offload_union_;
  int fast_multiprocessors_ = 0;  // SMs of the device, for the split-K plan
  // Advanced whenever a selection may change: every Step made (a forward, an
  // MTP step) and every indexer run (SlotsKey).
  uint64_t selection_epoch_ = 0;
};

}  // namespace megactx::cuda
