#include "server/weight_groups.h"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include "core/error.h"
#include "server/api_error.h"

namespace megactx::server {

WeightGroups::WeightGroups(WeightGroupSettings settings) : settings_(std::move(settings)) {
  worker_.emplace(1);
}

WeightGroups::~WeightGroups() {
  // Members blocked in a rendezvous or a broadcast end when their process is
  // killed, so the worker's current task returns before the join below.
  {
    std::lock_guard lock(mutex_);
    for (auto* groups : {&groups_, &joining_})
      for (auto& [name, group] : *groups)
        for (auto& member : group->members) member->kill();
    if (reader_)
      for (auto& member : reader_->members) member->kill();
  }
  worker_->join();
}

void WeightGroups::check_join(const WeightGroupJoin& join) const {
  if (join.group_name.empty()) throw_invalid("group_name", "'group_name' must not be empty");
  if (join.master_address.empty())
    throw_invalid("master_address", "give 'master_address' (the trainer's rendezvous host)");
  if (join.master_port <= 0 || join.master_port > 65535)
    throw_invalid("master_port", "'master_port' must be a port number (1..65535)");
  if (join.backend != "nccl" && join.backend != "gloo")
    throw_invalid("backend", "'backend' must be nccl or gloo");
  if (join.backend == "nccl" && !settings_.cuda)
    throw_invalid("backend",
                  "this server runs on the CPU: NCCL needs GPUs; use backend gloo (the "
                  "trainer's group must use gloo too)");
  if (join.rank_offset < 1)
    throw_invalid("rank_offset", "'rank_offset' must be 1 or more (rank 0 is the trainer)");
  if (join.world_size < join.rank_offset + settings_.ranks)
    throw_invalid("world_size",
                  fmt::format("'world_size' {} leaves no room for this server's {} rank(s) "
                              "from rank_offset {}",
                              join.world_size, settings_.ranks, join.rank_offset));
  std::lock_guard lock(mutex_);
  if (groups_.count(join.group_name) || joining_.count(join.group_name))
    throw_invalid("group_name", "a weight-update group named '" + join.group_name +
                                    "' exists already (destroy it first)");
}

void WeightGroups::check_known(const std::string& group_name) const {
  std::lock_guard lock(mutex_);
  if (!groups_.count(group_name))
    throw_invalid("group_name", "no weight-update group named '" + group_name +
                                    "' (init_weights_update_group first)");
}

std::vector<std::string> WeightGroups::names() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [name, group] : groups_) out.push_back(name);
  return out;
}

void WeightGroups::join(WeightGroupJoin join, std::function<void(const std::string&)> done) {
  auto group = std::make_shared<Group>();
  {
    std::lock_guard lock(mutex_);
    joining_[join.group_name] = group;
  }
  boost::asio::post(*worker_, [this, group, join = std::move(join), done = std::move(done)] {
    std::string error;
    try {
      // Every member starts before any is waited for: the rendezvous needs them all.
      for (int i = 0; i < settings_.ranks; ++i) {
        TorchGroupJoin member;
        member.python = settings_.python;
        member.master_address = join.master_address;
        member.master_port = join.master_port;
        member.rank = join.rank_offset + i;
        member.world_size = join.world_size;
        member.group_name = join.group_name;
        member.backend = join.backend;
        member.timeout_s = settings_.timeout_s;
        member.device = settings_.cuda ? std::to_string(settings_.device_ordinal + i) : "cpu";
        // Every rank of the serving group takes the whole tensors (as SGLang's
        // do); one copy is enough here: the engine hands the bucket to its ranks.
        member.send_bytes = i == 0;
        auto started = TorchHelper::start(member);
        std::lock_guard lock(mutex_);  // the destructor may kill members meanwhile
        group->members.push_back(std::move(started));
      }
      for (auto& member : group->members) member->wait_ready();
    } catch (const std::exception& failure) {
      error = failure.what();
    }
    {
      std::lock_guard lock(mutex_);
      joining_.erase(join.group_name);
      if (error.empty()) groups_[join.group_name] = group;
    }
    if (error.empty())
      spdlog::info("joined weight-update group '{}' as rank(s) {}..{} of {} ({})", join.group_name,
                   join.rank_offset, join.rank_offset + settings_.ranks - 1, join.world_size,
                   join.backend);
    done(error);  // a failed group's members are killed as `group` goes
  });
}

void WeightGroups::receive(
    std::string group_name, std::vector<AnnouncedTensor> tensors, bool flattened,
    std::function<void(const std::string&, std::shared_ptr<TensorBucket>)> done) {
  boost::asio::post(*worker_, [this, group_name = std::move(group_name),
                               tensors = std::move(tensors), flattened, done = std::move(done)] {
    std::shared_ptr<Group> group;
    {
      std::lock_guard lock(mutex_);
      if (auto it = groups_.find(group_name); it != groups_.end()) group = it->second;
    }
    if (!group) {
      done("no weight-update group named '" + group_name + "' (it was destroyed)", nullptr);
      return;
    }
    auto bucket = std::make_shared<TensorBucket>();
    std::string error;
    try {
      for (auto& member : group->members) member->request(tensors, flattened);
      for (auto& member : group->members)
        member->finish(tensors, member->join().send_bytes ? bucket.get() : nullptr);
    } catch (const std::exception& failure) {
      error = failure.what();
    }
    bool lost = false;
    for (auto& member : group->members) lost = lost || !member->alive();
    if (lost) {
      std::lock_guard lock(mutex_);
      groups_.erase(group_name);
      error += "\nthe group lost a member and was left; init_weights_update_group again";
    }
    done(error, error.empty() ? bucket : nullptr);
  });
}

void WeightGroups::destroy(std::string group_name, std::function<void(const std::string&)> done) {
  boost::asio::post(*worker_, [this, group_name = std::move(group_name), done = std::move(done)] {
    std::shared_ptr<Group> group;
    {
      std::lock_guard lock(mutex_);
      if (auto it = groups_.find(group_name); it != groups_.end()) {
        group = it->second;
        groups_.erase(it);
      }
    }
    if (!group) {
      done("no weight-update group named '" + group_name + "'");
      return;
    }
    for (auto& member : group->members) member->destroy();
    spdlog::info("left weight-update group '{}'", group_name);
    done("");
  });
}

void WeightGroups::read_tensors(
    std::string payload, std::string load_format,
    std::function<void(const std::string&, std::shared_ptr<TensorBucket>)> done) {
  boost::asio::post(*worker_, [this, payload = std::move(payload),
                               load_format = std::move(load_format), done = std::move(done)] {
    std::string error;
    auto bucket = std::make_shared<TensorBucket>();
    try {
      std::shared_ptr<Group> reader;
      {
        std::lock_guard lock(mutex_);
        if (reader_ && !reader_->members.front()->alive()) reader_.reset();
        reader = reader_;
      }
      if (!reader) {
        reader = std::make_shared<Group>();
        auto started = TorchHelper::start_reader(
            settings_.python, settings_.cuda ? std::to_string(settings_.device_ordinal) : "cpu",
            settings_.timeout_s);
        {
          std::lock_guard lock(mutex_);  // the destructor may kill it meanwhile
          reader->members.push_back(std::move(started));
          reader_ = reader;
        }
        reader->members.front()->wait_ready();
      }
      *bucket = std::move(reader->members.front()->read(payload, load_format, 0).bucket);
    } catch (const std::exception& failure) {
      error = failure.what();
    }
    done(error, error.empty() ? bucket : nullptr);
  });
}

}  // namespace megactx::server
