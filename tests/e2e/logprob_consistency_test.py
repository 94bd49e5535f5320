"""Rollout logprobs against scoring logprobs, through `megactx serve`.

An RL trainer takes the logprob of every sampled token from the rollout engine and compares it
with the one its scoring forward computes (the importance ratio of PPO/GRPO). This script
measures how far apart the two are in megactx, in every way a trainer meets them:

  rollout      sampled decode of 6 prompts that share a 48-token prefix, all at once (one
               decode batch of 6), logprobs of the sampled tokens;
  solo         the same 6 rollouts one request at a time (decode batches of 1): same seeds,
               so the same tokens as far as the logprobs agree (compared up to the first
               token sampled differently);
  scored       each prompt + rollout scored by prefill (max_new_tokens 0), one at a time, right
               after the rollout (its pages are in the prefix cache);
  batched      all 6 scored in one request (one prefill batch of 6 sequences);
  n=4          4 samples of one prompt in one request (sampling_params.n: they share its
               KV), each scored;
  cold         scored after /flush_cache (nothing cached);
  chunked      scored by a server whose prefill chunk is 16 tokens (--max-prefill-tokens 16);
  mtp          rolled out by a server with MTP (--speculative-steps 3, verified drafts), then
               scored by the main server.

Every figure is max |logprob a - logprob b| over the sampled tokens. With --expect-exact (the
CTest run, with --deterministic among the server arguments) every one must be exactly 0 and the
solo rollouts must give the same tokens; without it the figures are printed as a table row
(docs/benchmarks.md).

    python3 logprob_consistency_test.py --megactx build/megactx --model models/default \\
        [--expect-exact] [--label NAME] -- [serve arguments, e.g. --deterministic --kv-dtype f32]
"""
import argparse
import concurrent.futures
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
import requests  # noqa: E402

from megactx_server import MegactxServer  # noqa: E402

PROMPTS = 6
PREFIX = 48
NEW_TOKENS = 40


def post(server, path, payload):
    response = requests.post(server.url + path, json=payload, timeout=600)
    if response.status_code != 200:
        raise AssertionError(f"{path}: {response.status_code} {response.text}")
    return response.json()


def make_prompts(vocab):
    rng = random.Random(7)
    prefix = [rng.randrange(16, vocab - 16) for _ in range(PREFIX)]
    return [prefix + [rng.randrange(16, vocab - 16) for _ in range(5 + 11 * i)]
            for i in range(PROMPTS)]


def rollout_payload(prompt, seed):
    return {"input_ids": prompt, "return_logprob": True,
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 1.0, "top_p": 1.0,
                                "ignore_eos": True, "sampling_seed": seed}}


def rollouts(server, prompts, concurrently):
    """[(output ids, their logprobs)] of one sampled rollout per prompt."""
    payloads = [rollout_payload(p, 100 + i) for i, p in enumerate(prompts)]
    if concurrently:
        with concurrent.futures.ThreadPoolExecutor(len(payloads)) as pool:
            answers = list(pool.map(lambda p: post(server, "/generate", p), payloads))
    else:
        answers = [post(server, "/generate", p) for p in payloads]
    out = []
    for answer in answers:
        entries = answer["meta_info"]["output_token_logprobs"]
        out.append(([e[1] for e in entries], [e[0] for e in entries]))
    return out


def score(server, sequences, prompts):
    """Scoring logprobs of each sequence's generated part, one request for all `sequences`."""
    answers = post(server, "/generate", {
        "input_ids": sequences, "return_logprob": True, "logprob_start_len": 0,
        "sampling_params": {"max_new_tokens": 0, "temperature": 1.0}})
    if isinstance(answers, dict):
        answers = [answers]
    out = []
    for answer, prompt in zip(answers, prompts):
        entries = answer["meta_info"]["input_token_logprobs"]
        out.append([e[0] for e in entries[len(prompt):]])
    return out


def max_difference(a, b):
    worst = 0.0
    for x, y in zip(a, b):
        assert len(x) == len(y), (len(x), len(y))
        worst = max([worst] + [abs(p - q) for p, q in zip(x, y)])
    return worst


def has_mtp_layer(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return int(json.load(f).get("num_nextn_predict_layers") or 0) > 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--expect-exact", action="store_true")
    parser.add_argument("--label", default="")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    serve_args = [a for a in args.serve_args if a != "--"]

    figures = {}
    with MegactxServer(args.megactx, args.model, *serve_args, name="main") as server:
        vocab = requests.get(server.url + "/get_server_info", timeout=30).json()["vocab_size"]
        prompts = make_prompts(vocab)
        together = rollouts(server, prompts, concurrently=True)
        sequences = [p + ids for p, (ids, _) in zip(prompts, together)]
        rollout_logprobs = [lp for _, lp in together]
        solo = rollouts(server, prompts, concurrently=False)
        # Up to the first token the two runs sampled differently (after it they condition on
        # other text).
        common = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
                  for (a, _), (b, _) in zip(together, solo)]
        figures["solo"] = max_difference([lp[:c] for lp, c in zip(rollout_logprobs, common)],
                                         [lp[:c] for (_, lp), c in zip(solo, common)])
        same_tokens = all(c == len(ids) for c, (ids, _) in zip(common, together))
        scored = [score(server, [s], [p])[0] for s, p in zip(sequences, prompts)]
        figures["scored"] = max_difference(rollout_logprobs, scored)
        figures["batched"] = max_difference(rollout_logprobs, score(server, sequences, prompts))
        # sampling_params.n: the first sample prefills the prompt, the others share its KV.
        group = post(server, "/generate", {
            "input_ids": prompts[1], "return_logprob": True,
            "sampling_params": {"n": 4, "max_new_tokens": NEW_TOKENS, "temperature": 1.0,
                                "ignore_eos": True, "sampling_seed": 7}})
        group_logprobs = [[e[0] for e in item["meta_info"]["output_token_logprobs"]]
                          for item in group]
        figures["n=4"] = max_difference(
            group_logprobs, score(server, [prompts[1] + item["output_ids"] for item in group],
                                  [prompts[1]] * len(group)))
        post(server, "/flush_cache", {})
        figures["cold"] = max_difference(
            rollout_logprobs, [score(server, [s], [p])[0] for s, p in zip(sequences, prompts)])
        with MegactxServer(args.megactx, args.model, *serve_args, "--max-prefill-tokens", "16",
                           name="chunked") as chunked:
            figures["chunked"] = max_difference(rollout_logprobs,
                                                score(chunked, sequences, prompts))
        if has_mtp_layer(args.model):
            with MegactxServer(args.megactx, args.model, *serve_args, "--speculative-steps",
                               "3", name="mtp") as mtp:
                speculated = rollouts(mtp, prompts, concurrently=True)
                mtp_sequences = [p + ids for p, (ids, _) in zip(prompts, speculated)]
                figures["mtp"] = max_difference([lp for _, lp in speculated],
                                                score(server, mtp_sequences, prompts))
        else:
            print(f"mtp: skipped ({args.model} has no MTP layer)")

    label = args.label or " ".join(serve_args) or "defaults"
    print("| mode | " + " | ".join(figures) + " | solo rollouts give the same tokens |")
    print("|---" * (len(figures) + 2) + "|")
    print(f"| {label} | " + " | ".join(f"{v:.3g}" for v in figures.values()) +
          f" | {'yes' if same_tokens else 'no'} |")
    if args.expect_exact:
        failed = {k: v for k, v in figures.items() if v != 0.0}
        if failed or not same_tokens:
            print(f"FAIL: not bit-identical: {failed}, same tokens solo: {same_tokens}")
            return 1
        print("every rollout logprob equals its scoring logprob bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
