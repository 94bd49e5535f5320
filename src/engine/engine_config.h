// EngineConfig: the runtime choices of a serving engine (ModelConfig holds the
// checkpoint's). GenerationDefaults: what generation_config.json adds.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/host_kv_tier.h"
#include "cache/kv_cache.h"
#include "engine/dp_load_balance.h"
#include "engine/rejection_sampler.h"

namespace megactx {

struct EngineConfig {
  int64_t max_running_requests = 256;
  // Per-step budget of prefill tokens (SGLang's chunked_prefill_size): long
  // prompts are split into chunks of at most this many tokens; decode tokens
  // of running requests do not count against it.
  int64_t max_prefill_tokens = 8192;
  // The most rows of logits [rows, vocab] one step asks for (--max-logit-rows;
  // 0: kDefaultMaxLogitRows). A prefill chunk of a scoring request (logits at
  // every scored position) is cut to fit; decode and verification rows always
  // fit: step_logit_rows() raises the limit to what a full decode batch needs.
  // The CUDA memory plan sizes the logits buffer by it (at GLM-5.2's vocab a
  // row is 0.6 MiB: 16K rows would be 10 GB).
  int64_t max_logit_rows = 0;
  // Data-parallel attention: how a new request is pinned to a rank
  // (--load-balance-method; engine/scheduler.h: DpLoadBalance).
  DpLoadBalance dp_load_balance = DpLoadBalance::CacheAware;
  int64_t kv_memory_bytes = int64_t{4} << 30;  // --kv-memory, all pools together
  KvDType kv_dtype = KvDType::BF16;
  int64_t context_length = 0;  // 0: the model's max_position_embeddings
  int64_t page_size = 64;
  // MTP draft steps; > 0 adds the MTP layer's pools. Verification
  // steps append 1 + k tokens per request and roll back; the scheduler
  // reserves pages for them.
  int64_t speculative_steps = 0;
  // Speculation per batch: a step that decodes at least this many requests
  // runs without drafts (0: never off); the MTP layer keeps refilling, so the
  // next smaller batch speculates again. EngineStats::spec_off_steps counts
  // the steps it turned off.
  int64_t speculative_disable_batch_size = 0;
  // Speculation per batch from measured speed (--speculative-auto): per
  // decode batch-size bucket, drafts only where drafting steps have given
  // more tokens per second than plain ones (src/engine/speculation_policy.h).
  bool speculative_auto = false;
  // The deterministic mode (--deterministic; the model loaded with
  // ModelLoadOptions::deterministic): a sampled token's logprob is computed
  // as scoring computes it (on the host on CUDA too), so that rollout and
  // scoring logprobs are bit-identical.
  bool deterministic = false;
  // --enable-return-routed-experts: every forward records the routed experts
  // of its tokens (engine/routed_experts.h) so that requests may ask for them
  // (GenerationRequest::return_routed_experts).
  bool record_routed_experts = false;
  // Requests may ask for return_hidden_states (serve
  // --enable-return-hidden-states); forwards that run one return their rows'
  // hidden states.
  bool record_hidden_states = false;
  // The most host memory one return_hidden_states request may hold (its
  // prompt + max_new_tokens rows of hidden floats, within the context);
  // larger asks are an error.
  int64_t max_hidden_states_bytes = int64_t{256} << 20;
  // IndexShare + KVShare across draft steps (false: the ablation).
  bool speculative_share = true;
  // Verification of sampled requests (greedy ones are always verified exactly).
  VerifyMode speculative_sampled_mode = VerifyMode::RejectionSampling;
  // Structured output: drafts from the grammar-masked draft logits (true), or
  // from the unmasked ones, checked against the automaton afterwards and
  // rejected from the first one it does not allow (the ablation; also
  // lossless, it accepts less).
  bool speculative_masked_drafts = true;
  // Structured output: with this many constrained rows or more in a step
  // (0: never), their matchers advance and fill their masks on the process's
  // thread pool instead of one after another. Off: on the H200 machine at 64
  // rows the pool's hand-offs made the phase slower (2.94 against 1.13 us per
  // token, docs/benchmarks.md).
  int64_t parallel_grammar_rows = 0;
  // The checkpoint the model was loaded from: its MTP layer's weights, and
  // the base of weight updates (engine_control.cpp).
  std::string model_dir;
  bool enable_prefix_cache = true;
  // Start the engine thread. Tests leave it off and drive step() themselves.
  bool run_thread = true;
  // Run check_integrity() after every step (tests, debugging).
  bool check_integrity_every_step = false;
  // The host tier of the prefix cache (--host-kv-memory; 0: none): pages the
  // KV pool evicts keep their contents in this many bytes of host memory and
  // are copied back on a prefix hit instead of being recomputed
  // (cache/host_kv_tier.h). Needs the prefix cache.
  int64_t host_kv_memory_bytes = 0;
  // The live host tier (--host-latent-memory; 0: none): offload pages whose
  // latents live in this many bytes of host memory (cache/kv_cache.h). Once
  // a request's context (prompt included) reaches host_latent_min_tokens, or
  // half the device pages, its full pages move there at the end of every step,
  // while it prefills as while it decodes; their indexer keys stay beside the
  // pools, in kv_memory_bytes. A request may then be as long as the offload
  // pages and all but two device pages hold (a prompt longer than the device
  // pages prefills into the tier in chunks that fit).
  int64_t host_latent_memory_bytes = 0;
  int64_t host_latent_min_tokens = 0;
};

inline constexpr int64_t kDefaultMaxLogitRows = 4096;

// The logits rows a step of this engine may ask for: max_logit_rows (or the
// default), at least one row per decode and verification token of a full
// batch, at most every row a step can hold.
inline int64_t step_logit_rows(const EngineConfig& config) {
  const int64_t per_request = 1 + (config.speculative_steps > 0 ? config.speculative_steps : 0);
  const int64_t decode = config.max_running_requests * per_request;
  const int64_t wanted = config.max_logit_rows > 0 ? config.max_logit_rows : kDefaultMaxLogitRows;
  const int64_t most = config.max_prefill_tokens + decode;
  return wanted > decode ? (wanted < most ? wanted : most) : decode;
}

struct GenerationDefaults {
  // Ids that end generation unless ignore_eos (config.json and
  // generation_config.json eos_token_id, merged).
  std::vector<int32_t> eos_token_ids;
  // Sampling defaults of generation_config.json; the HTTP layer applies them
  // to fields a request leaves unset.
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
};

// Reads DIR/generation_config.json when present and merges the eos ids of
// `config_eos_ids`. A malformed file is a megactx::Error.
GenerationDefaults load_generation_defaults(const std::string& model_dir,
                                            const std::vector<int64_t>& config_eos_ids);

}  // namespace megactx
