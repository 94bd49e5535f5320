#include "model/cuda/checkpoint_shares.h"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8_blocks.h"

namespace megactx {
namespace {

// How a tensor of the checkpoint is cut for one rank.
enum class Cut {
  whole,         // every rank reads all of it
  rows,          // tensor parallel: the rank's block of rows
  columns,       // tensor parallel: the rank's block of columns
  local_expert,  // expert parallel: a routed expert this rank holds, whole (asking for
                 // another rank's is an Error)
};

// Rows [begin, end) or columns [begin, end) of a row-major [rows, cols]
// tensor of any element size, copied.
Tensor cut_tensor(const Tensor& whole, bool rows, int64_t begin, int64_t end) {
  const int64_t r = whole.dim(0), c = whole.dim(1);
  const size_t element = dtype_size(whole.dtype());
  if (rows) {
    Tensor part = Tensor::empty({end - begin, c}, whole.dtype());
    std::memcpy(part.raw(), static_cast<const char*>(whole.raw()) + begin * c * element,
                part.nbytes());
    return part;
  }
  Tensor part = Tensor::empty({r, end - begin}, whole.dtype());
  const size_t width = static_cast<size_t>(end - begin) * element;
  for (int64_t i = 0; i < r; ++i) {
    std::memcpy(static_cast<char*>(part.raw()) + i * width,
                static_cast<const char*>(whole.raw()) + (i * c + begin) * element, width);
  }
  return part;
}

// A block cut [begin, end) of an extent that the 128-wide scale blocks follow:
// it starts on a block and ends on one or at the extent's end.
bool on_blocks(int64_t begin, int64_t end, int64_t extent) {
  return begin % kFp8WeightBlock == 0 && (end % kFp8WeightBlock == 0 || end == extent);
}

class ShareMatrices final : public MatrixSource {
 public:
  ShareMatrices(MatrixSource& whole, const ModelConfig& config, const ModelPlan& plan)
      : whole_(whole), config_(config), plan_(plan) {
    MEGACTX_CHECK(!plan.indexer_split,
                  "checkpoint shares: the split indexer's cut is not served (load the host "
                  "model's float32 shares instead)");
  }

  bool has(const std::string& name) const override { return whole_.has(name); }

  CheckpointMatrix matrix(const std::string& name, const Shape& shape) override {
    const Cut cut = cut_of(name);
    if (cut == Cut::whole || cut == Cut::local_expert) return whole_.matrix(name, shape);
    const bool rows = cut == Cut::rows;
    const auto [whole_shape, begin, end] = whole_extent(name, shape, rows);
    const CheckpointMatrix m = whole_.matrix(name, whole_shape);
    CheckpointMatrix part;
    const int64_t extent = rows ? m.rows() : m.cols();
    if (m.fp8() && on_blocks(begin, end, extent)) {
      part.values = cut_tensor(m.values, rows, begin, end);
      const int64_t first = begin / kFp8WeightBlock;
      const int64_t last = (end + kFp8WeightBlock - 1) / kFp8WeightBlock;
      part.scales = cut_tensor(m.scales, rows, first, last);
      return part;
    }
    // float32 weights, or an fp8 cut across a scale block: float32 values
    // (exactly the host path's dequantised ones).
    part.values = cut_tensor(m.fp8() ? dequantize(m) : m.values, rows, begin, end);
    return part;
  }

  Tensor float_tensor(const std::string& name, const Shape& shape) override {
    const Cut cut = cut_of(name);
    if (cut == Cut::whole || cut == Cut::local_expert) return whole_.float_tensor(name, shape);
    const bool rows = cut == Cut::rows;
    const auto [whole_shape, begin, end] = whole_extent(name, shape, rows);
    return cut_tensor(whole_.float_tensor(name, whole_shape), rows, begin, end);
  }

  void check_all_used(const std::vector<std::string>& ignored_prefixes) const override {
    std::vector<std::string> ignored = ignored_prefixes;
    if (plan_.expert_parallel_size > 1) {
      // The other ranks' experts are never read. One prefix per layer (not
      // per expert: the check compares every unread name with every prefix).
      for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer)
        ignored.push_back(fmt::format("model.layers.{}.mlp.experts.", layer));
    }
    whole_.check_all_used(ignored);
  }

 private:
  struct Extent {
    Shape whole;
    int64_t begin = 0, end = 0;
  };

  // The whole tensor's shape and the rank's [begin, end) along the cut axis,
  // from the share's shape the caller asked for.
  Extent whole_extent(const std::string& name, const Shape& share, bool rows) const {
    MEGACTX_CHECK(share.size() == 2, "checkpoint shares: '{}' is cut but has {} dims", name,
                  share.size());
    const int axis = rows ? 0 : 1;
    const int64_t size = plan_.tensor_parallel_size, rank = plan_.tensor_parallel_rank;
    Extent e;
    e.whole = share;
    e.whole[axis] = share[axis] * size;
    e.begin = rank * share[axis];
    e.end = e.begin + share[axis];
    return e;
  }

  // The cut of `name` (parallel_shard_layer's, by name; dsa_weights.cpp).
  Cut cut_of(const std::string& name) const {
    const std::string layers = "model.layers.";
    if (!name.starts_with(layers)) return Cut::whole;  // embedding, norm, lm_head
    const size_t dot = name.find('.', layers.size());
    if (dot == std::string::npos) return Cut::whole;
    const std::string rest = name.substr(dot + 1);
    const bool tensor = plan_.tensor_parallel_size > 1;
    const bool experts = plan_.expert_parallel_size > 1;
    const std::string routed = "mlp.experts.";
    if (rest.starts_with(routed)) {
      const size_t end = rest.find('.', routed.size());
      MEGACTX_CHECK(end != std::string::npos, "checkpoint shares: '{}' names no expert", name);
      const std::string matrix = rest.substr(end + 1);
      if (experts) {
        const int64_t e = std::stoll(rest.substr(routed.size(), end - routed.size()));
        const bool local = e >= plan_.first_expert && e < plan_.first_expert + plan_.local_experts;
        MEGACTX_CHECK(local,
                      "checkpoint shares: '{}' is another rank's expert (this rank holds {} .. "
                      "{})",
                      name, plan_.first_expert, plan_.first_expert + plan_.local_experts - 1);
        return Cut::local_expert;
      }
      return tensor ? mlp_cut(matrix) : Cut::whole;
    }
    if (!tensor) return Cut::whole;
    if (rest == "self_attn.q_b_proj.weight" || rest == "self_attn.q_proj.weight" ||
        rest == "self_attn.kv_b_proj.weight")
      return Cut::rows;
    if (rest == "self_attn.o_proj.weight") return Cut::columns;
    if (rest.starts_with("mlp.shared_experts.")) return mlp_cut(rest.substr(19));
    if (rest.starts_with("mlp.") && rest.find('.', 4) == rest.rfind('.')) {
      // A dense MLP's own matrices (mlp.gate_proj.weight), not the router's.
      return mlp_cut(rest.substr(4));
    }
    return Cut::whole;
  }

  // gate_proj.weight / up_proj.weight / down_proj.weight of a SwiGLU MLP.
  static Cut mlp_cut(const std::string& matrix) {
    if (matrix == "gate_proj.weight" || matrix == "up_proj.weight") return Cut::rows;
    if (matrix == "down_proj.weight") return Cut::columns;
    return Cut::whole;
  }

  MatrixSource& whole_;
  ModelConfig config_;
  ModelPlan plan_;
};

}  // namespace

std::unique_ptr<MatrixSource> make_share_matrices(MatrixSource& whole, const ModelConfig& config,
                                                  const ModelPlan& plan) {
  return std::make_unique<ShareMatrices>(whole, config, plan);
}

}  // namespace megactx
