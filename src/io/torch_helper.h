// torch, run as a child process for the two SGLang weight transports whose
// formats are torch's own and change between torch versions:
// - a rank that megactx holds in an RL trainer's torch.distributed group
//   (/init_weights_update_group, /update_weights_from_distributed: the
//   trainer broadcasts each tensor from its rank 0; NCCL on GPUs, gloo on
//   CPUs), joined exactly as SGLang's engine joins;
// - the reader of /update_weights_from_tensor's payloads (tensors pickled
//   with torch's multiprocessing reductions: CUDA IPC handles, shared-memory
//   files), opened from an allowlist of classes.
// The child runs tools/weight_sync/torch_helper.py (compiled into the binary)
// with the trainer's Python and talks to the server over a pipe (JSON lines;
// tensor bytes after an answer).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/weight_update.h"

namespace megactx {

struct TorchGroupJoin {
  std::string python = "python3";  // an interpreter with torch
  std::string master_address;
  int master_port = 0;
  int rank = 0;  // the member's rank in the trainer's group
  int world_size = 0;
  std::string group_name;
  std::string backend = "nccl";  // nccl or gloo (torch's names)
  double timeout_s = 600;        // the rendezvous's and every collective's
  std::string device = "cpu";    // "cpu" or a CUDA ordinal ("0")
  bool send_bytes = true;        // false: receives and drops (a rank whose copy is not needed)
};

// A tensor announced by /update_weights_from_distributed.
struct AnnouncedTensor {
  std::string name;
  std::string torch_dtype;  // torch's name: "bfloat16", "float32", "float8_e4m3fn"
  DType dtype = DType::F32;
  Shape shape;
};

// torch's dtype names (with or without "torch.") megactx stores: float32,
// bfloat16, float16, float8_e4m3fn (and their aliases float, half). Throws
// megactx::Error naming the dtype otherwise.
AnnouncedTensor announced_tensor(std::string name, std::string_view torch_dtype, Shape shape);

// The Python source of the helper (generated from tools/weight_sync/torch_helper.py).
std::string_view torch_helper_script();

// Named tensors a helper read, and their bytes.
struct ReadTensors {
  std::vector<AnnouncedTensor> tensors;
  TensorBucket bucket;
};

class TorchHelper {
 public:
  // Starts a group member; it joins the group on its own. Throws when the
  // interpreter cannot be started.
  static std::unique_ptr<TorchHelper> start(const TorchGroupJoin& join);
  // Starts a reader of /update_weights_from_tensor payloads (`device`: "cpu"
  // or the CUDA ordinal its IPC handles open on).
  static std::unique_ptr<TorchHelper> start_reader(const std::string& python,
                                                   const std::string& device, double timeout_s);
  ~TorchHelper();  // kills the process if it still runs
  TorchHelper(const TorchHelper&) = delete;
  TorchHelper& operator=(const TorchHelper&) = delete;

  // Waits for the helper's first answer: a member joined its group, a reader
  // has torch (up to the timeout and a minute for Python to start). Throws
  // megactx::Error with the helper's message and the tail of its stderr.
  void wait_ready();
  // Asks for the broadcast of `tensors`, in order (returns at once: every
  // member of an engine must be asked before any is waited for); `flattened`:
  // one broadcast of all their bytes (SGLang's flattened_bucket).
  void request(const std::vector<AnnouncedTensor>& tensors, bool flattened = false);
  // Waits for the answer to request(); a member with send_bytes puts the
  // tensors into `bucket` under their names (null: `send_bytes` was false).
  // Throws as wait_joined() does; the member stays usable after a failed
  // broadcast only in the sense torch allows (the trainer's next call says).
  void finish(const std::vector<AnnouncedTensor>& tensors, TensorBucket* bucket);
  // A reader's work: one payload (base64 of a pickle) in SGLang's
  // load_format ("" or "direct": [(name, tensor or LocalSerializedTensor)];
  // "flattened_bucket"), the entries of rank `rank`. Throws as wait_joined().
  ReadTensors read(const std::string& payload, const std::string& load_format, int rank);
  // Leaves the group (a member) and waits for the process (killed after `grace_s`).
  void destroy(double grace_s = 30);

  // Ends the process now (from any thread): a call blocked on it returns
  // with an error.
  void kill();

  const TorchGroupJoin& join() const { return join_; }
  bool alive() const { return pid_ > 0 && !killed_; }

 private:
  TorchHelper(TorchGroupJoin join, pid_t pid, int to_member, int from_member,
              std::string stderr_path);
  static std::unique_ptr<TorchHelper> spawn(const TorchGroupJoin& join, const std::string& config);
  // Reads an answer; fails on {"ok": false}; returns its "bytes" list (empty
  // without one).
  std::vector<uint64_t> read_answer(double deadline_s, nlohmann::json* answer);
  std::string read_line(double deadline_s);
  void read_exact(char* out, size_t size);
  void write_line(const std::string& line);
  [[noreturn]] void fail_member(const std::string& what);
  void reap(double grace_s);

  TorchGroupJoin join_;
  std::atomic<pid_t> pid_ = -1;
  std::atomic<bool> killed_ = false;
  int to_member_ = -1;    // the member's stdin
  int from_member_ = -1;  // the member's stdout
  std::string stderr_path_;
  std::string buffer_;  // read from the member, not consumed yet
};

}  // namespace megactx
