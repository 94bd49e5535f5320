// Host side of the grouped MoE path: which shapes it serves, the plan
// buffer's layout and the workspace sizes (plain arithmetic, testable on a
// machine without a GPU).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/env_switch.h"
#include "core/error.h"
#include "kernels/cuda/common/alignment.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/gemm/fp8_block_gemm.h"
#include "kernels/cuda/moe/expert_kernels.h"
#include "kernels/cuda/moe/grouped_moe.h"

namespace megactx::cuda {
namespace {

constexpr size_t kPlanSharedLimit = 48 * 1024;

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// The bucketing block ranks up to 512 pairs per pass.
constexpr int64_t kPlanMaxThreads = 512;

int64_t plan_threads(const GroupedMoeShape& shape) {
  return std::min(round_up(std::max<int64_t>(shape.pairs(), 1), 32), kPlanMaxThreads);
}

// Shared memory of the bucketing block: per expert its count, bucket
// offset, tile offset, pairs placed so far and pairs of the current pass,
// plus one count per (warp, expert).
size_t plan_shared_bytes(const GroupedMoeShape& shape) {
  const int64_t warps = plan_threads(shape) / 32;
  return static_cast<size_t>((5 + warps) * shape.experts) * sizeof(int32_t);
}

// Empty when supported, else the reason (one place for both entry points).
std::string unsupported_reason(const GroupedMoeShape& s) {
  if (s.rows < 1 || s.hidden < 1 || s.intermediate < 1 || s.experts < 1 || s.top_k < 1)
    return fmt::format(
        "grouped MoE: rows {}, hidden {}, intermediate {}, experts {}, top_k {} "
        "must all be positive",
        s.rows, s.hidden, s.intermediate, s.experts, s.top_k);
  if (s.fp8 && s.bf16)
    return "grouped MoE: a shape cannot be both fp8 and bf16 (GroupedMoeShape::fp8 / bf16)";
  if (s.top_k > s.experts)
    return fmt::format("grouped MoE: top_k {} exceeds the {} experts", s.top_k, s.experts);
  if (s.rows > kGroupedMoeMaxRows || s.pairs() > kGroupedMoeMaxPairs)
    return fmt::format("grouped MoE: {} rows x top_k {} exceed the bounds ({} rows, {} pairs)",
                       s.rows, s.top_k, kGroupedMoeMaxRows, kGroupedMoeMaxPairs);
  if (s.hidden % 8 != 0 || s.intermediate % 8 != 0)
    return fmt::format("grouped MoE: hidden {} and intermediate {} must be multiples of 8",
                       s.hidden, s.intermediate);
  if (plan_shared_bytes(s) > kPlanSharedLimit)
    return fmt::format(
        "grouped MoE: {} experts x {} pairs need {} B of shared memory to bucket "
        "(limit {})",
        s.experts, s.pairs(), plan_shared_bytes(s), kPlanSharedLimit);
  return {};
}

}  // namespace

int64_t grouped_moe_gate_up_scale_rows(int64_t intermediate, int64_t scale_split) {
  // The scale row of the last of the 2I rows, plus one.
  return fp8_scale_row(2 * intermediate - 1, scale_split) + 1;
}

bool grouped_moe_supported(const GroupedMoeShape& shape) {
  return unsupported_reason(shape).empty();
}

void check_grouped_moe(const GroupedMoeShape& shape) {
  const std::string reason = unsupported_reason(shape);
  if (!reason.empty()) throw Error(reason);
}

void check_grouped_moe_inputs(const float* x, const GroupedMoeShape& shape,
                              const StackedExperts& weights, const GroupedMoeBuffers& buffers) {
  MEGACTX_CHECK(weights.gate_up != nullptr && weights.down != nullptr,
                "grouped MoE: stacked expert weights missing");
  const auto kind = [](bool bf16, bool fp8) {
    return fp8 ? (bf16 ? "fp8+bf16" : "fp8") : bf16 ? "bf16" : "float32";
  };
  MEGACTX_CHECK(weights.bf16 == shape.bf16 && weights.fp8 == shape.fp8,
                "grouped MoE: {} weights but a plan made for {} (GroupedMoeShape::bf16 / fp8)",
                kind(weights.bf16, weights.fp8), kind(shape.bf16, shape.fp8));
  MEGACTX_CHECK(buffers.plan != nullptr && buffers.act != nullptr && buffers.pair_out != nullptr,
                "grouped MoE: workspace buffers missing");
  if (weights.fp8) {
    MEGACTX_CHECK(weights.gate_up_scale != nullptr && weights.down_scale != nullptr,
                  "grouped MoE: fp8 experts without their block scales");
    MEGACTX_CHECK(
        weights.gate_up_scale_split == 0 || weights.gate_up_scale_split == shape.intermediate,
        "grouped MoE: gate_up scale_split {} must be 0 or the intermediate size {}",
        weights.gate_up_scale_split, shape.intermediate);
    MEGACTX_CHECK(buffers.fp8 != nullptr && aligned16(buffers.fp8),
                  "grouped MoE: fp8 experts need the 16-byte aligned fp8 workspace");
    MEGACTX_CHECK(
        (buffers.x_q == nullptr) == (buffers.x_scale == nullptr) && aligned16(buffers.x_q),
        "grouped MoE: x's e4m3 copy needs its scales and 16-byte alignment");
  }
  MEGACTX_CHECK(aligned16(x) && aligned16(weights.gate_up) && aligned16(weights.down) &&
                    aligned16(buffers.act),
                "grouped MoE: inputs, weights and activations must be 16-byte aligned");
}

GroupedMoeLayout grouped_moe_layout(const GroupedMoeShape& shape) {
  check_grouped_moe(shape);
  const int64_t pairs = shape.pairs();
  GroupedMoeLayout layout;
  // Each used expert has ceil(m / R) <= 1 + floor(m / R) tiles; summed over
  // at most min(E, pairs) used experts whose m add up to pairs.
  layout.max_tiles = std::min(shape.experts, pairs) + pairs / shape.tile_rows();
  layout.tile_count = 0;
  layout.tiles = 1;
  layout.pair_of = layout.tiles + 3 * layout.max_tiles;
  layout.counts = layout.pair_of + pairs;
  layout.offsets = layout.counts + shape.experts;
  layout.plan_ints = layout.offsets + shape.experts + 1;
  layout.act_floats = pairs * shape.intermediate;
  layout.pair_out_floats = pairs * shape.hidden;
  layout.plan_threads = static_cast<int>(plan_threads(shape));
  layout.plan_shared_bytes = plan_shared_bytes(shape);
  if (shape.fp8) {
    const auto groups = [](int64_t n) { return (n + 127) / 128; };
    const auto bytes = [&](int64_t count) { return static_cast<size_t>(round_up(count, 16)); };
    layout.fp8_x_q = 0;
    layout.fp8_x_scale = layout.fp8_x_q + bytes(shape.rows * shape.hidden);
    layout.fp8_act_q = layout.fp8_x_scale + bytes(4 * shape.rows * groups(shape.hidden));
    layout.fp8_act_scale = layout.fp8_act_q + bytes(pairs * shape.intermediate);
    layout.fp8_bytes = layout.fp8_act_scale + bytes(4 * pairs * groups(shape.intermediate));
  }
  return layout;
}

bool shared_fp8_moe_input() {
  static const bool on = env_switch("MEGACTX_MOE_SHARED_FP8_INPUT", kSharedFp8MoeInput);
  return on;
}

int expert_split_from_env(const char* variable, int split) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return 0;
  const std::string_view text(value);
  MEGACTX_CHECK(text == "1" || text == std::to_string(split), "{}={}: expected 1 or {}", variable,
                text, split);
  return text == "1" ? 1 : split;
}

bool expert_split_k(int forced, int64_t grid_ctas, bool batch_invariant) {
  if (forced > 0) return forced > 1;
  return !batch_invariant &&
         grid_ctas <= kExpertSplitMaxCtasPerSm * current_device_multiprocessors();
}

}  // namespace megactx::cuda
