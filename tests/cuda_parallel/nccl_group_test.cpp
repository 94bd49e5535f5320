// The device communicators with two forked ranks: NCCL with one GPU each,
// its unique id carried by the CPU group; and two ranks on ONE GPU, over
// NCCL with each rank named a host of its own
// (NcclCommunicatorOptions::ranks_share_device) and over host memory
// (make_host_staged_communicator). Sums and maxima across the ranks, the
// gather in rank order, a broadcast from rank 1, a ragged all-to-all (rank r
// sends 3 + r + 2q bytes to rank q), a split into one-rank groups, against
// values computed on the host. This process never touches CUDA itself (a
// forked child cannot use a CUDA context its parent made); it counts the GPUs
// with nvidia-smi and skips, saying so, below what a case needs.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "../parallel/forked_group.h"
#include "cuda_group_helpers.h"
#include "parallel/host_staged_communicator.h"
#include "parallel/nccl_communicator.h"

// After the test headers: this file's checks run in the children, on CUDA.
#include <cuda_runtime.h>

namespace megactx::parallel {
namespace {

using megactx::testing::gpus_by_nvidia_smi;

uint8_t byte_of(int from, int to, int i) {
  return static_cast<uint8_t>(17 * from + 5 * to + i);
}

bool same(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int rank,
          const char* what) {
  if (got == want) return true;
  std::fprintf(stderr, "rank %d: %s differs\n", rank, what);
  return false;
}

// Every collective of `nccl` (a device communicator of `cpu`'s ranks on
// `stream`) against the values the host computes.
bool collectives_match(Communicator& cpu, Communicator& nccl_ref, cudaStream_t stream) {
  const int rank = cpu.rank(), size = cpu.size();
  Communicator* nccl = &nccl_ref;
  bool ok = true;

  // all_reduce: rank r holds i + 100 r.
  const int count = 4099;
  std::vector<float> values(count);
  for (int i = 0; i < count; ++i) values[i] = static_cast<float>(i + 100 * rank);
  float* data = nullptr;
  cudaMalloc(&data, count * sizeof(float));
  cudaMemcpy(data, values.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();  // a pageable upload may return before its DMA ends
  nccl->all_reduce(data, count, ReduceOp::Sum);
  std::vector<float> got(count);
  cudaMemcpyAsync(got.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  for (int i = 0; i < count; ++i) ok &= got[i] == static_cast<float>(2 * i + 100);
  nccl->all_reduce(data, count, ReduceOp::Max);  // of equal sums: the same
  cudaMemcpyAsync(got.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  for (int i = 0; i < count; ++i) ok &= got[i] == static_cast<float>(2 * i + 100);
  if (!ok) std::fprintf(stderr, "rank %d: all_reduce differs\n", rank);

  // all_gather of 333 bytes; broadcast from rank 1.
  const int bytes = 333;
  std::vector<uint8_t> mine(bytes), gathered(size * bytes), want(size * bytes);
  for (int i = 0; i < bytes; ++i) mine[i] = byte_of(rank, 0, i);
  for (int r = 0; r < size; ++r)
    for (int i = 0; i < bytes; ++i) want[r * bytes + i] = byte_of(r, 0, i);
  uint8_t *in = nullptr, *out = nullptr;
  cudaMalloc(&in, 4096);
  cudaMalloc(&out, 4096);
  cudaMemcpy(in, mine.data(), bytes, cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();  // a pageable upload may return before its DMA ends
  nccl->all_gather(in, out, bytes);
  cudaMemcpyAsync(gathered.data(), out, size * bytes, cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  ok &= same(gathered, want, rank, "all_gather");
  nccl->broadcast(in, bytes, 1);
  std::vector<uint8_t> broadcast(bytes), from_one(bytes);
  cudaMemcpyAsync(broadcast.data(), in, bytes, cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  for (int i = 0; i < bytes; ++i) from_one[i] = byte_of(1, 0, i);
  ok &= same(broadcast, from_one, rank, "broadcast");

  // Ragged all_to_all: rank r sends 3 + r + 2q bytes to rank q.
  std::vector<int64_t> send(size), recv(size);
  std::vector<uint8_t> outgoing, expected;
  for (int q = 0; q < size; ++q) {
    send[q] = 3 + rank + 2 * q;
    recv[q] = 3 + q + 2 * rank;
    for (int i = 0; i < send[q]; ++i) outgoing.push_back(byte_of(rank, q, i));
    for (int i = 0; i < recv[q]; ++i) expected.push_back(byte_of(q, rank, i));
  }
  cudaMemcpy(in, outgoing.data(), outgoing.size(), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();  // a pageable upload may return before its DMA ends
  nccl->all_to_all(in, send, out, recv);
  std::vector<uint8_t> received(expected.size());
  cudaMemcpyAsync(received.data(), out, received.size(), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  ok &= same(received, expected, rank, "all_to_all");
  // A split into one-rank groups: a sum over one rank is the identity.
  auto alone = nccl->split(rank, 0);
  cudaMemcpy(data, values.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();  // a pageable upload may return before its DMA ends
  alone->all_reduce(data, count, ReduceOp::Sum);
  cudaMemcpyAsync(got.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  bool alone_ok = alone->size() == 1;
  for (int i = 0; i < count; ++i) alone_ok &= got[i] == values[i];
  if (!alone_ok) std::fprintf(stderr, "rank %d: split differs\n", rank);
  ok &= alone_ok;
  alone.reset();
  nccl->barrier();
  cudaFree(data);
  cudaFree(in);
  cudaFree(out);
  return ok;
}

enum class Transport { nccl_per_gpu, nccl_one_gpu, host_one_gpu };

void run_two_ranks(Transport transport) {
  run_forked_group(2, [transport](Communicator& cpu) {
    const int rank = cpu.rank(), size = cpu.size();
    const int device = transport == Transport::nccl_per_gpu ? rank : 0;
    cudaStream_t stream = nullptr;
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
      return false;
    std::unique_ptr<Communicator> group;
    if (transport == Transport::host_one_gpu) {
      group = make_host_staged_communicator(cpu, stream);
    } else {
      std::string why;
      if (!nccl_available("", &why)) {
        std::fprintf(stderr, "rank %d: %s\n", rank, why.c_str());
        return false;
      }
      NcclCommunicatorOptions options;
      options.rank = rank;
      options.size = size;
      options.device = device;
      options.stream = stream;
      options.bootstrap = &cpu;
      options.ranks_share_device = transport == Transport::nccl_one_gpu;
      group = make_nccl_communicator(options);
    }
    const bool ok = collectives_match(cpu, *group, stream);
    group.reset();
    cudaStreamDestroy(stream);
    return ok;
  });
}

TEST(NcclGroup, TwoRanksOnTwoGpus) {
  const int gpus = gpus_by_nvidia_smi();
  if (gpus < 2) GTEST_SKIP() << "needs two GPUs (nvidia-smi lists " << gpus << ")";
  run_two_ranks(Transport::nccl_per_gpu);
}

TEST(NcclGroup, TwoRanksOnOneGpuNamedAsTwoHosts) {
  const int gpus = gpus_by_nvidia_smi();
  if (gpus < 1) GTEST_SKIP() << "needs a GPU";
  std::string why;
  if (!nccl_available("", &why)) GTEST_SKIP() << "NCCL is not available: " << why;
  run_two_ranks(Transport::nccl_one_gpu);
}

TEST(NcclGroup, TwoRanksOnOneGpuOverHostMemory) {
  const int gpus = gpus_by_nvidia_smi();
  if (gpus < 1) GTEST_SKIP() << "needs a GPU";
  run_two_ranks(Transport::host_one_gpu);
}

}  // namespace
}  // namespace megactx::parallel
