// The trainers' torch.distributed groups this server joined for SGLang's NCCL
// weight updates: /init_weights_update_group makes the server's ranks members
// (one TorchGroupMember per rank of the serving group, ranks rank_offset ..
// rank_offset + ranks - 1), /update_weights_from_distributed receives one
// bucket of broadcast tensors through them, /destroy_weights_update_group
// leaves. Joining and receiving block until the trainer takes part, so they
// run on a thread of their own (one at a time), never on the HTTP or control
// threads.
#pragma once

#include <boost/asio/thread_pool.hpp>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "io/torch_group_member.h"
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
  void receive(std::string group_name, std::vector<AnnouncedTensor> tensors,
               std::function<void(const std::string& error, std::shared_ptr<TensorBucket>)> done);
  void destroy(std::string group_name, std::function<void(const std::string&)> done);

  std::vector<std::string> names() const;

 private:
  struct Group {
    std::vector<std::unique_ptr<TorchGroupMember>> members;
  };

  WeightGroupSettings settings_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Group>> groups_;
  std::map<std::string, std::shared_ptr<Group>> joining_;  // being formed now
  std::optional<boost::asio::thread_pool> worker_;
};

}  // namespace megactx::server
