// NcclCommunicator: the Communicator interface on NCCL, loaded with dlopen.
// The handful of NCCL entry points it calls are declared here with NCCL's C
// ABI (nccl.h: ncclResult_t, ncclDataType_t and ncclRedOp_t are C enums, an
// ncclUniqueId is a 128-byte struct passed by value).
#include "parallel/nccl_communicator.h"

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"

#if MEGACTX_HAVE_CUDA
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <map>
#endif

namespace megactx::parallel {

#if MEGACTX_HAVE_CUDA
namespace {

using NcclComm = void*;  // ncclComm_t: an opaque pointer
struct NcclUniqueId {
  char internal[128];
};
constexpr int kNcclSuccess = 0;
constexpr int kNcclUint8 = 1;    // ncclUint8
constexpr int kNcclFloat32 = 7;  // ncclFloat32
constexpr int kNcclSum = 0;      // ncclSum
constexpr int kNcclMax = 2;      // ncclMax

// The entry points, resolved once per library path (the library stays loaded:
// NCCL keeps threads of its own).
struct NcclApi {
  int version = 0;
  int (*get_version)(int*) = nullptr;
  int (*get_unique_id)(NcclUniqueId*) = nullptr;
  int (*comm_init_rank)(NcclComm*, int, NcclUniqueId, int) = nullptr;
  int (*comm_destroy)(NcclComm) = nullptr;
  int (*all_reduce)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
  int (*broadcast)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
  int (*all_gather)(const void*, void*, size_t, int, NcclComm, cudaStream_t) = nullptr;
  int (*send)(const void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
  int (*recv)(void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  const char* (*error_string)(int) = nullptr;
  // NCCL 2.18+ only (split() says so where they are missing).
  int (*comm_split)(NcclComm, int, int, NcclComm*, void*) = nullptr;
  int (*comm_count)(NcclComm, int*) = nullptr;
  int (*comm_user_rank)(NcclComm, int*) = nullptr;
};

std::string library_path(const std::string& library) {
  if (!library.empty()) return library;
  const char* from_environment = std::getenv("MEGACTX_NCCL_LIBRARY");
  if (from_environment != nullptr && *from_environment != '\0') return from_environment;
  return "libnccl.so.2";
}

// The API of `path`, or null with `why` set.
const NcclApi* load_nccl(const std::string& path, std::string* why) {
  static std::mutex mutex;
  static std::map<std::string, NcclApi> loaded;
  std::lock_guard lock(mutex);
  if (auto it = loaded.find(path); it != loaded.end()) return &it->second;
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    *why = "cannot load " + path + ": " + (error ? error : "unknown error");
    return nullptr;
  }
  NcclApi api;
  bool complete = true;
  auto resolve = [&](auto& function, const char* name) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(::dlsym(handle, name));
    if (function == nullptr && complete) {
      complete = false;
      *why = path + " has no " + name;
    }
  };
  resolve(api.get_version, "ncclGetVersion");
  resolve(api.get_unique_id, "ncclGetUniqueId");
  resolve(api.comm_init_rank, "ncclCommInitRank");
  resolve(api.comm_destroy, "ncclCommDestroy");
  resolve(api.all_reduce, "ncclAllReduce");
  resolve(api.broadcast, "ncclBroadcast");
  resolve(api.all_gather, "ncclAllGather");
  resolve(api.send, "ncclSend");
  resolve(api.recv, "ncclRecv");
  resolve(api.group_start, "ncclGroupStart");
  resolve(api.group_end, "ncclGroupEnd");
  resolve(api.error_string, "ncclGetErrorString");
  if (!complete) return nullptr;
  api.comm_split = reinterpret_cast<decltype(api.comm_split)>(::dlsym(handle, "ncclCommSplit"));
  api.comm_count = reinterpret_cast<decltype(api.comm_count)>(::dlsym(handle, "ncclCommCount"));
  api.comm_user_rank = reinterpret_cast<decltype(api.comm_user_rank)>(
      ::dlsym(handle, "ncclCommUserRank"));  // the handle stays open: dlclose of NCCL is not safe
  if (api.get_version(&api.version) != kNcclSuccess) {
    *why = path + ": ncclGetVersion failed";
    return nullptr;
  }
  return &loaded.emplace(path, api).first->second;
}

void check_cuda(cudaError_t result, const char* what) {
  MEGACTX_CHECK(result == cudaSuccess, "NCCL communicator: {}: {}", what,
                cudaGetErrorString(result));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclApi& api, const NcclCommunicatorOptions& options)
      : api_(api),
        rank_(options.rank),
        size_(options.size),
        stream_(static_cast<cudaStream_t>(options.stream)) {
    check_cuda(cudaSetDevice(options.device), "cudaSetDevice");
    check_cuda(cudaMalloc(&barrier_word_, sizeof(float)), "cudaMalloc");
    try {
      if (options.ranks_share_device && size_ > 1) {
        // Before NCCL's first init in this process reads them (nccl_communicator.h).
        const std::string host_id = "megactx-rank-" + std::to_string(rank_);
        ::setenv("NCCL_HOSTID", host_id.c_str(), /*overwrite=*/1);  // must differ by rank
        ::setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
        // Loopback sockets, not an InfiniBand NIC the machine may have.
        ::setenv("NCCL_IB_DISABLE", "1", /*overwrite=*/0);
      }
      NcclUniqueId id{};
      if (rank_ == 0) check(api_.get_unique_id(&id), "ncclGetUniqueId");
      if (size_ > 1) options.bootstrap->broadcast(&id, sizeof id, 0);
      check(api_.comm_init_rank(&comm_, size_, id, rank_), "ncclCommInitRank");
    } catch (...) {
      cudaFree(barrier_word_);  // no destructor runs for a constructor that throws
      throw;
    }
  }
  // A group ncclCommSplit made: its communicator, on the parent's stream.
  NcclCommunicator(const NcclApi& api, NcclComm comm, int rank, int size, cudaStream_t stream)
      : api_(api), rank_(rank), size_(size), stream_(stream), comm_(comm) {
    check_cuda(cudaMalloc(&barrier_word_, sizeof(float)), "cudaMalloc");
  }
  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);
    if (comm_ != nullptr) api_.comm_destroy(comm_);
    if (barrier_word_ != nullptr) cudaFree(barrier_word_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(float* data, int64_t count, ReduceOp op) override {
    MEGACTX_CHECK(count >= 0, "NCCL all_reduce: negative count {}", count);
    if (count == 0) return;
    check(api_.all_reduce(data, data, static_cast<size_t>(count), kNcclFloat32,
                          op == ReduceOp::Sum ? kNcclSum : kNcclMax, comm_, stream_),
          "ncclAllReduce");
  }

  void all_gather(const void* in, void* out, int64_t bytes) override {
    MEGACTX_CHECK(bytes >= 0, "NCCL all_gather: negative size {}", bytes);
    if (bytes == 0) return;
    check(api_.all_gather(in, out, static_cast<size_t>(bytes), kNcclUint8, comm_, stream_),
          "ncclAllGather");
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    MEGACTX_CHECK(root >= 0 && root < size_, "NCCL broadcast: root {} of {} ranks", root, size_);
    MEGACTX_CHECK(bytes >= 0, "NCCL broadcast: negative size {}", bytes);
    if (bytes == 0) return;
    check(api_.broadcast(data, data, static_cast<size_t>(bytes), kNcclUint8, root, comm_, stream_),
          "ncclBroadcast");
  }

  void all_to_all(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                  const std::vector<int64_t>& recv_bytes) override {
    MEGACTX_CHECK(static_cast<int>(send_bytes.size()) == size_ &&
                      static_cast<int>(recv_bytes.size()) == size_,
                  "NCCL all_to_all: {} send and {} receive counts for {} ranks", send_bytes.size(),
                  recv_bytes.size(), size_);
    std::vector<int64_t> send_at(size_ + 1, 0), recv_at(size_ + 1, 0);
    for (int q = 0; q < size_; ++q) {
      MEGACTX_CHECK(send_bytes[q] >= 0 && recv_bytes[q] >= 0,
                    "NCCL all_to_all: negative count for rank {}", q);
      send_at[q + 1] = send_at[q] + send_bytes[q];
      recv_at[q + 1] = recv_at[q] + recv_bytes[q];
    }
    MEGACTX_CHECK(send_bytes[rank_] == recv_bytes[rank_],
                  "NCCL all_to_all: rank {} sends itself {} bytes but receives {}", rank_,
                  send_bytes[rank_], recv_bytes[rank_]);
    const auto* source = static_cast<const uint8_t*>(in);
    auto* destination = static_cast<uint8_t*>(out);
    // This rank's own share is a device copy; the others are point-to-point
    // pairs in one NCCL group (all posted before any may block).
    if (send_bytes[rank_] > 0)
      check_cuda(cudaMemcpyAsync(destination + recv_at[rank_], source + send_at[rank_],
                                 static_cast<size_t>(send_bytes[rank_]), cudaMemcpyDeviceToDevice,
                                 stream_),
                 "cudaMemcpyAsync");
    if (size_ == 1) return;
    check(api_.group_start(), "ncclGroupStart");
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      if (send_bytes[q] > 0)
        check(api_.send(source + send_at[q], static_cast<size_t>(send_bytes[q]), kNcclUint8, q,
                        comm_, stream_),
              "ncclSend");
      if (recv_bytes[q] > 0)
        check(api_.recv(destination + recv_at[q], static_cast<size_t>(recv_bytes[q]), kNcclUint8, q,
                        comm_, stream_),
              "ncclRecv");
    }
    check(api_.group_end(), "ncclGroupEnd");
  }

  void barrier() override {
    all_reduce(barrier_word_, 1, ReduceOp::Sum);
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    return split_on(color, key, stream_);
  }

  // split() whose collectives go on `stream`.
  std::unique_ptr<Communicator> split_on(int color, int key, cudaStream_t stream) {
    MEGACTX_CHECK(
        api_.comm_split != nullptr && api_.comm_count != nullptr && api_.comm_user_rank != nullptr,
        "NCCL communicator: NCCL version code {} has no ncclCommSplit (2.18 or later)",
        api_.version);
    MEGACTX_CHECK(color >= 0, "NCCL communicator: split color {} (must be >= 0)", color);
    NcclComm comm = nullptr;
    check(api_.comm_split(comm_, color, key, &comm, nullptr), "ncclCommSplit");
    int rank = 0, size = 0;
    check(api_.comm_user_rank(comm, &rank), "ncclCommUserRank");
    check(api_.comm_count(comm, &size), "ncclCommCount");
    return std::make_unique<NcclCommunicator>(api_, comm, rank, size, stream);
  }

 private:
  void check(int result, const char* what) const {
    MEGACTX_CHECK(result == kNcclSuccess, "NCCL communicator (rank {} of {}): {}: {}", rank_, size_,
                  what, api_.error_string(result));
  }

  const NcclApi& api_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  NcclComm comm_ = nullptr;
  float* barrier_word_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const NcclCommunicatorOptions& options) {
  MEGACTX_CHECK(options.size >= 1 && options.rank >= 0 && options.rank < options.size,
                "NCCL communicator: rank {} of {} ranks", options.rank, options.size);
  MEGACTX_CHECK(options.size == 1 || options.bootstrap != nullptr,
                "NCCL communicator: {} ranks need a bootstrap group for the unique id",
                options.size);
  MEGACTX_CHECK(options.bootstrap == nullptr || (options.bootstrap->size() == options.size &&
                                                 options.bootstrap->rank() == options.rank),
                "NCCL communicator: the bootstrap group is rank {} of {}, not {} of {}",
                options.bootstrap ? options.bootstrap->rank() : -1,
                options.bootstrap ? options.bootstrap->size() : -1, options.rank, options.size);
  std::string why;
  const NcclApi* api = load_nccl(library_path(options.library), &why);
  MEGACTX_CHECK(api != nullptr, "NCCL communicator: {}", why);
  return std::make_unique<NcclCommunicator>(*api, options);
}

std::unique_ptr<Communicator> split_nccl_on_stream(Communicator& group, int color, int key,
                                                   void* stream) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&group);
  if (nccl == nullptr) return nullptr;
  return nccl->split_on(color, key, static_cast<cudaStream_t>(stream));
}

bool nccl_available(const std::string& library, std::string* why) {
  std::string reason;
  const NcclApi* api = load_nccl(library_path(library), &reason);
  if (api != nullptr) reason = "NCCL version code " + std::to_string(api->version);
  if (why != nullptr) *why = reason;
  return api != nullptr;
}

#else  // a build without CUDA

std::unique_ptr<Communicator> make_nccl_communicator(const NcclCommunicatorOptions&) {
  MEGACTX_CHECK(false, "NCCL communicator: megactx was built without CUDA");
  return nullptr;
}

std::unique_ptr<Communicator> split_nccl_on_stream(Communicator&, int, int, void*) {
  return nullptr;
}

bool nccl_available(const std::string&, std::string* why) {
  if (why != nullptr) *why = "megactx was built without CUDA";
  return false;
}

#endif

}  // namespace megactx::parallel
