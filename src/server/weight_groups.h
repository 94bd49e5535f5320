// The torch helpers (io/torch_helper.h) behind SGLang's two torch-format
// weight transports. The trainers' torch.distributed groups this server
// joined for NCCL weight updates: /init_weights_update_group makes the
// server's ranks members (one helper per rank of the serving group, ranks
// rank_offset .. rank_offset + ranks - 1), /update_weights_from_distributed
// receives one bucket of broadcast tensors through them,
// /destroy_weights_update_group leaves. And one reader, started at the first
// /update_weights_from_tensor, that opens its pickled tensors. Joining and
// receiving block until the trainer takes part, so all of it runs on a thread
// of its own (one call at a time), never on the HTTP or control threads.
#pragma once

#include <boost/asio/thread_pool.hpp>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "io/torch_helper.h"
#include "io/weight_update.h"

namespace megactx::server {

struct WeightGroupSettings {
  std::string python = "python3";  // serve --weight-update-python
  double timeout_s = 600;          // serve --weight-update-timeout
  int ranks = 1;                   // the serving group's processes: the ranks SGLang counts
  bool cuda = false;               // members receive on GPUs (device_ordinal + rank)
  int device_ordinal = 0;
};

struct WeightGroupJoin {
  std::string group_name;
  std::string master_address;
  int master_port = 0;
  int rank_offset = 0;
  int world_size = 0;
  std::string backend;
};

class WeightGroups {
 public:
  explicit WeightGroups(WeightGroupSettings settings);
  ~WeightGroups();  // leaves every group (its members are killed if they hang)

  const WeightGroupSettings& settings() const { return settings_; }

  // Checks that run before anything starts (ApiError 400 naming the field).
  void check_join(const WeightGroupJoin& join) const;
  void check_known(const std::string& group_name) const;

  // Each runs on the groups' thread and reports through `done`: an empty
  // string on success, else the error. `join` forms the group (members start,
  // rendezvous with the trainer); `receive` fills `bucket` with the broadcast
  // of `tensors` (a member lost on the way takes its group with it);
  // `destroy` leaves.
  void join(WeightGroupJoin join, std::function<void(const std::string&)> done);
  void receive(std::string group_name, std::vector<AnnouncedTensor> tensors, bool flattened,
               std::function<void(const std::string& error, std::shared_ptr<TensorBucket>)> done);
  void destroy(std::string group_name, std::function<void(const std::string&)> done);
  // Opens one /update_weights_from_tensor payload (TorchHelper::read) on the
  // reader, started (or restarted, if it died) here.
  void read_tensors(
      std::string payload, std::string load_format,
      std::function<void(const std::string& error, std::shared_ptr<TensorBucket>)> done);

  std::vector<std::string> names() const;

 private:
  struct Group {
    std::vector<std::unique_ptr<TorchHelper>> members;
  };

  WeightGroupSettings settings_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Group>> groups_;
  std::map<std::string, std::shared_ptr<Group>> joining_;  // being formed now
  std::shared_ptr<Group> reader_;  // one member: the payload reader (worker thread only)
  std::optional<boost::asio::thread_pool> worker_;
};

}  // namespace megactx::server
