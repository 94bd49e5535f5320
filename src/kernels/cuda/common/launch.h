// The programmatic-dependent-launch switch of launch.cuh, safe in .cpp files.
#pragma once

namespace megactx::cuda {

// Whether launch_kernel (launch.cuh) asks for PDL: kProgrammaticLaunch, or
// MEGACTX_PDL=0/1 (A/B runs). On: the GPU suite passes with it, and on the
// H200 it takes glm_1b's batch-1 decode step from 1.92 to 1.87 ms (bf16) and
// 1.72 to 1.48 ms (fp8 weights) (docs/benchmarks.md).
inline constexpr bool kProgrammaticLaunch = true;
bool programmatic_launch();

}  // namespace megactx::cuda
