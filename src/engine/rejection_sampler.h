// Verification of k draft tokens against the target's k + 1 distributions
// (one target forward over [last token, d_1..d_k]).
//
//  * Greedy: accept d_i while it equals the target's argmax at position i - 1;
//    the first mismatch (or position k when all pass) contributes the target's
//    argmax. The output equals non-speculative greedy decoding exactly.
//  * Rejection sampling (Leviathan et al. 2023, Chen et al. 2023): d_i was
//    drawn from q_i; accept with probability min(1, p_i(d_i) / q_i(d_i)); on
//    the first rejection draw from norm(max(0, p_i - q_i)) and stop; when all k
//    pass draw a bonus token from p_{k+1}. Every emitted token is distributed
//    exactly as under the target alone. p and q must come from the same
//    temperature/top-k/top-p transform (cpu_sampler's sampling_distribution).
//  * Target only: draw the target's own token x_i ~ p_i at each position and
//    accept d_i only when it equals x_i (strict match); lossless too, but it
//    accepts less (sum p q instead of sum min(p, q)).
// A greedy draft is q = one-hot(d_i); rejection sampling then accepts with
// probability p_i(d_i) and resamples from p_i without d_i, still lossless.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace megactx {

enum class VerifyMode : uint8_t { Greedy, RejectionSampling, TargetOnly };

// "rejection" | "target-only" (how sampled requests are verified); anything
// else is an Error.
VerifyMode parse_verify_mode(const std::string& name);

struct VerifyResult {
  int64_t accepted = 0;         // drafts accepted (0..k)
  std::vector<int32_t> tokens;  // accepted drafts, then one corrected or bonus token
};

// targets: k + 1 rows of target logits; drafts: k tokens.
VerifyResult verify_greedy(std::span<const std::span<const float>> target_logits,
                           std::span<const int32_t> drafts);

// The same from the k + 1 target argmax tokens (computed on the device).
VerifyResult verify_greedy_argmax(std::span<const int32_t> target_argmax,
                                  std::span<const int32_t> drafts);

// p: k + 1 target distributions, q: k draft distributions (each sums to 1
// over the vocabulary; empty q[i] means the draft was greedy, q = one-hot);
// drafts[i] ~ q[i]. `uniform` returns independent draws in [0, 1).
VerifyResult verify_rejection(std::span<const std::vector<float>> p,
                              std::span<const std::vector<float>> q,
                              std::span<const int32_t> drafts,
                              const std::function<double()>& uniform);

// Rejection sampling in its two parts, for rows that are not all in one
// place (data-parallel ranks hold their own rows): the accept tests read only
// each draft's probabilities; the final draw reads one whole row.
// verify_rejection is these two, with the same uniforms in the same order.
//
// The accept tests: p_at_draft[i] = p_i(d_i), q_at_draft[i] = q_i(d_i) (1 for
// a greedy draft); one uniform per test. Returns how many drafts pass before
// the first rejection (k: none rejected).
int64_t rejection_accepted(std::span<const float> p_at_draft, std::span<const float> q_at_draft,
                           const std::function<double()>& uniform);
// The token after `accepted` drafts: with accepted < k, a draw from
// norm(max(0, p - q)) of the rejecting position (`p_row` = p_accepted,
// `q_row` its q, empty for a greedy draft of `draft`: one-hot); with all k
// accepted, the bonus draw from `p_row` = p_k (q_row and draft unused).
int32_t rejection_final_token(std::span<const float> p_row, std::span<const float> q_row,
                              int32_t draft, bool rejected, const std::function<double()>& uniform);

VerifyResult verify_target_only(std::span<const std::vector<float>> p,
                                std::span<const int32_t> drafts,
                                const std::function<double()>& uniform);

// The two verifications with the target's rows made on demand: p_row(i) is
// called only for the rows the verification reads (p_0 .. p_a, a the first
// rejection or k), in order, so a verification that rejects early transforms
// one or two rows instead of k + 1 (the same uniforms in the same order, the
// same result). `vocab`: the rows' length, for checking the drafts up front.
using TargetRow = std::function<const std::vector<float>&(size_t)>;
VerifyResult verify_rejection_rows(size_t vocab, const TargetRow& p_row,
                                   std::span<const std::vector<float>> q,
                                   std::span<const int32_t> drafts,
                                   const std::function<double()>& uniform);
VerifyResult verify_target_only_rows(const TargetRow& p_row, std::span<const int32_t> drafts,
                                     const std::function<double()>& uniform);

// One draw from `weights` (non-negative, any positive total) by inverse CDF in
// id order; Error when the total is not positive.
int32_t draw_from(std::span<const float> weights, double u);

}  // namespace megactx
