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
// through step 0's top-k positions. The inputs come from the host and the
// outputs go back to it (the drafter picks drafts on the host); the decoder
// layer itself is the target's code path (decoder_layer), so the fp32 mode
// matches the CPU MTP layer to fp32 rounding.
#if MEGACTX_HAVE_CUDA
#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/dense/dense_ops.h"
#include "model/batch_checks.h"
#include "model/cuda_dsa_model.h"

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
  mtp->layer = weights_->upload_layer(host.layer);
  mtp->hand_off = hand_off;
  mtp_ = std::move(mtp);
}

MtpLayer::Output CudaDsaModel::run_mtp(std::span<const MtpLayer::Rows> sequences,
                                       PagedKvCache& cache) {
  MEGACTX_CHECK(mtp_ != nullptr, "CUDA model: no MTP layer loaded (load_mtp)");
  MEGACTX_CHECK(!sequences.empty(), "MTP: no sequences");
  const KvCacheSpec& spec = cache.spec();
  const int64_t layer = config_.num_hidden_layers;
  MEGACTX_CHECK(spec.device == Device::CUDA && cache.has_latent(layer) && cache.has_indexer(layer),
                "MTP: the device KV cache has no pools for the MTP layer {} "
                "(make_kv_cache_spec with_mtp_layer)",
                layer);
  const bool shared = sequences.front().shared;
  const bool target_hidden = sequences.front().target_hidden;
  for (const MtpLayer::Rows& r : sequences) {
    MEGACTX_CHECK(r.shared == shared && r.target_hidden == target_hidden,
                  "MTP on CUDA: one run is all step 0 or all draft steps");
    const int64_t pages = (r.start + r.count + spec.page_size - 1) / spec.page_size;
    MEGACTX_CHECK(r.start >= 0 && static_cast<int64_t>(r.pages.size()) >= pages,
                  "MTP: rows [{}, {}) need {} pages, {} given", r.start, r.start + r.count, pages,
                  r.pages.size());
    for (int64_t p = 0; p < pages; ++p) {
      MEGACTX_CHECK(r.pages[p] >= 0 && r.pages[p] < spec.num_pages,
                    "MTP: page id {} outside the pool of {}", r.pages[p], spec.num_pages);
    }
  }
  const int64_t H = config_.hidden_size;
  const int64_t vocab = config_.vocab_size;
  const float eps = plan_.rms_norm_eps;
  MtpScratch& sc = mtp_scratch_;
  bool one_row_each = true;
  for (const MtpLayer::Rows& r : sequences) one_row_each &= r.count == 1;
  timer_.begin_forward(one_row_each);  // MEGACTX_CUDA_PHASE_TIMES: "mtp ..." phases
  timer_.mark("mtp host prep + upload", stream_);

  // Host bookkeeping, as forward(): tokens, positions, paging, RoPE, hidden
  // rows, the last row of each sequence and (shared) the step-0 selections.
  std::vector<int32_t> ids, positions, table_offset, page_tables, last_rows, topk, counts;
  std::vector<int64_t> positions64;
  std::vector<float> hidden;
  Step step;
  step.shared = shared;
  int64_t n = 0;
  for (const MtpLayer::Rows& r : sequences) {
    const int32_t table = static_cast<int32_t>(page_tables.size());
    const int64_t pages = (r.start + r.count + spec.page_size - 1) / spec.page_size;
    page_tables.insert(page_tables.end(), r.pages.begin(), r.pages.begin() + pages);
    hidden.insert(hidden.end(), r.hidden, r.hidden + r.count * H);
    for (int64_t i = 0; i < r.count; ++i) {
      ids.push_back(r.next_tokens[i]);
      positions.push_back(static_cast<int32_t>(r.start + i));
      positions64.push_back(r.start + i);
      table_offset.push_back(table);
      if (shared) {
        for (int64_t j = 0; j < index_topk_; ++j)
          topk.push_back(j < r.shared_count ? r.shared_topk[j] : -1);
        counts.push_back(static_cast<int32_t>(r.shared_count));
      }
    }
    n += r.count;
    last_rows.push_back(static_cast<int32_t>(n - 1));
    step.max_context = std::max(step.max_context, r.start + r.count);
  }
  step.tokens = n;
  const int64_t half = config_.qk_rope_head_dim / 2;
  std::vector<float> cos(static_cast<size_t>(n * half)), sin(cos.size());
  rope_.fill(positions64.data(), n, cos.data(), sin.data());
  const CacheDType dtype = spec.dtype == KvDType::F32    ? CacheDType::F32
                           : spec.dtype == KvDType::BF16 ? CacheDType::BF16
                                                         : CacheDType::FP8;
  step.latent = {dtype, spec.kv_lora_rank + spec.qk_rope_head_dim, spec.kv_lora_rank};
  step.indexer = {dtype, spec.index_head_dim, spec.index_head_dim};
  step.rows.page_size = spec.page_size;
  // Every input in one page-locked staging buffer and one copy (4-byte words).
  std::vector<std::pair<const void*, size_t>> parts = {{page_tables.data(), page_tables.size()},
                                                       {table_offset.data(), table_offset.size()},
                                                       {positions.data(), positions.size()},
                                                       {cos.data(), cos.size()},
                                                       {sin.data(), sin.size()},
                                                       {topk.data(), topk.size()},
                                                       {counts.data(), counts.size()},
                                                       {ids.data(), ids.size()},
                                                       {last_rows.data(), last_rows.size()},
                                                       {hidden.data(), hidden.size()}};
  size_t words = 0;
  for (const auto& part : parts) words += part.second;
  auto* staged = sc.staging.get<uint32_t>(words);
  auto* device = sc.inputs.get<uint32_t>(static_cast<int64_t>(words));
  std::vector<uint32_t*> at;
  size_t offset = 0;
  for (const auto& [data, count] : parts) {
    if (count > 0) std::memcpy(staged + offset, data, count * 4);
    at.push_back(device + offset);
    offset += count;
  }
  MEGACTX_CUDA_CHECK(cudaMemcpyAsync(device, staged, words * 4, cudaMemcpyHostToDevice, stream_));
  step.rows.page_tables = reinterpret_cast<const int32_t*>(at[0]);
  step.rows.table_offset = reinterpret_cast<const int32_t*>(at[1]);
  step.rows.positions = reinterpret_cast<const int32_t*>(at[2]);
  step.cos = reinterpret_cast<const float*>(at[3]);
  step.sin = reinterpret_cast<const float*>(at[4]);
  // Shared: the caller's selection (uploaded); else the indexer writes them.
  step.topk = shared ? reinterpret_cast<int32_t*>(at[5]) : sc.topk.get<int32_t>(n * index_topk_);
  step.counts = shared ? reinterpret_cast<int32_t*>(at[6]) : sc.counts.get<int32_t>(n);
  const int32_t* d_ids = reinterpret_cast<const int32_t*>(at[7]);
  const int32_t* d_last = reinterpret_cast<const int32_t*>(at[8]);
  float* d_hidden = reinterpret_cast<float*>(at[9]);

  // cat: [n, 2H] = [enorm(embed(token_{t+1})) | hnorm(h)].
  float* cat = sc.cat.get<float>(n * 2 * H);
  float* x = sc.x.get<float>(n * H);
  timer_.mark("mtp embed + eh_proj", stream_);
  embed_gather(mtp_->embed, d_ids, n, H, x, stream_);
  rmsnorm(x, n, H, H, mtp_->enorm, eps, cat, 2 * H, stream_);
  if (target_hidden) {
    // The target's hidden state after model.norm (as CpuMtpLayer::run).
    rmsnorm(d_hidden, n, H, H, weights_->final_norm, eps, d_hidden, H, stream_);
  }
  rmsnorm(d_hidden, n, H, H, mtp_->hnorm, eps, cat + H, 2 * H, stream_);
  blas_->linear(cat, n, 2 * H, mtp_->eh_proj, H, x);
  timer_.mark("mtp decoder layer", stream_);
  timer_.set_muted(true);  // one phase, not the target's attention/MoE phases
  decoder_layer(mtp_->layer, layer, step, cache, x);
  timer_.set_muted(false);
  timer_.mark("mtp head", stream_);

  // Last row of each sequence: shared_head.norm, lm_head, hand-off.
  const int64_t s = static_cast<int64_t>(sequences.size());
  float* last = sc.last.get<float>(s * H);
  float* normed = sc.normed.get<float>(s * H);
  float* logits = sc.logits.get<float>(s * vocab);
  gather_rows(x, d_last, s, H, last, stream_);
  rmsnorm(last, s, H, H, mtp_->head_norm, eps, normed, H, stream_);
  blas_->linear(normed, s, H, mtp_->lm_head, vocab, logits);

  // Every output through one page-locked buffer and one synchronisation:
  // logits [s, V], hand-off [s, H], and (unshared) the selections of all rows.
  MtpLayer::Output output;
  output.logits = Tensor::empty({s, vocab});
  output.hand_off = Tensor::empty({s, H});
  const float* hand = mtp_->hand_off == MtpHandOff::NormedOutput ? normed : last;
  const size_t logit_words = static_cast<size_t>(s * vocab),
               hand_words = static_cast<size_t>(s * H);
  const size_t topk_words = shared ? 0 : static_cast<size_t>(n * index_topk_);
  const size_t count_words = shared ? 0 : static_cast<size_t>(n);
  auto* back = sc.readback.get<uint32_t>(logit_words + hand_words + topk_words + count_words);
  const auto read = [&](size_t at, const void* from, size_t count) {
    if (count == 0) return;
    MEGACTX_CUDA_CHECK(
        cudaMemcpyAsync(back + at, from, count * 4, cudaMemcpyDeviceToHost, stream_));
  };
  read(0, logits, logit_words);
  read(logit_words, hand, hand_words);
  read(logit_words + hand_words, step.topk, topk_words);
  read(logit_words + hand_words + topk_words, step.counts, count_words);
  timer_.mark("mtp readback", stream_);
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  timer_.collect(stream_);
  std::memcpy(output.logits.raw(), back, logit_words * 4);
  std::memcpy(output.hand_off.raw(), back + logit_words, hand_words * 4);
  const auto* all_topk = reinterpret_cast<const int32_t*>(back + logit_words + hand_words);
  const int32_t* all_counts = all_topk + topk_words;
  for (int64_t i = 0; i < s; ++i) {
    if (shared) {
      output.last_topk.emplace_back();
      output.last_count.push_back(0);
      continue;
    }
    const int64_t row = last_rows[i];
    const int32_t* first = all_topk + row * index_topk_;
    output.last_topk.emplace_back(first, first + index_topk_);
    output.last_count.push_back(all_counts[row]);
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
    check_rows(sequences);
    return model_.run_mtp(sequences, cache);
  }

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
