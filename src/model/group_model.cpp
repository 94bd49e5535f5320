#include "model/group_model.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/weight_update.h"
#include "model/batch_checks.h"
#include "model/dp_attention_batch.h"
#include "model/mtp_layer.h"

namespace megactx {
namespace {

// A command from the leader: a fixed header, then `bytes` of payload, both by
// broadcast from rank 0.
enum class Command : int64_t {
  MakeCache = 1,
  Forward = 2,
  Stop = 3,
  LoadMtp = 4,
  MtpRun = 5,
  Reload = 6,
  Release = 7,
  MakeHostCache = 8,
  CopyPages = 9,
  DpForward = 10,    // data-parallel attention: the step's ranks, then its batch
  DpCopyPages = 11,  // data-parallel attention: CopyPages in the group's page numbering
  DpMtpRun = 12,     // data-parallel attention: an MTP run's ranks, then MtpRun's rows
  RankRows = 13      // data-parallel attention: RankRows::run (its collectives follow)
};

// CopyPages directions.
constexpr int64_t kCopyFromHost = 0, kCopyToHost = 1, kCopyWithin = 2;

// One broadcast per command when its payload fits `inline_words` (a decode
// step's batch of a few sequences, a sampling command's rows): the
// collectives' latency, not their bytes, is what a step pays on the CPU
// group. Larger payloads follow in a second broadcast.
struct Header {
  static constexpr size_t kInlineWords = 510;  // 4 KiB in all
  Command command = Command::Stop;
  int64_t bytes = 0;
  int64_t inline_words[kInlineWords] = {};
};

// Payloads are int64 words: every field of a KV spec or a forward batch is an
// integer.
std::vector<int64_t> encode_spec(const KvCacheSpec& spec) {
  std::vector<int64_t> words = {spec.num_pages,
                                spec.page_size,
                                spec.kv_lora_rank,
                                spec.qk_rope_head_dim,
                                spec.index_head_dim,
                                static_cast<int64_t>(spec.dtype),
                                static_cast<int64_t>(spec.device),
                                static_cast<int64_t>(spec.latent_layers.size())};
  words.insert(words.end(), spec.latent_layers.begin(), spec.latent_layers.end());
  words.push_back(static_cast<int64_t>(spec.indexer_layers.size()));
  words.insert(words.end(), spec.indexer_layers.begin(), spec.indexer_layers.end());
  words.push_back(spec.offload_pages);
  return words;
}

// Reads the words back in order; a short payload is an Error.
class Reader {
 public:
  explicit Reader(const std::vector<int64_t>& words) : words_(words) {}
  size_t size() const { return words_.size(); }
  int64_t next() {
    MEGACTX_CHECK(at_ < words_.size(), "parallel group: a truncated command from the leader");
    return words_[at_++];
  }
  template <class T>
  std::vector<T> list() {
    const int64_t count = next();
    MEGACTX_CHECK(count >= 0 && static_cast<size_t>(count) <= words_.size() - at_,
                  "parallel group: a list of {} from the leader", count);
    std::vector<T> out;
    for (int64_t i = 0; i < count; ++i) out.push_back(static_cast<T>(next()));
    return out;
  }
  // A string written by encode_text (a count, then one word per byte).
  std::string text() {
    std::string out;
    for (const int64_t c : list<int64_t>()) out.push_back(static_cast<char>(c));
    return out;
  }

 private:
  const std::vector<int64_t>& words_;
  size_t at_ = 0;
};

KvCacheSpec decode_spec(const std::vector<int64_t>& words) {
  Reader in(words);
  KvCacheSpec spec;
  spec.num_pages = in.next();
  spec.page_size = in.next();
  spec.kv_lora_rank = in.next();
  spec.qk_rope_head_dim = in.next();
  spec.index_head_dim = in.next();
  spec.dtype = static_cast<KvDType>(in.next());
  spec.device = static_cast<Device>(in.next());
  spec.latent_layers = in.list<int64_t>();
  spec.indexer_layers = in.list<int64_t>();
  spec.offload_pages = in.next();
  return spec;
}

std::vector<int64_t> encode_batch(const ForwardBatch& batch) {
  std::vector<int64_t> words = {static_cast<int64_t>(batch.sequences.size()),
                                batch.want_hidden_states, batch.want_routed_experts,
                                batch.logits_at_ranks};
  for (const SequenceInput& in : batch.sequences) {
    words.push_back(in.start_position);
    words.push_back(in.logits_from);
    words.push_back(static_cast<int64_t>(in.tokens.size()));
    words.insert(words.end(), in.tokens.begin(), in.tokens.end());
    words.push_back(static_cast<int64_t>(in.page_table.size()));
    words.insert(words.end(), in.page_table.begin(), in.page_table.end());
  }
  return words;
}

// A batch and the storage its spans point into.
struct DecodedBatch {
  ForwardBatch batch;
  std::vector<std::vector<int32_t>> tokens, pages;
};

void decode_batch(const std::vector<int64_t>& words, DecodedBatch& out) {
  Reader in(words);
  const int64_t sequences = in.next();
  MEGACTX_CHECK(sequences >= 0 && static_cast<size_t>(sequences) <= words.size(),
                "parallel group: a batch of {} sequences from the leader", sequences);
  out.batch = ForwardBatch{};
  out.batch.want_hidden_states = in.next() != 0;
  out.batch.want_routed_experts = in.next() != 0;
  out.batch.logits_at_ranks = in.next() != 0;
  out.tokens.assign(static_cast<size_t>(sequences), {});
  out.pages.assign(static_cast<size_t>(sequences), {});
  for (int64_t s = 0; s < sequences; ++s) {
    SequenceInput input;
    input.start_position = in.next();
    input.logits_from = in.next();
    out.tokens[s] = in.list<int32_t>();
    out.pages[s] = in.list<int32_t>();
    input.tokens = out.tokens[s];
    input.page_table = out.pages[s];
    out.batch.sequences.push_back(input);
  }
}

// A checkpoint folder as words (one per byte).
std::vector<int64_t> encode_text(const std::string& text) {
  std::vector<int64_t> words = {static_cast<int64_t>(text.size())};
  for (const char c : text) words.push_back(static_cast<unsigned char>(c));
  return words;
}

std::string decode_text(const std::vector<int64_t>& words) {
  Reader in(words);
  return in.text();
}

// Weights to reload: the checkpoint's folder, then (an OverlayCheckpoint: a
// trainer's tensors in front of it) every overlaid tensor's name, dtype and
// shape; their bytes follow in one broadcast, in that order.
std::vector<int64_t> encode_checkpoint(const Checkpoint& checkpoint, std::vector<uint8_t>& bytes) {
  std::vector<int64_t> words = encode_text(checkpoint.directory());
  static const std::map<std::string, Tensor> kNone;
  const auto* overlay = dynamic_cast<const OverlayCheckpoint*>(&checkpoint);
  const std::map<std::string, Tensor>& tensors =
      overlay != nullptr ? overlay->overlay().tensors() : kNone;
  words.push_back(static_cast<int64_t>(tensors.size()));
  bytes.clear();
  for (const auto& [name, tensor] : tensors) {
    const std::vector<int64_t> text = encode_text(name);
    words.insert(words.end(), text.begin(), text.end());
    words.push_back(static_cast<int64_t>(tensor.dtype()));
    words.push_back(static_cast<int64_t>(tensor.shape().size()));
    words.insert(words.end(), tensor.shape().begin(), tensor.shape().end());
    const auto* data = static_cast<const uint8_t*>(tensor.raw());
    bytes.insert(bytes.end(), data, data + tensor.nbytes());
  }
  return words;
}

// The worker's side: the folder opened here, the overlaid tensors received.
std::shared_ptr<const Checkpoint> receive_checkpoint(parallel::Communicator& group,
                                                     const std::vector<int64_t>& words) {
  Reader in(words);
  const std::string directory = in.text();
  const int64_t count = in.next();
  MEGACTX_CHECK(count >= 0 && static_cast<size_t>(count) <= words.size(),
                "parallel group: {} tensors from the leader", count);
  auto bucket = std::make_shared<TensorBucket>();
  std::vector<std::pair<std::string, Tensor>> tensors;
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    std::string name = in.text();
    const auto dtype = static_cast<DType>(in.next());
    Shape shape;
    for (const int64_t dim : in.list<int64_t>()) shape.push_back(dim);
    tensors.emplace_back(std::move(name), Tensor::empty(shape, dtype));
    total += static_cast<int64_t>(tensors.back().second.nbytes());
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(total));
  if (total > 0) group.broadcast(bytes.data(), total, 0);
  size_t at = 0;
  for (auto& [name, tensor] : tensors) {
    std::memcpy(tensor.raw(), bytes.data() + at, tensor.nbytes());
    at += tensor.nbytes();
    bucket->put(name, std::move(tensor));
  }
  std::shared_ptr<const Checkpoint> base = Checkpoint::open(directory);
  if (count == 0) return base;
  return std::make_shared<OverlayCheckpoint>(std::move(base), std::move(bucket));
}

// An MTP run's rows: their integers as words; their hidden inputs (count x H
// floats each, in sequence order) follow in a second broadcast.
std::vector<int64_t> encode_mtp_rows(std::span<const MtpLayer::Rows> sequences) {
  std::vector<int64_t> words = {static_cast<int64_t>(sequences.size())};
  const auto list = [&](auto values) {
    words.push_back(static_cast<int64_t>(values.size()));
    words.insert(words.end(), values.begin(), values.end());
  };
  for (const MtpLayer::Rows& r : sequences) {
    words.push_back(r.start);
    words.push_back(r.count);
    list(r.pages);
    list(r.next_tokens);
    words.push_back(r.target_hidden);
    words.push_back(r.shared);
    words.push_back(r.shared_context);
    list(r.shared_topk);
    words.push_back(r.shared_count);
    words.push_back(r.output_row);
    words.push_back(r.greedy_drafts);
    words.push_back(r.want_logits);
    words.push_back(r.want_argmax);
  }
  return words;
}

// Rows and the storage their spans and hidden pointers point into.
struct DecodedMtpRows {
  std::vector<MtpLayer::Rows> rows;
  std::vector<std::vector<int32_t>> pages, next_tokens, shared_topk;
  std::vector<float> hidden;  // [sum of counts, H]
};

// The integers; `hidden` is sized for the rows and their pointers set (the
// caller receives the floats into it).
void decode_mtp_rows(Reader& in, int64_t hidden_size, DecodedMtpRows& out) {
  const size_t words = in.size();
  const int64_t sequences = in.next();
  MEGACTX_CHECK(sequences >= 0 && static_cast<size_t>(sequences) <= words,
                "parallel group: an MTP run of {} sequences from the leader", sequences);
  const auto n = static_cast<size_t>(sequences);
  out.rows.assign(n, {});
  out.pages.assign(n, {});
  out.next_tokens.assign(n, {});
  out.shared_topk.assign(n, {});
  int64_t total = 0;
  for (size_t s = 0; s < n; ++s) {
    MtpLayer::Rows& r = out.rows[s];
    r.start = in.next();
    r.count = in.next();
    MEGACTX_CHECK(r.count >= 0 && r.count <= static_cast<int64_t>(words),
                  "parallel group: an MTP run of {} rows from the leader", r.count);
    out.pages[s] = in.list<int32_t>();
    out.next_tokens[s] = in.list<int32_t>();
    r.target_hidden = in.next() != 0;
    r.shared = in.next() != 0;
    r.shared_context = in.next();
    out.shared_topk[s] = in.list<int32_t>();
    r.shared_count = in.next();
    r.output_row = in.next();
    r.greedy_drafts = in.next();
    r.want_logits = in.next() != 0;
    r.want_argmax = in.next() != 0;
    r.pages = out.pages[s];
    r.next_tokens = out.next_tokens[s];
    r.shared_topk = out.shared_topk[s];
    total += r.count;
  }
  out.hidden.assign(static_cast<size_t>(total * hidden_size), 0.0f);
  int64_t row = 0;
  for (MtpLayer::Rows& r : out.rows) {
    r.hidden = out.hidden.data() + row * hidden_size;
    row += r.count;
  }
}

void decode_mtp_rows(const std::vector<int64_t>& words, int64_t hidden_size, DecodedMtpRows& out) {
  Reader in(words);
  decode_mtp_rows(in, hidden_size, out);
}

void send(parallel::Communicator& group, Command command, std::span<const int64_t> words) {
  Header header;
  header.command = command;
  header.bytes = static_cast<int64_t>(words.size_bytes());
  const bool fits = words.size() <= Header::kInlineWords;
  if (fits && !words.empty()) std::memcpy(header.inline_words, words.data(), words.size_bytes());
  group.broadcast(&header, sizeof(header), 0);
  if (!fits) group.broadcast(const_cast<int64_t*>(words.data()), header.bytes, 0);
}

// A worker's side of send: the next command, its payload in `words`.
Command receive(parallel::Communicator& group, std::vector<int64_t>& words) {
  Header header;
  group.broadcast(&header, sizeof(header), 0);
  MEGACTX_CHECK(header.bytes >= 0 && header.bytes % sizeof(int64_t) == 0,
                "parallel group: a command of {} bytes from the leader", header.bytes);
  words.assign(static_cast<size_t>(header.bytes) / sizeof(int64_t), 0);
  if (words.size() <= Header::kInlineWords) {
    std::copy_n(header.inline_words, words.size(), words.begin());
  } else {
    group.broadcast(words.data(), header.bytes, 0);
  }
  return header.command;
}

// Data-parallel attention's replicas: `shares` of `tensor` ranks each (one
// rank each without tensor parallelism), the tensor rank innermost. Every
// rank of a share computes the same rows; its tensor rank 0 reports them.
struct DpShares {
  int shares = 1;
  int tensor = 1;
  int share_of(int rank) const { return rank / tensor; }
  bool reports(int rank) const { return rank % tensor == 0; }
  int reporter(int share) const { return share * tensor; }
  // The reporting rank of each sequence, from the share of each.
  std::vector<int> reporters(const std::vector<int>& share_of_sequence) const {
    std::vector<int> out;
    out.reserve(share_of_sequence.size());
    for (const int share : share_of_sequence) out.push_back(reporter(share));
    return out;
  }
};

DpShares dp_shares(int group_size, int replicas) {
  const int shares = replicas > 0 ? replicas : group_size;
  MEGACTX_CHECK(shares >= 1 && group_size % shares == 0,
                "data-parallel attention: {} replicas do not divide a group of {}", shares,
                group_size);
  return {shares, group_size / shares};
}

// An MTP run: its rows (after `prefix`: DpMtpRun's ranks), then their hidden inputs.
void send_mtp_run(parallel::Communicator& group, std::span<const MtpLayer::Rows> sequences,
                  int64_t hidden_size, Command command = Command::MtpRun,
                  std::vector<int64_t> prefix = {}) {
  const std::vector<int64_t> rows = encode_mtp_rows(sequences);
  prefix.insert(prefix.end(), rows.begin(), rows.end());
  send(group, command, prefix);
  std::vector<float> hidden;
  for (const MtpLayer::Rows& r : sequences)
    hidden.insert(hidden.end(), r.hidden, r.hidden + r.count * hidden_size);
  if (!hidden.empty())
    group.broadcast(hidden.data(), static_cast<int64_t>(hidden.size() * sizeof(float)), 0);
}

// Data-parallel attention: this rank's share of an MTP run over `whole`
// (the sequences `ranks` gives it, page ids made local) through `mtp`, an
// empty share too (its MoE's all-to-all meets the others'), and the outputs
// gathered on rank 0 in the run's order: the logits (when a sequence wants
// them; only each row's argmax when every such sequence wants only that),
// the hand-offs and, for unshared runs, the output rows' selections.
// No greedy drafts: GroupLeaderMtp chains those, a group run per draft step.
// Called by every rank with the same `whole` and `ranks`; the result is rank 0's.
MtpLayer::Output run_mtp_share(MtpLayer& mtp, std::span<const MtpLayer::Rows> whole,
                               const std::vector<int>& shares_of, PagedKvCache& cache,
                               parallel::Communicator& group, DpShares dp) {
  const int me = dp.share_of(group.rank());
  const bool reports = dp.reports(group.rank());
  const std::vector<int> ranks = dp.reporters(shares_of);
  const RankPages layout = rank_pages(cache.spec(), dp.shares);
  std::vector<std::vector<int32_t>> pages;
  for (size_t s = 0; s < whole.size(); ++s)
    if (shares_of[s] == me) pages.emplace_back();  // sized first: the spans point into it
  std::vector<MtpLayer::Rows> own;
  for (size_t s = 0, next = 0; s < whole.size(); ++s) {
    if (shares_of[s] != me) continue;
    std::vector<int32_t>& local = pages[next++];
    for (const int32_t page : whole[s].pages) local.push_back(layout.local(page));
    MtpLayer::Rows r = whole[s];
    r.pages = local;
    r.greedy_drafts = 0;
    own.push_back(r);
  }
  MtpLayer::Output mine = mtp.run_share(own, group_run_shape(whole, shares_of), cache);
  if (!reports) {
    // Another rank of this share reports its rows.
    own.clear();
    mine = MtpLayer::Output{};
    mine.logits = Tensor::empty({0, mtp.vocab_size()});
    mine.hand_off = Tensor::empty({0, mtp.hidden_size()});
  }
  const bool logits = std::any_of(whole.begin(), whole.end(), [](const MtpLayer::Rows& r) {
    return r.want_logits && !r.want_argmax;
  });
  const bool argmax = !logits && std::any_of(whole.begin(), whole.end(),
                                             [](const MtpLayer::Rows& r) { return r.want_argmax; });
  const std::vector<int64_t> one(whole.size(), 1);
  MtpLayer::Output out;
  if (logits)
    out.logits =
        gather_sequence_rows(one, ranks, mine.logits, {mtp.vocab_size()}, DType::F32, group);
  if (argmax) {
    // Each own sequence's argmax (-1 where it wanted none), then rank 0 gets them all.
    Tensor ids = Tensor::empty({static_cast<int64_t>(own.size()), 1}, DType::I32);
    for (size_t i = 0; i < own.size(); ++i)
      ids.data<int32_t>()[i] = own[i].want_logits ? mine.argmax_of(i, mtp.vocab_size()) : -1;
    const Tensor all = gather_sequence_rows(one, ranks, ids, {1}, DType::I32, group);
    if (group.rank() == 0)
      out.argmax.assign(all.data<int32_t>(), all.data<int32_t>() + all.numel());
  }
  out.hand_off =
      gather_sequence_rows(one, ranks, mine.hand_off, {mtp.hidden_size()}, DType::F32, group);
  const auto n = whole.size();
  if (whole.empty() || whole.front().shared) {
    out.last_topk.assign(n, {});
    out.last_count.assign(n, 0);
    return out;
  }
  // Each own sequence's selection as one row: its count, then its top-k.
  const int64_t k = mtp.index_topk();
  Tensor selection = Tensor::empty({static_cast<int64_t>(own.size()), 1 + k}, DType::I32);
  for (size_t i = 0; i < own.size(); ++i) {
    MEGACTX_CHECK(static_cast<int64_t>(mine.last_topk[i].size()) == k,
                  "data-parallel attention: an MTP selection of {} entries (top-k {})",
                  mine.last_topk[i].size(), k);
    int32_t* row = selection.data<int32_t>() + static_cast<int64_t>(i) * (1 + k);
    row[0] = static_cast<int32_t>(mine.last_count[i]);
    std::copy(mine.last_topk[i].begin(), mine.last_topk[i].end(), row + 1);
  }
  const Tensor all = gather_sequence_rows(one, ranks, selection, {1 + k}, DType::I32, group);
  if (group.rank() != 0) return out;
  for (size_t s = 0; s < n; ++s) {
    const int32_t* row = all.data<int32_t>() + static_cast<int64_t>(s) * (1 + k);
    out.last_count.push_back(row[0]);
    out.last_topk.emplace_back(row + 1, row + 1 + k);
  }
  return out;
}

class GroupLeaderModel;

// Rank 0's MTP layer: every run goes to the other ranks first, whose MTP
// layers (their shares, loaded from the same checkpoint) run it in lockstep.
// The greedy drafts a run chains after step 0 are computed the same way on
// every rank (the same logits after the group's sums), so each rank runs the
// same draft steps inside its own run. With data-parallel attention each
// rank runs its own sequences' rows, and its chains would be as long as its
// own longest: the leader chains the drafts instead (greedy_drafts_on_host),
// each draft step one run of the whole group.
class GroupLeaderMtp final : public MtpLayer {
 public:
  GroupLeaderMtp(std::unique_ptr<MtpLayer> inner, const ModelConfig& config,
                 const GroupLeaderModel& leader)
      : MtpLayer(config, inner->index_topk(), inner->hand_off()),
        inner_(std::move(inner)),
        leader_(leader) {}
  Output run(std::span<const Rows> sequences, PagedKvCache& cache) override;
  bool prefers_uniform_rows() const override { return inner_->prefers_uniform_rows(); }

 private:
  std::unique_ptr<MtpLayer> inner_;
  const GroupLeaderModel& leader_;
};

// A data-parallel attention step: the rank of every sequence, then the batch
// (page ids in the group's numbering).
std::vector<int64_t> encode_dp_step(const ForwardBatch& batch, const std::vector<int>& ranks) {
  std::vector<int64_t> words = {static_cast<int64_t>(ranks.size())};
  words.insert(words.end(), ranks.begin(), ranks.end());
  const std::vector<int64_t> rest = encode_batch(batch);
  words.insert(words.end(), rest.begin(), rest.end());
  return words;
}

std::vector<int> decode_dp_step(const std::vector<int64_t>& words, int size, DecodedBatch& out) {
  Reader in(words);
  std::vector<int> ranks = in.list<int>();
  for (const int rank : ranks)
    MEGACTX_CHECK(rank >= 0 && rank < size, "parallel group: a sequence of rank {} of {}", rank,
                  size);
  decode_batch(
      std::vector<int64_t>(words.begin() + 1 + static_cast<int64_t>(ranks.size()), words.end()),
      out);
  MEGACTX_CHECK(ranks.size() == out.batch.sequences.size(),
                "parallel group: {} ranks for {} sequences", ranks.size(),
                out.batch.sequences.size());
  return ranks;
}

class GroupLeaderModel final : public LanguageModel {
 public:
  GroupLeaderModel(std::unique_ptr<LanguageModel> model, parallel::Communicator& group,
                   std::function<void(const std::string&)> on_failure, bool data_parallel,
                   int replicas)
      : model_(std::move(model)),
        group_(group),
        on_failure_(std::move(on_failure)),
        data_parallel_(data_parallel),
        dp_(dp_shares(group.size(), data_parallel ? replicas : 1)) {
    MEGACTX_CHECK(group_.rank() == 0, "the group leader is rank 0, not {}", group_.rank());
  }
  ~GroupLeaderModel() override {
    if (failed_) return;  // no worker left to stop
    try {
      send(group_, Command::Stop, {});
    } catch (const std::exception&) {
    }
  }

  const ModelConfig& config() const override { return model_->config(); }
  Device device() const override { return model_->device(); }
  int data_parallel_ranks() const override { return data_parallel_ ? dp_.shares : 1; }
  RankRows* rank_rows() override { return data_parallel_ ? &rank_rows_ : nullptr; }
  ForwardOutput forward(const ForwardBatch& batch, PagedKvCache& cache) override {
    MEGACTX_CHECK(!failed_, "the parallel group failed: {}", failure_);
    if (data_parallel_) return forward_data_parallel(batch, cache);
    return watched([&] {
      send(group_, Command::Forward, encode_batch(batch));
      return model_->forward(batch, cache);
    });
  }
  // Data-parallel attention: `spec` numbers every replica's pages, each
  // replica's cache (every rank of a share of tensor ranks) holds its
  // 1 / replicas of them: of the device pages and of the live host tier's
  // offload pages (cache/rank_pages.h).
  std::unique_ptr<PagedKvCache> make_kv_cache(const KvCacheSpec& spec) const override {
    MEGACTX_CHECK(!failed_, "the parallel group failed: {}", failure_);
    KvCacheSpec local = spec;
    if (data_parallel_) {
      MEGACTX_CHECK(spec.num_pages % dp_.shares == 0 && spec.offload_pages % dp_.shares == 0,
                    "data-parallel attention: {} KV pages and {} offload pages do not split over "
                    "{} replicas",
                    spec.num_pages, spec.offload_pages, dp_.shares);
      local.num_pages = spec.num_pages / dp_.shares;
      local.offload_pages = spec.offload_pages / dp_.shares;
      group_spec_ = spec;
    }
    return watched([&] {
      send(group_, Command::MakeCache, encode_spec(local));
      return model_->make_kv_cache(local);
    });
  }
  std::unique_ptr<PagedKvCache> make_host_kv_cache(const KvCacheSpec& spec) const override {
    MEGACTX_CHECK(!failed_, "the parallel group failed: {}", failure_);
    // Data-parallel attention: each rank's tier holds 1 / size of the pages.
    KvCacheSpec local = spec;
    if (data_parallel_) {
      MEGACTX_CHECK(spec.num_pages % dp_.shares == 0,
                    "data-parallel attention: {} host KV pages over {} replicas", spec.num_pages,
                    dp_.shares);
      local.num_pages = spec.num_pages / dp_.shares;
    }
    return watched([&] {
      send(group_, Command::MakeHostCache, encode_spec(local));
      std::unique_ptr<PagedKvCache> host = model_->make_host_kv_cache(local);
      host_cache_ = host.get();
      return host;
    });
  }
  // The host tier's page copies (prefix-cache evictions to host memory and
  // hits copied back) and the live host tier's moves to offload pages run on
  // every rank: each holds its own copy of the pages (MLA's latent cache is
  // whole on every rank), so the workers repeat each copy between their
  // device cache and their host cache. With data-parallel attention each
  // rank copies only the pairs of its own pages instead.
  KvPageCopy kv_page_copy() const override {
    return [this, inner = model_->kv_page_copy()](
               const PagedKvCache& from, std::span<const int32_t> from_pages, PagedKvCache& to,
               std::span<const int32_t> to_pages) {
      MEGACTX_CHECK(!failed_, "the parallel group failed: {}", failure_);
      // Device cache -> host tier, back, or within the device cache (the
      // live host tier's moves to offload pages).
      const bool within = &from == &to;
      const bool to_host = &to == host_cache_;
      MEGACTX_CHECK(within || (host_cache_ != nullptr && to_host != (&from == host_cache_)),
                    "parallel group: a KV page copy that is not between the device cache and "
                    "the host tier");
      const int64_t direction = within ? kCopyWithin : to_host ? kCopyToHost : kCopyFromHost;
      std::vector<int64_t> words = {direction, static_cast<int64_t>(from_pages.size())};
      words.insert(words.end(), from_pages.begin(), from_pages.end());
      words.push_back(static_cast<int64_t>(to_pages.size()));
      words.insert(words.end(), to_pages.begin(), to_pages.end());
      if (!data_parallel_) {
        watched([&] { send(group_, Command::CopyPages, words); });
        inner(from, from_pages, to, to_pages);
        return;
      }
      // Data-parallel attention: every pair on one rank (checked for all of
      // them here, before any rank copies), each rank copying its own (a
      // move to offload pages: its device page to its offload page).
      const RankPagePairs own =
          rank_page_pairs(from_pages, to_pages, rank_pages(from.spec(), dp_.shares),
                          rank_pages(to.spec(), dp_.shares), 0);
      watched([&] { send(group_, Command::DpCopyPages, words); });
      inner(from, own.from, to, own.to);
    };
  }
  std::unique_ptr<MtpLayer> load_mtp_layer(const Checkpoint& checkpoint) override {
    MEGACTX_CHECK(!failed_, "the parallel group failed: {}", failure_);
    return watched([&]() -> std::unique_ptr<MtpLayer> {
      send(group_, Command::LoadMtp, encode_text(checkpoint.directory()));
      return std::make_unique<GroupLeaderMtp>(model_->load_mtp_layer(checkpoint), model_->config(),
                                              *this);
    });
  }
  std::vector<KvCacheSpec> kv_cache_shares(const KvCacheSpec& whole) const override {
    return model_->kv_cache_shares(whole);  // every rank's plan names every rank's layers
  }
  MtpLayer::Output run_mtp(MtpLayer& inner, std::span<const MtpLayer::Rows> sequences,
                           PagedKvCache& cache) const {
    MEGACTX_CHECK(!failed_, "the parallel group failed: {}", failure_);
    return watched([&] {
      send_mtp_run(group_, sequences, model_->config().hidden_size);
      return inner.run(sequences, cache);
    });
  }
  bool data_parallel() const { return data_parallel_; }
  // Data-parallel attention: every rank runs its own sequences' rows (none:
  // still the run, for the MoE's all-to-all) and rank 0 gets the outputs.
  // Every check a rank's run could fail is made here on the whole run first,
  // so that no rank refuses its share after others entered the collectives.
  MtpLayer::Output run_mtp_data_parallel(MtpLayer& inner, std::span<const MtpLayer::Rows> sequences,
                                         PagedKvCache& cache) const {
    MEGACTX_CHECK(!failed_, "the parallel group failed: {}", failure_);
    const RankPages layout = rank_pages(cache.spec(), dp_.shares);
    const int64_t page_size = cache.spec().page_size;
    MEGACTX_CHECK(group_spec_.num_pages == layout.device_pages() &&
                      group_spec_.total_pages() == layout.total(),
                  "data-parallel attention: an MTP run with a cache the group did not make");
    std::vector<int64_t> words = {static_cast<int64_t>(sequences.size())};
    std::vector<int> ranks;
    for (size_t s = 0; s < sequences.size(); ++s) {
      const MtpLayer::Rows& r = sequences[s];
      ranks.push_back(page_table_rank(r.pages, layout, s));
      words.push_back(ranks.back());
      MEGACTX_CHECK(r.shared == sequences.front().shared,
                    "MTP: a run mixes shared and unshared sequences");
      const int64_t last = r.shared ? r.shared_context : r.start + r.count;
      MEGACTX_CHECK(r.start >= 0 && static_cast<int64_t>(r.pages.size()) * page_size >= last,
                    "MTP: {} pages do not cover {} positions", r.pages.size(), last);
      MEGACTX_CHECK(
          !r.shared || (static_cast<int64_t>(r.shared_topk.size()) == inner.index_topk() &&
                        r.shared_count > 0 && r.shared_count <= r.shared_context),
          "MTP: a shared selection of {} entries, {} valid (top-k {})", r.shared_topk.size(),
          r.shared_count, inner.index_topk());
    }
    return watched([&] {
      send_mtp_run(group_, sequences, model_->config().hidden_size, Command::DpMtpRun, words);
      return run_mtp_share(inner, sequences, ranks, cache, group_, dp_);
    });
  }
  // The leader's share first (every check of the update runs there: a
  // refused one changes nothing on any rank), then the workers'.
  void reload_weights(const Checkpoint& checkpoint) override {
    MEGACTX_CHECK(!failed_, "the parallel group failed: {}", failure_);
    model_->reload_weights(checkpoint);
    watched([&] {
      std::vector<uint8_t> bytes;
      send(group_, Command::Reload, encode_checkpoint(checkpoint, bytes));
      if (!bytes.empty()) group_.broadcast(bytes.data(), static_cast<int64_t>(bytes.size()), 0);
    });
  }
  void final_norm(const float* x, int64_t rows, float* out) const override {
    model_->final_norm(x, rows, out);  // the final norm is whole on every rank
  }
  void release_weights() override {
    MEGACTX_CHECK(!failed_, "the parallel group failed: {}", failure_);
    watched([&] { send(group_, Command::Release, {}); });
    model_->release_weights();
  }
  Tensor to_host(const Tensor& tensor) const override { return model_->to_host(tensor); }
  void* compute_stream() const override { return model_->compute_stream(); }
  // The leader's share (every rank stages the same selections of its heads;
  // with data-parallel attention rank 0's own requests only, but only the
  // CUDA model counts these reads and its group is tensor-parallel only).
  OffloadReadStats offload_read_stats() const override { return model_->offload_read_stats(); }
  CudaGraphStats graph_stats(bool mtp) const override { return model_->graph_stats(mtp); }

 private:
  // Every rank forwards its own sequences (none: still every collective),
  // and rank 0 gets the outputs in the batch's order. The whole batch is
  // checked here first, so that no rank refuses its share after others
  // entered the forward's collectives.
  ForwardOutput forward_data_parallel(const ForwardBatch& batch, PagedKvCache& cache) {
    const RankPages layout = rank_pages(cache.spec(), dp_.shares);
    MEGACTX_CHECK(group_spec_.num_pages == layout.device_pages() &&
                      group_spec_.total_pages() == layout.total(),
                  "data-parallel attention: a forward with a cache the group did not make");
    // In the group's numbering every device page is below every offload
    // page, so this also refuses new tokens on any rank's offload pages.
    check_sequence_inputs(batch, group_spec_, model_->config().vocab_size);
    const std::vector<int> ranks = sequence_ranks(batch, layout);
    return watched([&] {
      send(group_, Command::DpForward, encode_dp_step(batch, ranks));
      rank_share(batch, ranks, 0, layout, share_);
      ForwardOutput own = model_->forward(share_.batch, cache);
      if (!batch.logits_at_ranks) own.logits = model_->to_host(own.logits);
      ForwardOutput out =
          gather_to_leader(batch, dp_.reporters(ranks), own, model_->config(), group_);
      if (batch.logits_at_ranks) {
        out.logits = std::move(own.logits);  // rank 0 reports its share's rows
        for (size_t s = 0; s < ranks.size(); ++s)
          out.logits_ranks.insert(out.logits_ranks.end(),
                                  static_cast<size_t>(batch.sequences[s].logits_rows()), ranks[s]);
      }
      return out;
    });
  }

  // RankRows over the leader's group.
  class LeaderRankRows final : public RankRows {
   public:
    explicit LeaderRankRows(GroupLeaderModel& leader) : leader_(leader) {}
    void run(std::span<const int64_t> command,
             const std::function<void(parallel::Communicator&)>& body) override {
      MEGACTX_CHECK(!leader_.failed_, "the parallel group failed: {}", leader_.failure_);
      leader_.watched([&] {
        send(leader_.group_, Command::RankRows, command);
        body(leader_.group_);
      });
    }
    int holder(int share) const override { return leader_.dp_.reporter(share); }

   private:
    GroupLeaderModel& leader_;
  };

  // Runs `body`; an error of the group's collectives (their messages start
  // with "communicator") marks the group failed and is reported once.
  template <class Body>
  auto watched(Body&& body) const -> decltype(body()) {
    try {
      return body();
    } catch (const megactx::Error& error) {
      const std::string what = error.what();
      if (what.rfind("communicator", 0) == 0 && !failed_) {
        failed_ = true;
        failure_ = what;
        if (on_failure_) on_failure_(what);
      }
      throw;
    }
  }

  std::unique_ptr<LanguageModel> model_;
  parallel::Communicator& group_;
  std::function<void(const std::string&)> on_failure_;
  mutable const PagedKvCache* host_cache_ = nullptr;  // the host tier's pages (the engine's)
  bool data_parallel_ = false;
  DpShares dp_;                     // data-parallel attention's replicas
  mutable KvCacheSpec group_spec_;  // data-parallel attention: every rank's pages
  RankBatch share_;                 // rank 0's share of the step (buffers reused)
  LeaderRankRows rank_rows_{*this};
  mutable bool failed_ = false;
  mutable std::string failure_;
};

MtpLayer::Output GroupLeaderMtp::run(std::span<const Rows> sequences, PagedKvCache& cache) {
  if (!leader_.data_parallel()) return leader_.run_mtp(*inner_, sequences, cache);
  check_rows(sequences);
  const bool chained = std::any_of(sequences.begin(), sequences.end(),
                                   [](const Rows& r) { return r.greedy_drafts > 0; });
  if (!chained) {
    Output out = leader_.run_mtp_data_parallel(*inner_, sequences, cache);
    out.drafts.assign(sequences.size(), {});  // as a layer's own run gives them: none each
    return out;
  }
  // Step 0 with the logits the first drafts are taken from, then each draft
  // step a run of the group (this->run), as long as the longest chain.
  std::vector<Rows> first(sequences.begin(), sequences.end());
  for (Rows& r : first) {
    if (r.greedy_drafts > 0) {
      // d_1 is the argmax of this row: only the id comes back, unless the
      // caller reads the logits too.
      if (!r.want_logits) r.want_argmax = true;
      r.want_logits = true;
    }
    r.greedy_drafts = 0;
  }
  Output out = leader_.run_mtp_data_parallel(*inner_, first, cache);
  greedy_drafts_on_host(sequences, cache, out);
  return out;
}

}  // namespace

std::unique_ptr<LanguageModel> make_group_leader(std::unique_ptr<LanguageModel> model,
                                                 parallel::Communicator& group,
                                                 std::function<void(const std::string&)> on_failure,
                                                 bool data_parallel_attention,
                                                 int data_parallel_size) {
  return std::make_unique<GroupLeaderModel>(std::move(model), group, std::move(on_failure),
                                            data_parallel_attention, data_parallel_size);
}

void run_group_worker(LanguageModel& model, parallel::Communicator& group, int data_parallel_size,
                      RankRowsHandler rank_rows) {
  MEGACTX_CHECK(group.rank() != 0, "rank 0 leads the group; it does not run a worker");
  const DpShares dp = dp_shares(group.size(), data_parallel_size);
  std::unique_ptr<PagedKvCache> cache;
  std::unique_ptr<PagedKvCache> host_cache;  // the host tier's pages
  const KvPageCopy copy = model.kv_page_copy();
  std::unique_ptr<MtpLayer> mtp;
  std::shared_ptr<const Checkpoint> weights;  // the last reload's (null: as loaded)
  std::vector<int64_t> words;
  DecodedBatch batch;
  DecodedMtpRows mtp_rows;
  RankBatch share;
  // The logits of this rank's rows that the last forward left here
  // (ForwardBatch::logits_at_ranks; [0, vocab] when it reports none).
  Tensor kept_logits = no_rows_output(model.config()).logits;
  for (;;) {
    const Command command = receive(group, words);
    switch (command) {
      case Command::Stop:
        return;
      case Command::MakeCache:
        cache.reset();  // the leader's engine holds one cache at a time
        cache = model.make_kv_cache(decode_spec(words));
        break;
      case Command::Forward:
        MEGACTX_CHECK(cache != nullptr, "parallel group: a forward before the KV cache");
        decode_batch(words, batch);
        try {
          model.forward(batch.batch, *cache);
        } catch (const megactx::Error&) {
          // The leader ran the same checks on the same batch and failed at
          // the same point (after the same collectives): the group stays in step.
        }
        break;
      case Command::DpForward: {
        MEGACTX_CHECK(cache != nullptr, "parallel group: a forward before the KV cache");
        const std::vector<int> ranks = decode_dp_step(words, dp.shares, batch);
        rank_share(batch.batch, ranks, dp.share_of(group.rank()),
                   rank_pages(cache->spec(), dp.shares), share);
        ForwardOutput own;
        kept_logits = no_rows_output(model.config()).logits;
        try {
          own = model.forward(share.batch, *cache);
        } catch (const megactx::Error&) {
          break;  // as for Forward: the leader failed at the same point
        }
        // Another rank of this share reports its rows.
        if (!dp.reports(group.rank())) own = no_rows_output(model.config());
        if (batch.batch.logits_at_ranks) {
          kept_logits = std::move(own.logits);
          own.logits = Tensor();
        } else {
          own.logits = model.to_host(own.logits);
        }
        gather_to_leader(batch.batch, dp.reporters(ranks), own, model.config(), group);
        break;
      }
      case Command::RankRows:
        // Without a handler this rank cannot make the leader's collectives:
        // ending the worker fails the group at once instead of a hang.
        MEGACTX_CHECK(rank_rows != nullptr,
                      "parallel group: rank {} has no way to sample its own rows", group.rank());
        rank_rows(kept_logits, words, group);
        break;
      case Command::LoadMtp: {
        // The MTP layer of the weights the leader holds: the last reload's
        // (a trainer's tensors included), else the folder's.
        const std::string directory = decode_text(words);
        mtp.reset();
        mtp = weights != nullptr && weights->directory() == directory
                  ? model.load_mtp_layer(*weights)
                  : model.load_mtp_layer(directory);
        break;
      }
      case Command::Reload:
        // The leader reloaded its share of these weights: a failure here
        // leaves the ranks apart, so it ends the worker (and the group).
        weights = receive_checkpoint(group, words);
        model.reload_weights(*weights);
        break;
      case Command::MakeHostCache:
        host_cache.reset();
        host_cache = model.make_host_kv_cache(decode_spec(words));
        break;
      case Command::CopyPages: {
        Reader in(words);
        const int64_t direction = in.next();
        const std::vector<int32_t> from = in.list<int32_t>(), to = in.list<int32_t>();
        MEGACTX_CHECK(cache != nullptr && (direction == kCopyWithin || host_cache != nullptr),
                      "parallel group: a KV page copy before the caches");
        if (direction == kCopyWithin) {
          copy(*cache, from, *cache, to);
        } else if (direction == kCopyToHost) {
          copy(*cache, from, *host_cache, to);
        } else {
          copy(*host_cache, from, *cache, to);
        }
        break;
      }
      case Command::DpCopyPages: {
        Reader in(words);
        const int64_t direction = in.next();
        const std::vector<int32_t> from = in.list<int32_t>(), to = in.list<int32_t>();
        MEGACTX_CHECK(cache != nullptr && (direction == kCopyWithin || host_cache != nullptr),
                      "parallel group: a KV page copy before the caches");
        // Within: the live host tier's moves of device pages to offload pages.
        PagedKvCache& source = direction == kCopyFromHost ? *host_cache : *cache;
        PagedKvCache& target = direction == kCopyToHost ? *host_cache : *cache;
        const RankPagePairs own =
            rank_page_pairs(from, to, rank_pages(source.spec(), dp.shares),
                            rank_pages(target.spec(), dp.shares), dp.share_of(group.rank()));
        copy(source, own.from, target, own.to);
        break;
      }
      case Command::Release:
        mtp.reset();
        model.release_weights();
        break;
      case Command::DpMtpRun: {
        Reader in(words);
        const std::vector<int> ranks = in.list<int>();
        decode_mtp_rows(in, model.config().hidden_size, mtp_rows);
        if (!mtp_rows.hidden.empty())
          group.broadcast(mtp_rows.hidden.data(),
                          static_cast<int64_t>(mtp_rows.hidden.size() * sizeof(float)), 0);
        MEGACTX_CHECK(cache != nullptr && mtp != nullptr,
                      "parallel group: an MTP run before the KV cache or the MTP layer");
        MEGACTX_CHECK(ranks.size() == mtp_rows.rows.size() &&
                          std::all_of(ranks.begin(), ranks.end(),
                                      [&](int r) { return r >= 0 && r < dp.shares; }),
                      "parallel group: an MTP run's ranks do not match its sequences");
        // Not caught: the leader checked every sequence before sending, so a
        // failure here would leave it waiting for this rank's outputs; ending
        // the worker fails the group at once instead.
        run_mtp_share(*mtp, mtp_rows.rows, ranks, *cache, group, dp);
        break;
      }
      case Command::MtpRun: {
        decode_mtp_rows(words, model.config().hidden_size, mtp_rows);
        if (!mtp_rows.hidden.empty())
          group.broadcast(mtp_rows.hidden.data(),
                          static_cast<int64_t>(mtp_rows.hidden.size() * sizeof(float)), 0);
        MEGACTX_CHECK(cache != nullptr && mtp != nullptr,
                      "parallel group: an MTP run before the KV cache or the MTP layer");
        try {
          mtp->run(mtp_rows.rows, *cache);
        } catch (const megactx::Error&) {
          // As for a forward: the leader failed at the same point.
        }
        break;
      }
      default:
        fail("parallel group: unknown command {} from the leader", static_cast<int64_t>(command));
    }
  }
}

}  // namespace megactx
