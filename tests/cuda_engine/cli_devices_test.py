#!/usr/bin/env python3
"""`megactx generate` / `serve` through the serving Engine, on the CPU and (with
--cuda, on the GPU machine) on CUDA.

Host part (runs everywhere): `generate` (the serving Engine on the CPU) gives
24 greedy tokens, and a seeded sampled request gives the same tokens twice; the CUDA
model's switches (--cuda-fallback-attention, --cuda-host-moe, --no-cuda-graphs,
--cuda-bf16) without --device cuda are a one-line error (exit 1) in generate,
logits and serve.
--cuda: `generate --device cuda` gives the CPU's greedy tokens and
the CPU's seeded sampled tokens, also with
--cuda-fallback-attention and --cuda-host-moe (and with the FP8 KV cache
both attention paths finish); `serve --device cuda`
answers /generate with the CPU server's greedy tokens and its logprobs within
1e-4; budgets that cannot hold the model or one full-context sequence are a
one-line error at start-up (exit 1).

  python3 tests/cuda_engine/cli_devices_test.py --megactx build/megactx [--cuda]
"""
import argparse
import json
import os
import subprocess
import sys
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = [os.path.join(ROOT, "tests/fixtures/hf/glm_bf16"), os.path.join(ROOT, "models/default")]
PROMPT = "3,17,99,42,7,1,250,31,64,12,5,77,200,150,9,11,23"
failures = []


def check(condition, message):
    print(("ok   " if condition else "FAIL ") + message, flush=True)
    if not condition:
        failures.append(message)


def generate(megactx, model, *extra):
    command = [megactx, "generate", "--model", model, "--input-ids", PROMPT,
               "--max-new-tokens", "24", "--ignore-eos", *extra]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        return "error: " + result.stderr.strip().splitlines()[-1]
    return result.stdout.strip()


def start_server(megactx, model, *extra):
    process = subprocess.Popen([megactx, "serve", "--model", model, "--port", "0", *extra],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if "serving" not in line:
        process.kill()
        return None, process.stderr.read()
    return process, line.strip().rsplit(" ", 1)[-1]


def post(url, body):
    request = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def served(megactx, model, *extra):
    process, url = start_server(megactx, model, *extra)
    if process is None:
        return None, url
    try:
        body = {"input_ids": [int(x) for x in PROMPT.split(",")], "return_logprob": True,
                "top_logprobs_num": 3,
                "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}
        return post(url, body), ""
    finally:
        process.terminate()
        process.wait(timeout=60)


def start_up_error(megactx, model, *extra):
    result = subprocess.run([megactx, "serve", "--model", model, "--port", "0", *extra],
                            capture_output=True, text=True, timeout=600)
    return result.returncode, result.stderr.strip()


# Switches of the CUDA model: each needs --device cuda.
CUDA_ONLY_FLAGS = [["--cuda-fallback-attention"], ["--cuda-host-moe"], ["--no-cuda-graphs"],
                   ["--base-gpu-id", "1"], ["--gpu-id-step", "0"],
                   ["--cuda-collectives", "host"]]


def cuda_flag_error(megactx, command, model, flag):
    """(exit code, stderr) of `command` given a CUDA-only `flag` on the CPU."""
    extra = {"generate": ["--input-ids", PROMPT, "--max-new-tokens", "2"],
             "logits": ["--input-ids", PROMPT, "--out", os.devnull],
             "serve": ["--port", "0"]}[command]
    result = subprocess.run([megactx, command, "--model", model, *extra, *flag],
                            capture_output=True, text=True, timeout=600)
    return result.returncode, result.stderr.strip()


def check_cuda_flags_need_cuda(megactx, model):
    name = os.path.basename(model)
    commands = ["generate", "logits"]
    if os.path.exists(os.path.join(model, "tokenizer.json")):
        commands.append("serve")  # serve loads the tokenizer first
    for command in commands:
        flags = CUDA_ONLY_FLAGS + ([["--cuda-bf16"]] if command != "logits" else [])
        for flag in flags:
            code, text = cuda_flag_error(megactx, command, model, flag)
            lines = text.splitlines()
            check(code == 1 and len(lines) >= 1 and "error" in lines[-1] and
                  f"{flag[0]} needs --device cuda" in lines[-1],
                  f"{name}: {command} {' '.join(flag)} without --device cuda is an error: "
                  f"{text[-300:]}")


def check_host_kv_memory_errors(megactx, model):
    """serve --host-kv-memory: a size that holds no page, or none at all, is a start-up error."""
    name = os.path.basename(model)
    for size, message in (("0", "--host-kv-memory must be positive"),
                          ("abc", "does not start with a number"),
                          ("1KiB", "holds no page")):
        code, text = start_up_error(megactx, model, "--host-kv-memory", size)
        lines = text.splitlines()
        check(code == 1 and len(lines) >= 1 and message in lines[-1],
              f"{name}: serve --host-kv-memory {size} is an error: {text[-300:]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--cuda", action="store_true", help="also run the CUDA checks (GPU)")
    args = parser.parse_args()
    for model in MODELS:
        name = os.path.basename(model)
        loop = generate(args.megactx, model)
        check(not loop.startswith("error") and len(loop.split(",")) == 24, f"{name}: loop {loop}")
        sampled = ("--temperature", "0.9", "--seed", "4")
        engine_sampled = generate(args.megactx, model, *sampled)
        check(not engine_sampled.startswith("error"), f"{name}: sampled {engine_sampled}")
        check(generate(args.megactx, model, *sampled) == engine_sampled,
              f"{name}: seeded sampling reproduces")
        check_cuda_flags_need_cuda(args.megactx, model)
        if os.path.exists(os.path.join(model, "tokenizer.json")):
            check_host_kv_memory_errors(args.megactx, model)
        if not args.cuda:
            continue
        check(generate(args.megactx, model, "--device", "cuda") == loop,
              f"{name}: generate --device cuda greedy = CPU")
        # The fixtures' F32 cache never takes the fast path; the host MoE
        # dispatch computes the same float32 sums in another launch order.
        for switch in ("--cuda-fallback-attention", "--cuda-host-moe"):
            check(generate(args.megactx, model, "--device", "cuda", switch) == loop,
                  f"{name}: generate --device cuda {switch} greedy = CPU")
        for switch in ([], ["--cuda-fallback-attention"]):
            out = generate(args.megactx, model, "--device", "cuda", "--kv-dtype", "fp8", *switch)
            check(not out.startswith("error") and len(out.split(",")) == 24,
                  f"{name}: generate --device cuda --kv-dtype fp8 {' '.join(switch)}: {out}")
        check(generate(args.megactx, model, "--device", "cuda", *sampled) == engine_sampled,
              f"{name}: generate --device cuda seeded sampled = CPU")
        if not os.path.exists(os.path.join(model, "tokenizer.json")):
            continue  # serve needs a tokenizer
        want, error = served(args.megactx, model, "--kv-dtype", "f32")
        got, cuda_error = served(args.megactx, model, "--kv-dtype", "f32", "--device", "cuda",
                                 "--gpu-memory-utilization", "0.3")
        check(want is not None, f"{name}: CPU server {error}")
        check(got is not None, f"{name}: CUDA server {cuda_error}")
        if want is not None and got is not None:
            check(got["output_ids"] == want["output_ids"],
                  f"{name}: serve --device cuda greedy = CPU server")
            lp_got = [entry[0] for entry in got["meta_info"]["output_token_logprobs"]]
            lp_want = [entry[0] for entry in want["meta_info"]["output_token_logprobs"]]
            check(len(lp_got) == len(lp_want) and
                  all(abs(a - b) <= 1e-4 for a, b in zip(lp_got, lp_want)),
                  f"{name}: serve --device cuda logprobs within 1e-4")
        code, text = start_up_error(args.megactx, model, "--device", "cuda",
                                    "--gpu-memory-utilization", "0.0001")
        check(code == 1 and "error:" in text,
              f"{name}: tiny --gpu-memory-utilization is a start-up error: {text[-300:]}")
        # An explicit --context-length the KV budget cannot hold for one sequence is an
        # error (without it the model's context would shrink to what the pages hold).
        with open(os.path.join(model, "config.json")) as handle:
            context = json.load(handle)["max_position_embeddings"]
        code, text = start_up_error(args.megactx, model, "--device", "cuda", "--kv-memory", "64KiB",
                                    "--context-length", str(context))
        check(code == 1 and "needs" in text and "--context-length" in text,
              f"{name}: --kv-memory below one full-context sequence is an error: {text[-300:]}")
    print("FAILED" if failures else "PASSED", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
