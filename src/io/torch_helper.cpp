#include "io/torch_helper.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace megactx {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The last `limit` bytes of the member's stderr (its traceback), for errors.
std::string file_tail(const std::string& path, size_t limit = 2000) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const auto size = static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0));
  const size_t start = size > limit ? size - limit : 0;
  in.seekg(static_cast<std::streamoff>(start));
  std::string text(size - start, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

AnnouncedTensor announced_tensor(std::string name, std::string_view torch_dtype, Shape shape) {
  std::string_view base = torch_dtype;
  if (base.rfind("torch.", 0) == 0) base.remove_prefix(6);
  AnnouncedTensor tensor;
  tensor.name = std::move(name);
  tensor.shape = std::move(shape);
  if (base == "float32" || base == "float") {
    tensor.torch_dtype = "float32", tensor.dtype = DType::F32;
  } else if (base == "bfloat16") {
    tensor.torch_dtype = "bfloat16", tensor.dtype = DType::BF16;
  } else if (base == "float16" || base == "half") {
    tensor.torch_dtype = "float16", tensor.dtype = DType::F16;
  } else if (base == "float8_e4m3fn") {
    tensor.torch_dtype = "float8_e4m3fn", tensor.dtype = DType::F8_E4M3;
  } else {
    ::megactx::fail(
        "tensor {} has dtype '{}': megactx takes float32, bfloat16, float16 or "
        "float8_e4m3fn weights",
        tensor.name, torch_dtype);
  }
  for (int64_t size : tensor.shape)
    MEGACTX_CHECK(size >= 0, "tensor {} has a negative size in its shape", tensor.name);
  return tensor;
}

std::unique_ptr<TorchHelper> TorchHelper::start(const TorchGroupJoin& join) {
  const nlohmann::json config = {{"mode", "group"},
                                 {"master_address", join.master_address},
                                 {"master_port", join.master_port},
                                 {"rank", join.rank},
                                 {"world_size", join.world_size},
                                 {"group_name", join.group_name},
                                 {"backend", join.backend},
                                 {"timeout_s", join.timeout_s},
                                 {"device", join.device},
                                 {"send_bytes", join.send_bytes}};
  return spawn(join, config.dump());
}

std::unique_ptr<TorchHelper> TorchHelper::start_reader(const std::string& python,
                                                       const std::string& device,
                                                       double timeout_s) {
  TorchGroupJoin reader;  // the fields a reader has: its interpreter, device and timeout
  reader.python = python;
  reader.device = device;
  reader.timeout_s = timeout_s;
  reader.group_name = "";
  const nlohmann::json config = {{"mode", "tensors"}, {"device", device}, {"timeout_s", timeout_s}};
  return spawn(reader, config.dump());
}

std::unique_ptr<TorchHelper> TorchHelper::spawn(const TorchGroupJoin& join,
                                                const std::string& config_text) {
  int to_member[2], from_member[2];
  MEGACTX_CHECK(::pipe2(to_member, O_CLOEXEC) == 0, "pipe: {}", std::strerror(errno));
  if (::pipe2(from_member, O_CLOEXEC) != 0) {
    ::close(to_member[0]), ::close(to_member[1]);
    ::megactx::fail("pipe: {}", std::strerror(errno));
  }
  char stderr_template[] = "/tmp/megactx-torch-helper-XXXXXX";
  const int stderr_fd = ::mkstemp(stderr_template);
  auto close_all = [&] {
    for (int fd : {to_member[0], to_member[1], from_member[0], from_member[1], stderr_fd})
      if (fd >= 0) ::close(fd);
  };
  if (stderr_fd < 0) {
    close_all();
    ::megactx::fail("a file for the weight-update helper's stderr: {}", std::strerror(errno));
  }
  // The child gets the pipes as 0 / 1, the file as 2, and nothing else (the
  // server's sockets must not outlive it in the member).
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_member[0], 0);
  posix_spawn_file_actions_adddup2(&actions, from_member[1], 1);
  posix_spawn_file_actions_adddup2(&actions, stderr_fd, 2);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  const std::string script(torch_helper_script());
  std::vector<char*> argv = {const_cast<char*>(join.python.c_str()), const_cast<char*>("-c"),
                             const_cast<char*>(script.c_str()),
                             const_cast<char*>(config_text.c_str()), nullptr};
  // The server blocks SIGINT / SIGTERM in every thread (its main thread waits
  // for them): the member starts with no signal blocked and SIGPIPE at its default.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int spawned =
      ::posix_spawnp(&pid, join.python.c_str(), &actions, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(to_member[0]), ::close(from_member[1]), ::close(stderr_fd);
  if (spawned != 0) {
    ::close(to_member[1]), ::close(from_member[0]), ::unlink(stderr_template);
    ::megactx::fail(
        "cannot start '{}' for the weight-update helper: {} (serve "
        "--weight-update-python names an interpreter with torch)",
        join.python, std::strerror(spawned));
  }
  return std::unique_ptr<TorchHelper>(
      new TorchHelper(join, pid, to_member[1], from_member[0], stderr_template));
}

TorchHelper::TorchHelper(TorchGroupJoin join, pid_t pid, int to_member, int from_member,
                         std::string stderr_path)
    : join_(std::move(join)),
      pid_(pid),
      to_member_(to_member),
      from_member_(from_member),
      stderr_path_(std::move(stderr_path)) {}

TorchHelper::~TorchHelper() {
  if (to_member_ >= 0) ::close(to_member_);
  if (from_member_ >= 0) ::close(from_member_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  ::unlink(stderr_path_.c_str());
}

void TorchHelper::fail_member(const std::string& what) {
  // The member may be on its way out: give it a moment so its status and
  // traceback are complete.
  reap(2);
  std::string message = join_.group_name.empty()
                            ? "the weight-update tensor reader: " + what
                            : "weight-update group '" + join_.group_name + "', rank " +
                                  std::to_string(join_.rank) + ": " + what;
  const std::string tail = file_tail(stderr_path_);
  if (!tail.empty()) message += "\n(the member's stderr ends with)\n" + tail;
  throw Error(message);
}

void TorchHelper::reap(double grace_s) {
  if (pid_ <= 0) return;
  const double deadline = now_s() + grace_s;
  while (true) {
    int status = 0;
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_ || (done < 0 && errno != EINTR)) {
      pid_ = -1;
      return;
    }
    if (now_s() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string TorchHelper::read_line(double deadline_s) {
  while (true) {
    if (auto end = buffer_.find('\n'); end != std::string::npos) {
      std::string line = buffer_.substr(0, end);
      buffer_.erase(0, end + 1);
      return line;
    }
    if (from_member_ < 0) fail_member("the member is gone");
    const double left = deadline_s - now_s();
    if (left <= 0) {
      ::kill(pid_, SIGKILL);
      fail_member("no answer within the timeout");
    }
    pollfd fd{from_member_, POLLIN, 0};
    const int ready = ::poll(&fd, 1, static_cast<int>(std::min(left, 1e6) * 1000) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char chunk[4096];
    const ssize_t got = ::read(from_member_, chunk, sizeof(chunk));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) fail_member("the member exited without an answer");
    buffer_.append(chunk, static_cast<size_t>(got));
  }
}

void TorchHelper::read_exact(char* out, size_t size) {
  const size_t buffered = std::min(size, buffer_.size());
  std::memcpy(out, buffer_.data(), buffered);
  buffer_.erase(0, buffered);
  size_t done = buffered;
  while (done < size) {
    const ssize_t got = ::read(from_member_, out + done, size - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) fail_member("the member exited while sending a tensor's bytes");
    done += static_cast<size_t>(got);
  }
}

void TorchHelper::write_line(const std::string& line) {
  // A member that died closes the pipe: the write must fail with EPIPE, not
  // raise SIGPIPE in the server. Blocked on this thread, and a pending one
  // taken back before unblocking.
  sigset_t pipe_signal, previous;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, &previous);
  const std::string text = line + "\n";
  size_t done = 0;
  int error = 0;
  while (done < text.size()) {
    const ssize_t wrote = ::write(to_member_, text.data() + done, text.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) {
      error = errno;
      break;
    }
    done += static_cast<size_t>(wrote);
  }
  if (error == EPIPE) {
    const timespec zero{0, 0};
    sigtimedwait(&pipe_signal, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (error != 0) fail_member(std::string("cannot write to the member: ") + std::strerror(error));
}

std::vector<uint64_t> TorchHelper::read_answer(double deadline_s, nlohmann::json* answer) {
  *answer = nlohmann::json::parse(read_line(deadline_s), nullptr, false);
  if (answer->is_discarded() || !answer->is_object())
    fail_member("the helper's answer is no JSON object");
  if (!answer->value("ok", false))
    fail_member(answer->value("error", std::string("the helper failed")));
  std::vector<uint64_t> sizes;
  if (answer->contains("bytes")) {
    const nlohmann::json& list = answer->at("bytes");
    if (!list.is_array()) fail_member("the helper's 'bytes' is no list");
    for (const auto& size : list) {
      if (!size.is_number_unsigned()) fail_member("the helper's 'bytes' lists no sizes");
      sizes.push_back(size.get<uint64_t>());
    }
  }
  return sizes;
}

void TorchHelper::wait_ready() {
  // Python and torch take seconds to start; the rendezvous waits up to the timeout.
  nlohmann::json answer;
  read_answer(now_s() + join_.timeout_s + 60, &answer);
}

void TorchHelper::request(const std::vector<AnnouncedTensor>& tensors, bool flattened) {
  nlohmann::json specs = nlohmann::json::array();
  for (const AnnouncedTensor& tensor : tensors)
    specs.push_back({{"dtype", tensor.torch_dtype}, {"shape", tensor.shape}});
  write_line(
      nlohmann::json{{"cmd", "receive"}, {"tensors", specs}, {"flattened", flattened}}.dump());
}

void TorchHelper::finish(const std::vector<AnnouncedTensor>& tensors, TensorBucket* bucket) {
  // Every broadcast is bounded by torch's own timeout; this one only guards
  // against a member that stopped answering altogether.
  const double deadline = now_s() + join_.timeout_s * (2.0 + static_cast<double>(tensors.size()));
  nlohmann::json answer;
  const std::vector<uint64_t> sizes = read_answer(deadline, &answer);
  if (!join_.send_bytes) return;
  MEGACTX_CHECK(sizes.size() == tensors.size(),
                "the group member announced {} tensors' bytes for {} tensors", sizes.size(),
                tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    Tensor tensor = Tensor::empty(tensors[i].shape, tensors[i].dtype);
    MEGACTX_CHECK(sizes[i] == tensor.nbytes(),
                  "the group member sends {} bytes for tensor {} of {} bytes", sizes[i],
                  tensors[i].name, tensor.nbytes());
    if (tensor.nbytes() > 0) read_exact(static_cast<char*>(tensor.raw()), tensor.nbytes());
    if (bucket) bucket->put(tensors[i].name, std::move(tensor));
  }
}

ReadTensors TorchHelper::read(const std::string& payload, const std::string& load_format,
                              int rank) {
  nlohmann::json command = {{"cmd", "load"}, {"payload", payload}, {"rank", rank}};
  command["load_format"] = load_format.empty() ? nlohmann::json() : nlohmann::json(load_format);
  write_line(command.dump());
  nlohmann::json answer;
  const std::vector<uint64_t> sizes = read_answer(now_s() + join_.timeout_s, &answer);
  const auto& names = answer.at("names");
  const auto& dtypes = answer.at("dtypes");
  const auto& shapes = answer.at("shapes");
  if (!names.is_array() || names.size() != sizes.size() || dtypes.size() != sizes.size() ||
      shapes.size() != sizes.size())
    fail_member("the reader's answer lists names, dtypes, shapes and bytes of different lengths");
  ReadTensors out;
  // Every tensor's bytes are read, a refused one's too, so that the pipe
  // stays in step; the first refusal is thrown after.
  std::string refused;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Shape shape;
    for (const auto& size : shapes[i]) shape.push_back(size.get<int64_t>());
    std::optional<AnnouncedTensor> tensor;
    try {
      tensor = announced_tensor(names[i].get<std::string>(), dtypes[i].get<std::string>(), shape);
    } catch (const Error& error) {
      if (refused.empty()) refused = error.what();
    }
    Tensor data = tensor ? Tensor::empty(tensor->shape, tensor->dtype)
                         : Tensor::empty({static_cast<int64_t>(sizes[i])}, DType::U8);
    if (data.nbytes() != sizes[i])
      fail_member(fmt::format("the reader sends {} bytes for tensor {} of {} bytes", sizes[i],
                              names[i].get<std::string>(), data.nbytes()));
    if (data.nbytes() > 0) read_exact(static_cast<char*>(data.raw()), data.nbytes());
    if (tensor) {
      out.bucket.put(tensor->name, std::move(data));
      out.tensors.push_back(std::move(*tensor));
    }
  }
  if (!refused.empty()) throw Error(refused);
  return out;
}

void TorchHelper::kill() {
  killed_ = true;
  if (const pid_t pid = pid_; pid > 0) ::kill(pid, SIGKILL);
}

void TorchHelper::destroy(double grace_s) {
  if (pid_ <= 0) return;
  try {
    write_line(R"({"cmd": "destroy"})");
    read_line(now_s() + grace_s);
  } catch (const Error&) {
    // Gone already, or no answer: what follows makes sure it is gone.
  }
  reap(grace_s);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

}  // namespace megactx
