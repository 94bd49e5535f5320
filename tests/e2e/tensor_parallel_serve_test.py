"""`megactx serve --tensor-parallel-size N` end to end: the server and N - 1
forked worker processes share the model (heads and MLP widths split, or the
routed experts sharded with --expert-parallel-size N; with
--enable-layer-split each layer's KV cache on one rank, which sends the
entries a step selected to the others; or, with
--context-parallel-size N, every prefill step's rows split over ranks that
each hold the whole model, or all of it but 1 / N of the routed experts with
--expert-parallel-size N, or over N shares of --tensor-parallel-size T
ranks, the experts over each share's T ranks or, with --expert-parallel-size
N x T, over the whole group; --split-indexer splits the indexer's heads over the tensor-parallel
ranks), one engine and HTTP front. On an HF fixture (glm_moe_dsa with IndexShare and MoE layers, token
ids in and out) the greedy continuation equals HF transformers' greedy ids
(the fixture's reference.json) and the single-process server's output, the
logprobs agree with it within 1e-4, concurrent requests do not mix, the
workers exit with the server, a server whose worker dies shuts down, and the
configurations that are not served yet are start-up errors. MTP speculation
(--speculative-steps 3) on the default model over 2 ranks (tensor or context
parallel, the latter also with the experts sharded) gives the single-process plain decoding's greedy ids and logprobs,
with drafts accepted, also with LayerSplit (and over 2 context shares of 2 tensor ranks with
LayerSplit). Weight updates reach every rank (tensor parallel, with LayerSplit,
context parallel with the experts sharded, and context over tensor parallel): a trainer's tensor (the negated
lm_head) gives the single-process server's output after the same update,
update_weights_from_disk and a release / resume of the weights bring back
the original output; so do the same tensor through a trainer's torch.distributed
group of 1 + N ranks (gloo) and as pickled tensors (one payload per rank), when
torch is here. With a host KV tier over 2 ranks, a prompt pushed out
of the device pool comes back from host memory with the cold run's output
(also with LayerSplit, whose ranks' host tiers hold their own layers). With
LayerSplit the start-up log shows each rank's share of the KV pools and the
same --kv-memory holds about N times the pages. Requests that decode from
pages moved to the live host tier (--host-latent-memory) over 2 ranks,
replicated and with LayerSplit, give one process's output. Context-parallel
prefills return one process's routed experts (--enable-return-routed-experts).

    python3 tensor_parallel_serve_test.py --megactx build/megactx --fixture tests/fixtures/hf/glm_schedule \
        --mtp-model models/default
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import signal
import struct
import subprocess
import sys

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megactx_server import MegactxServer  # noqa: E402
from weight_buckets import safetensors_bytes, update_body  # noqa: E402
try:  # SGLang's NCCL transport needs a torch trainer (Debian's python3-torch in CI)
    import torch
    from trainer_group import TrainerGroup
    import tensor_payloads
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

COMMON = ("--skip-tokenizer-init", "--kv-dtype", "f32", "--max-running-requests", "8")


def generate(url, ids, new_tokens):
    response = requests.post(url + "/generate", json={
        "input_ids": ids, "return_logprob": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}},
        timeout=300)
    response.raise_for_status()
    body = response.json()
    logprobs = [entry[0] for entry in body["meta_info"]["output_token_logprobs"]]
    return body["output_ids"], logprobs


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def speculation_over_two_ranks(megactx, model, layout=("--tensor-parallel-size", "2"),
                               mtp_graphs=False):
    """MTP over two ranks (tensor or context parallel) against one process without MTP:
    (ok, message). mtp_graphs: the MTP layer's runs must replay CUDA Graphs too."""
    ids_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "default_model",
                            "passkey_8k_ids.txt")
    prompt = [int(token) for token in open(ids_file).read().replace(",", " ").split()[:48]]
    with MegactxServer(megactx, model, *COMMON, name="plain") as server:
        want_ids, want_logprobs = generate(server.url, prompt, 24)
    with MegactxServer(megactx, model, *COMMON, *layout, "--speculative-steps", "3",
                       name="tp-mtp") as server:
        ids, logprobs = generate(server.url, prompt, 24)
        metrics = requests.get(server.url + "/metrics", timeout=30).text
    verify = metric(metrics, "megactx_spec_verify_steps_total") or 0
    accepted = metric(metrics, "megactx_spec_accepted_tokens_total") or 0
    mtp_replays = metric(metrics, 'megactx_cuda_graph_replays_total{graphs="mtp"}') or 0
    worst = max(abs(a - b) for a, b in zip(logprobs, want_logprobs))
    ok = ids == want_ids and worst <= 1e-4 and verify > 0 and accepted > 0 and \
        (mtp_replays > 0 or not mtp_graphs)
    return ok, (f"{' '.join(layout)} --speculative-steps 3: greedy ids "
                f"{'equal to' if ids == want_ids else 'DIFFERENT from'} one process without MTP, "
                f"max |logprob difference| {worst:.2e}, {accepted:.0f} drafts accepted in "
                f"{verify:.0f} verifications, {mtp_replays:.0f} MTP graph replays")


def fixture_tensor(fixture, name):
    """(dtype, shape, raw bytes) of one tensor of a sharded safetensors checkpoint."""
    index = json.load(open(os.path.join(fixture, "model.safetensors.index.json")))
    raw = open(os.path.join(fixture, index["weight_map"][name]), "rb").read()
    size = struct.unpack("<Q", raw[:8])[0]
    entry = json.loads(raw[8:8 + size])[name]
    begin, end = entry["data_offsets"]
    return entry["dtype"], entry["shape"], raw[8 + size + begin:8 + size + end]


def post(server, path, payload):
    response = requests.post(server.url + path, json=payload, timeout=300)
    response.raise_for_status()
    return response


def weight_updates_over_two_ranks(megactx, fixture, prompt, new_tokens, extra=(),
                                  layout=("--tensor-parallel-size", "2")):
    """Updates through a 2-rank server against one process: (ok, message)."""
    dtype, shape, raw = fixture_tensor(fixture, "lm_head.weight")
    assert dtype == "F32", dtype
    negated = bytearray(raw)
    for i in range(3, len(negated), 4):
        negated[i] ^= 0x80  # the sign bit of each little-endian float
    bucket = safetensors_bytes({"lm_head.weight": (dtype, shape, bytes(negated))})
    with MegactxServer(megactx, fixture, *COMMON, name="single") as server:
        update_body(server, bucket).raise_for_status()
        want = generate(server.url, prompt, new_tokens)
    # The serving group's processes: each is a rank of a trainer's weight-update group.
    sizes = {flag: int(layout[i + 1]) for i, flag in enumerate(layout)
             if flag in ("--tensor-parallel-size", "--context-parallel-size")}
    ranks = sizes.get("--tensor-parallel-size", 1) * sizes.get("--context-parallel-size", 1)
    group_args = ("--weight-update-python", sys.executable) if torch is not None else ()
    via_group = via_tensor = None
    group_note = "the trainer's group and pickled tensors: skipped (no torch)"
    with MegactxServer(megactx, fixture, *COMMON, *layout, *extra, *group_args,
                       name="tp-updates") as server:
        before = generate(server.url, prompt, new_tokens)
        update_body(server, bucket).raise_for_status()
        after = generate(server.url, prompt, new_tokens)
        post(server, "/update_weights_from_disk", {"model_path": fixture})
        restored = generate(server.url, prompt, new_tokens)
        post(server, "/release_memory_occupation", {"tags": ["weights"]})
        post(server, "/resume_memory_occupation", {"tags": ["weights"]})
        resumed = generate(server.url, prompt, new_tokens)
        if torch is not None:
            # SGLang's NCCL transport on gloo: the trainer is rank 0 of 1 + `ranks`.
            group = TrainerGroup(server.url, "tp-updates", engine_ranks=ranks)
            assert group.status == 200, group.answer
            status, answer = group.update({"lm_head.weight": torch.frombuffer(
                bytearray(negated), dtype=torch.float32).reshape(shape)})
            assert status == 200, answer
            via_group = generate(server.url, prompt, new_tokens)
            assert group.destroy()[0] == 200
            # SGLang's tensor transport: one payload per rank of the server, then the original
            # back the same way.
            restore = post(server, "/update_weights_from_disk", {"model_path": fixture})
            assert restore.status_code == 200
            negated_tensor = torch.frombuffer(bytearray(negated), dtype=torch.float32).reshape(shape)
            payload = tensor_payloads.named_payload({"lm_head.weight": negated_tensor})
            post(server, "/update_weights_from_tensor",
                 {"serialized_named_tensors": [payload] * ranks})
            via_tensor = generate(server.url, prompt, new_tokens)
            group_note = ("through the trainer's group ({} ranks of {}): {}; as pickled tensors "
                          "({} payloads): {}".format(
                              ranks, ranks + 1,
                              "the same" if via_group[0] == want[0] else "NOT the same", ranks,
                              "the same" if via_tensor[0] == want[0] else "NOT the same"))
    worst = max(abs(a - b) for a, b in zip(after[1], want[1]))
    ok = after[0] == want[0] and worst <= 1e-4 and after[0] != before[0] and \
        restored == before and resumed[0] == before[0] and \
        (via_group is None or via_group[0] == want[0]) and \
        (via_tensor is None or via_tensor[0] == want[0])
    return ok, (f"weight updates over 2 ranks{''.join(' ' + a for a in layout + extra)}: a "
                f"trainer's "
                f"lm_head "
                f"{'gives' if after[0] == want[0] else 'does NOT give'} one process's output "
                f"(max |logprob difference| {worst:.2e}, output changed: {after[0] != before[0]}); "
                f"update_weights_from_disk restores it: {restored == before}; release + resume: "
                f"{resumed[0] == before[0]}; {group_note}")


def host_tier_over_two_ranks(megactx, model, extra=(), kv_memory="3840KiB"):
    """A prefix evicted to the host tier and hit again over 2 ranks: (ok, message)."""
    def ids(length, seed):
        rng = random.Random(seed)
        return [rng.randrange(100, 8000) for _ in range(length)]

    # 10 pages of f32 KV per rank on the device (the default model), 64 MiB of host tier.
    # (LayerSplit: each rank half the pools, so half the memory for those 10 pages.)
    with MegactxServer(megactx, model, *COMMON, "--tensor-parallel-size", "2", *extra,
                       "--host-kv-memory", "64MiB", kv_memory=kv_memory,
                       name="tp-host-tier") as server:
        prompt = ids(150, 31)
        cold = generate(server.url, prompt, 8)
        for seed in (32, 33, 34, 35):  # push the prompt's pages out of the device pool
            generate(server.url, ids(200, seed), 8)
        warm = generate(server.url, prompt, 8)
        metrics = requests.get(server.url + "/metrics", timeout=30).text
    host_hits = metric(metrics, "megactx_prefix_cache_host_hit_tokens_total") or 0
    worst = max(abs(a - b) for a, b in zip(warm[1], cold[1]))
    ok = warm[0] == cold[0] and worst <= 1e-4 and host_hits >= 128
    return ok, (f"host KV tier over 2 ranks{''.join(' ' + a for a in extra)}: {host_hits:.0f} prompt tokens from host memory, "
                f"output {'equal to' if warm[0] == cold[0] else 'DIFFERENT from'} the cold run's "
                f"(max |logprob difference| {worst:.2e})")


def kv_pages(log):
    """The pages of the start-up log's KV cache line, and the line."""
    for line in log:
        match = re.search(r"KV cache: (\d+) pages", line)
        if match:
            return int(match.group(1)), line.strip()
    return 0, ""


def live_host_tier_over_two_ranks(megactx, model):
    """Requests that decode from pages moved to the live host tier (--host-latent-memory) over
    2 ranks, replicated and with LayerSplit, against one process without the tier:
    [(ok, message)]."""
    def ids(length, seed):
        rng = random.Random(seed)
        return [rng.randrange(100, 8000) for _ in range(length)]

    prompts = [ids(150 + 40 * i, 51 + i) for i in range(3)]

    def serve(*extra, kv_memory="16MiB"):
        with MegactxServer(megactx, model, *COMMON, *extra, kv_memory=kv_memory,
                           name="live-tier") as server:
            outputs = [generate(server.url, prompt, 70) for prompt in prompts]
            metrics = requests.get(server.url + "/metrics", timeout=30).text
        return outputs, metric(metrics, "megactx_host_latent_moved_pages_total") or 0

    plain, _ = serve()
    results = []
    # (LayerSplit: each rank half the pools, so half the memory for the same pages.)
    for extra, kv_memory, host in (((), "16MiB", "32MiB"),
                                   (("--enable-layer-split",), "8MiB", "16MiB")):
        outputs, moved = serve("--tensor-parallel-size", "2", *extra, "--host-latent-memory",
                               host, kv_memory=kv_memory)
        same = all(got[0] == want[0] for got, want in zip(outputs, plain))
        worst = max(abs(a - b) for got, want in zip(outputs, plain)
                    for a, b in zip(got[1], want[1]))
        ok = same and worst <= 1e-4 and moved > 0
        results.append((ok, f"live host tier over 2 ranks{''.join(' ' + a for a in extra)}: "
                            f"{moved:.0f} pages moved to host memory, greedy ids "
                            f"{'equal to' if same else 'DIFFERENT from'} one process without "
                            f"the tier, max |logprob difference| {worst:.2e}"))
    return results


def run(megactx, fixture, extra, prompts, new_tokens):
    with MegactxServer(megactx, fixture, *COMMON, *extra, name="tp") as server:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            outputs = list(pool.map(lambda ids: generate(server.url, ids, new_tokens), prompts))
        info = requests.get(server.url + "/get_server_info", timeout=30).json()
        info["kv_pages"], info["kv_line"] = kv_pages(server.log)
        info["metrics"] = requests.get(server.url + "/metrics", timeout=30).text
        leader = server.process.pid
        workers = subprocess.run(["pgrep", "-P", str(leader)], capture_output=True,
                                 text=True).stdout.split()
    # The server waited for its workers before it exited.
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().split()[2] == "Z", f"worker {pid} outlived the server"
    return outputs, info, len(workers)


def routed_experts(megactx, fixture, prompts, extra):
    """(output ids, routed experts) of each prompt, all sent at once, from a server with
    --enable-return-routed-experts and `extra`."""
    with MegactxServer(megactx, fixture, *COMMON, "--enable-return-routed-experts", *extra,
                       name="routing") as server:
        def one(request_ids):
            response = requests.post(server.url + "/generate", json={
                "input_ids": request_ids, "return_routed_experts": True,
                "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}},
                timeout=300)
            response.raise_for_status()
            body = response.json()
            return body["output_ids"], body["meta_info"]["routed_experts"]

        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(one, prompts))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--fixture", required=True)
    parser.add_argument("--mtp-model", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "default"))
    args = parser.parse_args()
    reference = json.load(open(os.path.join(args.fixture, "reference.json")))
    prompt, greedy = reference["input_ids"], reference["greedy_ids"]
    # The fixture's prompt (HF's greedy ids known) and two others sent at the same time.
    prompts = [prompt, prompt[3:] + prompt[:3], list(reversed(prompt))]
    new_tokens = len(greedy)

    plain, plain_info, _ = run(args.megactx, args.fixture, (), prompts, new_tokens)
    assert plain[0][0] == greedy, f"one process: {plain[0][0]} != HF's {greedy}"
    failures = 0
    for extra, workers in ((("--tensor-parallel-size", "2"), 1),
                           (("--tensor-parallel-size", "2", "--expert-parallel-size", "2"), 1),
                           (("--tensor-parallel-size", "4"), 3),
                           (("--tensor-parallel-size", "2", "--enable-layer-split"), 1),
                           (("--tensor-parallel-size", "2", "--expert-parallel-size", "2",
                             "--enable-layer-split"), 1),
                           (("--tensor-parallel-size", "4", "--enable-layer-split"), 3),
                           (("--context-parallel-size", "2"), 1),
                           (("--context-parallel-size", "2", "--expert-parallel-size", "2"), 1),
                           # The experts' rows gathered from every rank's padded share, not
                           # sent pair by pair (expert_dispatch.h).
                           (("--context-parallel-size", "2", "--expert-parallel-size", "2",
                             "--moe-dispatch", "gathered"), 1),
                           (("--context-parallel-size", "3"), 2),
                           (("--context-parallel-size", "2", "--tensor-parallel-size", "2"), 3),
                           (("--context-parallel-size", "2", "--tensor-parallel-size", "2",
                             "--expert-parallel-size", "2"), 3),
                           # The experts over the whole group of 4 (each MoE layer gathers
                           # both shares' rows), not over each share's 2 tensor ranks.
                           (("--context-parallel-size", "2", "--tensor-parallel-size", "2",
                             "--expert-parallel-size", "4"), 3),
                           # The indexer's heads split over the ranks, the scores summed.
                           (("--tensor-parallel-size", "2", "--split-indexer"), 1),
                           # Each context share's caches split over its 2 tensor ranks.
                           (("--context-parallel-size", "2", "--tensor-parallel-size", "2",
                             "--enable-layer-split"), 3),
                           # ... and the experts over the whole group of 4.
                           (("--context-parallel-size", "2", "--tensor-parallel-size", "2",
                             "--enable-layer-split", "--expert-parallel-size", "4"), 3)):
        outputs, info, seen = run(args.megactx, args.fixture, extra, prompts, new_tokens)
        worst = 0.0
        for (ids, logprobs), (want_ids, want_logprobs) in zip(outputs, plain):
            if ids != want_ids:
                print(f"FAIL {' '.join(extra)}: {ids} != one process's {want_ids}")
                failures += 1
            worst = max([worst] + [abs(a - b) for a, b in zip(logprobs, want_logprobs)])
        ok = worst <= 1e-4 and seen == workers and \
            info.get(extra[0][2:].replace("-", "_")) == int(extra[1])
        split = ""
        if "--enable-layer-split" in extra:
            # Each rank holds its layers' pools only: the same --kv-memory holds more pages
            # (the fixture's 8 layers, 4 of them with an indexer pool, split evenly over 2 and
            # 4 tensor ranks: exactly 2x and 4x; the largest rank's share bounds them in general).
            ranks = int(extra[extra.index("--tensor-parallel-size") + 1])
            ratio = info["kv_pages"] / max(plain_info["kv_pages"], 1)
            ok = ok and info.get("enable_layer_split") is True and \
                f"split over {ranks} ranks (LayerSplit)" in info["kv_line"] and ratio >= 0.99 * ranks
            split = f", {ratio:.2f}x one process's KV pages ({info['kv_line']})"
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {' '.join(extra)}: {seen} workers, greedy ids equal to "
              f"HF's and one process's, max |logprob difference| {worst:.2e}{split}")
    for layout in (("--tensor-parallel-size", "2"), ("--context-parallel-size", "2"),
                   ("--context-parallel-size", "2", "--expert-parallel-size", "2"),
                   ("--tensor-parallel-size", "2", "--enable-layer-split"),
                   ("--context-parallel-size", "2", "--tensor-parallel-size", "2",
                    "--enable-layer-split"),
                   ("--context-parallel-size", "2", "--tensor-parallel-size", "2",
                    "--expert-parallel-size", "4")):
        ok, message = speculation_over_two_ranks(args.megactx, args.mtp_model, layout)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {message}")
    for extra, layout in (((), ("--tensor-parallel-size", "2")),
                          (("--enable-layer-split",), ("--tensor-parallel-size", "2")),
                          ((), ("--context-parallel-size", "2", "--expert-parallel-size", "2")),
                          ((), ("--context-parallel-size", "2", "--tensor-parallel-size", "2")),
                          ((), ("--context-parallel-size", "2", "--tensor-parallel-size", "2",
                                "--expert-parallel-size", "4"))):
        ok, message = weight_updates_over_two_ranks(args.megactx, args.fixture, prompt,
                                                    new_tokens, extra, layout)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {message}")
    for extra, kv_memory in (((), "3840KiB"), (("--enable-layer-split",), "1920KiB")):
        ok, message = host_tier_over_two_ranks(args.megactx, args.mtp_model, extra, kv_memory)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {message}")
    for ok, message in live_host_tier_over_two_ranks(args.megactx, args.mtp_model):
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {message}")
    # The routed experts of context-parallel prefills (each rank's rows gathered) are one
    # process's, with the experts whole on every rank and sharded over the group.
    plain_routing = routed_experts(args.megactx, args.fixture, prompts, ())
    for extra in (("--context-parallel-size", "2"),
                  ("--context-parallel-size", "2", "--expert-parallel-size", "2"),
                  ("--context-parallel-size", "2", "--tensor-parallel-size", "2",
                   "--expert-parallel-size", "4")):
        routing = routed_experts(args.megactx, args.fixture, prompts, extra)
        ok = routing == plain_routing and all(r for _, r in routing)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {' '.join(extra)} --enable-return-routed-experts: "
              f"output ids and routed experts {'equal to' if ok else 'DIFFER from'} one process's")
    # Not served yet: start-up errors, not hangs.
    for extra in (("--tensor-parallel-size", "2", "--enable-dp-attention"),
                  ("--tensor-parallel-size", "2", "--expert-parallel-size", "3"),
                  ("--tensor-parallel-size", "3"),  # 4 heads do not divide by 3
                  ("--context-parallel-size", "2", "--tensor-parallel-size", "2",
                   "--expert-parallel-size", "3"),
                  ("--context-parallel-size", "2", "--expert-parallel-size", "3"),
                  ("--enable-layer-split",),  # no tensor-parallel group to split over
                  ("--split-indexer",),
                  ("--tensor-parallel-size", "2", "--split-indexer", "--enable-layer-split"),
                  ("--context-parallel-size", "2", "--enable-layer-split"),
                  ("--tensor-parallel-size", "2", "--enable-layer-split", "--enable-dp-attention"),
                  ("--tensor-parallel-size", "2", "--enable-layer-split", "--host-latent-memory",
                   "64MiB", "--device", "cuda")):
        result = subprocess.run([args.megactx, "serve", "--model", args.fixture, "--port", "0",
                                 *COMMON, *extra], capture_output=True, text=True, timeout=120)
        refused = result.returncode != 0 and "error" in result.stderr.lower() and \
            ("--enable-layer-split" not in extra or "--enable-layer-split" in result.stderr)
        failures += not refused
        print(f"{'ok  ' if refused else 'FAIL'} {' '.join(extra)}: refused "
              f"({result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ''})")
    # A worker rank dies: the next request fails with the group's error, and the server
    # (which cannot serve without it) shuts down with exit status 1, its other workers with it.
    with MegactxServer(args.megactx, args.fixture, *COMMON, "--tensor-parallel-size", "4",
                       name="tp") as server:
        generate(server.url, prompt, 2)
        workers = subprocess.run(["pgrep", "-P", str(server.process.pid)], capture_output=True,
                                 text=True).stdout.split()
        os.kill(int(workers[1]), signal.SIGKILL)
        response = requests.post(server.url + "/generate", json={
            "input_ids": prompt, "sampling_params": {"max_new_tokens": 2}}, timeout=60)
        status = server.process.wait(60)
        alive = [w for w in workers
                 if os.path.exists(f"/proc/{w}") and open(f"/proc/{w}/stat").read().split()[2] != "Z"]
    # A failed engine step is the server's error (500), not the request's.
    ok = response.status_code == 500 and "communicator" in response.text and status == 1 and not alive
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} a killed worker: request refused ({response.status_code}), "
          f"server exit {status}, {len(alive)} workers left")
    # The leader fails after the group is up (no tokenizer.json, no --skip-tokenizer-init):
    # the server exits with the error, its worker with it, instead of waiting forever.
    result = subprocess.run([args.megactx, "serve", "--model", args.fixture, "--port", "0",
                             "--kv-dtype", "f32", "--tensor-parallel-size", "2"],
                            capture_output=True, text=True, timeout=120)
    refused = result.returncode != 0 and "tokenizer" in result.stderr
    failures += not refused
    print(f"{'ok  ' if refused else 'FAIL'} a leader that fails after the group is up exits")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
