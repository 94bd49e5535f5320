#!/usr/bin/env python3
"""PyTorch peer baselines for the DSA kernels, on the same GPU, same shapes as
bench/cuda/dsa_attention_bench: the indexer as bf16 matmul + relu + weighted
sum + torch.topk, torch.topk alone, sparse MLA decode as gather + einsum +
softmax + einsum, and indexer prefill in chunks; plus the ceilings (D2D copy,
bf16 GEMM, fp8 torch._scaled_mm) measured in the same process.

Usage: python3 tools/bench/dsa_torch_baseline.py [--quick] [--json OUT.json]
Prints a markdown table; times are medians of CUDA-event-timed repetitions.
"""
import argparse
import json

import torch


def median_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def ceilings(rows):
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a), reps=10)
    rows.append(("D2D copy 1 GiB", ms, f"{2 * n / ms / 1e6:.0f} GB/s (read+write)"))
    del a, b
    size = 8192
    x = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: x @ y, reps=10)
    rows.append(("bf16 GEMM 8192^3", ms, f"{2 * size**3 / ms / 1e9:.0f} TFLOP/s"))
    try:
        xf = x.to(torch.float8_e4m3fn)
        yf = y.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.ones((), device="cuda")
        ms = median_ms(lambda: torch._scaled_mm(xf, yf, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps=10)
        rows.append(("fp8 GEMM 8192^3 (_scaled_mm)", ms, f"{2 * size**3 / ms / 1e9:.0f} TFLOP/s"))
    except Exception as error:  # noqa: BLE001 - report, keep going
        rows.append(("fp8 GEMM 8192^3 (_scaled_mm)", float("nan"), f"failed: {error}"))


def indexer_decode(rows, contexts, heads=32, dim=128, top_k=2048):
    for n in contexts:
        keys = torch.randn(n, dim, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(heads, dim, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(heads, device="cuda", dtype=torch.float32)

        def full():
            scores = torch.relu(q @ keys.t()).float()  # [heads, n]
            s = (w[:, None] * scores).sum(0)
            return torch.topk(s, min(top_k, n))

        ms = median_ms(full)
        scores = torch.randn(n, device="cuda")
        tk = median_ms(lambda: torch.topk(scores, min(top_k, n)))
        flops = 2 * heads * dim * n
        rows.append((f"indexer decode {n // 1024}K: matmul+relu+sum+topk", ms, f"{flops / ms / 1e9:.1f} TFLOP/s"))
        rows.append((f"torch.topk(2048) of {n // 1024}K fp32", tk, ""))
        del keys


def sparse_mla_decode(rows, batch=64, tokens=2, top_k=2048, cache_tokens=1 << 20):
    cache = torch.randn(cache_tokens, 576, device="cuda", dtype=torch.bfloat16)
    for heads in (64, 128):
        r = batch * tokens
        q = torch.randn(r, heads, 576, device="cuda", dtype=torch.bfloat16)
        idx = torch.randint(0, cache_tokens, (r, top_k), device="cuda")
        scale = 256 ** -0.5

        def attend():
            kv = cache[idx]  # [r, k, 576]
            logits = torch.einsum("rhd,rkd->rhk", q, kv).float() * scale
            p = torch.softmax(logits, dim=-1).to(torch.bfloat16)
            return torch.einsum("rhk,rkd->rhd", p, kv[..., :512])

        ms = median_ms(attend)
        flops = 2 * r * heads * top_k * (576 + 512)
        rows.append((f"sparse MLA decode {batch}x{tokens} x {heads} heads (gather+einsum+softmax)", ms,
                     f"{flops / ms / 1e9:.0f} TFLOP/s"))
    del cache


def indexer_prefill(rows, prompt, heads=32, dim=128, top_k=2048, chunk=2048):
    keys = torch.randn(prompt, dim, device="cuda", dtype=torch.bfloat16)
    qs = torch.randn(prompt, heads, dim, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(prompt, heads, device="cuda", dtype=torch.float32)
    positions = torch.arange(prompt, device="cuda")

    def run():
        for start in range(0, prompt, chunk):
            end = min(prompt, start + chunk)
            visible = end
            s = torch.relu(torch.einsum("thd,nd->thn", qs[start:end], keys[:visible])).float()
            s = (w[start:end, :, None] * s).sum(1)  # [t, visible]
            mask = positions[None, :visible] > positions[start:end, None]
            s.masked_fill_(mask, float("-inf"))
            torch.topk(s, min(top_k, visible), dim=-1)

    ms = median_ms(run, reps=2, warmup=1)
    flops = 2 * heads * dim * prompt * (prompt + 1) / 2
    rows.append((f"indexer prefill {prompt // 1024}K (chunks of {chunk})", ms,
                 f"{prompt / ms * 1e3:.0f} tok/s, {flops / ms / 1e9:.0f} TFLOP/s (causal)"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    print(f"# PyTorch {torch.__version__} baselines on {torch.cuda.get_device_name()}\n")
    ceilings(rows)
    contexts = [8192, 32768, 131072, 524288, 1048576]
    indexer_decode(rows, contexts)
    sparse_mla_decode(rows)
    indexer_prefill(rows, 32768)
    if not args.quick:
        indexer_prefill(rows, 131072, chunk=1024)
    print("| op | ms | rate |")
    print("|---|---|---|")
    for name, ms, rate in rows:
        print(f"| {name} | {ms:.4f} | {rate} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([{"op": n, "ms": m, "rate": r} for n, m, r in rows], handle, indent=1)


if __name__ == "__main__":
    main()
