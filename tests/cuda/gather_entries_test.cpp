// LayerSplit's dense gather of selected entries (kernels/cuda/kv_copy/gather_entries.h)
// against the host: a pool of 656-byte entries, selections of several rows
// with -1 padding, repeated slots and the pool's first and last slot; the
// owner's launch copies entry i from slot slots[i] and both launches (owner
// and receiver) write dense slot i or -1. Entries without a slot are left as
// they were, and sizes the kernel cannot take are errors.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "dsa_test_support.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/kv_copy/gather_entries.h"

namespace megactx::test {
namespace {

constexpr int kEntry = 656;

TEST(GatherEntries, DenseCopiesEqualTheHostGather) {
  constexpr int64_t kSlots = 5000;
  std::mt19937 rng(11);
  std::vector<uint8_t> pool(kSlots * kEntry);
  for (uint8_t& b : pool) b = static_cast<uint8_t>(rng());
  for (const int64_t entries : {int64_t{1}, int64_t{7}, int64_t{3 * 2048}, int64_t{40000}}) {
    std::vector<int32_t> slots(static_cast<size_t>(entries));
    for (int64_t i = 0; i < entries; ++i) {
      const uint32_t r = rng();
      slots[i] = r % 7 == 0 ? -1 : static_cast<int32_t>(r % kSlots);
    }
    slots[0] = 0;
    if (entries > 2) {
      slots[1] = kSlots - 1;
      slots[2] = slots[1];  // the same slot twice
    }
    DeviceBuffer<uint8_t> device_pool(pool);
    DeviceBuffer<int32_t> device_slots(slots);
    const std::vector<uint8_t> marker(static_cast<size_t>(entries * kEntry), 0xab);
    DeviceBuffer<uint8_t> dense(marker);
    DeviceBuffer<int32_t> dense_slots(static_cast<size_t>(entries));
    DeviceBuffer<int32_t> receiver_slots(static_cast<size_t>(entries));
    cuda::GatherEntriesParams p;
    p.slots = device_slots.get();
    p.entries = entries;
    p.dense_slots = dense_slots.get();
    p.pool = device_pool.get();
    p.dense = dense.get();
    p.entry_bytes = kEntry;
    cuda::gather_entries(p, nullptr);
    cuda::GatherEntriesParams receiver = p;
    receiver.pool = nullptr;
    receiver.dense = nullptr;
    receiver.dense_slots = receiver_slots.get();
    cuda::gather_entries(receiver, nullptr);
    MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());

    std::vector<uint8_t> want = marker;
    std::vector<int32_t> want_slots(static_cast<size_t>(entries));
    for (int64_t i = 0; i < entries; ++i) {
      want_slots[i] = slots[i] >= 0 ? static_cast<int32_t>(i) : -1;
      if (slots[i] >= 0)
        std::memcpy(want.data() + i * kEntry, pool.data() + int64_t{slots[i]} * kEntry, kEntry);
    }
    EXPECT_EQ(dense.download(), want) << entries << " entries";
    EXPECT_EQ(dense_slots.download(), want_slots) << entries << " entries";
    EXPECT_EQ(receiver_slots.download(), want_slots) << entries << " entries";
  }
}

TEST(GatherEntries, RefusesWhatItCannotCopy) {
  DeviceBuffer<int32_t> slots(std::vector<int32_t>{0});
  DeviceBuffer<int32_t> dense_slots(1);
  DeviceBuffer<uint8_t> pool(std::vector<uint8_t>(2048, 0));
  cuda::GatherEntriesParams p;
  p.slots = slots.get();
  p.entries = 1;
  p.dense_slots = dense_slots.get();
  p.pool = pool.get();
  p.dense = nullptr;  // a pool without its dense buffer
  p.entry_bytes = kEntry;
  EXPECT_THROW(cuda::gather_entries(p, nullptr), Error);
  p.pool = nullptr;
  p.entry_bytes = 1152 + 16;  // past 1024 bytes
  EXPECT_THROW(cuda::gather_entries(p, nullptr), Error);
  p.entry_bytes = 100;  // not a multiple of 16
  EXPECT_THROW(cuda::gather_entries(p, nullptr), Error);
}

}  // namespace
}  // namespace megactx::test
