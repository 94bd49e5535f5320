#!/usr/bin/python3
"""PyTorch reference of the MTP (multi-token prediction) step of glm_moe_dsa / deepseek_v32,
written from the formulas (DeepSeek-V3 paper section 2.2, the GLM-5 / DeepSeek-V3.2 DSA indexer)
and checked by reading the public engines (vLLM deepseek_mtp.py / glm4_moe_mtp.py, SGLang
deepseek_nextn.py): h' = eh_proj(cat[enorm(embed(x_{t+1})), hnorm(h_t)]), one full decoder layer with
its own indexer, logits = head(shared_head.norm(.)). Plain dense tensors, no paging, no absorption
(K and V are expanded through kv_b_proj), so it shares no code path with megactx.

Makes tests/fixtures/mtp/<name>/ from an HF fixture (tests/fixtures/hf/<name>): the target's
tensors plus random MTP tensors model.layers.{L}.* (seeded), config.json with
num_nextn_predict_layers 1, and golden draft logits:
  hidden.f32       [T, H]  random target hidden states (before model.norm, as megactx's forward returns)
  step0_logits.f32 [T, V]  step 0 at every row t (reads ids[t+1], h_t), causal over rows <= t
  shared_logits.f32   [S, V]  chained steps j = 1..S from the last row, IndexShare + KVShare
  unshared_logits.f32 [S, V]  the same without sharing (each step writes its own KV at T-1+j)
  golden.json: ids (T + 1), draft ids fed at steps 1..S, shapes, hand-off rule.
Run: /usr/bin/python3 tools/mtp_reference/mtp_reference.py glm_schedule dsv32_yarn
"""
import json
import math
import os
import shutil
import struct
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T = 40       # rows of step 0 (> index_topk of the fixtures: sparse selection matters)
STEPS = 4    # chained draft steps after step 0


# ----------------------------------------------------------------------------- safetensors I/O
def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        if info["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype=np.float32)
        elif info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: {name} has dtype {info['dtype']} (F32/BF16 only)")
        out[name] = torch.from_numpy(arr.copy()).reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        raw = tensors[name].to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def load_fixture_weights(directory):
    weights = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            weights.update(read_safetensors(os.path.join(directory, name)))
    return weights


# ----------------------------------------------------------------------------- config
class Cfg:
    def __init__(self, raw):
        self.raw = raw
        self.glm = raw["model_type"] == "glm_moe_dsa"
        g = lambda k, d=None: raw.get(k, d)
        self.H, self.V, self.L = raw["hidden_size"], raw["vocab_size"], raw["num_hidden_layers"]
        self.heads, self.q_lora, self.lora = raw["num_attention_heads"], raw["q_lora_rank"], raw["kv_lora_rank"]
        self.nope, self.rope, self.v = raw["qk_nope_head_dim"], raw["qk_rope_head_dim"], raw["v_head_dim"]
        self.hi, self.di, self.topk = raw["index_n_heads"], raw["index_head_dim"], raw["index_topk"]
        self.eps = raw["rms_norm_eps"]
        self.experts, self.top_e = g("n_routed_experts"), g("num_experts_per_tok")
        self.n_group, self.topk_group = g("n_group", 1), g("topk_group", 1)
        self.shared = g("n_shared_experts", 0)
        self.moe_inter, self.inter = g("moe_intermediate_size"), raw["intermediate_size"]
        self.scaling, self.norm_topk = g("routed_scaling_factor", 1.0), g("norm_topk_prob", True)
        self.moe = self.L >= g("first_k_dense_replace", 0)  # the MTP layer index is L
        self.mla_interleave = g("rope_interleave", True)
        self.idx_interleave = g("indexer_rope_interleave", self.glm)
        rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
        self.theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        self.yarn = rope if rope.get("type", rope.get("rope_type")) == "yarn" else None


# ----------------------------------------------------------------------------- building blocks
def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def yarn_mscale(scale, m):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def rope_tables(cfg, positions):
    """cos/sin [n, rope/2] and the attention softmax scale (YaRN per DeepSeek-V3)."""
    d = cfg.rope
    idx = torch.arange(0, d, 2, dtype=torch.float64) / d
    inv = 1.0 / cfg.theta ** idx
    scale = (cfg.nope + cfg.rope) ** -0.5
    attn_factor = 1.0
    if cfg.yarn:
        y = cfg.yarn
        factor, orig = y["factor"], y["original_max_position_embeddings"]
        fast, slow = y.get("beta_fast", 32), y.get("beta_slow", 1)
        corr = lambda rot: d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(cfg.theta))
        low, high = max(math.floor(corr(fast)), 0), min(math.ceil(corr(slow)), d - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extra_mask = 1 - ramp  # 1: keep the original frequency (high-frequency dims)
        inv = (inv / factor) * (1 - extra_mask) + inv * extra_mask
        attn_factor = yarn_mscale(factor, y.get("mscale", 1)) / yarn_mscale(factor, y.get("mscale_all_dim", 0))
        if y.get("mscale_all_dim"):
            scale *= yarn_mscale(factor, y["mscale_all_dim"]) ** 2
    ang = torch.tensor(positions, dtype=torch.float64)[:, None] * inv[None, :]
    return (torch.cos(ang) * attn_factor).float(), (torch.sin(ang) * attn_factor).float(), scale


def apply_rope(x, cos, sin, interleaved):
    """x [n, ..., d]; rotates pairs (2i, 2i+1) or (i, i + d/2) by the angle of frequency i."""
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
    c, s = cos.reshape(shape), sin.reshape(shape)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
        return out
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def swiglu(x, p):
    return (torch.nn.functional.silu(x @ p["gate_proj.weight"].T) * (x @ p["up_proj.weight"].T)) @ p["down_proj.weight"].T


def sub(w, prefix):
    return {k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix)}


def moe(cfg, x, w):
    s = torch.sigmoid(x @ w["gate.weight"].T)  # [n, E]
    choice = s + w.get("gate.e_score_correction_bias", torch.zeros(cfg.experts))
    per = cfg.experts // cfg.n_group
    group_score = choice.view(-1, cfg.n_group, per).topk(min(2, per), dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_score).scatter_(1, group_score.topk(cfg.topk_group, dim=-1).indices, 1)
    masked = choice.masked_fill(keep.repeat_interleave(per, dim=1) == 0, float("-inf"))
    ids = masked.topk(cfg.top_e, dim=-1).indices
    gates = s.gather(1, ids)
    if cfg.norm_topk:
        gates = gates / gates.sum(-1, keepdim=True)
    gates = gates * cfg.scaling
    out = torch.zeros_like(x)
    for r in range(x.shape[0]):
        for j in range(cfg.top_e):
            out[r] += gates[r, j] * swiglu(x[r:r + 1], sub(w, f"experts.{int(ids[r, j])}."))[0]
    if cfg.shared:
        out += swiglu(x, sub(w, "shared_experts."))
    return out


class MtpCache:
    """The MTP layer's own cache: per position, expanded K [heads, nope+rope], V, indexer key."""
    def __init__(self):
        self.k, self.v, self.ki = {}, {}, {}


def attention(cfg, a, h, positions, cache, write, attend_until, forced_topk=None):
    """h [n, H] (input_layernorm-ed). Rows at `positions`; `write`: store K/V/indexer keys at
    those positions; row i attends over cached positions <= attend_until[i] through the
    indexer's top-k (or `forced_topk`, a list of position lists). Returns (out [n, H], topk)."""
    n = h.shape[0]
    cos, sin, scale = rope_tables(cfg, positions)
    q_resid = rms(h @ a["q_a_proj.weight"].T, a["q_a_layernorm.weight"], 1e-6)
    q = (q_resid @ a["q_b_proj.weight"].T).view(n, cfg.heads, cfg.nope + cfg.rope)
    q = torch.cat([q[..., :cfg.nope], apply_rope(q[..., cfg.nope:], cos, sin, cfg.mla_interleave)], -1)
    ckv = h @ a["kv_a_proj_with_mqa.weight"].T
    c = rms(ckv[:, :cfg.lora], a["kv_a_layernorm.weight"], 1e-6)
    k_rope = apply_rope(ckv[:, cfg.lora:], cos, sin, cfg.mla_interleave)  # [n, rope], one per token
    kv = (c @ a["kv_b_proj.weight"].T).view(n, cfg.heads, cfg.nope + cfg.v)
    k = torch.cat([kv[..., :cfg.nope], k_rope[:, None, :].expand(n, cfg.heads, cfg.rope)], -1)
    # indexer: heads [rope | nope] (rope first), LayerNorm key with bias, ReLU-weighted head sum
    ia = sub(a, "indexer.")
    qi = (q_resid @ ia["wq_b.weight"].T).view(n, cfg.hi, cfg.di)
    qi = torch.cat([apply_rope(qi[..., :cfg.rope], cos, sin, cfg.idx_interleave), qi[..., cfg.rope:]], -1)
    ki = torch.nn.functional.layer_norm(h @ ia["wk.weight"].T, (cfg.di,), ia["k_norm.weight"], ia["k_norm.bias"], 1e-6)
    ki = torch.cat([apply_rope(ki[:, :cfg.rope], cos, sin, cfg.idx_interleave), ki[:, cfg.rope:]], -1)
    wts = (h @ ia["weights_proj.weight"].T) * cfg.hi ** -0.5
    if write:
        for i, p in enumerate(positions):
            cache.k[p], cache.v[p], cache.ki[p] = k[i], kv[i, :, cfg.nope:], ki[i]
    outs, chosen = [], []
    for i in range(n):
        visible = [p for p in sorted(cache.k) if p <= attend_until[i]]
        if forced_topk is not None:
            sel = forced_topk[i]
        else:
            keys = torch.stack([cache.ki[p] for p in visible])  # [m, DI]
            score = (torch.relu(qi[i] @ keys.T * cfg.di ** -0.5) * wts[i][:, None]).sum(0)  # [m]
            top = score.topk(min(cfg.topk, len(visible))).indices.tolist()
            sel = sorted(visible[j] for j in top)
        chosen.append(sel)
        K = torch.stack([cache.k[p] for p in sel], 1)  # [heads, m, qk]
        V = torch.stack([cache.v[p] for p in sel], 1)  # [heads, m, v]
        att = torch.softmax((K @ q[i][:, :, None]).squeeze(-1) * scale, -1)  # [heads, m]
        outs.append((att[:, None, :] @ V).reshape(-1))
    return torch.stack(outs) @ a["o_proj.weight"].T, chosen


def decoder(cfg, lw, x, positions, cache, write, attend_until, forced_topk=None):
    a, topk = attention(cfg, sub(lw, "self_attn."), rms(x, lw["input_layernorm.weight"], cfg.eps), positions,
                        cache, write, attend_until, forced_topk)
    x = x + a
    hn = rms(x, lw["post_attention_layernorm.weight"], cfg.eps)
    x = x + (moe(cfg, hn, sub(lw, "mlp.")) if cfg.moe else swiglu(hn, sub(lw, "mlp.")))
    return x, topk


def mtp_step(cfg, w, mw, tokens, h_prev, positions, cache, write, attend_until, forced_topk=None):
    """One MTP application. Returns (logits [n, V], hand-off [n, H], top-k per row)."""
    embed = mw.get("embed_tokens.weight", w["model.embed_tokens.weight"])
    head = mw.get("shared_head.head.weight", w["lm_head.weight"])
    x = torch.cat([rms(embed[tokens], mw["enorm.weight"], cfg.eps), rms(h_prev, mw["hnorm.weight"], cfg.eps)], -1)
    x = x @ mw["eh_proj.weight"].T
    x, topk = decoder(cfg, mw, x, positions, cache, write, attend_until, forced_topk)
    normed = rms(x, mw["shared_head.norm.weight"], cfg.eps)
    # Hand-off to the next step: GLM the shared_head.norm-ed state (SGLang nextn models; the
    # default model's training), DeepSeek the raw layer output (vLLM deepseek_mtp).
    return normed @ head.T, (normed if cfg.glm else x), topk


# ----------------------------------------------------------------------------- fixture
def make_mtp_weights(cfg, gen):
    L, H = cfg.L, cfg.H
    p = f"model.layers.{L}."
    rnd = lambda *shape: torch.randn(*shape, generator=gen) / math.sqrt(shape[-1])
    one = lambda n: 1.0 + 0.1 * torch.randn(n, generator=gen)
    w = {p + "enorm.weight": one(H), p + "hnorm.weight": one(H), p + "eh_proj.weight": rnd(H, 2 * H),
         p + "shared_head.norm.weight": one(H), p + "input_layernorm.weight": one(H),
         p + "post_attention_layernorm.weight": one(H)}
    a = p + "self_attn."
    w.update({a + "q_a_proj.weight": rnd(cfg.q_lora, H), a + "q_a_layernorm.weight": one(cfg.q_lora),
              a + "q_b_proj.weight": rnd(cfg.heads * (cfg.nope + cfg.rope), cfg.q_lora),
              a + "kv_a_proj_with_mqa.weight": rnd(cfg.lora + cfg.rope, H), a + "kv_a_layernorm.weight": one(cfg.lora),
              a + "kv_b_proj.weight": rnd(cfg.heads * (cfg.nope + cfg.v), cfg.lora),
              a + "o_proj.weight": rnd(H, cfg.heads * cfg.v),
              a + "indexer.wq_b.weight": rnd(cfg.hi * cfg.di, cfg.q_lora), a + "indexer.wk.weight": rnd(cfg.di, H),
              a + "indexer.k_norm.weight": one(cfg.di), a + "indexer.k_norm.bias": 0.1 * torch.randn(cfg.di, generator=gen),
              a + "indexer.weights_proj.weight": rnd(cfg.hi, H)})
    m = p + "mlp."
    mlp = lambda pre, inter: {pre + "gate_proj.weight": rnd(inter, H), pre + "up_proj.weight": rnd(inter, H),
                              pre + "down_proj.weight": rnd(H, inter)}
    if cfg.moe:
        w[m + "gate.weight"] = rnd(cfg.experts, H)
        w[m + "gate.e_score_correction_bias"] = 0.05 * torch.randn(cfg.experts, generator=gen)
        for e in range(cfg.experts):
            w.update(mlp(f"{m}experts.{e}.", cfg.moe_inter))
        if cfg.shared:
            w.update(mlp(m + "shared_experts.", cfg.moe_inter * cfg.shared))
    else:
        w.update(mlp(m, cfg.inter))
    if not cfg.glm:  # DeepSeek ships its own embedding and head copies in the MTP layer
        w[p + "embed_tokens.weight"] = torch.randn(cfg.V, H, generator=gen)
        w[p + "shared_head.head.weight"] = rnd(cfg.V, H)
    return w


def make(name):
    src = os.path.join(ROOT, "tests/fixtures/hf", name)
    dst = os.path.join(ROOT, "tests/fixtures/mtp", name)
    os.makedirs(dst, exist_ok=True)
    raw = json.load(open(os.path.join(src, "config.json")))
    raw["num_nextn_predict_layers"] = 1
    cfg = Cfg(raw)
    gen = torch.Generator().manual_seed(20261130)
    w = load_fixture_weights(src)
    mtp = make_mtp_weights(cfg, gen)
    w.update(mtp)
    mw = sub(mtp, f"model.layers.{cfg.L}.")
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
    if os.path.exists(os.path.join(src, "generation_config.json")):
        shutil.copy(os.path.join(src, "generation_config.json"), dst)
    write_safetensors(os.path.join(dst, "model.safetensors"), w)

    ids = torch.randint(0, cfg.V, (T + 1,), generator=gen)
    hidden = torch.randn(T, cfg.H, generator=gen) * 2.0  # before model.norm
    h_normed = rms(hidden, w["model.norm.weight"], cfg.eps)
    with torch.no_grad():
        cache = MtpCache()
        logits0, hand0, topk0 = mtp_step(cfg, w, mw, ids[1:], h_normed, list(range(T)), cache, True,
                                         list(range(T)))
        drafts = torch.randint(0, cfg.V, (STEPS,), generator=gen)  # fed at steps 1..S (not argmax: no ties)
        t = T - 1
        results = {}
        for share in (True, False):
            c = MtpCache()
            c.k, c.v, c.ki = dict(cache.k), dict(cache.v), dict(cache.ki)
            h, rows = hand0[t:t + 1], []
            for j in range(1, STEPS + 1):
                pos = [t + j]
                if share:  # query at t + j over step 0's KV of rows <= t through step 0's top-k of row t
                    lg, h, _ = mtp_step(cfg, w, mw, drafts[j - 1:j], h, pos, c, False, [t], [topk0[t]])
                else:      # own KV at t + j, own indexer over everything cached so far
                    lg, h, _ = mtp_step(cfg, w, mw, drafts[j - 1:j], h, pos, c, True, [t + j])
                rows.append(lg[0])
            results[share] = torch.stack(rows)
    # Margin of the k-th vs (k+1)-th indexer score is not needed for logits comparisons of
    # rows with <= topk visible tokens; rows past topk depend on it, so report the minimum gap.
    def save(name_, t_):
        t_.contiguous().numpy().astype(np.float32).tofile(os.path.join(dst, name_))
    save("hidden.f32", hidden)
    save("step0_logits.f32", logits0)
    save("shared_logits.f32", results[True])
    save("unshared_logits.f32", results[False])
    golden = {"ids": ids.tolist(), "drafts": drafts.tolist(), "rows": T, "steps": STEPS,
              "hidden_size": cfg.H, "vocab_size": cfg.V, "hand_off": "normed" if cfg.glm else "raw",
              "step0_topk_last_row": topk0[t],
              "made_by": "tools/mtp_reference/mtp_reference.py (PyTorch %s, CPU, float32)" % torch.__version__}
    with open(os.path.join(dst, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
    print(f"{name}: wrote {dst} (MTP layer {cfg.L}, {'moe' if cfg.moe else 'dense'}, hand-off {golden['hand_off']})")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    for fixture in sys.argv[1:] or ["glm_schedule", "dsv32_yarn"]:
        make(fixture)
