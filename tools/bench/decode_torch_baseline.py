#!/usr/bin/env python3
"""Peer baseline for bench/cuda/model_decode_bench: one decode step of the same GLM-shaped model
(bench/cuda/configs/glm_1b.json) written directly in PyTorch, bf16 weights and activations, random
weights, every sequence at the same context. Per layer: q-LoRA and KV projections, the indexer's
projections and scores on full layers, MLA in absorbed form over the whole context (the context is
below index_topk, so DSA selects every token), o_proj, then the dense MLP or the MoE (sigmoid router,
top-k experts per row, grouped by expert, shared expert); then the final norm and lm_head.

It times eager PyTorch (the MoE grouping reads the expert counts back to the host, as megactx's
MoE dispatch does today, so no CUDA graph) and prints tokens/s like model_decode_bench.

    python3 tools/bench/decode_torch_baseline.py [--config ...] [--context 1024] [--batches 1,16,64]
"""
import argparse
import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def build(c, device):
    g = torch.Generator(device="cpu").manual_seed(1)

    def w(*shape):
        return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(device, torch.bfloat16)

    h, ql, heads = c["hidden_size"], c["q_lora_rank"], c["num_attention_heads"]
    lora, nope, rope, v = c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    layers = []
    for i in range(c["num_hidden_layers"]):
        L = {"q_a": w(ql, h), "q_b": w(heads * (nope + rope), ql), "kv_a": w(lora + rope, h),
             "w_uk": w(heads, nope, lora), "w_uv": w(heads, v, lora), "o": w(h, heads * v)}
        if c["indexer_types"][i] == "full":
            ih, idim = c["index_n_heads"], c["index_head_dim"]
            L.update(wq_b=w(ih * idim, ql), wk=w(idim, h), wp=w(ih, h))
        if c["mlp_layer_types"][i] == "sparse":
            e, im = c["n_routed_experts"], c["moe_intermediate_size"]
            L.update(router=w(e, h).float(), gate_up=w(e, 2 * im, h), down=w(e, h, im),
                     shared_gate_up=w(2 * im * c["n_shared_experts"], h),
                     shared_down=w(h, im * c["n_shared_experts"]))
        else:
            L.update(gate_up=w(2 * c["intermediate_size"], h), down=w(h, c["intermediate_size"]))
        layers.append(L)
    return layers, w(c["vocab_size"], h)


def rms(x):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)


def swiglu(x, gate_up, down):
    gu = x @ gate_up.T
    a, b = gu.chunk(2, dim=-1)
    return (torch.nn.functional.silu(a) * b) @ down.T


def step(c, layers, lm_head, x, kv_cache, idx_cache):
    """x [B, H] bf16; kv_cache[l] [B, T, lora + rope]; idx_cache[l] [B, T, index_head_dim]."""
    heads, lora, nope, rope = c["num_attention_heads"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
    B = x.shape[0]
    for i, L in enumerate(layers):
        hx = rms(x)
        q_res = rms(hx @ L["q_a"].T)
        q = (q_res @ L["q_b"].T).view(B, heads, nope + rope)
        _ = hx @ L["kv_a"].T  # the new token's latent (written to the cache in a real step)
        if "wq_b" in L:
            iq = (q_res @ L["wq_b"].T).view(B, c["index_n_heads"], c["index_head_dim"])
            _k = hx @ L["wk"].T
            wts = hx @ L["wp"].T
            scores = torch.relu(torch.einsum("bhd,btd->bht", iq, idx_cache[i]))
            _ = (scores * wts[:, :, None]).sum(1)  # [B, T] index scores (top-k keeps all T here)
        q_lat = torch.einsum("bhn,hnl->bhl", q[..., :nope], L["w_uk"])
        kv = kv_cache[i]
        logits = torch.einsum("bhl,btl->bht", q_lat, kv[..., :lora]) + torch.einsum(
            "bhr,btr->bht", q[..., nope:], kv[..., lora:])
        p = torch.softmax(logits.float() / (nope + rope) ** 0.5, dim=-1).to(x.dtype)
        o_lat = torch.einsum("bht,btl->bhl", p, kv[..., :lora])
        o = torch.einsum("bhl,hvl->bhv", o_lat, L["w_uv"]).reshape(B, -1)
        x = x + o @ L["o"].T
        hx = rms(x)
        if "router" in L:
            scores = torch.sigmoid(hx.float() @ L["router"].T)
            gates, ids = scores.topk(c["num_experts_per_tok"], dim=-1)
            out = swiglu(hx, L["shared_gate_up"], L["shared_down"])
            flat = ids.flatten()
            order = flat.argsort()
            rows = order // c["num_experts_per_tok"]
            counts = torch.bincount(flat, minlength=c["n_routed_experts"]).tolist()
            start = 0
            for e, n in enumerate(counts):  # grouped by expert, as an eager MoE does
                if n:
                    r = rows[start:start + n]
                    g = gates.flatten()[order[start:start + n]].to(x.dtype)[:, None]
                    out.index_add_(0, r, swiglu(hx[r], L["gate_up"][e], L["down"][e]) * g)
                    start += n
            x = x + out
        else:
            x = x + swiglu(hx, L["gate_up"], L["down"])
    return rms(x) @ lm_head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(REPO, "bench/cuda/configs/glm_1b.json"))
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--iters", type=int, default=16)
    args = ap.parse_args()
    c = json.load(open(args.config))
    dev = torch.device("cuda")
    layers, lm_head = build(c, dev)
    print("# PyTorch {} decode step, bf16, same shapes ({}), context {}\n".format(
        torch.__version__, os.path.basename(args.config), args.context))
    print("| mode | batch | step ms | tokens/s |\n|---|---|---|---|")
    for B in [int(b) for b in args.batches.split(",")]:
        kv = [torch.randn(B, args.context, c["kv_lora_rank"] + c["qk_rope_head_dim"], device=dev, dtype=torch.bfloat16)
              for _ in layers]
        idx = [torch.randn(B, args.context, c["index_head_dim"], device=dev, dtype=torch.bfloat16)
               if t == "full" else None for t in c["indexer_types"]]
        x = torch.randn(B, c["hidden_size"], device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            for mode in ["eager"]:
                run = lambda: step(c, layers, lm_head, x, kv, idx)  # noqa: E731
                for _ in range(3):
                    run()
                torch.cuda.synchronize()
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.iters):
                    run()
                stop.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(stop) / args.iters
                print("| {} | {} | {:.2f} | {:.0f} |".format(mode, B, ms, B / ms * 1e3))


if __name__ == "__main__":
    main()
