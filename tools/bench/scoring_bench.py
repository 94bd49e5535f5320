"""Scoring throughput through `megactx serve`: prefill-only requests that return the logprob of
every input token (what an RL trainer's reference/teacher pass sends), beside plain prefill of
the same sequences in the same run (max_new_tokens 1, no logprobs: the peer), and decode.

For each server configuration (the serve arguments after --; several configurations separated
by ' ;; ' are run one after another, e.g. without and with --deterministic) the script starts a
server and runs, closed loop at each concurrency:

  prefill   input tokens/s of requests of --tokens random ids, max_new_tokens 1;
  scoring   input tokens/s of the same requests with max_new_tokens 0, return_logprob,
            logprob_start_len 0 (every position's logprob);
  decode    output tokens/s of --decode-tokens new tokens per request (ignore_eos).

    python3 tools/bench/scoring_bench.py --megactx build/megactx --model models/default \\
        --concurrency 1,8 -- --kv-dtype f32 ';;' --kv-dtype f32 --deterministic
"""
import argparse
import concurrent.futures
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "e2e"))
import requests  # noqa: E402

from megactx_server import MegactxServer  # noqa: E402


def post(server, payload):
    response = requests.post(server.url + "/generate", json=payload, timeout=900)
    response.raise_for_status()
    return response.json()


def run(server, payloads, concurrency):
    """Seconds to serve `payloads` with `concurrency` clients, from an empty prefix cache (a
    repeat would otherwise find plain prefill's prompts cached)."""
    requests.post(server.url + "/flush_cache", timeout=60).raise_for_status()
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda p: post(server, p), payloads))
    return time.perf_counter() - start


def measure(server, args, concurrency, vocab):
    rng = random.Random(concurrency)
    count = max(concurrency * args.requests_per_client, 2)
    sequences = [[rng.randrange(16, vocab - 16) for _ in range(args.tokens)] for _ in range(count)]
    prefill = [{"input_ids": s, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
               for s in sequences]
    scoring = [{"input_ids": s, "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {"max_new_tokens": 0}} for s in sequences]
    decode = [{"input_ids": s[:32], "sampling_params": {
        "max_new_tokens": args.decode_tokens, "temperature": 1.0, "ignore_eos": True,
        "sampling_seed": i}} for i, s in enumerate(sequences)]
    rows = {}
    for name, payloads, tokens in (("prefill", prefill, count * args.tokens),
                                   ("scoring", scoring, count * args.tokens),
                                   ("decode", decode, count * args.decode_tokens)):
        post(server, {**payloads[0], "input_ids": payloads[0]["input_ids"][::-1]})  # warm-up
        best = min(run(server, payloads, concurrency) for _ in range(args.repeat))
        rows[name] = tokens / best
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", default="models/default")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("serve_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    words = [a for a in args.serve_args if a != "--"]
    configs, current = [], []
    for word in words:
        if word == ";;":
            configs.append(current)
            current = []
        else:
            current.append(word)
    configs.append(current)

    print("| serve arguments | concurrency | prefill input tok/s (peer) | scoring input tok/s | "
          "scoring / prefill | decode output tok/s |")
    print("|---|---|---|---|---|---|")
    for config in configs:
        with MegactxServer(args.megactx, args.model, *config, kv_memory="1GiB") as server:
            vocab = requests.get(server.url + "/get_server_info", timeout=30).json()["vocab_size"]
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                r = measure(server, args, concurrency, vocab)
                print(f"| {' '.join(config) or '(defaults)'} | {concurrency} | {r['prefill']:.0f} | "
                      f"{r['scoring']:.0f} | {r['scoring'] / r['prefill']:.2f} | "
                      f"{r['decode']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
