// One rank's share of a checkpoint's matrices, read straight from the
// checkpoint: what a rank of a parallel group on GPUs uploads, e4m3 bytes and
// block scales kept as shipped, instead of the whole model in float32 on the
// host first (GLM-5.2-FP8's 744B parameters would need ~3 TB of host memory
// that way). The cuts are parallel_shard_layer's (dsa_weights.h), by tensor
// name:
//   tensor parallel (plan.tensor_parallel_size > 1): rows of q_b_proj
//   (q_proj without q-LoRA) and kv_b_proj for the rank's heads, the matching
//   columns of o_proj; rows of gate_proj / up_proj and columns of down_proj
//   for the rank's share of every dense MLP, shared expert and (without
//   expert parallelism) routed expert;
//   expert parallel (plan.expert_parallel_size > 1): routed experts
//   [first_expert, first_expert + local_experts) whole, and none other may be
//   asked for.
// Everything else comes whole. The caller asks with the SHARE's shape (the
// rank's heads, widths), the source reads the whole tensor (its shape follows
// from the share's and the group size) and cuts it. An fp8 cut must fall on
// the 128 x 128 scale blocks (the scale rows or columns are cut with it);
// one that does not (a share not a multiple of 128 rows or columns) comes
// back dequantised to float32, the values the host path would upload.
//
// Plain C++ (no CUDA): tested on the CPU against parallel_shard_layer's cuts
// of the same checkpoint (tests/model/checkpoint_shares_test.cpp).
#pragma once

#include <memory>

#include "model/cuda/checkpoint_matrix.h"
#include "model/model_plan.h"

namespace megactx {

// `whole` (not owned) must outlive the result. The plan is the rank's
// (parallel_plan); a plan with the indexer split is refused (its cut is not
// served here). check_all_used passes over the routed experts of other
// ranks (never read under expert parallelism).
std::unique_ptr<MatrixSource> make_share_matrices(MatrixSource& whole, const ModelConfig& config,
                                                  const ModelPlan& plan);

}  // namespace megactx
