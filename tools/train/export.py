"""Export of the trained model in the Hugging Face Hub layout of GLM-5 (glm_moe_dsa): config.json,
model.safetensors (bf16; the router's e_score_correction_bias in fp32 as in GLM's checkpoints; the
MTP layer as model.layers.{L}.*), tokenizer.json, tokenizer_config.json with the chat template,
generation_config.json."""
import json
import os
import struct

import torch

from config import SPECIAL_TOKENS
from model import MoE


def rope_permutation(r):
    """Split-half order [a0..a_{r/2-1}, b0..] -> interleaved [a0, b0, a1, b1, ...]."""
    return [i // 2 + (r // 2) * (i % 2) for i in range(r)]


def _permute_rows(w, start, r, block=None, heads=1):
    """Reorders rows [start, start + r) of each of `heads` blocks of `block` rows into interleaved order."""
    perm = torch.tensor(rope_permutation(r))
    w = w.clone()
    block = block or w.shape[0]
    for h in range(heads):
        base = h * block + start
        w[base:base + r] = w[base:base + r][perm]
    return w


def hub_state_dict(model, rope_interleave=False, indexer_rope_interleave=False, dtype=torch.bfloat16):
    """Our parameter names -> HF names (bf16 except the correction bias)."""
    cfg = model.cfg
    out = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm.weight,
           "lm_head.weight": model.lm_head.weight}
    r = cfg.qk_rope_head_dim

    def layer(prefix, lyr):
        a = lyr.self_attn
        q_b, kv_a = a.q_b_proj.weight, a.kv_a_proj_with_mqa.weight
        if rope_interleave:
            q_b = _permute_rows(q_b, cfg.qk_nope_head_dim, r, cfg.qk_head_dim, cfg.num_attention_heads)
            kv_a = _permute_rows(kv_a, cfg.kv_lora_rank, r)
        out.update({
            prefix + "input_layernorm.weight": lyr.input_layernorm.weight,
            prefix + "post_attention_layernorm.weight": lyr.post_attention_layernorm.weight,
            prefix + "self_attn.q_a_proj.weight": a.q_a_proj.weight,
            prefix + "self_attn.q_a_layernorm.weight": a.q_a_layernorm.weight,
            prefix + "self_attn.q_b_proj.weight": q_b,
            prefix + "self_attn.kv_a_proj_with_mqa.weight": kv_a,
            prefix + "self_attn.kv_a_layernorm.weight": a.kv_a_layernorm.weight,
            prefix + "self_attn.kv_b_proj.weight": a.kv_b_proj.weight,
            prefix + "self_attn.o_proj.weight": a.o_proj.weight,
        })
        if a.indexer is not None:
            ix = a.indexer
            wq_b, wk = ix.wq_b.weight, ix.wk.weight
            kn_w, kn_b = ix.k_norm.weight, ix.k_norm.bias
            if indexer_rope_interleave:
                wq_b = _permute_rows(wq_b, 0, r, cfg.index_head_dim, cfg.index_n_heads)
                wk = _permute_rows(wk, 0, r)
                kn_w = _permute_rows(kn_w[:, None], 0, r)[:, 0]
                kn_b = _permute_rows(kn_b[:, None], 0, r)[:, 0]
            out.update({
                prefix + "self_attn.indexer.wq_b.weight": wq_b,
                prefix + "self_attn.indexer.wk.weight": wk,
                prefix + "self_attn.indexer.k_norm.weight": kn_w,
                prefix + "self_attn.indexer.k_norm.bias": kn_b,
                prefix + "self_attn.indexer.weights_proj.weight": ix.weights_proj.weight,
            })
        m = lyr.mlp
        if isinstance(m, MoE):
            out[prefix + "mlp.gate.weight"] = m.gate_weight
            out[prefix + "mlp.gate.e_score_correction_bias"] = m.e_score_correction_bias
            for e in range(cfg.n_routed_experts):
                out[prefix + "mlp.experts.{}.gate_proj.weight".format(e)] = m.gate_proj[e]
                out[prefix + "mlp.experts.{}.up_proj.weight".format(e)] = m.up_proj[e]
                out[prefix + "mlp.experts.{}.down_proj.weight".format(e)] = m.down_proj[e]
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[prefix + "mlp.shared_experts.{}.weight".format(n)] = getattr(m.shared_experts, n).weight
        else:
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[prefix + "mlp.{}.weight".format(n)] = getattr(m, n).weight

    for i, lyr in enumerate(model.layers):
        layer("model.layers.{}.".format(i), lyr)
    L = cfg.num_hidden_layers
    mtp = "model.layers.{}.".format(L)
    layer(mtp, model.mtp_layer)
    out[mtp + "enorm.weight"] = model.mtp_enorm.weight
    out[mtp + "hnorm.weight"] = model.mtp_hnorm.weight
    out[mtp + "eh_proj.weight"] = model.mtp_eh_proj.weight
    out[mtp + "shared_head.norm.weight"] = model.mtp_head_norm.weight
    result = {}
    for k, v in out.items():
        v = v.detach().cpu().contiguous()
        result[k] = v.float() if k.endswith("e_score_correction_bias") else v.to(dtype)
    return result


_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}


def write_safetensors(path, tensors, metadata=None):
    """Minimal safetensors writer (header JSON + raw little-endian data, names sorted)."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header["__metadata__"] = metadata or {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        if info["dtype"] == "BF16":
            t = torch.frombuffer(bytearray(data[a:b]), dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32)
        out[name] = t.reshape(info["shape"])
    return out


def load_hub_into(model, tensors, rope_interleave=False, indexer_rope_interleave=False):
    """Inverse of hub_state_dict: loads Hub tensors (e.g. models/default, whose config.json names its
    RoPE layout) into model.py's split-half parameters."""
    cfg = model.cfg
    r = cfg.qk_rope_head_dim
    inverse = torch.argsort(torch.tensor(rope_permutation(r)))

    def unpermute(w, start, block, heads):
        w = w.clone()
        for h in range(heads):
            base = h * block + start
            w[base:base + r] = w[base:base + r][inverse]
        return w

    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    with torch.no_grad():
        for hub, (ours, expert) in _name_map(model).items():
            t = tensors[hub]
            if rope_interleave and hub.endswith("self_attn.q_b_proj.weight"):
                t = unpermute(t, cfg.qk_nope_head_dim, cfg.qk_head_dim, cfg.num_attention_heads)
            elif rope_interleave and hub.endswith("self_attn.kv_a_proj_with_mqa.weight"):
                t = unpermute(t, cfg.kv_lora_rank, t.shape[0], 1)
            elif indexer_rope_interleave and hub.endswith("indexer.wq_b.weight"):
                t = unpermute(t, 0, cfg.index_head_dim, cfg.index_n_heads)
            elif indexer_rope_interleave and (hub.endswith("indexer.wk.weight") or ".indexer.k_norm." in hub):
                t = unpermute(t if t.dim() == 2 else t[:, None], 0, t.shape[0], 1)
                t = t if tensors[hub].dim() == 2 else t[:, 0]
            target = params[ours] if expert is None else params[ours][expert]
            target.copy_(t.to(target.dtype))


def load_model_dir(model_dir):
    """models/default (or any export of this recipe) -> GlmMoeDsa in fp32 on the CPU."""
    from config import ModelConfig
    from model import GlmMoeDsa

    with open(os.path.join(model_dir, "config.json")) as f:
        hf = json.load(f)
    fields = set(ModelConfig.__dataclass_fields__)
    cfg = ModelConfig(**{k: v for k, v in hf.items() if k in fields})
    model = GlmMoeDsa(cfg)
    load_hub_into(model, read_safetensors(os.path.join(model_dir, "model.safetensors")),
                  hf.get("rope_interleave", False), hf.get("indexer_rope_interleave", False))
    return model


def _name_map(model):
    """HF name -> (our parameter name, expert index or None)."""
    out = {"model.embed_tokens.weight": ("embed_tokens.weight", None), "model.norm.weight": ("norm.weight", None),
           "lm_head.weight": ("lm_head.weight", None)}
    cfg = model.cfg

    def layer(prefix, ours):
        simple = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_a_proj.weight",
                  "self_attn.q_a_layernorm.weight", "self_attn.q_b_proj.weight", "self_attn.kv_a_proj_with_mqa.weight",
                  "self_attn.kv_a_layernorm.weight", "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight"]
        lyr = model.get_submodule(ours.rstrip("."))
        for s in simple:
            out[prefix + s] = (ours + s, None)
        if lyr.self_attn.indexer is not None:
            for s in ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight"):
                out[prefix + "self_attn.indexer." + s] = (ours + "self_attn.indexer." + s, None)
        if isinstance(lyr.mlp, MoE):
            out[prefix + "mlp.gate.weight"] = (ours + "mlp.gate_weight", None)
            out[prefix + "mlp.gate.e_score_correction_bias"] = (ours + "mlp.e_score_correction_bias", None)
            for e in range(cfg.n_routed_experts):
                for n in ("gate_proj", "up_proj", "down_proj"):
                    out[prefix + "mlp.experts.{}.{}.weight".format(e, n)] = (ours + "mlp." + n, e)
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[prefix + "mlp.shared_experts.{}.weight".format(n)] = (ours + "mlp.shared_experts.{}.weight".format(n), None)
        else:
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[prefix + "mlp.{}.weight".format(n)] = (ours + "mlp.{}.weight".format(n), None)

    for i in range(cfg.num_hidden_layers):
        layer("model.layers.{}.".format(i), "layers.{}.".format(i))
    L = cfg.num_hidden_layers
    layer("model.layers.{}.".format(L), "mtp_layer.")
    m = "model.layers.{}.".format(L)
    out[m + "enorm.weight"] = ("mtp_enorm.weight", None)
    out[m + "hnorm.weight"] = ("mtp_hnorm.weight", None)
    out[m + "eh_proj.weight"] = ("mtp_eh_proj.weight", None)
    out[m + "shared_head.norm.weight"] = ("mtp_head_norm.weight", None)
    return out


def write_model_dir(out_dir, model, tok, template_text, rope_interleave=False, indexer_rope_interleave=False):
    os.makedirs(out_dir, exist_ok=True)
    ids = {s: tok.token_to_id(s) for s in SPECIAL_TOKENS}
    cfg = model.cfg.hf_config(ids, rope_interleave, indexer_rope_interleave)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(out_dir, "model.safetensors"),
                      hub_state_dict(model, rope_interleave, indexer_rope_interleave))
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": model.cfg.max_position_embeddings,
        "padding_side": "left",
        "remove_space": False,
        "chat_template": template_text,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    gen = {"_from_model_config": False, "do_sample": True, "temperature": 0.6, "top_p": 0.95,
           "eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"], "bos_token_id": cfg["bos_token_id"]}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(template_text)
