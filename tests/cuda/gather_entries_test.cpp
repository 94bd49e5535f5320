// LayerSplit's dense gather of selected entries and its scatter of a chunk's
// new rows (kernels/cuda/kv_copy/gather_entries.h) against the host: pools of
// fp8 (656-byte) and f32 (2,304-byte) entries, selections of several rows
// with -1 padding, repeated slots and the pool's first and last slot; the
// owner's launch copies entry i from slot slots[i] and both launches (owner
// and receiver) write dense slot i or -1; the scatter puts the dense entries
// back at their slots of another pool. Entries without a slot are left as
// they were, and arguments the kernels cannot take are errors.
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
  for (const int entry_bytes : {kEntry, 2304})  // fp8, f32 latents
    for (const int64_t entries : {int64_t{1}, int64_t{7}, int64_t{3 * 2048}, int64_t{40000}}) {
      std::vector<uint8_t> pool(kSlots * entry_bytes);
      for (uint8_t& b : pool) b = static_cast<uint8_t>(rng());
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
      const std::vector<uint8_t> marker(static_cast<size_t>(entries * entry_bytes), 0xab);
      DeviceBuffer<uint8_t> dense(marker);
      DeviceBuffer<int32_t> dense_slots(static_cast<size_t>(entries));
      DeviceBuffer<int32_t> receiver_slots(static_cast<size_t>(entries));
      cuda::GatherEntriesParams p;
      p.slots = device_slots.get();
      p.entries = entries;
      p.dense_slots = dense_slots.get();
      p.pool = device_pool.get();
      p.dense = dense.get();
      p.entry_bytes = entry_bytes;
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
          std::memcpy(want.data() + i * entry_bytes, pool.data() + int64_t{slots[i]} * entry_bytes,
                      entry_bytes);
      }
      EXPECT_EQ(dense.download(), want) << entries << " entries";
      EXPECT_EQ(dense_slots.download(), want_slots) << entries << " entries";
      EXPECT_EQ(receiver_slots.download(), want_slots) << entries << " entries";
      // The scatter: the dense entries back at their slots of a zeroed pool.
      DeviceBuffer<uint8_t> other(std::vector<uint8_t>(pool.size(), 0));
      cuda::ScatterEntriesParams back;
      back.dense = dense.get();
      back.slots = device_slots.get();
      back.entries = entries;
      back.pool = other.get();
      back.entry_bytes = entry_bytes;
      cuda::scatter_entries(back, nullptr);
      MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint8_t> want_pool(pool.size(), 0);
      for (int64_t i = 0; i < entries; ++i)
        if (slots[i] >= 0)
          std::memcpy(want_pool.data() + int64_t{slots[i]} * entry_bytes,
                      pool.data() + int64_t{slots[i]} * entry_bytes, entry_bytes);
      EXPECT_EQ(other.download(), want_pool)
          << entries << " entries of " << entry_bytes << " bytes";
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
  p.entry_bytes = 100;  // not a multiple of 16
  EXPECT_THROW(cuda::gather_entries(p, nullptr), Error);
  cuda::ScatterEntriesParams back;
  back.dense = pool.get();
  back.slots = slots.get();
  back.entries = 1;
  back.entry_bytes = kEntry;  // no pool
  EXPECT_THROW(cuda::scatter_entries(back, nullptr), Error);
}

}  // namespace
}  // namespace megactx::test
