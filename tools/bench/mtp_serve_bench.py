"""MTP speculative decoding measured end to end through `megactx serve`.

For each speculative-steps value k (0 is plain decoding, the peer in the same
run) it starts one server, warms it up, then for each concurrency C sends C
requests at once, repeated `--rounds` times: /generate with token-id prompts
(distinct windows of real text, so the trained MTP layer's drafts are
accepted as they would be on text), greedy, `ignore_eos`, a fixed number of
new tokens. It reports

  * output tok/s: completion tokens of a round / the round's wall time (what a
    client sees, prefill included), best round;
  * decode tok/s: the same with each request's first token and its time to
    first token taken out (streaming), best round;
  * accepted length: megactx_spec_accept_length from /metrics (tokens per
    verification, accepted drafts + 1).

  python3 tools/bench/mtp_serve_bench.py --megactx build/megactx --model models/default [--temperature 1] \
      --steps 0,1,3,7 --concurrency 1,16 -- --device cuda --cuda-bf16

Arguments after `--` go to every `megactx serve`. Stdlib only.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "e2e"))
from megactx_server import MegactxServer  # noqa: E402


def stream_one(port, ids, new_tokens, temperature=0.0, top_p=None):
    """One streamed /generate: (completion tokens, seconds to first token, seconds in all).
    Above temperature 0 the request is seeded from its prompt (the same samples in every run).
    top_p None: the server's default (the model's generation_config.json)."""
    sampling = {"temperature": temperature, "max_new_tokens": new_tokens, "ignore_eos": True}
    if top_p is not None:
        sampling["top_p"] = top_p
    if temperature > 0:
        sampling["sampling_seed"] = sum(ids[:16]) % 1000003
    body = json.dumps({"input_ids": ids, "stream": True, "sampling_params": sampling})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    connection.request("POST", "/generate", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"/generate: {response.status} {response.read()[:200]!r}")
    first = None
    tokens = 0
    for line in response:
        line = line.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        event = json.loads(line[5:])
        if first is None:
            first = time.perf_counter() - start
        tokens = event["meta_info"]["completion_tokens"]
    connection.close()
    return tokens, first or 0.0, time.perf_counter() - start


def metric(port, name):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def stream_args(args):
    return stream_one(*args)


def run_round(port, prompts, new_tokens, pool=None, temperature=0.0, top_p=None):
    """One round of len(prompts) concurrent streams. With `pool` (a process pool of at least
    len(prompts) workers) every stream has a process of its own: a thread per stream shares
    one interpreter, which parses at most ~15-20K events/s in all and so capped the measured
    tok/s at 64 requests."""
    start = time.perf_counter()
    if pool is not None:
        results = list(pool.map(stream_args, [(port, ids, new_tokens, temperature, top_p) for ids in prompts]))
    else:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as threads:
            results = list(threads.map(lambda ids: stream_one(port, ids, new_tokens, temperature, top_p), prompts))
    wall = time.perf_counter() - start
    tokens = sum(r[0] for r in results)
    # Decode: tokens after each request's first, over the time after the last first token.
    last_first = max(r[1] for r in results)
    decode_tokens = sum(r[0] - 1 for r in results)
    return tokens / wall, decode_tokens / max(wall - last_first, 1e-9)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", default="models/default")
    parser.add_argument("--text", default="tests/default_model/passkey_8k_ids.txt",
                        help="comma-separated token ids the prompts are cut from")
    parser.add_argument("--steps", default="0,3")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature (above 0: seeded per prompt; drafts verified by "
                             "rejection sampling)")
    parser.add_argument("--top-p", type=float, default=None,
                        help="top-p of every request (default: the server's, from the model's "
                             "generation_config.json; 1 for the full softmax the trainer evaluates)")
    parser.add_argument("--kv-memory", default="2GiB")
    parser.add_argument("--json", default="", help="also write the rows here")
    parser.add_argument("serve_args", nargs="*", help="after --: passed to megactx serve")
    args = parser.parse_args()

    text = [int(t) for t in open(args.text).read().replace("\n", ",").split(",") if t.strip()]
    steps = [int(k) for k in args.steps.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    rows = []
    print(f"serve args: {' '.join(args.serve_args) or '(none)'}; prompts of {args.prompt_tokens} "
          f"tokens, {args.new_tokens} new tokens, "
          f"{'greedy' if args.temperature == 0 else f'temperature {args.temperature:g}'}"
          f"{'' if args.top_p is None else f', top-p {args.top_p:g}'}, "
          f"best of {args.rounds} rounds")
    print("| k | concurrency | output tok/s | decode tok/s | vs k=0 (decode) | accepted length |")
    print("|---|---|---|---|---|---|")
    baseline = {}
    for k in steps:
        extra = list(args.serve_args) + (["--speculative-steps", str(k)] if k > 0 else [])
        with MegactxServer(args.megactx, args.model, *extra, kv_memory=args.kv_memory) as server:
            port = int(server.url.rsplit(":", 1)[1])
            run_round(port, [text[:64]], 8)  # warm-up: first graphs, first allocations
            for c in levels:
                prompts = []
                for i in range(c):
                    offset = (i * 997) % max(len(text) - args.prompt_tokens, 1)
                    prompts.append(text[offset:offset + args.prompt_tokens])
                with concurrent.futures.ProcessPoolExecutor(c) as pool:
                    # this shape's graphs, and every worker process started
                    run_round(port, prompts, 16, pool)
                    verify0 = metric(port, "megactx_spec_verify_steps_total")
                    accepted0 = metric(port, "megactx_spec_accepted_tokens_total")
                    best_output = best_decode = 0.0
                    for _ in range(args.rounds):
                        output, decode = run_round(port, prompts, args.new_tokens, pool,
                                                   args.temperature, args.top_p)
                        best_output = max(best_output, output)
                        best_decode = max(best_decode, decode)
                verify = metric(port, "megactx_spec_verify_steps_total") - verify0
                accepted = metric(port, "megactx_spec_accepted_tokens_total") - accepted0
                length = 1 + accepted / verify if k > 0 and verify > 0 else None
                if k == 0:
                    baseline[c] = best_decode
                # Without k = 0 in --steps there is no baseline to divide by.
                ratio = f"{best_decode / baseline[c]:.2f}x" if c in baseline else "-"
                print(f"| {k} | {c} | {best_output:.0f} | {best_decode:.0f} | {ratio} | "
                      f"{'-' if length is None else f'{length:.2f}'} |", flush=True)
                rows.append({"k": k, "concurrency": c, "temperature": args.temperature,
                             "output_tok_s": best_output,
                             "decode_tok_s": best_decode, "accepted_length": length})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
