// bf16_skinny's plan and checks (host side; the kernel is bf16_skinny.cu).
#include <algorithm>
#include <cstdint>

#include "core/env_switch.h"
#include "core/error.h"
#include "kernels/cuda/common/alignment.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/gemm/bf16_skinny.h"

namespace megactx::cuda {
namespace {

constexpr int64_t kCtasPerSm = 2;  // the automatic split aims at this many CTAs

int64_t chunks_of(const Bf16Skinny& g) {
  return std::max<int64_t>((g.in + kBf16SkinnyChunk - 1) / kBf16SkinnyChunk, 1);
}

}  // namespace

int64_t bf16_skinny_tiles(const Bf16Skinny& g) {
  const int64_t columns_per_tile = (g.swiglu ? 8 : 16) * kBf16SkinnyWarps;
  return (g.out + columns_per_tile - 1) / columns_per_tile;
}

Bf16SkinnyPlan bf16_skinny_plan(const Bf16Skinny& g) {
  Bf16SkinnyPlan plan;
  plan.tiles = bf16_skinny_tiles(g);
  const int64_t chunks = chunks_of(g);
  int64_t split = g.split;
  if (split == 0) {
    // At most the CTAs kCtasPerSm per multiprocessor hold (one wave: a
    // second, partly filled wave would cost a whole one), each at least four
    // chunks (the stages in flight).
    const int64_t resident = kCtasPerSm * current_device_multiprocessors();
    split = std::min<int64_t>({resident / std::max<int64_t>(plan.tiles, 1), kBf16SkinnyMaxSplit,
                               std::max<int64_t>(chunks / 4, 1)});
    split = std::max<int64_t>(split, 1);
  }
  split = std::min(split, chunks);
  // No empty parts: as many as the chunks per part need.
  plan.chunks_per_part = (chunks + split - 1) / split;
  plan.split = static_cast<int>((chunks + plan.chunks_per_part - 1) / plan.chunks_per_part);
  const int64_t weight_rows = g.swiglu ? 2 * g.out : g.out;
  plan.parts_floats = plan.split > 1 ? plan.split * g.rows * weight_rows : 0;
  return plan;
}

bool bf16_skinny(const Bf16Skinny& g, cudaStream_t stream) {
  if (g.rows < 1 || g.rows > kBf16SkinnyMaxRows || g.in < 8 || g.in % 8 != 0 ||
      g.x_stride % 8 != 0 || !aligned16(g.x) || !aligned16(g.w) || g.out < 1 || g.split < 0 ||
      g.split > kBf16SkinnyMaxSplit)
    return false;
  const Bf16SkinnyPlan plan = bf16_skinny_plan(g);
  MEGACTX_CHECK(plan.split == 1 || (g.parts != nullptr && g.parts_capacity >= plan.parts_floats &&
                                    g.done != nullptr && g.done_capacity >= plan.tiles),
                "bf16_skinny: a split of {} over {} tiles needs {} floats of parts and {} counters "
                "(given {} and {})",
                plan.split, plan.tiles, plan.parts_floats, plan.tiles, g.parts_capacity,
                g.done_capacity);
  static const bool deep_default = env_switch("MEGACTX_BF16_SKINNY_DEEP", kBf16SkinnyDeep);
  const bool deep = g.pipeline == Bf16SkinnyPipeline::Deep ||
                    (g.pipeline == Bf16SkinnyPipeline::ProcessDefault && deep_default);
  launch_bf16_skinny(g, plan.split, plan.chunks_per_part, deep, stream);
  return true;
}

}  // namespace megactx::cuda
