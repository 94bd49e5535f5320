// One model served by a group of processes (tensor and expert parallelism,
// model_plan.h): rank 0 runs the engine, and its model is the group leader,
// which sends every KV-cache creation and every forward to the other ranks
// before running its own share; ranks 1.. run run_group_worker, which repeats
// the leader's calls on their shares in lockstep (the collectives inside the
// forward then match). The scheduler, the KV page allocator and the sampler
// exist on rank 0 only: a worker's cache is laid out by the leader's page
// tables, and after the group's sums every rank has the same logits.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "model/language_model.h"
#include "parallel/communicator.h"

namespace megactx {

// Rows that stay with their ranks (data-parallel attention): after a forward
// with ForwardBatch::logits_at_ranks, each share's reporting rank holds its
// rows' logits, and the leader's engine samples them there
// (engine/rank_sampler.h) rather than gathering [rows, vocab] on rank 0 (at
// GLM-5.2's 154,880-token vocabulary 0.6 MiB a row against a few bytes of
// result).
class RankRows {
 public:
  virtual ~RankRows() = default;
  // Sends `command` (the command's payload, every worker gets all of it),
  // then runs `body` on rank 0 while every worker runs its RankRowsHandler
  // on the logits it kept from the last forward and the payload: the two
  // make the same collectives over `group` (the whole group, every rank).
  // An error of those collectives fails the group as a forward's would.
  virtual void run(std::span<const int64_t> command,
                   const std::function<void(parallel::Communicator& group)>& body) = 0;
  // The group rank that holds data-parallel rank `share`'s rows (its tensor
  // rank 0).
  virtual int holder(int share) const = 0;
};

// A worker's side of RankRows::run: `own_logits` [its rows, vocab] (on the
// model's device; [0, vocab] on a rank that holds none) of the last forward,
// and the command's payload.
using RankRowsHandler = std::function<void(
    const Tensor& own_logits, std::span<const int64_t> command, parallel::Communicator& group)>;

// Wraps rank 0's model (built with `group`; the group outlives the wrapper).
// MTP layers it loads are wrapped too: each run goes to the other ranks,
// which load the same checkpoint's MTP layer (their shares) when rank 0 does.
// Weight updates reach every rank (the folder, and a trainer's tensors sent
// over the group), and so do releases and the host KV tier's page copies. Destroying it stops the
// workers. When the group fails (a worker exited: its connections closed) the call fails with
// megactx::Error and `on_failure` (if set) runs once with the reason: the
// group cannot serve any more, so a server shuts down.
// `data_parallel_attention` (the ranks' models built with it): every rank
// holds its own requests' KV pages (data_parallel_ranks() = the group's size,
// each rank's cache 1 / size of the engine's pages), and each forward sends
// every rank its own sequences (model/dp_attention_batch.h); a rank with none
// still runs the forward's collectives, and rank 0 gets every row's output
// (the logits rows only without ForwardBatch::logits_at_ranks: rank_rows()).
// `data_parallel_size` replicas of the attention (0: one per rank); fewer
// than the group's ranks: shares of tensor-parallel ranks (the tensor rank
// innermost), each share's ranks computing its requests together and its
// tensor rank 0 reporting their outputs.
std::unique_ptr<LanguageModel> make_group_leader(
    std::unique_ptr<LanguageModel> model, parallel::Communicator& group,
    std::function<void(const std::string&)> on_failure = {}, bool data_parallel_attention = false,
    int data_parallel_size = 0);

// Ranks 1..: repeats the leader's calls on `model` (built with `group`) until
// the leader stops (returns) or the group fails (megactx::Error);
// `data_parallel_size` as the leader's. `rank_rows` answers RankRows::run
// (none: the leader must not call it; a worker asked anyway ends the group).
void run_group_worker(LanguageModel& model, parallel::Communicator& group,
                      int data_parallel_size = 0, RankRowsHandler rank_rows = {});

}  // namespace megactx
