"""Weight updates of a native fp8 checkpoint through `megactx serve`.

A trainer holds bf16/f32 weights; the engine serving an fp8 checkpoint (e4m3 matrices with one
float32 `weight_scale_inv` per 128 x 128 block) must re-quantise what it receives. The reference
for every update is a checkpoint no code of ours quantised: the HF fp8 fixture
(tests/fixtures/hf/glm_fp8, quantised by PyTorch) with the scales of a few matrices doubled.
Doubling a scale doubles the matrix exactly and leaves its e4m3 codes as they are, so

  - a bucket with those matrices doubled in float32 (the fixture's e4m3 * scale, times 2; exact)
    must re-quantise to the same codes and scales: scores equal the reference server's within
    float32 rounding of the scales (1e-5);
  - the same as e4m3 codes plus their doubled scales must give exactly the reference's scores;
  - as bf16 (rounded, as a bf16 trainer would send them) they must land much closer to the
    reference than the unchanged weights are (mean over positions: the indexer's top-k and the
    router are discrete, so one code moved by the rounding can flip a choice);
  - update_weights_from_disk with the original folder brings back exactly the original scores,
    with the reference folder exactly the reference's;
  - a matrix of the wrong shape, e4m3 codes without their scales, or a scale block of the wrong
    shape are refused with the tensor's name, and the weights that served keep serving.

    python3 fp8_weight_update_test.py --megactx build/megactx \\
        [--model tests/fixtures/hf/glm_fp8] [-- serve arguments, e.g. --device cuda]

Needs numpy and requests (stdlib otherwise; no torch: e4m3 is decoded from its definition).
"""
import argparse
import json
import os
import random
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np  # noqa: E402
import requests  # noqa: E402

from megactx_server import MegactxServer  # noqa: E402
import weight_buckets  # noqa: E402
from weight_buckets import safetensors_bytes  # noqa: E402

BLOCK = 128
# Matrices whose scales the reference doubles: attention, a routed expert and a dense MLP.
CHANGED = ["model.layers.0.self_attn.q_b_proj.weight",
           "model.layers.0.mlp.gate_proj.weight",
           "model.layers.1.self_attn.o_proj.weight",
           "model.layers.1.mlp.experts.2.up_proj.weight"]


# ---------------------------------------------------------------- safetensors and e4m3

def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} in file order."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    header.pop("__metadata__", None)
    body = data[8 + length:]
    return {name: (entry["dtype"], entry["shape"],
                   body[entry["data_offsets"][0]:entry["data_offsets"][1]])
            for name, entry in header.items()}


def e4m3_table():
    """The 256 values of OCP fp8 e4m3 (bias 7, no infinities, S.1111.111 is NaN)."""
    table = np.zeros(256, dtype=np.float32)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
        if exponent == 0xF and mantissa == 0x7:
            table[byte] = np.nan
        elif exponent == 0:
            table[byte] = sign * (mantissa / 8.0) * 2.0 ** -6
        else:
            table[byte] = sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)
    return table


def dequantised(tensors, name):
    """float32 [rows, cols] = e4m3 * scale_inv of its 128 x 128 block."""
    _, shape, raw = tensors[name]
    codes = np.frombuffer(raw, dtype=np.uint8).reshape(shape)
    _, scale_shape, scale_raw = tensors[name + "_scale_inv"]
    scales = np.frombuffer(scale_raw, dtype=np.float32).reshape(scale_shape)
    full = np.repeat(np.repeat(scales, BLOCK, axis=0), BLOCK, axis=1)[:shape[0], :shape[1]]
    return (e4m3_table()[codes] * full).astype(np.float32)


def bf16_bytes(values):
    """float32 -> bf16 bytes, round to nearest even."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).tobytes()


def bf16_values(raw, shape):
    """bf16 bytes -> the float32 values they hold."""
    bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32).reshape(shape)


def quantised_e4m3(values):
    """float32 [rows, cols] -> (e4m3 codes, float32 scales) in the checkpoint's block format:
    scale = block amax / 448, code = the e4m3 value nearest to value / scale (ties to the even
    code, saturating at 448). Written from the format's definition, independently of the
    engine's quantiser, which must give the very same bytes."""
    rows, cols = values.shape
    table = e4m3_table()
    magnitudes = table[:0x7F]  # codes 0..126 ascending; 0x7F is NaN
    scales = np.ones(((rows + BLOCK - 1) // BLOCK, (cols + BLOCK - 1) // BLOCK), np.float32)
    codes = np.zeros((rows, cols), np.uint8)
    for br in range(scales.shape[0]):
        for bc in range(scales.shape[1]):
            block = values[br * BLOCK:(br + 1) * BLOCK, bc * BLOCK:(bc + 1) * BLOCK]
            amax = np.float32(np.abs(block).max())
            scale = amax / np.float32(448) if amax > 0 else np.float32(1)
            scales[br, bc] = scale
            scaled = np.minimum(np.abs(block / scale).astype(np.float32), np.float32(448))
            hi = np.clip(np.searchsorted(magnitudes, scaled), 0, len(magnitudes) - 1)
            lo = np.maximum(hi - 1, 0)
            below, above = scaled - magnitudes[lo], magnitudes[hi] - scaled
            pick = np.where((above < below) | ((above == below) & (hi % 2 == 0)), hi, lo)
            codes[br * BLOCK:(br + 1) * BLOCK, bc * BLOCK:(bc + 1) * BLOCK] = \
                pick.astype(np.uint8) | np.where(block < 0, 0x80, 0).astype(np.uint8)
    return codes.tobytes(), scales.tobytes(), list(scales.shape)


def doubled_scale(tensors, name):
    dtype, shape, raw = tensors[name + "_scale_inv"]
    assert dtype == "F32", dtype
    return (dtype, shape, (np.frombuffer(raw, dtype=np.float32) * 2).astype(np.float32).tobytes())


# ---------------------------------------------------------------- the server

def post(server, path, payload):
    return requests.post(server.url + path, json=payload, timeout=300)


def update_body(server, tensors, **query):
    return weight_buckets.update_body(server, safetensors_bytes(tensors), **query)


def update_file(server, tensors, **fields):
    return weight_buckets.update_file(server, safetensors_bytes(tensors), **fields)


def scores(server, sequences):
    """Prefill-only logprobs of every position but the first, one sequence per request and each
    cold: outside --deterministic a different batch (the scheduler may split a request's
    sequences over steps) or a prefix-cache hit (another chunking) gives the same logprobs only
    within rounding, and the exact checks below compare equal computations."""
    out = []
    for sequence in sequences:
        flushed = post(server, "/flush_cache", {})
        assert flushed.status_code == 200, flushed.text
        response = post(server, "/generate", {
            "input_ids": sequence, "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 0, "temperature": 1.0}})
        assert response.status_code == 200, response.text
        entries = response.json()["meta_info"]["input_token_logprobs"]
        out.extend(entry[0] for entry in entries[1:])
    return out


def difference(a, b):
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))


def mean_difference(a, b):
    assert len(a) == len(b), (len(a), len(b))
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def weight_version(server):
    response = requests.get(server.url + "/get_weight_version", timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["weight_version"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--model", default=os.path.join(os.path.dirname(__file__), "..",
                                                        "fixtures", "hf", "glm_fp8"))
    parser.add_argument("serve_args", nargs="*")
    args = parser.parse_args()
    serve_args = ["--skip-tokenizer-init", *args.serve_args]

    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(11)
    sequences = [[rng.randrange(vocab) for _ in range(24 + 9 * i)] for i in range(3)]
    short_sequences = [[rng.randrange(vocab) for _ in range(16)] for _ in range(6)]

    original = read_safetensors(os.path.join(args.model, "model.safetensors"))
    for name in CHANGED:
        assert original[name][0] == "F8_E4M3", (name, original[name][0])
    failures = []

    def check(ok, message):
        print(("ok    " if ok else "FAIL  ") + message)
        if not ok:
            failures.append(message)

    with tempfile.TemporaryDirectory(prefix="megactx-fp8-update-") as tmp:
        # The reference folder: the fixture with the scales of CHANGED doubled (codes untouched).
        reference_dir = os.path.join(tmp, "reference")
        os.makedirs(reference_dir)
        shutil.copy(os.path.join(args.model, "config.json"), reference_dir)
        reference_tensors = dict(original)
        for name in CHANGED:
            reference_tensors[name + "_scale_inv"] = doubled_scale(original, name)
        with open(os.path.join(reference_dir, "model.safetensors"), "wb") as f:
            f.write(safetensors_bytes(reference_tensors))

        with MegactxServer(args.megactx, reference_dir, *serve_args, name="reference") as server:
            reference = scores(server, sequences)
            short_reference = scores(server, short_sequences)
        with MegactxServer(args.megactx, args.model, *serve_args, name="policy") as policy:
            base = scores(policy, sequences)
            short_base = scores(policy, short_sequences)
            gap = difference(base, reference)
            check(gap > 1e-2, f"the doubled matrices change the scores ({gap:.3g})")

            # 1. float32 bucket in the body: re-quantised to the reference's codes and scales.
            f32 = {name: ("F32", original[name][1], (2 * dequantised(original, name)).tobytes())
                   for name in CHANGED}
            response = update_body(policy, f32, weight_version="f32")
            check(response.status_code == 200 and response.json()["success"],
                  f"float32 bucket accepted ({response.status_code} {response.text[:200]})")
            d = difference(scores(policy, sequences), reference)
            check(d <= 1e-5, f"float32 bucket re-quantised: max |policy - reference| {d:.3g}")
            check(weight_version(policy) == "f32", "weight_version is the update's")

            # 2. The original folder from disk: exactly the original scores.
            response = post(policy, "/update_weights_from_disk",
                            {"model_path": os.path.abspath(args.model), "weight_version": "disk"})
            check(response.status_code == 200, f"update from disk ({response.text[:200]})")
            d = difference(scores(policy, sequences), base)
            check(d == 0, f"update from the original folder: max |policy - original| {d:.3g}")

            # 3. e4m3 codes and their doubled scales, split over two /dev/shm buckets (the first
            #    staged, the second commits): exactly the reference.
            codes = {name: original[name] for name in CHANGED}
            scales = {name + "_scale_inv": doubled_scale(original, name) for name in CHANGED}
            staged = update_file(policy, codes, commit=False)
            check(staged.status_code == 200, f"e4m3 bucket staged ({staged.text[:200]})")
            d = difference(scores(policy, sequences), base)
            check(d == 0, f"nothing applied before the commit ({d:.3g})")
            response = update_file(policy, scales, weight_version="e4m3")
            check(response.status_code == 200, f"scale bucket commits ({response.text[:200]})")
            after_codes = scores(policy, sequences)
            d = difference(after_codes, reference)
            check(d == 0, f"e4m3 codes + scales: max |policy - reference| {d:.3g}")

            # 4. Bad updates: refused with the tensor's name, the weights that served keep serving.
            def rejected(response, name, what):
                answer = response.json() if response.headers.get(
                    "Content-Type", "").startswith("application/json") else {}
                check(response.status_code == 400 and name in answer.get("message", ""),
                      f"{what} refused naming {name} ({response.status_code} "
                      f"{answer.get('message', response.text)[:160]})")
                d = difference(scores(policy, sequences), after_codes)
                check(d == 0 and weight_version(policy) == "e4m3",
                      f"after {what}: scores and version unchanged ({d:.3g})")

            name = CHANGED[0]
            rows, cols = original[name][1]
            short = (2 * dequantised(original, name))[:rows - 1]
            rejected(update_body(policy, {name: ("F32", [rows - 1, cols], short.tobytes())},
                                 weight_version="bad"), name, "a matrix of the wrong shape")
            rejected(update_body(policy, {name: original[name]}, weight_version="bad"),
                     name + "_scale_inv", "e4m3 codes without their scales")
            scale_name = name + "_scale_inv"
            _, scale_shape, scale_raw = original[scale_name]
            wrong = ("F32", [scale_shape[0] * scale_shape[1]], scale_raw)
            rejected(update_body(policy, {name: original[name], scale_name: wrong},
                                 weight_version="bad"), scale_name, "a scale block of the wrong shape")

            # 5. bf16 bucket (what a bf16 trainer sends): close to the reference.
            bf16 = {name: ("BF16", original[name][1], bf16_bytes(2 * dequantised(original, name)))
                    for name in CHANGED}
            response = post(policy, "/update_weights_from_disk",
                            {"model_path": os.path.abspath(args.model), "weight_version": "disk"})
            check(response.status_code == 200, f"update from disk ({response.text[:200]})")
            d = difference(scores(policy, sequences), base)
            check(d == 0, f"after the bad updates, the original folder: max |policy - original| "
                          f"{d:.3g}")
            response = update_body(policy, bf16, weight_version="bf16")
            check(response.status_code == 200, f"bf16 bucket accepted ({response.text[:200]})")
            # bf16 rounding moves some codes by one step, and the model's choices are discrete
            # (the indexer's top-16, the router's top experts): one flip moves a few logprobs a
            # lot. So: sequences short enough that the top-16 keeps every token, and the mean
            # difference against the mean change the update makes.
            after_bf16 = scores(policy, short_sequences)
            d, moved = mean_difference(after_bf16, short_reference), mean_difference(
                short_base, short_reference)
            # Not exact: bf16 rounding, and with native fp8 weights on CUDA the activations are
            # quantised to e4m3 per 1x128 group too, which amplifies it (0.036 against 0.0014).
            check(d <= moved / 4, f"bf16 bucket re-quantised: mean |policy - reference| {d:.3g} "
                                  f"against the update's mean change {moved:.3g} (max "
                                  f"{difference(after_bf16, short_reference):.3g})")
            # Exact: the same values quantised here from the format's definition and sent as
            # e4m3 codes with their scales give the very same scores.
            quantised = {}
            for name in CHANGED:
                codes, scale_bytes, scale_shape = quantised_e4m3(
                    bf16_values(bf16[name][2], original[name][1]))
                quantised[name] = ("F8_E4M3", original[name][1], codes)
                quantised[name + "_scale_inv"] = ("F32", scale_shape, scale_bytes)
            response = update_body(policy, quantised, weight_version="bf16-as-e4m3")
            check(response.status_code == 200, f"e4m3 of the bf16 values ({response.text[:120]})")
            d = difference(scores(policy, short_sequences), after_bf16)
            check(d == 0, f"bf16 bucket = its e4m3 block quantisation sent as codes: max "
                          f"|difference| {d:.3g}")
            response = update_body(policy, bf16, weight_version="bf16")
            check(response.status_code == 200, f"bf16 bucket again ({response.text[:120]})")
            # The same bf16 values once more, now as one bucket per matrix: the same weights.
            for index, name in enumerate(CHANGED):
                last = index == len(CHANGED) - 1
                response = update_body(policy, {name: bf16[name]}, commit=last,
                                       **({"weight_version": "bf16-split"} if last else {}))
                check(response.status_code == 200, f"bf16 bucket {name} ({response.text[:120]})")
            d = difference(scores(policy, short_sequences), after_bf16)
            check(d == 0, f"bf16 in one bucket per matrix: the same scores ({d:.3g})")

            # 6. The reference folder from disk: exactly the reference.
            response = post(policy, "/update_weights_from_disk",
                            {"model_path": reference_dir, "weight_version": "reference"})
            check(response.status_code == 200, f"reference folder from disk ({response.text[:200]})")
            d = difference(scores(policy, sequences), reference)
            check(d == 0, f"update from the reference folder: max |policy - reference| {d:.3g}")

    print(f"fp8 weight updates ({' '.join(args.serve_args) or 'cpu'}): "
          f"{'all passed' if not failures else str(len(failures)) + ' failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
