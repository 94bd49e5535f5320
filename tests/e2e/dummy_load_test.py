"""`megactx serve --load-format dummy` (SGLang's flag): random weights from a folder holding only
config.json, the benchmark load of models whose checkpoints are not at hand, and the multi-GPU
benchmark script that uses it.

- a folder with the default model's config.json alone serves token ids (no tokenizer, no
  weights read), and its greedy ids are the same in one process and in a group of two ranks
  with data-parallel attention (every rank makes the same random tensors and takes its share);
- an unknown --load-format, and --speculative-steps with a dummy load (the MTP layer comes from
  the checkpoint), are start-up errors naming the flag;
- tools/bench/multi_gpu_bench.py --small (its CPU check) runs every part on two ranks and
  writes its JSON: time per output token, output tok/s per GPU, and LayerSplit's KV pages
  (more with it, from the same budget) and decode rates.

    python3 dummy_load_test.py --megactx build/megactx
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
from megactx_server import MegactxServer  # noqa: E402


def greedy(url, ids, new_tokens):
    response = requests.post(url + "/generate", json={
        "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens,
                                              "ignore_eos": True}}, timeout=300)
    response.raise_for_status()
    return response.json()["output_ids"]


def check(failures, ok, message):
    print(f"{'ok  ' if ok else 'FAIL'} {message}", flush=True)
    return failures + (0 if ok else 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    args = parser.parse_args()
    config = os.path.join(ROOT, "models", "default", "config.json")
    folder = tempfile.mkdtemp(prefix="megactx-dummy-test-")
    failures = 0
    try:
        shutil.copy(config, os.path.join(folder, "config.json"))
        prompts = [[5 + 7 * i for i in range(40)], [900 + i for i in range(70)]]
        outputs = {}
        for label, extra in (("one process", []),
                             ("2 ranks, data-parallel attention",
                              ["--tensor-parallel-size", "2", "--expert-parallel-size", "2",
                               "--enable-dp-attention"])):
            with MegactxServer(args.megactx, folder, "--load-format", "dummy", *extra,
                               name="dummy", kv_memory="64MiB") as server:
                outputs[label] = [greedy(server.url, ids, 12) for ids in prompts]
                text = requests.post(server.url + "/generate", json={"text": "hello"},
                                     timeout=60)
            failures = check(failures, all(len(o) == 12 for o in outputs[label]) and
                             text.status_code == 400,
                             f"{label}: random weights from config.json alone serve token ids "
                             f"(text: {text.status_code})")
        same = outputs["one process"] == outputs["2 ranks, data-parallel attention"]
        failures = check(failures, same, "the same random model in one process and over 2 ranks: "
                         f"greedy ids {'equal' if same else 'DIFFERENT'}")

        for extra, named in ((["--load-format", "fast"], "--load-format"),
                             (["--load-format", "dummy", "--speculative-steps", "2"],
                              "--speculative-steps")):
            result = subprocess.run([args.megactx, "serve", "--model", folder, "--port", "0",
                                     *extra], capture_output=True, text=True, timeout=120)
            last = (result.stderr.strip().splitlines() or [""])[-1]
            failures = check(failures, result.returncode != 0 and named in last,
                             f"{' '.join(extra)}: refused ({last})")

        record_path = os.path.join(folder, "multi_gpu.json")
        result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench",
                                                              "multi_gpu_bench.py"),
                                 "--megactx", args.megactx, "--device", "cpu", "--gpus", "2",
                                 "--config", config, "--small", "--json", record_path],
                                capture_output=True, text=True, timeout=600)
        print(result.stdout, end="")
        ok = result.returncode == 0 and os.path.exists(record_path)
        record = json.load(open(record_path)) if ok else {}
        splits = record.get("layersplit", [])
        ok = ok and record.get("tpot", {}).get("tpot_s") and \
            record.get("throughput", {}).get("tok_s_per_gpu", 0) > 0 and len(splits) == 2 and \
            all(s["layer_split"]["pages"] > s["plain"]["pages"] and
                s["layer_split"]["decode_tok_s"] > 0 for s in splits)
        failures = check(failures, ok, "multi_gpu_bench.py --small: every part ran, LayerSplit "
                         "gave more KV pages from the same budget"
                         + ("" if result.returncode == 0 else f"\n{result.stderr[-2000:]}"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{failures} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
