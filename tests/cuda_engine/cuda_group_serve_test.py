"""`megactx serve --device cuda --tensor-parallel-size 2` on ONE GPU
(`--gpu-id-step 0`): the serving group's ranks, each a CUDA model with its
share of the heads and MLP widths (or of the routed experts, with
`--expert-parallel-size 2`; or attention whole and its own requests, with
`--enable-dp-attention`; or every prefill step's rows split, with
`--context-parallel-size 2`), give the single-process CUDA server's greedy ids
(and HF's, the fixture's reference.json) with logprobs within 1e-4, for three
concurrent requests; with MTP speculation (`--speculative-steps 3`, the
default model; tensor parallel and data-parallel attention) one process's
plain greedy ids, drafts accepted; with data-parallel attention every replica samples its
own rows (/metrics). The partial sums travel through host memory over the CPU
group (`--cuda-collectives host`, eager steps) and over NCCL with each rank
named a host of its own (the default `nccl`; eager too: ranks that share a
GPU run without CUDA Graphs, whose first capture hung there); data-parallel
attention also with `--moe-dispatch gathered` (the dispatch its graph steps
take) on every step. On a machine with several GPUs tensor, expert,
data-parallel attention, LayerSplit and context-parallel layouts run one rank
per GPU (`--gpu-id-step 1`, the default) and must replay CUDA Graphs (NCCL
inside them); that case runs where `nvidia-smi` lists two GPUs.

    python3 tests/cuda_engine/cuda_group_serve_test.py --megactx build/megactx \
        --fixture tests/fixtures/hf/glm_schedule

Exit 77 without a GPU. Run by scripts/gpu-check.sh.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from dp_attention_serve_test import rejection_over_two_ranks  # noqa: E402
from tensor_parallel_serve_test import run, speculation_over_two_ranks  # noqa: E402

# MegactxServer passes --kv-memory (256 MiB per rank): two ranks on one GPU
# do not each take a fraction of the whole device.
CUDA = ("--device", "cuda")


def gpus():
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def graph_replays(info):
    """The target's CUDA Graph replays in a run's /metrics text."""
    for line in info.get("metrics", "").splitlines():
        if line.startswith('megactx_cuda_graph_replays_total{graphs="target"}'):
            return float(line.split()[-1])
    return -1.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--megactx", required=True)
    parser.add_argument("--fixture", required=True)
    parser.add_argument("--mtp-model", default=os.path.join(HERE, "..", "..", "models", "default"))
    args = parser.parse_args()
    count = gpus()
    if count < 1:
        print("skipped: no GPU (nvidia-smi lists none)")
        return 77
    reference = json.load(open(os.path.join(args.fixture, "reference.json")))
    prompt, greedy = reference["input_ids"], reference["greedy_ids"]
    prompts = [prompt, prompt[3:] + prompt[:3], list(reversed(prompt))]
    new_tokens = len(greedy)
    plain, plain_info, _ = run(args.megactx, args.fixture, CUDA, prompts, new_tokens)
    failures = 0
    if plain[0][0] != greedy:
        print(f"FAIL one CUDA process: {plain[0][0]} != HF's {greedy}")
        failures += 1
    # One process replays its decode steps as CUDA Graphs (/metrics).
    if graph_replays(plain_info) <= 0:
        print("FAIL one CUDA process: no decode step replayed a CUDA Graph")
        failures += 1
    layouts = []
    for collectives in ("host", "nccl"):
        for experts in ((), ("--expert-parallel-size", "2"),
                        ("--expert-parallel-size", "2", "--enable-dp-attention"),
                        # The gathered MoE dispatch (what graph steps take) on every step.
                        ("--expert-parallel-size", "2", "--enable-dp-attention",
                         "--moe-dispatch", "gathered")):
            layouts.append(("--tensor-parallel-size", "2", *experts, "--gpu-id-step", "0",
                            "--cuda-collectives", collectives))
        # LayerSplit: each layer's KV cache on one of the 2 ranks.
        layouts.append(("--tensor-parallel-size", "2", "--enable-layer-split", "--gpu-id-step",
                        "0", "--cuda-collectives", collectives))
        # Context parallelism: every prefill step's rows split over 2 ranks.
        for experts in ((), ("--expert-parallel-size", "2")):
            layouts.append(("--context-parallel-size", "2", *experts, "--gpu-id-step", "0",
                            "--cuda-collectives", collectives))
        # Context shares of tensor ranks: 2 shares of 2 (the experts over each share's 2).
        for experts in ((), ("--expert-parallel-size", "2")):
            layouts.append(("--context-parallel-size", "2", "--tensor-parallel-size", "2",
                            *experts, "--gpu-id-step", "0", "--cuda-collectives", collectives))
        # SGLang's --dp-size below --tp-size: 2 replicas of 2 tensor-parallel ranks.
        layouts.append(("--tensor-parallel-size", "4", "--expert-parallel-size", "4",
                        "--enable-dp-attention", "--data-parallel-size", "2", "--gpu-id-step", "0",
                        "--cuda-collectives", collectives))
        # ... with LayerSplit inside each replica: each layer's KV on one of its 2 ranks.
        layouts.append(("--tensor-parallel-size", "4", "--expert-parallel-size", "4",
                        "--enable-dp-attention", "--data-parallel-size", "2",
                        "--enable-layer-split", "--gpu-id-step", "0",
                        "--cuda-collectives", collectives))
    if count >= 2:
        # Ranks on GPUs of their own: NCCL inside their CUDA Graphs.
        layouts.append(("--tensor-parallel-size", "2"))
        layouts.append(("--tensor-parallel-size", "2", "--expert-parallel-size", "2"))
        layouts.append(("--tensor-parallel-size", "2", "--expert-parallel-size", "2",
                        "--enable-dp-attention"))
        layouts.append(("--tensor-parallel-size", "2", "--enable-layer-split"))
        layouts.append(("--context-parallel-size", "2", "--expert-parallel-size", "2"))
    for layout in layouts:
        try:
            outputs, info, workers = run(args.megactx, args.fixture, CUDA + layout, prompts,
                                         new_tokens)
        except Exception as error:  # a server that did not start: its log says why
            failures += 1
            print(f"FAIL {' '.join(layout)}: {str(error).strip().splitlines()[-1:]}")
            continue
        same = all(got[0] == want[0] for got, want in zip(outputs, plain))
        worst = max(abs(a - b) for got, want in zip(outputs, plain)
                    for a, b in zip(got[1], want[1]))
        sizes = {flag: int(layout[i + 1]) for i, flag in enumerate(layout)
                 if flag in ("--tensor-parallel-size", "--context-parallel-size")}
        tensor = sizes.get("--tensor-parallel-size", 1)
        context = sizes.get("--context-parallel-size", 1)
        ok = same and worst <= 1e-4 and workers == tensor * context - 1 and \
            info.get("tensor_parallel_size") == tensor and \
            info.get("context_parallel_size", 1) == context
        # Data-parallel attention: every replica sampled its own rows (on its device).
        sampled = [float(line.split()[-1]) for line in info.get("metrics", "").splitlines()
                   if line.startswith("megactx_dp_rank_sampled_rows_total{")]
        if "--enable-dp-attention" in layout:
            ok = ok and len(sampled) == info.get("dp_size") and all(n > 0 for n in sampled)
        # CUDA Graphs: none through host collectives (each waits for the
        # stream) nor for NCCL ranks that share a GPU (their first capture
        # hung: they run eagerly); ranks on GPUs of their own replay them where
        # the layout captures at all (every layout but replicas of tensor
        # ranks, whose MoE takes the all-to-all: data-parallel attention's
        # steps take the gathered dispatch, LayerSplit's send the selected
        # entries).
        replays = graph_replays(info)
        shared_gpu = "--gpu-id-step" in layout
        captures = "--data-parallel-size" not in layout
        ok = ok and (replays > 0 if captures and not shared_gpu else replays == 0)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {' '.join(layout)}: {workers} workers, greedy ids "
              f"{'equal to' if same else 'DIFFERENT from'} one CUDA process's, "
              f"max |logprob difference| {worst:.2e}, {replays:.0f} graph replays"
              + (f", rows sampled per replica {sampled}" if sampled else ""))
    # MTP speculation (drafts chained on the device) over the 2 ranks on one GPU,
    # against one process without MTP (on the CPU: the fp32 mode is HF's within 1e-6).
    for collectives in ("host", "nccl"):
        for dp in ((), ("--expert-parallel-size", "2", "--enable-dp-attention")):
            ok, message = speculation_over_two_ranks(
                args.megactx, args.mtp_model,
                ("--device", "cuda", "--tensor-parallel-size", "2", *dp, "--gpu-id-step", "0",
                 "--cuda-collectives", collectives))
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {message}")
    if count >= 2:
        # One rank per GPU: the MTP layer's runs replay CUDA Graphs too (under data-parallel
        # attention padded to the whole run's shape; with the experts split by all-to-all, the
        # MoE by the gathered dispatch).
        for layout in (("--tensor-parallel-size", "2"),
                       ("--tensor-parallel-size", "2", "--expert-parallel-size", "2",
                        "--enable-dp-attention"),
                       ("--context-parallel-size", "2", "--expert-parallel-size", "2")):
            ok, message = speculation_over_two_ranks(
                args.megactx, args.mtp_model, ("--device", "cuda", *layout), mtp_graphs=True)
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {message}")
    # Sampled drafts verified by rejection sampling at the data-parallel ranks (each rank's
    # rows to the host there: CudaSampler::rows_on_host) against one CUDA process, uniform
    # for uniform (the ranks' logits equal one process's exactly).
    ok, message = rejection_over_two_ranks(
        args.megactx, args.mtp_model, device_flags=("--device", "cuda"),
        group_flags=("--gpu-id-step", "0", "--cuda-collectives", "nccl"))
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} CUDA, {message}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
