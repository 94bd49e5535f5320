// CudaDsaModel's MTP layer: MtpLayer::run (model/mtp_layer.h) on device
// buffers, step for step as CpuMtpLayer::run:
//
//   cat = [enorm(embed(token_{t+1})) | hnorm(h)]          [rows, 2H]
//   x   = decoder layer L(eh_proj(cat))                   [rows, H]
//   out = shared_head.norm(x[last row of each sequence])  [sequences, H]
//   logits = lm_head(out)                                 [sequences, V]
//
// h is the target's hidden state after model.norm at step 0 (refill) and the
// previous step's hand-off at draft steps. Draft steps with sharing run the
// decoder layer in Step::shared mode: no cache row, no indexer, attention
// through step 0's top-k positions. The decoder layer itself is the target's
// code path (decoder_layer), so the fp32 mode matches the CPU MTP layer to
// fp32 rounding.
//
// A step 0 with greedy drafts (Rows::greedy_drafts) chains them on the
// device: argmax of the logits, then the shared draft steps, each reading the
// previous argmax and hand-off from device memory; the host gets the drafts
// with the step's one readback. Runs whose sequences have the same row count
// (a verification refills all its k + 1 rows: Rows::output_row) are padded to
// a batch bucket and replay a CUDA Graph per shape, like the target's decode
// steps (model/cuda/decode_graph.h), with the inputs uploaded into a fixed
// block outside the graph.
#if MEGACTX_HAVE_CUDA
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/scoped_value.h"
#include "kernels/cuda/elementwise/elementwise_ops.h"
#include "model/batch_checks.h"
#include "model/cuda/cuda_dsa_model.h"

namespace megactx {
namespace cuda {

void CudaDsaModel::load_mtp(const MtpWeights& host, MtpHandOff hand_off) {
  MEGACTX_CHECK(host.layer.attention.has_indexer, "the MTP layer needs its indexer weights");
  auto mtp = std::make_unique<DeviceMtp>();
  mtp->enorm = weights_->upload(host.enorm);
  mtp->hnorm = weights_->upload(host.hnorm);
  mtp->head_norm = weights_->upload(host.head_norm);
  mtp->eh_proj = weights_->upload_matrix(host.eh_proj);
  // GLM shares the target's embedding and head (no upload); DeepSeek has copies.
  mtp->embed = host.embed.defined() ? weights_->upload(host.embed) : weights_->embed;
  mtp->lm_head = host.lm_head.defined() ? weights_->upload_matrix(host.lm_head) : weights_->lm_head;
  // A rank of a tensor- or expert-parallel group keeps its share of the
  // layer, as of every decoder layer (decoder_layer adds the group's partial
  // sums; the expert all-to-all of data-parallel attention and context
  // parallelism sends each rank the pairs of its own experts, by local index).
  const bool share = plan_.tensor_parallel_size > 1 || plan_.expert_parallel_size > 1;
  mtp->layer = weights_->upload_layer(share ? parallel_shard_layer(host.layer, plan_) : host.layer);
  mtp->hand_off = hand_off;
  mtp_ = std::move(mtp);
}

namespace {

// Word offsets of run_mtp's packed inputs in one device block, a function of
// the shape alone (n rows of s sequences, the chain, the page capacity), so
// that a captured graph's pointers stay valid for every run of its key. The
// page tables come last: their length varies below their capacity.
struct MtpInputs {
  MtpInputs(int64_t n, int64_t s, int64_t half, int64_t hidden, int64_t shared_topk, int64_t chain,
            int64_t page_capacity) {
    int64_t at = 0;
    const auto take = [&at](int64_t words) {
      const int64_t offset = at;
      at += words;
      return offset;
    };
    table_offset = take(n);
    positions = take(n);
    cos = take(n * half);
    sin = take(n * half);
    topk = take(n * shared_topk);
    counts = take(shared_topk > 0 ? n : 0);
    ids = take(n);
    last_rows = take(s);
    hidden_rows = take(n * hidden);
    const int64_t links = std::max<int64_t>(chain - 1, 0);  // draft steps after d_1
    chain_table_offset = take(links > 0 ? s : 0);
    chain_positions = take(links * s);
    chain_cos = take(links * s * half);
    chain_sin = take(links * s * half);
    page_tables = take(0);
    words = page_tables + page_capacity;
  }
  int64_t table_offset, positions, cos, sin, topk, counts, ids, last_rows, hidden_rows;
  int64_t chain_table_offset, chain_positions, chain_cos, chain_sin, page_tables, words;
};

// Positions an MTP run touches: its rows and the chain's draft rows after
// each output row.
int64_t mtp_context(std::span<const MtpLayer::Rows> sequences, int64_t chain) {
  int64_t context = 0;
  for (const MtpLayer::Rows& r : sequences) {
    context = std::max(
        {context, r.start + r.count, r.start + r.last_row() + std::max<int64_t>(chain, 1)});
  }
  return context;
}

}  // namespace

std::optional<DecodeGraphKey> CudaDsaModel::mtp_graph_key(std::span<const MtpLayer::Rows> sequences,
                                                          const PagedKvCache& cache, int64_t chain,
                                                          const MtpLayer::GroupRun* group) const {
  // (LayerSplit keeps the MTP layer's pools on every rank: its runs exchange
  // nothing but the tensor-parallel sums. Context parallelism's runs are the
  // same on every rank: the shares of the padded rows have fixed sizes.)
  if (!options_.cuda_graphs || timer_.enabled()) return std::nullopt;
  // Data-parallel attention: the whole run's shape decides, the same on
  // every rank (a rank with no rows replays a graph of padding rows). Its
  // runs chain no drafts on the device (the leader chains them, one group
  // run per draft step).
  const bool data_parallel = plan_.expert_all_to_all && plan_.context_parallel_size == 1;
  if (data_parallel && (group == nullptr || chain > 0)) return std::nullopt;
  if (!data_parallel && sequences.empty()) return std::nullopt;
  const int64_t count = data_parallel ? group->rows_per_sequence : sequences.front().count;
  for (const MtpLayer::Rows& r : sequences) {
    if (r.count != count) return std::nullopt;
  }
  if (count < 1 || count > kMaxGraphTokensPerSequence) return std::nullopt;
  const int64_t padded =
      batch_bucket(graph_buckets_,
                   data_parallel ? group->max_sequences : static_cast<int64_t>(sequences.size()));
  if (padded == 0) return std::nullopt;
  // The MoE of step 0 (padded x count rows) and of the chain's draft steps
  // (padded rows): with the experts reached by all-to-all the gathered
  // dispatch (the all-to-all reads its counts on the host), else as
  // ffn_capturable one grouped call per MoE layer (the deterministic mode's
  // chunked steps run eagerly).
  const auto capturable = [&](int64_t rows) {
    if (!mtp_->layer.is_moe) return true;
    if (plan_.expert_all_to_all) {
      const int64_t gathered = graph_gathered_rows(rows);
      return gathered > 0 && gathered_on_device(mtp_->layer, gathered);
    }
    return moe_on_device(mtp_->layer, rows) && grouped_moe_rows(mtp_->layer, rows) >= rows;
  };
  if (!capturable(padded * count) || (chain > 1 && !capturable(padded))) return std::nullopt;
  DecodeGraphKey key;
  key.sequences = padded;
  key.tokens_per_sequence = count;
  key.context = context_bucket(mtp_context(sequences, chain));
  key.kv_dtype = static_cast<int>(cache.spec().dtype);
  key.cache = cache_fingerprint(cache, config_.num_hidden_layers + 1);
  key.mtp_shared = data_parallel ? group->shared : sequences.front().shared;
  key.mtp_drafts = chain;
  return key;
}

MtpLayer::Output CudaDsaModel::run_mtp_no_rows() {
  MEGACTX_CHECK(mtp_ != nullptr, "CUDA model: no MTP layer loaded (load_mtp)");
  // One decoder-layer pass per group run (the leader chains the drafts, one
  // run each), so one exchange, as the ranks with rows make.
  if (mtp_->layer.is_moe) data_parallel_moe(mtp_->layer, nullptr, 0, nullptr);
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  MtpLayer::Output output;
  output.logits = Tensor::empty({0, config_.vocab_size});
  output.hand_off = Tensor::empty({0, config_.hidden_size});
  return output;
}

MtpLayer::Output CudaDsaModel::run_mtp(std::span<const MtpLayer::Rows> sequences,
                                       PagedKvCache& cache, const MtpLayer::GroupRun* group) {
  MEGACTX_CHECK(mtp_ != nullptr, "CUDA model: no MTP layer loaded (load_mtp)");
  MEGACTX_CHECK(!sequences.empty() || group != nullptr, "MTP: no sequences");
  const KvCacheSpec& spec = cache.spec();
  const int64_t layer = config_.num_hidden_layers;
  MEGACTX_CHECK(spec.device == Device::CUDA && cache.has_latent(layer) && cache.has_indexer(layer),
                "MTP: the device KV cache has no pools for the MTP layer {} "
                "(make_kv_cache_spec with_mtp_layer)",
                layer);
  // A data-parallel rank's share may be empty: the whole run's kind then.
  const bool shared = sequences.empty() ? group->shared : sequences.front().shared;
  const bool target_hidden =
      sequences.empty() ? group->target_hidden : sequences.front().target_hidden;
  int64_t chain = 0;  // greedy drafts chained after this step 0
  bool want_logits = false;
  for (const MtpLayer::Rows& r : sequences) {
    MEGACTX_CHECK(r.shared == shared && r.target_hidden == target_hidden,
                  "MTP on CUDA: one run is all step 0 or all draft steps");
    const int64_t pages = (r.start + r.count + spec.page_size - 1) / spec.page_size;
    MEGACTX_CHECK(r.start >= 0 && static_cast<int64_t>(r.pages.size()) >= pages,
                  "MTP: rows [{}, {}) need {} pages, {} given", r.start, r.start + r.count, pages,
                  r.pages.size());
    for (int64_t p = 0; p < pages; ++p) {
      MEGACTX_CHECK(r.pages[p] >= 0 && r.pages[p] < spec.total_pages(),
                    "MTP: page id {} outside the pool of {}", r.pages[p], spec.total_pages());
    }
    chain = std::max(chain, r.greedy_drafts);
    want_logits = want_logits || r.want_logits;
  }
  const int64_t H = config_.hidden_size;
  const int64_t vocab = config_.vocab_size;
  const int64_t half = config_.qk_rope_head_dim / 2;
  const float eps = plan_.rms_norm_eps;
  MtpScratch& sc = mtp_scratch_;
  // The shape: as given (eager), or padded to a batch bucket of sequences of
  // `count` rows each (a CUDA Graph; padding rows have position -1, so they
  // write no cache entry and attend to nothing).
  const std::optional<DecodeGraphKey> key = mtp_graph_key(sequences, cache, chain, group);
  // Data-parallel attention: an empty share without a graph makes the MoE
  // exchange alone; a graph run's MoE takes the gathered dispatch over the
  // rows every rank pads to (a capture that failed runs the same padded
  // shape eagerly).
  if (sequences.empty() && !key) return run_mtp_no_rows();
  // The gathered dispatch's rows of a decoder-layer pass of `rows` rows (step
  // 0's, the chain's draft steps') in a graph run; 0: the all-to-all.
  const auto gathered_of = [&](int64_t rows) {
    return key && plan_.expert_all_to_all ? graph_gathered_rows(rows) : int64_t{0};
  };
  bool one_row_each = true;
  for (const MtpLayer::Rows& r : sequences) one_row_each &= r.count == 1;
  timer_.begin_forward(one_row_each);  // MEGACTX_CUDA_PHASE_TIMES: "mtp ..." phases
  timer_.mark("mtp host prep + upload", stream_);
  const int64_t real = static_cast<int64_t>(sequences.size());
  const int64_t s = key ? key->sequences : real;
  int64_t n = 0;
  int64_t max_context = mtp_context(sequences, chain);
  int64_t page_words = 0;
  for (const MtpLayer::Rows& r : sequences) {
    n += r.count;
    page_words += (r.start + r.count + spec.page_size - 1) / spec.page_size;
  }
  if (key) {
    n = key->rows();
    max_context = key->context;
    page_words = s * ((key->context + spec.page_size - 1) / spec.page_size);
  }
  const int64_t links = std::max<int64_t>(chain - 1, 0);
  const MtpInputs at(n, s, half, H, shared ? index_topk_ : 0, chain, page_words);

  // Pack every input into one page-locked staging block (zeroed: padding
  // rows read token 0, hidden 0, table 0) and upload it with one copy. The
  // previous run ended with a stream sync, so the staging is free.
  auto* words = graphs_mtp_.staging().get<int32_t>(static_cast<size_t>(at.words));
  std::memset(words, 0, static_cast<size_t>(at.words) * sizeof(int32_t));
  auto* words_f = reinterpret_cast<float*>(words);
  std::vector<int64_t> positions(static_cast<size_t>(n), 0);  // RoPE positions (0 for padding)
  std::vector<int64_t> chain_positions(static_cast<size_t>(links * s), 0);
  int64_t row = 0, table = 0;
  for (int64_t i = 0; i < s; ++i) {
    const bool padding = i >= real;
    const int64_t count = padding ? key->tokens_per_sequence : sequences[i].count;
    const int32_t offset = static_cast<int32_t>(padding ? 0 : table);
    if (!padding) {
      const MtpLayer::Rows& r = sequences[i];
      const int64_t pages = (r.start + r.count + spec.page_size - 1) / spec.page_size;
      std::copy(r.pages.begin(), r.pages.begin() + pages, words + at.page_tables + table);
      table += pages;
      std::memcpy(words_f + at.hidden_rows + row * H, r.hidden,
                  static_cast<size_t>(r.count * H) * sizeof(float));
    }
    for (int64_t j = 0; j < count; ++j, ++row) {
      words[at.table_offset + row] = offset;
      if (padding) {
        words[at.positions + row] = -1;
        continue;
      }
      const MtpLayer::Rows& r = sequences[i];
      words[at.positions + row] = static_cast<int32_t>(r.start + j);
      positions[static_cast<size_t>(row)] = r.start + j;
      words[at.ids + row] = r.next_tokens[j];
      if (shared) {
        for (int64_t t = 0; t < index_topk_; ++t)
          words[at.topk + row * index_topk_ + t] = t < r.shared_count ? r.shared_topk[t] : -1;
        words[at.counts + row] = static_cast<int32_t>(r.shared_count);
      }
    }
    words[at.last_rows + i] =
        static_cast<int32_t>(row - count + (padding ? count - 1 : sequences[i].last_row()));
    if (links > 0) {
      words[at.chain_table_offset + i] = offset;
      for (int64_t j = 1; j <= links; ++j) {
        const int64_t position = padding ? -1 : sequences[i].start + sequences[i].last_row() + j;
        words[at.chain_positions + (j - 1) * s + i] = static_cast<int32_t>(position);
        chain_positions[static_cast<size_t>((j - 1) * s + i)] = std::max<int64_t>(position, 0);
      }
    }
  }
  rope_.fill(positions.data(), n, words_f + at.cos, words_f + at.sin);
  if (links > 0) {
    rope_.fill(chain_positions.data(), links * s, words_f + at.chain_cos, words_f + at.chain_sin);
  }
  int32_t* block = graphs_mtp_.inputs().get<int32_t>(at.words);
  const int64_t upload = key ? at.page_tables + table : at.words;
  MEGACTX_CUDA_CHECK(cudaMemcpyAsync(block, words, static_cast<size_t>(upload) * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, stream_));

  const CacheLayouts layouts = cache_layouts(spec);
  Step step;
  ++selection_epoch_;
  step.shared = shared;
  step.tokens = n;
  step.max_context = max_context;
  step.latent = layouts.latent;
  step.indexer = layouts.indexer;
  step.rows.page_size = spec.page_size;
  step.rows.page_tables = block + at.page_tables;
  step.rows.table_offset = block + at.table_offset;
  step.rows.positions = block + at.positions;
  step.cos = reinterpret_cast<const float*>(block + at.cos);
  step.sin = reinterpret_cast<const float*>(block + at.sin);
  // Shared: the caller's selection (uploaded); else the indexer writes them.
  step.topk = shared ? block + at.topk : sc.topk.get<int32_t>(n * index_topk_);
  step.counts = shared ? block + at.counts : sc.counts.get<int32_t>(n);
  const int32_t* d_ids = block + at.ids;
  const int32_t* d_last = block + at.last_rows;
  float* d_hidden = reinterpret_cast<float*>(block + at.hidden_rows);
  // A draft step of the chain: one row per sequence at position row + j,
  // attending through step 0's selection of the output row.
  Step link = step;
  link.shared = true;
  link.tokens = s;
  link.rows.table_offset = block + at.chain_table_offset;
  link.topk = sc.chain_topk.get<int32_t>(s * index_topk_);
  link.counts = sc.chain_counts.get<int32_t>(s);

  float* cat = sc.cat.get<float>(std::max(n, s) * 2 * H);
  float* x = sc.x.get<float>(std::max(n, s) * H);
  float* last = sc.last.get<float>(s * H);
  float* normed = sc.normed.get<float>(s * H);
  float* logits = sc.logits.get<float>(s * vocab);
  float* hand0 = sc.hand0.get<float>(s * H);  // step 0's hand-off, kept through the chain
  float* embedded = sc.embedded.get<float>(s * H);
  int32_t* drafts = sc.drafts.get<int32_t>(std::max<int64_t>(chain, 1) * s);  // [chain, s]
  const bool normed_hand = mtp_->hand_off == MtpHandOff::NormedOutput;
  const auto head = [&](const float* rows, float* out_logits) {
    rmsnorm(rows, s, H, H, mtp_->head_norm, eps, normed, H, stream_);
    blas_->linear(normed, s, H, mtp_->lm_head, vocab, out_logits);
  };
  auto record = [&] {
    blas_->clear_shared_inputs();
    // cat: [n, 2H] = [enorm(embed(token_{t+1})) | hnorm(h)].
    timer_.mark("mtp embed + eh_proj", stream_);
    embed_gather(mtp_->embed, d_ids, n, H, x, stream_);
    rmsnorm(x, n, H, H, mtp_->enorm, eps, cat, 2 * H, stream_);
    if (target_hidden) {
      // The target's hidden state after model.norm (as CpuMtpLayer::run);
      // into cat, so the uploaded rows stay as they are for a graph replay.
      rmsnorm(d_hidden, n, H, H, weights_->final_norm, eps, cat + H, 2 * H, stream_);
      rmsnorm(cat + H, n, H, 2 * H, mtp_->hnorm, eps, cat + H, 2 * H, stream_);
    } else {
      rmsnorm(d_hidden, n, H, H, mtp_->hnorm, eps, cat + H, 2 * H, stream_);
    }
    blas_->linear(cat, n, 2 * H, mtp_->eh_proj, H, x);
    timer_.mark("mtp decoder layer", stream_);
    timer_.set_muted(true);  // one phase, not the target's attention/MoE phases
    Step fresh = step;
    {
      const ScopedValue<int64_t> dispatch(gathered_rows_, gathered_of(n));
      decoder_layer(mtp_->layer, layer, fresh, cache, x);
    }
    timer_.set_muted(false);
    timer_.mark("mtp head", stream_);
    // The output row of each sequence: shared_head.norm, lm_head, hand-off.
    gather_rows(x, d_last, s, H, last, stream_);
    head(last, logits);
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(hand0, normed_hand ? normed : last,
                                       static_cast<size_t>(s * H) * sizeof(float),
                                       cudaMemcpyDeviceToDevice, stream_));
    if (!shared) {
      gather_rows(step.topk, d_last, s, index_topk_, link.topk, stream_);
      gather_rows(step.counts, d_last, s, 1, link.counts, stream_);
    }
    if (chain == 0) return;
    timer_.mark("mtp greedy drafts", stream_);
    argmax_rows(logits, s, vocab, drafts, 1, stream_);
    const float* hand = hand0;
    float* link_logits = sc.link_logits.get<float>(s * vocab);
    for (int64_t j = 1; j < chain; ++j) {
      Step draft = link;
      draft.rows.positions = block + at.chain_positions + (j - 1) * s;
      draft.cos = reinterpret_cast<const float*>(block + at.chain_cos + (j - 1) * s * half);
      draft.sin = reinterpret_cast<const float*>(block + at.chain_sin + (j - 1) * s * half);
      embed_gather(mtp_->embed, drafts + (j - 1) * s, s, H, embedded, stream_);
      rmsnorm(embedded, s, H, H, mtp_->enorm, eps, cat, 2 * H, stream_);
      rmsnorm(hand, s, H, H, mtp_->hnorm, eps, cat + H, 2 * H, stream_);
      blas_->linear(cat, s, 2 * H, mtp_->eh_proj, H, x);
      timer_.set_muted(true);
      {
        const ScopedValue<int64_t> dispatch(gathered_rows_, gathered_of(s));
        decoder_layer(mtp_->layer, layer, draft, cache, x);
      }
      timer_.set_muted(false);
      head(x, link_logits);
      argmax_rows(link_logits, s, vocab, drafts + j * s, 1, stream_);
      hand = normed_hand ? normed : x;
    }
  };

  if (key) {
    graphs_mtp_.sync_epoch(scratch_epoch());
    if (cudaGraphExec_t graph = graphs_mtp_.find(*key)) {
      graphs_mtp_.launch(graph, stream_);
    } else {
      // As forward_graph: run eagerly (which sizes every scratch buffer for
      // this shape), then capture the same launches for the next runs.
      graphs_mtp_.count_eager_step();
      record();
      if (!graphs_mtp_.failed(*key)) graphs_mtp_.capture(*key, scratch_epoch(), stream_, record);
    }
  } else {
    record();
  }

  // Every output through one page-locked buffer and one synchronisation:
  // logits [real, V] when wanted, hand-off [real, H], (unshared) the output
  // rows' selections [real, top-k] and counts, drafts [chain, s].
  MtpLayer::Output output;
  const size_t logit_words = want_logits ? static_cast<size_t>(real * vocab) : 0;
  const size_t hand_words = static_cast<size_t>(real * H);
  const size_t topk_words = shared ? 0 : static_cast<size_t>(real * index_topk_);
  const size_t count_words = shared ? 0 : static_cast<size_t>(real);
  const size_t draft_words = static_cast<size_t>(chain * s);
  auto* back =
      sc.readback.get<uint32_t>(logit_words + hand_words + topk_words + count_words + draft_words);
  size_t offset = 0;
  const auto read = [&](const void* from, size_t count) {
    const size_t here = offset;
    offset += count;
    if (count > 0) {
      MEGACTX_CUDA_CHECK(
          cudaMemcpyAsync(back + here, from, count * 4, cudaMemcpyDeviceToHost, stream_));
    }
    return back + here;
  };
  const uint32_t* back_logits = read(logits, logit_words);
  const uint32_t* back_hand = read(hand0, hand_words);
  const auto* back_topk = reinterpret_cast<const int32_t*>(read(link.topk, topk_words));
  const auto* back_counts = reinterpret_cast<const int32_t*>(read(link.counts, count_words));
  const auto* back_drafts = reinterpret_cast<const int32_t*>(read(drafts, draft_words));
  timer_.mark("mtp readback", stream_);
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  timer_.collect(stream_);
  if (want_logits) {
    output.logits = Tensor::empty({real, vocab});
    std::memcpy(output.logits.raw(), back_logits, logit_words * 4);
  }
  output.hand_off = Tensor::empty({real, H});
  std::memcpy(output.hand_off.raw(), back_hand, hand_words * 4);
  output.drafts.resize(static_cast<size_t>(real));
  for (int64_t i = 0; i < real; ++i) {
    if (shared) {
      output.last_topk.emplace_back();
      output.last_count.push_back(0);
    } else {
      output.last_topk.emplace_back(back_topk + i * index_topk_, back_topk + (i + 1) * index_topk_);
      output.last_count.push_back(back_counts[i]);
    }
    for (int64_t j = 0; j < sequences[i].greedy_drafts; ++j)
      output.drafts[i].push_back(back_drafts[j * s + i]);
  }
  return output;
}

}  // namespace cuda

namespace {

// MtpLayer over a CudaDsaModel (which owns the device weights).
class CudaMtpLayer final : public MtpLayer {
 public:
  CudaMtpLayer(cuda::CudaDsaModel& model, MtpHandOff hand_off)
      : MtpLayer(model.config(), model.index_topk(), hand_off), model_(model) {}
  Output run(std::span<const Rows> sequences, PagedKvCache& cache) override {
    // A data-parallel rank's empty share of a group run (run_mtp_share).
    if (sequences.empty() && model_.expert_all_to_all()) return model_.run_mtp_no_rows();
    check_rows(sequences);
    return model_.run_mtp(sequences, cache);
  }
  // Data-parallel attention: padded to the whole run's shape where every
  // rank can replay one graph of it (CudaDsaModel::mtp_graph_key).
  Output run_share(std::span<const Rows> own, const GroupRun& whole, PagedKvCache& cache) override {
    if (!own.empty()) check_rows(own);
    return model_.run_mtp(own, cache, &whole);
  }
  bool prefers_uniform_rows() const override { return true; }

 private:
  cuda::CudaDsaModel& model_;
};

}  // namespace

std::unique_ptr<MtpLayer> make_cuda_mtp_layer(LanguageModel& model, const std::string& model_dir,
                                              bool random_weights, uint64_t seed) {
  auto* cuda_model = dynamic_cast<cuda::CudaDsaModel*>(&model);
  MEGACTX_CHECK(cuda_model != nullptr, "make_cuda_mtp_layer: not a CUDA model");
  const ModelConfig& config = cuda_model->config();
  const MtpHandOff hand_off = mtp_hand_off(config);
  if (!cuda_model->has_mtp()) {
    cuda_model->load_mtp(read_mtp_weights(config, model_dir, random_weights, seed), hand_off);
  }
  return std::make_unique<CudaMtpLayer>(*cuda_model, hand_off);
}

std::unique_ptr<MtpLayer> make_cuda_mtp_layer(LanguageModel& model, const Checkpoint& checkpoint) {
  auto* cuda_model = dynamic_cast<cuda::CudaDsaModel*>(&model);
  MEGACTX_CHECK(cuda_model != nullptr, "make_cuda_mtp_layer: not a CUDA model");
  const MtpHandOff hand_off = mtp_hand_off(cuda_model->config());
  if (!cuda_model->has_mtp()) {
    auto source = make_checkpoint_weights(checkpoint);
    cuda_model->load_mtp(load_mtp_weights(cuda_model->config(), *source), hand_off);
  }
  return std::make_unique<CudaMtpLayer>(*cuda_model, hand_off);
}

}  // namespace megactx
#endif  // MEGACTX_HAVE_CUDA
