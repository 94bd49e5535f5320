"""The default model in PyTorch: glm_moe_dsa written from the formulas, matching the math of
transformers' GlmMoeDsaForCausalLM (MLA with q-LoRA and a latent KV, DSA indexer with a
LayerNorm key and a ReLU-weighted head sum, IndexShare, sigmoid-routed MoE with a correction
bias and a shared expert) plus one MTP layer (HF ignores it).

Attention modes: "dense" (causal softmax over every earlier token) and "sparse" (each query
attends only to the top-k tokens its layer's indexer, or the last full layer's, selected). Sparse
attention gathers each query's k selected latents (MLA's absorbed form: q_nope is mapped into the
kv_lora space, keys and values stay latent until the output), in checkpointed chunks of query rows,
so its memory is O(T x k), not O(T^2) (run 4: rows of 32K-64K tokens).
RoPE is split-half (rotate_half) on the rope slice, as transformers' glm_moe_dsa applies it;
export.py can permute the rope weights into interleaved order when a consumer needs that.

Shapes: B batch, T tokens, H attention heads, D head dims, HI/DI indexer heads/dim, E experts."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def rms_norm(x, weight, eps):
    # Same order of operations as HF's GlmMoeDsaRMSNorm: normalize in fp32, cast back, scale.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope_cos_sin(positions, rope_dim, theta, dtype):
    """positions [T] -> cos, sin [T, rope_dim] (frequencies repeated for the two halves)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.int64, device=positions.device).float() / rope_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x [..., T, (heads,) D] with cos/sin broadcastable; split-half rotation."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # HF casts cos/sin to the activation dtype
    return x * cos + rotated * sin


def causal_attention(q, k, v, scale, allowed=None):
    """q [B,H,Tq,D], k [B,H,Tk,D], v [B,H,Tk,Dv]; row t attends columns <= t (Tq == Tk).
    allowed: optional bool [B,1,Tq,Tk] (already causal) restricting the columns (sparse mode)."""
    if HAS_SDPA and q.is_cuda:
        if allowed is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    T = q.shape[-2]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    if allowed is not None:
        mask = mask & allowed
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)


class Indexer(nn.Module):
    """DSA lightning indexer: score(t,s) = sum_j w(t,j) relu(qi(t,j) . ki(s) / sqrt(DI)), w = weights_proj(h) / sqrt(HI).
    Inputs are detached by the caller so the indexer learns only from its KL loss."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wq_b = nn.Linear(cfg.q_lora_rank, cfg.index_n_heads * cfg.index_head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden_size, cfg.index_head_dim, bias=False)
        self.k_norm = nn.LayerNorm(cfg.index_head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(cfg.hidden_size, cfg.index_n_heads, bias=False)

    def project(self, h, q_resid, cos, sin):
        """-> qi [B,T,HI,DI] (fp32), ki [B,T,DI] (fp32), w [B,T,HI] (fp32, includes HI^-0.5 and DI^-0.5)."""
        cfg = self.cfg
        B, T, _ = h.shape
        r = cfg.qk_rope_head_dim
        q = self.wq_b(q_resid).view(B, T, cfg.index_n_heads, cfg.index_head_dim)
        q = torch.cat([apply_rope(q[..., :r], cos[:, None, :], sin[:, None, :]), q[..., r:]], dim=-1)  # head = [rope | nope]
        k = self.k_norm(self.wk(h).float())
        k = torch.cat([apply_rope(k[..., :r], cos, sin), k[..., r:]], dim=-1)
        w = self.weights_proj(h).float() * (cfg.index_n_heads ** -0.5) * (cfg.index_head_dim ** -0.5)
        return q.float(), k.float(), w

    @staticmethod
    def scores(qi, ki, w, rows=None):
        """Index scores for query rows (all when rows is None): [B, R, T] fp32, without the causal mask."""
        if rows is not None:
            qi, w = qi[:, rows], w[:, rows]
        # fp32 even under autocast: the selection must match fp32 inference engines (HF, megactx).
        with torch.autocast(device_type=qi.device.type, enabled=False):
            s = torch.einsum("brhd,btd->brht", qi.float(), ki.float()).relu()
            return torch.einsum("brht,brh->brt", s, w.float())

    @torch.no_grad()
    def topk(self, qi, ki, w, k, chunk=None):
        """Top-k token positions per query, causal: [B, T, min(k, T)] int64 (HF semantics: the -inf
        future columns fill the set when fewer than k are visible; the causal mask drops them).
        A chunk of query rows [a, b) scores only the columns [0, max(b, k)): the later ones are masked
        anyway (half the work of scoring all T columns); chunk rows keep the fp32 scores near 1 GiB."""
        B, T, HI, _ = qi.shape
        kk = min(k, T)
        out = torch.empty(B, T, kk, dtype=torch.long, device=qi.device)
        if chunk is None:
            chunk = max(64, min(T, (1 << 28) // max(1, B * T * HI)))
        for start in range(0, T, chunk):
            end = min(T, start + chunk)
            width = max(end, kk)
            rows = torch.arange(start, end, device=qi.device)
            cols = torch.arange(width, device=qi.device)
            s = self.scores(qi, ki[:, :width], w, rows)
            s = s.masked_fill(cols[None, None, :] > rows[None, :, None], float("-inf"))
            out[:, start:end] = s.topk(kk, dim=-1).indices
        return out


def allowed_from_topk(topk, T):
    """topk [B,T,k] -> bool [B,1,T,T]: selected and causal."""
    B = topk.shape[0]
    allowed = torch.zeros(B, T, T, dtype=torch.bool, device=topk.device)
    allowed.scatter_(-1, topk, True)
    allowed &= torch.ones(T, T, dtype=torch.bool, device=topk.device).tril()
    return allowed[:, None]


def allowed_rows_from_topk(topk, rows, T):
    """Rows `rows` [R] of allowed_from_topk without building [T, T]: bool [B, R, T]."""
    B = topk.shape[0]
    allowed = torch.zeros(B, rows.shape[0], T, dtype=torch.bool, device=topk.device)
    allowed.scatter_(-1, topk[:, rows], True)
    return allowed & (torch.arange(T, device=topk.device)[None, :] <= rows[:, None])[None]


def _sparse_chunk(q_cat, kv_cat, idx, rows, scale, v_dim):
    """Query rows `rows` [C] against their selected latents. q_cat [B,C,H,Dc], kv_cat [B,T,Dc]
    (normed latent | roped k_pe), idx [B,C,K] -> latent outputs [B,C,H,v_dim]. Scores and softmax in
    fp32 (as flash attention accumulates), the probabilities cast back for the value sum."""
    B, T, Dc = kv_cat.shape
    offsets = (torch.arange(B, device=idx.device) * T)[:, None, None]
    g = F.embedding(idx + offsets, kv_cat.reshape(B * T, Dc))  # [B,C,K,Dc]
    with torch.autocast(device_type=q_cat.device.type, enabled=False):
        s = torch.matmul(q_cat.float(), g.float().transpose(-1, -2)) * scale  # [B,C,H,K]
        s = s.masked_fill((idx > rows[None, :, None])[:, :, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1).to(g.dtype)
        return torch.matmul(p, g[..., :v_dim])


def sparse_attention(q_cat, kv_cat, topk, scale, v_dim, chunk=None):
    """Top-k attention with O(T x k) memory: each query row attends to its selected columns that are
    not in its future (the same set as allowed_from_topk). q_cat [B,T,H,Dc], kv_cat [B,T,Dc],
    topk [B,T,K] -> [B,T,H,v_dim]. With autograd on, every chunk of rows is checkpointed: only its
    inputs are kept, the gathered latents are recomputed in the backward pass."""
    B, T = q_cat.shape[:2]
    if chunk is None:
        chunk = max(256, 8192 // B)
    rows_all = torch.arange(T, device=q_cat.device)
    outs = []
    grad = torch.is_grad_enabled() and (q_cat.requires_grad or kv_cat.requires_grad)
    for start in range(0, T, chunk):
        end = min(T, start + chunk)
        args = (q_cat[:, start:end], kv_cat, topk[:, start:end], rows_all[start:end], scale, v_dim)
        if grad:
            outs.append(torch.utils.checkpoint.checkpoint(_sparse_chunk, *args, use_reentrant=False))
        else:
            outs.append(_sparse_chunk(*args))
    return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]


class MLAttention(nn.Module):
    def __init__(self, cfg, has_indexer):
        super().__init__()
        self.cfg = cfg
        H = cfg.num_attention_heads
        self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, H * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, 1e-6)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, H * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(H * cfg.v_head_dim, cfg.hidden_size, bias=False)
        self.indexer = Indexer(cfg) if has_indexer else None
        self.scale = cfg.qk_head_dim ** -0.5

    def query(self, h, cos, sin):
        """h [B,T,hidden] -> q [B,H,T,Dqk], q_resid [B,T,q_lora]."""
        cfg = self.cfg
        B, T, _ = h.shape
        q_resid = self.q_a_layernorm(self.q_a_proj(h))
        q = self.q_b_proj(q_resid).view(B, T, cfg.num_attention_heads, cfg.qk_head_dim).transpose(1, 2)
        q_nope, q_pe = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        return torch.cat([q_nope, apply_rope(q_pe, cos, sin)], dim=-1), q_resid

    def latent(self, h, cos, sin):
        """h [B,T,hidden] -> normed latent c [B,T,kv_lora] and roped k_pe [B,T,r] (shared by the heads)."""
        cfg = self.cfg
        c_kv, k_pe = self.kv_a_proj_with_mqa(h).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        return self.kv_a_layernorm(c_kv), apply_rope(k_pe, cos, sin)

    def expand(self, c, k_pe):
        """Latent -> k [B,H,T,Dqk], v [B,H,T,Dv]."""
        cfg = self.cfg
        B, T, _ = c.shape
        kv = self.kv_b_proj(c).view(B, T, cfg.num_attention_heads, -1).transpose(1, 2)
        k_nope, v = kv.split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        k_pe = k_pe[:, None].expand(-1, cfg.num_attention_heads, -1, -1)
        return torch.cat([k_nope, k_pe], dim=-1), v

    def keys_values(self, h, cos, sin):
        """h [B,T,hidden] -> k [B,H,T,Dqk], v [B,H,T,Dv] (expanded from the latent)."""
        return self.expand(*self.latent(h, cos, sin))

    def _kv_b(self):
        cfg = self.cfg
        w = self.kv_b_proj.weight.view(cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim,
                                       cfg.kv_lora_rank)
        return w[:, :cfg.qk_nope_head_dim], w[:, cfg.qk_nope_head_dim:]  # [H,dn,L], [H,dv,L]

    def absorbed_q(self, q):
        """Absorbed MLA query: q_cat [B,T,H,L+r] = [q_nope W_k | q_pe], so that q_cat . [c | k_pe] equals
        q . k of the expanded form (W_k: the key rows of kv_b_proj)."""
        cfg = self.cfg
        w_k, _ = self._kv_b()
        q_nope, q_pe = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        q_lat = torch.einsum("bhtn,hnc->bthc", q_nope, w_k)
        return torch.cat([q_lat, q_pe.transpose(1, 2).to(q_lat.dtype)], dim=-1)

    @staticmethod
    def absorbed_kv(c, k_pe, dtype):
        """kv_cat [B,T,L+r] = [normed latent | roped k_pe] in the activation dtype."""
        return torch.cat([c.to(dtype), k_pe.to(dtype)], dim=-1)

    def sparse(self, q_cat, kv_cat, topk):
        """Top-k attention in the latent space -> [B,H,T,Dv] (as causal_attention returns)."""
        _, w_v = self._kv_b()
        o_lat = sparse_attention(q_cat, kv_cat, topk, self.scale, self.cfg.kv_lora_rank)  # [B,T,H,L]
        return torch.einsum("bthc,hvc->bhtv", o_lat, w_v)

    def head_mean_probs(self, q, k, rows, allowed=None):
        """Main attention of query rows, summed over heads and L1-normalized: [B, R, T] fp32 (no grad).
        allowed: None, bool [B,1,T,T] (allowed_from_topk) or its rows [B,R,T]."""
        with torch.no_grad():
            s = torch.matmul(q[:, :, rows].float(), k.float().transpose(-1, -2)) * self.scale  # [B,H,R,T]
            return self._mean_probs(s, rows, allowed)

    def head_mean_probs_latent(self, q_cat, kv_cat, rows, allowed_rows):
        """head_mean_probs from the absorbed operands (sparse mode: no expanded keys)."""
        with torch.no_grad():
            with torch.autocast(device_type=q_cat.device.type, enabled=False):
                s = torch.einsum("brhc,btc->bhrt", q_cat[:, rows].float(), kv_cat.float()) * self.scale
            return self._mean_probs(s, rows, allowed_rows)

    @staticmethod
    def _mean_probs(s, rows, allowed):
        T = s.shape[-1]
        mask = (torch.arange(T, device=s.device)[None, :] <= rows[:, None])[None, None]  # [1,1,R,T]
        if allowed is not None:
            mask = mask & (allowed[:, :, rows] if allowed.dim() == 4 else allowed[:, None])
        return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1).mean(dim=1)

    def output(self, attn):
        B, H, T, Dv = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(B, T, H * Dv))


class DenseMLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Sigmoid router (fp32) with e_score_correction_bias for the choice only (aux-loss-free
    balancing, updated outside the optimizer), top-k experts, normalized weights, shared expert."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        E, I, Hd = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
        self.gate_weight = nn.Parameter(torch.empty(E, Hd))
        self.register_buffer("e_score_correction_bias", torch.zeros(E))
        self.gate_proj = nn.Parameter(torch.empty(E, I, Hd))  # experts.{e}.gate_proj.weight [I, hidden]
        self.up_proj = nn.Parameter(torch.empty(E, I, Hd))
        self.down_proj = nn.Parameter(torch.empty(E, Hd, I))
        self.shared_experts = DenseMLP(Hd, I * cfg.n_shared_experts)
        self.last_load = None
        # Under bf16 autocast on the GPU the experts run as grouped GEMMs (_experts_grouped; H100: 9-28%
        # faster training steps, bench_step.py); False: the per-expert loop everywhere
        self.grouped = True

    def route(self, x):
        cfg = self.cfg
        s = torch.sigmoid(x.float() @ self.gate_weight.float().t())  # [N, E]
        idx = torch.topk(s + self.e_score_correction_bias, cfg.num_experts_per_tok, dim=-1).indices
        w = s.gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * cfg.routed_scaling_factor
        return idx, w

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        idx, w = self.route(x2)
        k = idx.shape[1]
        flat = idx.reshape(-1)
        order = torch.argsort(flat)
        token = order // k
        counts = torch.bincount(flat, minlength=self.cfg.n_routed_experts)
        self.last_load = counts.detach()
        xs = x2[token]  # [N*k, hidden], the (token, expert) pairs in expert order
        if self.grouped and xs.is_cuda and torch.is_autocast_enabled() and hasattr(torch, "_grouped_mm"):
            ys = self._experts_grouped(xs, counts)
        else:
            ys = self._experts_loop(xs, counts)
        ys = ys * w.reshape(-1)[order][:, None].to(ys.dtype)
        y = torch.zeros(x2.shape[0], shape[-1], dtype=ys.dtype, device=x.device).index_add_(0, token, ys)
        return (y.to(x.dtype) + self.shared_experts(x2)).reshape(shape)

    def _experts_loop(self, xs, counts):
        """One GEMM chain per expert: the host reads the counts (a device sync per MoE layer)."""
        outs = []
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n == 0:
                continue
            xe = xs[start:start + n]
            he = F.silu(xe @ self.gate_proj[e].t().to(xe.dtype)) * (xe @ self.up_proj[e].t().to(xe.dtype))
            outs.append(he @ self.down_proj[e].t().to(xe.dtype))
            start += n
        return torch.cat(outs, dim=0)

    def _experts_grouped(self, xs, counts):
        """The same products as _experts_loop in three bf16 grouped GEMMs (torch._grouped_mm, sm90+)
        whose group ends are read on the device: no sync, no launch per expert. xs [N*k, hidden] in
        expert order, counts [E] -> [N*k, hidden] bf16."""
        ends = torch.cumsum(counts, 0, dtype=torch.int32)
        a = xs.to(torch.bfloat16)
        gate = torch._grouped_mm(a, self.gate_proj.to(torch.bfloat16).transpose(1, 2), offs=ends)  # [N*k, I]
        up = torch._grouped_mm(a, self.up_proj.to(torch.bfloat16).transpose(1, 2), offs=ends)
        h = F.silu(gate) * up
        return torch._grouped_mm(h, self.down_proj.to(torch.bfloat16).transpose(1, 2), offs=ends)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx, has_indexer, moe):
        super().__init__()
        self.cfg = cfg
        self.layer_idx = layer_idx
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAttention(cfg, has_indexer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if moe else DenseMLP(cfg.hidden_size, cfg.intermediate_size)

    def mlp_block(self, x):
        return x + self.mlp(self.post_attention_layernorm(x))


class IndexerLoss:
    """Collects the KL(p || softmax(index scores)) terms of one forward pass.

    dense_target: in sparse mode, p is the main attention over every causal column (the dense
    attention the layers would compute, from the sparse forward's hidden states) and the KL's support
    is every causal column. Without it (runs 1-4), sparse mode restricts p and the indexer's softmax to
    the selected set: the loss can then only re-rank keys the indexer already selected, never raise one
    it missed (the needle 60K tokens back). Dense mode is the same either way.
    row_weights: None (every query row weighs the same, runs 1-4) or [B, R] weights of the rows."""

    def __init__(self, dense_target=False, row_weights=None):
        self.terms = []
        self.dense_target = dense_target
        self.row_weights = row_weights

    def add(self, p, logits, support):
        # p, logits, support: [B, R, T]; support marks the columns both distributions live on.
        logq = torch.log_softmax(logits.masked_fill(~support, float("-inf")), dim=-1)
        kl = torch.where(support & (p > 0), p * (torch.log(p.clamp_min(1e-30)) - logq), torch.zeros_like(p))
        per_row = kl.sum(-1)  # [B, R]
        if self.row_weights is None:
            self.terms.append(per_row.mean())
        else:
            rw = self.row_weights.to(per_row.dtype)
            self.terms.append((per_row * rw).sum() / rw.sum().clamp_min(1e-12))

    def total(self):
        return sum(self.terms) / len(self.terms) if self.terms else None


class GlmMoeDsa(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        L = cfg.num_hidden_layers
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([
            DecoderLayer(cfg, i, cfg.indexer_types[i] == "full", i >= cfg.first_k_dense_replace) for i in range(L)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # MTP layer model.layers.{L}: enorm, hnorm, eh_proj, a full decoder layer with its own indexer, shared_head.norm.
        self.mtp_enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mtp_hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mtp_eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.mtp_layer = DecoderLayer(cfg, L, True, L >= cfg.first_k_dense_replace)
        self.mtp_head_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # "auto" (default): the [B,T,T] mask and masked attention of runs 1-3 while B*T*T <= auto_mask_max
        # (8K x 4 rows; faster on the GPU there), above it "gather": O(T x k) top-k attention in the
        # latent space (same math, equal to fp32 rounding); "mask" / "gather" force one of them.
        self.sparse_impl = "auto"
        self.auto_mask_max = 1 << 28
        self.reset_parameters()

    def reset_parameters(self):
        std = self.cfg.initializer_range
        depth_scale = 1.0 / math.sqrt(2 * (self.cfg.num_hidden_layers + 1))
        for name, p in self.named_parameters():
            if p.dim() == 1:
                if name.endswith("k_norm.bias"):
                    nn.init.zeros_(p)
                else:
                    nn.init.ones_(p)
                continue
            nn.init.normal_(p, std=std)
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight") or name.endswith("mlp.down_proj"):
                p.data.mul_(depth_scale)

    # ------------------------------------------------------------------ attention core

    def _attend(self, layer, h_normed, cos, sin, mode, topk, index_loss, kl_rows, kl_group):
        """One attention block. Returns (output [B,T,hidden], topk for the next layers, extras)."""
        attn = layer.self_attn
        q, q_resid = attn.query(h_normed, cos, sin)
        c, k_pe = attn.latent(h_normed, cos, sin)
        T = h_normed.shape[1]
        B = h_normed.shape[0]
        gather = mode == "sparse" and (self.sparse_impl == "gather" or
                                       (self.sparse_impl == "auto" and B * T * T > self.auto_mask_max))
        extras = {}
        if not gather:
            extras["k"], extras["v"] = attn.expand(c, k_pe)
        if attn.indexer is not None:
            qi, ki, w = attn.indexer.project(h_normed.detach(), q_resid.detach(), cos, sin)
            extras["index"] = (qi, ki, w)
            if mode == "sparse":
                topk = attn.indexer.topk(qi, ki, w, self.cfg.index_topk)
            if index_loss is not None:
                kl_group.clear()
                kl_group.append(Indexer.scores(qi, ki, w, kl_rows))
        extras["topk"] = topk
        dense_target = getattr(index_loss, "dense_target", False)
        extras["allowed_rows"] = allowed_rows_from_topk(topk, kl_rows, T) \
            if (mode == "sparse" and kl_rows is not None and not dense_target) else None
        if gather:
            q_cat = attn.absorbed_q(q)
            kv_cat = attn.absorbed_kv(c, k_pe, q_cat.dtype)
            extras["kv_cat"] = kv_cat
            if index_loss is not None:
                kl_group.append(attn.head_mean_probs_latent(q_cat, kv_cat, kl_rows, extras["allowed_rows"]))
            out = attn.sparse(q_cat, kv_cat, topk)
        else:
            allowed = allowed_from_topk(topk, T) if mode == "sparse" else None
            extras["allowed"] = allowed
            if index_loss is not None:
                kl_group.append(attn.head_mean_probs(q, extras["k"], kl_rows, None if dense_target else allowed))
            out = causal_attention(q, extras["k"], extras["v"], attn.scale, allowed)
        return attn.output(out), topk, extras

    @staticmethod
    def _flush_index_loss(index_loss, kl_group, kl_rows, T, allowed_rows):
        # kl_group = [index logits of the full layer, p of each layer it serves...]
        if index_loss is None or len(kl_group) < 2:
            return
        logits = kl_group[0]
        p = torch.stack(kl_group[1:]).mean(0)
        support = torch.arange(T, device=logits.device)[None, None, :] <= kl_rows[None, :, None]
        if allowed_rows is not None:
            support = support & allowed_rows
        index_loss.add(p, logits, support)

    def forward(self, ids, mode="dense", index_loss=None, kl_rows=None, positions=None):
        """ids [B,T] -> final hidden after model.norm [B,T,hidden]. index_loss collects indexer KL terms
        on query rows kl_rows [R] (sparse mode: restricted to each row's selected set unless
        index_loss.dense_target)."""
        B, T = ids.shape
        if positions is None:
            positions = torch.arange(T, device=ids.device)
        cos, sin = rope_cos_sin(positions, self.cfg.qk_rope_head_dim, self.cfg.rope_theta, torch.float32)
        x = self.embed_tokens(ids)
        topk, kl_group, group_allowed = None, [], None
        for layer in self.layers:
            if layer.self_attn.indexer is not None:
                self._flush_index_loss(index_loss, kl_group, kl_rows, T, group_allowed)
            a, topk, extras = self._attend(layer, layer.input_layernorm(x), cos, sin, mode, topk, index_loss, kl_rows,
                                           kl_group)
            if layer.self_attn.indexer is not None:
                group_allowed = extras["allowed_rows"]
            x = layer.mlp_block(x + a)
        self._flush_index_loss(index_loss, kl_group, kl_rows, T, group_allowed)
        return self.norm(x)

    def logits(self, h):
        return self.lm_head(h)

    # ------------------------------------------------------------------ MTP

    def mtp_input(self, h_prev, next_ids):
        return self.mtp_eh_proj(torch.cat([self.mtp_enorm(self.embed_tokens(next_ids)), self.mtp_hnorm(h_prev)], dim=-1))

    def mtp_forward(self, h_target, ids, steps, mode="dense", share=True, index_loss=None, kl_rows=None):
        """Chained MTP drafts over every row t of ids [B,T].
        Step 0: input (target hidden h_t after model.norm, embed(x_{t+1})), causal attention over the
        MTP layer's own KV of rows <= t; predicts x_{t+2}. Step j >= 1: input (shared_head.norm of step
        j-1's output, embed(x_{t+1+j})), query at position t+j; with share=True it attends over step 0's
        KV of rows <= t with step 0's top-k (IndexShare + KVShare, as at inference), else it is a fresh
        causal pass with its own KV and indexer. Returns a list of normed hidden states [B,T,hidden],
        step j predicting x_{t+2+j} (rows past the end see id 0 and must be masked by the caller)."""
        B, T = ids.shape
        layer = self.mtp_layer
        attn = layer.self_attn
        positions = torch.arange(T, device=ids.device)
        cos0, sin0 = rope_cos_sin(positions, self.cfg.qk_rope_head_dim, self.cfg.rope_theta, torch.float32)
        outs = []
        h_prev = h_target
        ext0 = None
        for j in range(steps):
            nxt = torch.zeros_like(ids)
            if j + 1 < T:
                nxt[:, : T - 1 - j] = ids[:, 1 + j:]
            x = self.mtp_input(h_prev, nxt)
            hn = layer.input_layernorm(x)
            if j == 0 or not share:
                kl_group = []
                a, _, extras = self._attend(layer, hn, cos0, sin0, mode, None, index_loss if j == 0 else None,
                                            kl_rows, kl_group)
                if j == 0:
                    ext0 = extras
                    self._flush_index_loss(index_loss, kl_group, kl_rows, T, extras["allowed_rows"])
            else:
                cos, sin = rope_cos_sin(positions + j, self.cfg.qk_rope_head_dim, self.cfg.rope_theta, torch.float32)
                q, _ = attn.query(hn, cos, sin)
                if "kv_cat" in ext0:
                    a = attn.output(attn.sparse(attn.absorbed_q(q), ext0["kv_cat"], ext0["topk"]))
                else:
                    a = attn.output(causal_attention(q, ext0["k"], ext0["v"], attn.scale, ext0.get("allowed")))
            x = layer.mlp_block(x + a)
            h_prev = self.mtp_head_norm(x)
            outs.append(h_prev)
        return outs

    def moe_layers(self):
        return [l.mlp for l in list(self.layers) + [self.mtp_layer] if isinstance(l.mlp, MoE)]
