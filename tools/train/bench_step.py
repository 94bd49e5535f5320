#!/usr/bin/env python3
"""Step time and peak GPU memory of the training step (train.step_loss + backward + AdamW) by row
length, attention mode and head chunking, on random tokens; plus no-grad forward passes of the
evaluation and the indexer's top-k alone. For planning a run's curriculum (run 4: rows up to 64K-128K).

    python3 tools/train/bench_step.py --init-from models/default --out $OUT/bench.json \
        --configs sparse:8192x4:0,sparse:32768x1:8192,dense:32768x1:8192,eval-sparse:131072,topk:65536

A config is MODE:TxB:HEAD_CHUNK (a training step, MODE dense, sparse (gather), mask
(sparse with the [B,T,T] mask of runs 1-3) or auto; HEAD_CHUNK 0 = whole logits as in runs 1-3),
eval-MODE:T (forward, no grad), topk:T (one Indexer.topk), check:TxB (loss and
gradients of the gather path against the mask path, fp32 and bf16 autocast), or mtp-VARIANT:TxB:IMPL
(one run's step of the MTP ablation, `train.train_mtp_variants`: the frozen target's sparse forward,
then the MTP layer's losses, backward and AdamW; VARIANT no_share_ce, share_ce or share_ce_tv, IMPL
gather or mask), or moecheck:N (the grouped-GEMM experts against the per-expert loop on N
tokens: outputs and gradients). An out-of-memory error is recorded, not fatal. --profile N: N more steps of every
training config under torch.profiler, printing the kernels that take the most device time and the
share of the wall time the device was busy (a host-bound step is mostly idle).

Measured on an H100 80GB (torch 2.11, models/default weights, random tokens, head chunk 8192; gather
path): dense 8192x4 0.31 s/step (105K tokens/s, 12.8 GiB), 16384x2 0.33 s (99K), 32768x1
0.36 s (90K, 13.0 GiB); sparse 8192x4 0.75 s (44K, 13.4 GiB), 32768x1 0.72 s (45K, 13.6 GiB),
65536x1 1.59 s (41K, 23.6 GiB; 46.3 GiB without head chunking), 131072x1 4.26 s (31K, 43.7 GiB);
runs 1-3's mask path 8192x4 0.39 s (85K, 28.1 GiB without head chunking); Indexer.topk at 131072
tokens 0.45 s; a sparse no-grad forward of 131072 tokens 2.07 s, dense of 65536 0.11 s. Since the
experts became grouped GEMMs (MoE.grouped; --moe-loop for the old path) the steps are 9-28% faster and
one run's MTP-ablation step at 2K x 16 takes 0.092 s on the mask path (docs/default-model.md, "The
trainer 2.6x faster on the ablation's step")."""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import export  # noqa: E402
import train  # noqa: E402
from ablation import ABLATION_VARIANTS  # noqa: E402
from config import ModelConfig  # noqa: E402
from model import GlmMoeDsa  # noqa: E402


def sync():
    torch.cuda.synchronize()


def timed_steps(model, step, steps, profile, tokens):
    """Runs step() steps + 1 times (the first one warms up) and profile more under torch.profiler,
    then puts model.sparse_impl back to "auto". tokens: a step's tokens. Returns {s_per_step,
    tokens_per_s, first_step_s[, profile]}."""
    try:
        return _timed_steps(step, steps, profile, tokens)
    finally:
        model.sparse_impl = "auto"


def _timed_steps(step, steps, profile, tokens):
    times = []
    for _ in range(steps + 1):
        sync()
        t0 = time.time()
        step()
        sync()
        times.append(time.time() - t0)
    s = min(times[1:]) if len(times) > 1 else times[0]
    r = {"s_per_step": s, "tokens_per_s": tokens / s, "first_step_s": times[0]}
    if profile > 0:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile
        sync()
        t0 = time.time()
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(profile):
                step()
            sync()
        wall = time.time() - t0
        events = prof.key_averages()
        device_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
        print(events.table(sort_by=key, row_limit=30), flush=True)
        r["profile"] = {"profiled_steps": profile, "wall_s_per_step": wall / profile,
                        "device_busy_s_per_step": device_us / 1e6 / profile,
                        "device_busy_fraction": device_us / 1e6 / wall}
    return r


def run_config(model, opt, spec, steps, device, profile=0):
    kind, rest = spec.split(":", 1)
    cfg = model.cfg
    gen = torch.Generator().manual_seed(0)
    if kind == "topk":
        T = int(rest)
        ix = model.layers[0].self_attn.indexer
        qi = torch.randn(1, T, cfg.index_n_heads, cfg.index_head_dim, device=device)
        ki = torch.randn(1, T, cfg.index_head_dim, device=device)
        w = torch.randn(1, T, cfg.index_n_heads, device=device)
        times = []
        for _ in range(steps + 1):
            sync()
            t0 = time.time()
            ix.topk(qi, ki, w, cfg.index_topk)
            sync()
            times.append(time.time() - t0)
        return {"s_per_call": min(times[1:])}
    if kind == "check":
        # gather vs the [B,T,T] mask path: forward, MTP and gradients, fp32 and bf16 autocast
        T, B = (int(x) for x in rest.split("x"))
        full = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=gen).to(device)
        w = torch.ones(B, T, device=device)
        rows = train.sample_rows(T, 64, device, gen)
        out = {}
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            for amp in (False, True):
                res = {}
                for impl in ("mask", "gather"):
                    model.sparse_impl = impl
                    loss, lm, ces, kl = train.step_loss(model, full, w, "sparse", rows, device, amp, 3, 0.3, 1.0, 512)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    res[impl] = (loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                               if p.grad is not None})
                    opt.zero_grad(set_to_none=True)
                ga, gb = res["mask"][1], res["gather"][1]
                out["amp" if amp else "fp32"] = {
                    "loss_mask": res["mask"][0], "loss_gather": res["gather"][0],
                    "max_rel_grad_diff": max(((ga[n] - gb[n]).abs().max() / (ga[n].abs().max() + 1e-30)).item()
                                             for n in ga),
                    "same_grad_set": sorted(ga) == sorted(gb)}
        finally:
            model.sparse_impl = "auto"
            torch.backends.cuda.matmul.allow_tf32 = tf32
        return out
    if kind == "moecheck":
        # the grouped-GEMM experts against the per-expert loop: outputs and gradients, bf16 autocast
        n = int(rest)
        moe = model.layers[1].mlp
        was_grouped = moe.grouped
        x = torch.randn(n, cfg.hidden_size, device=device, generator=None)
        res = {}
        for grouped in (False, True):
            moe.grouped = grouped
            xg = x.clone().requires_grad_(True)
            moe.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                y = moe(xg)
            (y.float() * torch.linspace(-1, 1, y.numel(), device=device).view_as(y)).sum().backward()
            res[grouped] = (y.float(), xg.grad, {name: p.grad.clone() for name, p in moe.named_parameters()
                                                 if p.grad is not None})
        moe.grouped = was_grouped

        def rel(a, b):
            return ((a - b).abs().max() / (b.abs().max() + 1e-30)).item()
        return {"y_rel": rel(res[True][0], res[False][0]), "dx_rel": rel(res[True][1], res[False][1]),
                "dw_rel": max(rel(res[True][2][k], res[False][2][k]) for k in res[False][2]),
                "same_grad_set": sorted(res[True][2]) == sorted(res[False][2])}
    if kind.startswith("eval-"):
        T = int(rest)
        mode = kind[5:]
        ids = torch.randint(0, cfg.vocab_size, (1, T), generator=gen).to(device)
        model.eval()
        times = []
        with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            for _ in range(steps + 1):
                sync()
                t0 = time.time()
                h = model(ids, mode=mode)
                model.logits(h[:, -16:]).float().argmax(-1)
                sync()
                times.append(time.time() - t0)
        model.train()
        return {"s_per_forward": min(times[1:])}
    if kind.startswith("mtp-"):
        share, tv = ABLATION_VARIANTS[kind[4:]]
        shape, impl = rest.split(":")
        T, B = (int(x) for x in shape.split("x"))
        model.sparse_impl = impl
        full = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=gen).to(device)
        w = torch.ones(B, T, device=device)
        inp = full[:, :-1]
        mtp_params = [p for m in train.mtp_modules(model).values() for p in m.parameters()]
        mtp_opt = train.make_optimizer(mtp_params, 1e-5)
        out = {}

        def step():
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                with torch.no_grad():
                    h = model(inp, mode="sparse")
                    logits = model.logits(h)
                rows = train.sample_rows(T, 128, device, gen)
                index_loss = train.IndexerLoss()
                mtp, _ = train.mtp_losses(model, h, logits, inp, full, w, 3, "sparse", share, tv, index_loss, rows)
                loss = mtp + index_loss.total()
            mtp_opt.zero_grad(set_to_none=True)
            loss.backward()
            mtp_opt.step()
            out["loss"] = loss

        r = timed_steps(model, step, steps, profile, B * T)
        r["loss"] = out["loss"].item()
        return r
    shape, head_chunk = rest.split(":")
    T, B = (int(x) for x in shape.split("x"))
    mode = "sparse" if kind in ("sparse", "mask", "auto") else "dense"
    model.sparse_impl = {"mask": "mask", "auto": "auto"}.get(kind, "gather")  # dense ignores it
    full = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=gen).to(device)
    w = torch.ones(B, T, device=device)
    out = {}

    def step():
        rows = train.sample_rows(T, 256, device, gen)
        loss, lm, ces, kl = train.step_loss(model, full, w, mode, rows, device, True, 3, 0.3, 1.0, int(head_chunk))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        train.update_router_bias(model)
        out["lm"] = lm

    r = timed_steps(model, step, steps, profile, B * T)
    r["lm"] = out["lm"].item()
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init-from", default=None)
    ap.add_argument("--configs", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--moe-loop", action="store_true", help="the experts as one GEMM chain per expert in "
                    "every config (MoE.grouped off: the path before the grouped GEMMs)")
    ap.add_argument("--profile", type=int, default=0,
                    help="this many more steps of every training config under torch.profiler (a kernel table)")
    ap.add_argument("--budget-s", type=float, default=400, help="skip the remaining configs after this")
    ap.add_argument("--index-topk", type=int, default=None,
                    help="index_topk of the sparse configs (run 5's pipeline.py --index-topk; default 128)")
    args = ap.parse_args()
    t_start = time.time()
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    cfg = ModelConfig(**({"index_topk": args.index_topk} if args.index_topk else {}))
    model = GlmMoeDsa(cfg)
    if args.init_from:
        with open(os.path.join(args.init_from, "config.json")) as f:
            hf = json.load(f)
        export.load_hub_into(model, export.read_safetensors(os.path.join(args.init_from, "model.safetensors")),
                             hf.get("rope_interleave", False), hf.get("indexer_rope_interleave", False))
    model = model.to(device)
    for moe in model.moe_layers():
        moe.grouped = not args.moe_loop
    opt = train.make_optimizer(list(model.parameters()), 1e-5)
    print("torch {} on {}".format(torch.__version__, torch.cuda.get_device_name(0)), flush=True)
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "configs": {}}
    for spec in args.configs.split(","):
        if time.time() - t_start > args.budget_s:
            results["configs"][spec] = {"skipped": "budget"}
            continue
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        try:
            r = run_config(model, opt, spec, args.steps, device, args.profile)
        except torch.cuda.OutOfMemoryError as e:  # noqa: PERF203
            r = {"error": "OOM: " + str(e).split("\n")[0][:200]}
        except Exception as e:  # noqa: BLE001
            r = {"error": repr(e)[:300]}
        opt.zero_grad(set_to_none=True)
        r["peak_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
        r["wall_s"] = time.time() - t0
        results["configs"][spec] = r
        print(spec, json.dumps(r), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
