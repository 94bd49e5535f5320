// The MTP layer's runs under data-parallel attention on CUDA: 2 ranks forked
// on one GPU (host collectives and NCCL), each a CUDA model in the fp32
// parity mode, against one CUDA process, with the CPU test's cases
// (tests/parallel/dp_mtp_check.h: step 0 on either rank alone, a
// verification's refill with uniform rows and draft chains, the same with no
// logits read, unshared and shared draft steps, a run after a refused one):
// logits, hand-offs, selections and drafts.
#include <gtest/gtest.h>

#include <chrono>

#include "../parallel/dp_mtp_check.h"
#include "../parallel/forked_group.h"
#include "cuda_group_helpers.h"
#include "parallel/nccl_communicator.h"

namespace megactx::testing {
namespace {

TEST(CudaDataParallelMtp, RunsMatchOneProcess) {
  if (gpus_by_nvidia_smi() < 1) GTEST_SKIP() << "no GPU (nvidia-smi lists none)";
  for (const char* name : {"glm_schedule", "dsv32_yarn"}) {
    for (const auto collectives :
         {CudaModelOptions::Collectives::host, CudaModelOptions::Collectives::nccl}) {
      if (collectives == CudaModelOptions::Collectives::nccl && !parallel::nccl_available())
        continue;
      SCOPED_TRACE(name);
      ModelLoadOptions base;
      base.device = Device::CUDA;
      base.kv_dtype = KvDType::F32;
      base.cuda.gpu_id_step = 0;  // both ranks on device 0
      base.cuda.collectives = collectives;
      parallel::run_forked_group(
          2,
          [&](parallel::Communicator& group) {
            return dp_mtp_matches_one_process(name, group, 0, base, 1e-5);
          },
          std::chrono::milliseconds(300000));
    }
  }
}

}  // namespace
}  // namespace megactx::testing
