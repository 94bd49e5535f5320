// The NCCL communicator with one rank on the GPU: every collective of the
// Communicator interface on device memory (a group of one gives its own data
// back: sums and maxima equal the input, the gather and the all-to-all copy),
// the errors it reports before calling NCCL, and a communicator made twice in
// one process. Skipped, saying why, without a GPU or where NCCL cannot be
// loaded.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "parallel/nccl_communicator.h"

namespace megactx::parallel {
namespace {

template <typename T>
std::vector<T> download(const T* device, size_t count, cudaStream_t stream) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpyAsync(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return host;
}

template <typename T>
T* upload(const std::vector<T>& host) {
  T* device = nullptr;
  EXPECT_EQ(cudaMalloc(&device, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return device;
}

class NcclOneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      GTEST_SKIP() << "no CUDA device";
    std::string why;
    if (!nccl_available("", &why)) GTEST_SKIP() << "NCCL is not available: " << why;
    std::printf("%s\n", why.c_str());
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    NcclCommunicatorOptions options;
    options.stream = stream_;
    communicator_ = make_nccl_communicator(options);
  }
  void TearDown() override {
    communicator_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Communicator> communicator_;
};

TEST_F(NcclOneRank, EveryCollectiveGivesTheRanksOwnData) {
  ASSERT_EQ(communicator_->rank(), 0);
  ASSERT_EQ(communicator_->size(), 1);
  std::vector<float> values(1000);
  std::iota(values.begin(), values.end(), -500.f);
  float* data = upload(values);
  communicator_->all_reduce(data, static_cast<int64_t>(values.size()), ReduceOp::Sum);
  EXPECT_EQ(download(data, values.size(), stream_), values);
  communicator_->all_reduce(data, static_cast<int64_t>(values.size()), ReduceOp::Max);
  EXPECT_EQ(download(data, values.size(), stream_), values);

  std::vector<uint8_t> bytes(777);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  uint8_t* in = upload(bytes);
  uint8_t* out = upload(std::vector<uint8_t>(bytes.size(), 0));
  communicator_->all_gather(in, out, static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(download(out, bytes.size(), stream_), bytes);
  communicator_->broadcast(in, static_cast<int64_t>(bytes.size()), 0);
  EXPECT_EQ(download(in, bytes.size(), stream_), bytes);
  ASSERT_EQ(cudaMemset(out, 0, bytes.size()), cudaSuccess);
  const std::vector<int64_t> counts = {static_cast<int64_t>(bytes.size())};
  communicator_->all_to_all(in, counts, out, counts);
  EXPECT_EQ(download(out, bytes.size(), stream_), bytes);
  communicator_->all_to_all(in, {0}, out, {0});  // nothing to move
  communicator_->all_reduce(data, 0, ReduceOp::Sum);
  communicator_->barrier();
  cudaFree(data);
  cudaFree(in);
  cudaFree(out);
}

// ncclCommSplit of one rank: a group of one that runs collectives.
TEST_F(NcclOneRank, SplitGivesAGroupOfOne) {
  auto part = communicator_->split(0, 0);
  ASSERT_EQ(part->rank(), 0);
  ASSERT_EQ(part->size(), 1);
  float* data = upload(std::vector<float>{3.f, -1.f});
  part->all_reduce(data, 2, ReduceOp::Sum);
  EXPECT_EQ(download(data, 2, stream_), (std::vector<float>{3.f, -1.f}));
  part->barrier();
  cudaFree(data);
}

TEST_F(NcclOneRank, BadArgumentsAreErrorsBeforeNccl) {
  float* word = upload(std::vector<float>{1.f});
  EXPECT_THROW(communicator_->broadcast(word, 4, 1), Error);
  EXPECT_THROW(communicator_->broadcast(word, -4, 0), Error);
  EXPECT_THROW(communicator_->all_reduce(word, -1, ReduceOp::Sum), Error);
  EXPECT_THROW(communicator_->all_to_all(word, {4, 4}, word, {4, 4}), Error);
  EXPECT_THROW(communicator_->all_to_all(word, {4}, word, {0}), Error);
  communicator_->barrier();  // still usable
  cudaFree(word);
}

TEST_F(NcclOneRank, OptionsAreChecked) {
  NcclCommunicatorOptions options;
  options.size = 2;  // two ranks and no bootstrap group
  EXPECT_THROW(make_nccl_communicator(options), Error);
  options.size = 1;
  options.rank = 1;
  EXPECT_THROW(make_nccl_communicator(options), Error);
  options.rank = 0;
  options.library = "/nonexistent/libnccl.so.2";
  EXPECT_THROW(make_nccl_communicator(options), Error);
  EXPECT_FALSE(nccl_available(options.library));
  // A second communicator beside the first.
  options.library.clear();
  options.stream = stream_;
  auto second = make_nccl_communicator(options);
  second->barrier();
}

}  // namespace
}  // namespace megactx::parallel
