"""Checks on the GPU machine that transformers' GlmMoeDsaForCausalLM loads the exported directory and
computes the same logits as model.py, and that the HF tokenizer renders and encodes like ours."""
import copy
import inspect
import os
import shutil

import torch

import export
from model import MoE


def _fused_experts(model, tensors):
    """Fallback for a transformers build that wants fused expert tensors: [E, 2I, H] and [E, H, I]."""
    out = {}
    cfg = model.cfg
    for i in range(cfg.num_hidden_layers):
        p = "model.layers.{}.mlp.".format(i)
        if p + "experts.0.gate_proj.weight" not in tensors:
            continue
        g = torch.stack([tensors[p + "experts.{}.gate_proj.weight".format(e)] for e in range(cfg.n_routed_experts)])
        u = torch.stack([tensors[p + "experts.{}.up_proj.weight".format(e)] for e in range(cfg.n_routed_experts)])
        d = torch.stack([tensors[p + "experts.{}.down_proj.weight".format(e)] for e in range(cfg.n_routed_experts)])
        out[p + "experts.gate_up_proj"] = torch.cat([g, u], dim=1).float()
        out[p + "experts.down_proj"] = d.float()
    return out


def hf_logits(model_dir, ids, device, log, our_model):
    from transformers import GlmMoeDsaForCausalLM

    hf, info = GlmMoeDsaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager",
                                                    output_loading_info=True)
    missing = sorted(info.get("missing_keys", []))
    unexpected = sorted(info.get("unexpected_keys", []))
    log("HF load: {} missing (e.g. {}), {} unexpected (e.g. {})".format(len(missing), missing[:3], len(unexpected),
                                                                         unexpected[:3]))
    real_missing = [k for k in missing if ".indexer." not in k]
    if real_missing:
        tensors = export.read_safetensors(os.path.join(model_dir, "model.safetensors"))
        fused = _fused_experts(our_model, tensors)
        res = hf.load_state_dict(fused, strict=False)
        log("loaded fused experts by hand: {} tensors; still missing {}".format(
            len(fused), [k for k in res.missing_keys if ".indexer." not in k][:5]))
    hf.to(device).eval()
    with torch.no_grad():
        return hf(ids).logits.float()


def our_logits(model, model_dir, ids):
    """Logits of model.py with the exported (bf16-rounded) weights, fp32 math, sparse attention."""
    m = copy.deepcopy(model).float()
    export.load_hub_into(m, export.read_safetensors(os.path.join(model_dir, "model.safetensors")))
    m.eval()
    with torch.no_grad():
        return m.logits(m(ids, mode="sparse")).float()


def compare(model, tok, template, model_dir, ids, device, log):
    """Exports each RoPE layout until HF agrees (interleaved first). Returns the flags and the max
    relative difference of the layout that matched (left written in model_dir)."""
    try:
        from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as mod
        src = inspect.getsource(mod)
        log("transformers glm_moe_dsa source mentions interleave: {}".format("interleave" in src))
    except Exception as e:  # noqa: BLE001
        log("could not read the HF source: {}".format(e))
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # true fp32 on both sides
    try:
        return _compare(model, tok, template, model_dir, ids, device, log)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _compare(model, tok, template, model_dir, ids, device, log):
    ours = our_logits(model, model_dir, ids)
    best = None
    # transformers 5.17 applies interleaved RoPE in MLA and in the indexer: try that layout first.
    for flags in [(True, True), (False, False), (True, False), (False, True)]:
        export.write_model_dir(model_dir, model, tok, template, *flags)
        theirs = hf_logits(model_dir, ids, device, log, model)
        rel = ((theirs - ours).abs().max() / ours.abs().max()).item()
        agree = (theirs.argmax(-1) == ours.argmax(-1)).float().mean().item()
        log("rope_interleave={} indexer_rope_interleave={}: max |HF - ours| / max |ours| = {:.3e}, argmax agreement {:.4f}"
            .format(flags[0], flags[1], rel, agree))
        if best is None or rel < best[1]:
            best = (flags, rel, agree)
        if rel < 1e-3:
            break
    if best[0] != flags:
        export.write_model_dir(model_dir, model, tok, template, *best[0])
    return {"rope_interleave": best[0][0], "indexer_rope_interleave": best[0][1], "max_rel_diff": best[1],
            "argmax_agreement": best[2], "tokens": int(ids.shape[1])}


def check_tokenizer(model_dir, tok, fixture, log):
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(model_dir)
    rendered = hf_tok.apply_chat_template(fixture["messages"], tokenize=False, add_generation_prompt=True,
                                          **fixture["chat_template_kwargs"])
    same_text = rendered == fixture["prompt"]
    ids_ours = tok.encode(fixture["prompt"], add_special_tokens=False).ids
    ids_hf = hf_tok(fixture["prompt"], add_special_tokens=False)["input_ids"]
    log("HF apply_chat_template == prepare.py rendering: {}; HF ids == tokenizers ids: {} ({} tokens)".format(
        same_text, ids_ours == ids_hf, len(ids_ours)))
    return {"chat_template_same": same_text, "ids_same": ids_ours == ids_hf, "fixture_tokens": len(ids_ours)}


def cleanup(path):
    shutil.rmtree(path, ignore_errors=True)
