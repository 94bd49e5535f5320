#!/usr/bin/env python3
"""One GPU-machine run of the whole recipe inside a wall-clock budget: tokenizer (trained unless
models/default/tokenizer.json exists), packing, training (dense warm-up then sparse), export in the
Hub layout, the transformers parity check, evaluation, the MTP ablation; results go to OUT.

    python3 tools/train/pipeline.py --data .train-data --out $OUT --total-s 360

Every stage checks the clock so the run ends inside --total-s; a stage that does not fit is skipped
and recorded as not run."""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import data  # noqa: E402
from ablation import ABLATION_VARIANTS, ablation_runs, ablation_summary  # noqa: E402
import evaluate  # noqa: E402
import export  # noqa: E402
import train  # noqa: E402
from config import ModelConfig  # noqa: E402
from model import GlmMoeDsa  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(REPO, ".train-data"))
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/megactx-train"))
    ap.add_argument("--work", default="/tmp/megactx-work", help="checkpoints and bulky files")
    ap.add_argument("--total-s", type=float, default=360)
    ap.add_argument("--reserve-s", type=float, default=110, help="kept for export, check and evaluation")
    ap.add_argument("--ablation-s", type=float, default=45, help="MTP ablation training, all variants together")
    ap.add_argument("--ablation-seeds", type=int, default=1,
                    help="MTP ablation: runs per variant, each seed from its own initialisation and batches (the "
                         "spread between them is the run-to-run noise the variants' differences must exceed; the "
                         "variants of one seed share its batches)")
    ap.add_argument("--ablation-runs", default="",
                    help="MTP ablation: only these runs, a comma list of VARIANT:SEED (no_share_ce, share_ce, "
                         "share_ce_tv; seeds from 0), trained together, so that a budget too long "
                         "for one device call is spread over several (tools/train/ablation_table.py merges their "
                         "results); default every variant with seeds 0 .. --ablation-seeds - 1")
    ap.add_argument("--ablation-steps", type=int, default=0,
                    help="MTP ablation: every run trains this many steps (the schedule runs over steps; the time "
                         "left, less ~15 s per run for its evaluation, only caps it); 0: the runs train for "
                         "--ablation-s")
    ap.add_argument("--ablation-state", default="",
                    help="MTP ablation over several device calls: a folder (e.g. .ablation-state, ignored by git, "
                         "so a warm device machine keeps it between calls) that holds every run's MTP layer and "
                         "optimizer, read at the start when there and written after the call's training. "
                         "--ablation-s (or --ablation-steps) is then the whole span; a call that ends before it "
                         "skips the evaluation, and the same command, run again, goes on")
    ap.add_argument("--ablation-only", action="store_true",
                    help="with --init-from: no training of the target; the initial weights, as they are, are "
                         "the frozen target of the MTP ablation (its runs' MTP tensors go to OUT/ablation.tar.part*)")
    ap.add_argument("--mtp-prompts", choices=("chat", "text"), default="chat",
                    help="the PyTorch MTP acceptance's prompts: chat turns ending at <|assistant|> (the default), "
                         "or windows of the validation documents (evaluate.text_prompts), what the engine's "
                         "measurement serves")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--decay-frac", type=float, default=1.0,
                    help="the cosine decay over the last fraction of training only, the rate held at --lr "
                         "before it (warmup-stable-decay); 1 (runs 1-6): cosine over the whole budget")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--train-tokenizer", action="store_true")
    ap.add_argument("--resume", action="store_true", help="continue from --work/ckpt.pt (same machine)")
    ap.add_argument("--init-from", default=None,
                    help="start from an exported model directory, e.g. models/default (continued training on a fresh machine)")
    ap.add_argument("--assistant-weight", type=float, default=3.0, help="loss weight of assistant-turn tokens")
    ap.add_argument("--dense-until", type=float, default=0.6, help="fraction of the training time in the dense warm-up")
    ap.add_argument("--smoke", action="store_true", help="tiny evaluation sets")
    ap.add_argument("--passkey-n", type=int, default=8, help="passkey prompts per context length (at most 16)")
    ap.add_argument("--curriculum", default="",
                    help="run 3: row-length phases 'LEN:FRACTION,...' (e.g. 1024:0.15,2048:0.15,4096:0.25,8192:0.45); "
                         "retrieval documents are synthesized per phase from DATA/filler.jsonl.xz, the other tasks "
                         "come from DATA/other.jsonl.xz; batch = --batch * --seq-len tokens in every phase")
    ap.add_argument("--retrieval-weight", type=float, default=8.0,
                    help="with --curriculum: loss weight of assistant tokens of retrieval documents")
    ap.add_argument("--tokens-per-s", default="110000",
                    help="with --curriculum: expected training throughput, sizes each phase's data; one number "
                         "or per row length 'LEN:TOKENS_PER_S,...' (run 4: long rows train slower)")
    ap.add_argument("--max-phase-tokens", type=float, default=14e6, help="with --curriculum: cap per phase")
    ap.add_argument("--prep-s", type=float, default=30, help="with --curriculum: expected data synthesis time")
    ap.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    ap.add_argument("--mix", default="",
                    help="with --curriculum: token shares of a phase's documents, e.g. run 4's "
                         "passkey:0.12,multikey_turns:0.13,kv_list:0.05,other:0.3,text:0.4 (text = plain-text "
                         "documents packed whole; default run 3's mix: plain text only fills row ends)")
    ap.add_argument("--rope-theta", type=float, default=None,
                    help="RoPE base of MLA and the indexer (config.json rope_theta and rope_parameters); "
                         "default the --init-from folder's, else the config's 1e5")
    ap.add_argument("--max-position", type=int, default=None,
                    help="max_position_embeddings written to config.json (default the --init-from folder's, "
                         "else 32768)")
    ap.add_argument("--head-chunk", type=int, default=0,
                    help="LM/MTP heads and losses over checkpointed chunks of this many tokens (0: whole "
                         "logits as in runs 1-3); needed for rows of 64K+ tokens")
    ap.add_argument("--sparse-impl", default="auto", choices=["gather", "mask", "auto"],
                    help="sparse attention in training and evaluation: auto (runs 1-3's [B,T,T] mask while "
                         "B*T*T <= 2^28, e.g. 8K x 4 rows; above it the gather), gather (O(T x k) memory), mask; "
                         "same math")
    ap.add_argument("--kl-answer-rows", type=int, default=0,
                    help="add up to this many indexer-KL query rows at retrieval-answer targets (weight above "
                         "--assistant-weight) to the 256 random ones, so the indexer learns what answering attends to")
    ap.add_argument("--sparse-from", type=int, default=0,
                    help="run 5: sparse attention in every batch whose rows have at least this many tokens (e.g. "
                         "16384: the curriculum's 16K phase on), besides the time fraction --dense-until (pass "
                         "--dense-until 1 to decide by row length alone); 0: by --dense-until only (runs 1-4)")
    ap.add_argument("--kl-rows", type=int, default=None,
                    help="random indexer-KL query rows per step (default 256; 32 with --cpu-smoke)")
    ap.add_argument("--index-kl-weight", type=float, default=1.0,
                    help="factor of the indexer KL in the loss (runs 1-4: 1). The indexers learn from the KL alone "
                         "(detached inputs), so under AdamW this mostly matters through the joint gradient clip; "
                         "see --index-clip, --kl-answer-weight, --index-lr-mult")
    ap.add_argument("--kl-answer-weight", type=float, default=1.0,
                    help="weight of a retrieval-answer query row (see --kl-answer-rows) in the KL's mean over rows, "
                         "a random row weighing 1 (runs 1-4: 1)")
    ap.add_argument("--kl-dense-target", action="store_true",
                    help="sparse steps: the indexer KL's target is the dense attention over every causal column, not "
                         "the attention over the selected set (runs 1-4), so the indexer can learn to select a key it "
                         "missed; costs nothing extra (the same [rows, T] scores were computed and then masked)")
    ap.add_argument("--index-lr-mult", type=float, default=1.0,
                    help="the indexers' learning rate over --lr's schedule (runs 1-4: 1)")
    ap.add_argument("--index-clip", type=float, default=0.0,
                    help=">0: clip the indexers' gradients to this norm on their own, the other parameters' to 1.0 "
                         "(runs 1-4, 0: one clip to 1.0 over all)")
    ap.add_argument("--index-topk", type=int, default=None,
                    help="index_topk of the model (config.json index_topk, read by megactx and transformers) for "
                         "training and evaluation; default the config's 128, also when continuing from --init-from")
    ap.add_argument("--baseline-passkey", default="4096,8192",
                    help="with --baseline-eval: nominal passkey lengths evaluated with sparse attention (and the "
                         "needle recall) on the initial weights before training; '' for none")
    ap.add_argument("--alt-topk", type=int, default=0,
                    help="also evaluate sparse passkey (and the needle recall) with this index_topk, in the baseline "
                         "(--baseline-passkey lengths) and after training (lengths up to --alt-topk-max): what "
                         "serving the same weights with another top-k would give (0: not run)")
    ap.add_argument("--alt-topk-max", type=int, default=32768, help="longest nominal passkey length for --alt-topk")
    ap.add_argument("--passkey-dense-max", type=int, default=0,
                    help="evaluate dense-attention passkey only up to this nominal length (0: every length)")
    ap.add_argument("--baseline-eval", action="store_true",
                    help="validation loss of the initial weights before training (same rows as the final one)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="CPU machine check of the code path: no CUDA, byte tokenizer stand-in, tiny sets")
    args = ap.parse_args()
    if args.ablation_only and (not args.init_from or args.ablation_s <= 0):
        ap.error("--ablation-only needs --init-from (the frozen target) and --ablation-s > 0")
    if args.ablation_state and not args.ablation_only:
        ap.error("--ablation-state needs --ablation-only (a call that also trains the target has no time to go on)")
    try:
        ablation_runs(args.ablation_runs, args.ablation_seeds)
    except ValueError as e:
        ap.error(str(e))
    if args.ablation_steps < 0:
        ap.error("--ablation-steps must be >= 0, got {}".format(args.ablation_steps))
    if not 0.0 < args.decay_frac <= 1.0:
        ap.error("--decay-frac must be in (0, 1], got {}".format(args.decay_frac))
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    logf = open(os.path.join(args.out, "log.txt"), "a")

    def log(msg):
        line = "[{:6.1f}s] {}".format(time.time() - t0, msg)
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    def left():
        return args.total_s - (time.time() - t0)

    results = {"not_run": []}
    if args.cpu_smoke:
        device = torch.device("cpu")
        torch.set_num_threads(2)
        log("torch {} on the CPU (--cpu-smoke)".format(torch.__version__))
    else:
        device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        log("torch {} on {}".format(torch.__version__, torch.cuda.get_device_name(0)))

    # ---------------------------------------------------------------- data + tokenizer
    if args.curriculum:
        train_docs = data.read_jsonl(os.path.join(args.data, "other.jsonl.xz"))
        filler_path = os.path.join(args.data, "filler.jsonl.xz")
        if os.path.exists(filler_path):
            filler = [d["text"] for d in data.read_jsonl(filler_path)]
        else:  # make_r3.py --filler-from-text: the same paragraphs, from the carried package documents
            import curriculum  # noqa: F401  (puts tools/data on the path)
            from make_r3 import paragraphs_of

            filler = paragraphs_of(train_docs)
    else:
        train_docs = data.read_jsonl(os.path.join(args.data, "train.jsonl.xz"))
    val_docs = data.read_jsonl(os.path.join(args.data, "val.jsonl.xz"))
    passkey_items = data.read_jsonl(os.path.join(args.data, "passkey_eval.jsonl.xz"))
    long_path = os.path.join(args.data, "passkey_eval_long.jsonl.xz")
    if os.path.exists(long_path):  # run 4: 64K and 128K prompts (make_r3.py --long-passkey)
        passkey_items += data.read_jsonl(long_path)
    log("read {} train / {} val documents".format(len(train_docs), len(val_docs)))
    tok_path = os.path.join(REPO, "models", "default", "tokenizer.json")
    if args.cpu_smoke:
        from smoke_tokenizer import ByteTokenizer

        tok = ByteTokenizer(tok_path)
        log("byte tokenizer stand-in from {} (--cpu-smoke)".format(tok_path))
    elif os.path.exists(tok_path) and not args.train_tokenizer:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(tok_path)
        log("tokenizer from {} ({} tokens)".format(tok_path, tok.get_vocab_size()))
    else:
        rng = random.Random(0)
        sample = [d["text"] for d in train_docs]
        rng.shuffle(sample)
        budget, picked = 30_000_000, []
        for t in sample:
            picked.append(t)
            budget -= len(t)
            if budget <= 0:
                break
        tok = data.train_tokenizer(picked, args.vocab)
        tok.save(os.path.join(args.out, "tokenizer.json"))
        log("trained tokenizer on {:.0f} MB: {} tokens".format(sum(map(len, picked)) / 1e6, tok.get_vocab_size()))
    ids = data.special_ids(tok)
    val_len = 1024 if args.cpu_smoke else args.seq_len
    val_rows, _, _ = data.build_rows(tok, [d["text"] for d in val_docs], val_len, seed=2)
    if args.curriculum:
        batches = curriculum_batches(args, tok, ids, train_docs, filler, left, log, results)
    else:
        rows, weights, n_tok = data.build_rows(tok, [d["text"] for d in train_docs], args.seq_len, seed=1,
                                               assistant_weight=args.assistant_weight)
        chars = sum(len(d["text"]) for d in train_docs)
        log("train: {} tokens ({:.2f} chars/token) in {} rows of {}; val rows {}".format(
            n_tok, chars / n_tok, len(rows), args.seq_len, len(val_rows)))
        results["data"] = {"train_tokens": int(n_tok), "chars_per_token": chars / n_tok,
                           "train_rows": int(len(rows)), "seq_len": args.seq_len}
        batches = data.Batches(rows, weights, args.batch, seed=3)

    # ---------------------------------------------------------------- model + training
    overrides, hf = {}, {}
    if args.init_from:
        # Continuing: the folder's RoPE base and length unless the flags change them (before, the
        # defaults 1e5 / 32768 replaced a 1e6 folder's silently, so a frozen ablation target of runs
        # 4-7 ran at the wrong base without the flags).
        with open(os.path.join(args.init_from, "config.json")) as f:
            hf = json.load(f)
        for key in ("rope_theta", "max_position_embeddings"):
            if key in hf:
                overrides[key] = type(getattr(ModelConfig, key))(hf[key])
    if args.rope_theta is not None:
        overrides["rope_theta"] = float(args.rope_theta)
    if args.max_position is not None:
        overrides["max_position_embeddings"] = int(args.max_position)
    if args.index_topk is not None:
        overrides["index_topk"] = int(args.index_topk)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), **overrides)
    torch.manual_seed(0)
    model = GlmMoeDsa(cfg)
    if args.init_from:
        tensors = export.read_safetensors(os.path.join(args.init_from, "model.safetensors"))
        export.load_hub_into(model, tensors, hf.get("rope_interleave", False), hf.get("indexer_rope_interleave", False))
        log("initialized from {} (its rope_theta {}, max_position_embeddings {}, index_topk {})".format(
            args.init_from, hf.get("rope_theta"), hf.get("max_position_embeddings"), hf.get("index_topk")))
    log("rope_theta {}, max_position_embeddings {}, index_topk {}".format(cfg.rope_theta, cfg.max_position_embeddings,
                                                                       cfg.index_topk))
    results["config"] = {"rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position_embeddings,
                         "index_topk": cfg.index_topk}
    model.sparse_impl = args.sparse_impl
    model = model.to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for n, p in model.named_parameters() if n.startswith("mtp_"))
    log("params {:.2f}M (MTP layer {:.2f}M), indexer_types {}".format(n_params / 1e6, n_mtp / 1e6, cfg.indexer_types))
    results["params"] = {"total": n_params, "mtp": n_mtp}
    def val_losses(rows):  # padding targets excluded (data.real_targets)
        return {m: evaluate.val_loss(model, rows, m, device, ids["<|endoftext|>"]) for m in ("dense", "sparse")}

    if args.baseline_eval:
        ts = time.time()
        vr0 = val_rows[: (2 if args.smoke else 8)]
        if args.init_from and args.rope_theta is not None and float(hf.get("rope_theta", cfg.rope_theta)) != cfg.rope_theta:
            # The initial weights as shipped (their own theta) and under the new theta, before training.
            shipped_theta, cfg.rope_theta = cfg.rope_theta, float(hf.get("rope_theta"))
            results["val_loss_init"] = val_losses(vr0)
            cfg.rope_theta = shipped_theta
            results["val_loss_init_new_theta"] = val_losses(vr0)
        else:
            results["val_loss_init"] = val_losses(vr0)
        log("baseline val_loss ({:.0f}s): {} {}".format(time.time() - ts, json.dumps(results["val_loss_init"]),
                                                        json.dumps(results.get("val_loss_init_new_theta", ""))))
        lens0 = {int(x) for x in args.baseline_passkey.split(",") if x.strip()}
        if lens0:
            # Run 5: sparse passkey and the needle recall of the initial weights (same prompts as the final one).
            ts = time.time()
            items0 = [it for i, it in enumerate(passkey_items)
                      if i % 16 < (2 if args.smoke else args.passkey_n) and it["tokens"] in lens0]
            if args.cpu_smoke:
                items0 = items0[:1]
            try:
                results["passkey_init"] = {"index_topk": cfg.index_topk,
                                           "sparse": evaluate.passkey(model, tok, items0, "sparse", device,
                                                                      ids["<|endoftext|>"], None, log, needle=True)}
                if args.alt_topk:
                    results["passkey_init"]["sparse_topk{}".format(args.alt_topk)] = with_topk(
                        cfg, args.alt_topk, lambda: evaluate.passkey(model, tok, items0, "sparse", device,
                                                                     ids["<|endoftext|>"], None, log, needle=True))
            except Exception as e:  # noqa: BLE001
                log("baseline passkey failed: {!r}".format(e))
                results["not_run"].append("passkey_init: {!r}".format(e))
            log("baseline passkey ({:.0f}s)".format(time.time() - ts))
        model.train()
    if args.ablation_only:
        results["train"] = {"steps": 0, "seconds": 0.0, "skipped": "--ablation-only"}
        log("no training (--ablation-only): the initial weights are the target")
    else:
        train_s = max(15.0, left() - args.reserve_s - args.ablation_s)
        log("training budget {:.0f}s".format(train_s))
        sched = train.Schedule(train_s, args.lr, dense_until=args.dense_until, sparse_from=args.sparse_from,
                               decay_frac=args.decay_frac)
        ckpt = os.path.join(args.work, "ckpt.pt")
        kl_rows = args.kl_rows if args.kl_rows is not None else (32 if args.cpu_smoke else 256)
        state = train.train(model, batches, sched, device, log, ckpt_path=ckpt, resume=args.resume,
                            amp=not args.cpu_smoke, kl_rows=kl_rows, head_chunk=args.head_chunk,
                            kl_answer_rows=args.kl_answer_rows, kl_answer_min_weight=args.assistant_weight,
                            index_kl_weight=args.index_kl_weight, kl_answer_weight=args.kl_answer_weight,
                            kl_dense_target=args.kl_dense_target, index_lr_mult=args.index_lr_mult,
                            index_clip=args.index_clip)
        results["train"] = {"steps": state["step"], "seconds": state["elapsed"], "epochs": batches.epoch,
                            "tokens_seen": state["tokens"], "oom_dropped_phases": state.get("oom_dropped", [])}
        log("trained {} steps, {:.1f}M tokens".format(state["step"], results["train"]["tokens_seen"] / 1e6))

    # ---------------------------------------------------------------- export + parity
    # Evaluate what ships: round the weights to bf16 in place (the router bias stays fp32).
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model_dir = os.path.join(args.work, "model")
    template = open(os.path.join(REPO, "models", "default", "chat_template.jinja")).read()
    export.write_model_dir(model_dir, model, tok, template)
    fixture = json.load(open(os.path.join(REPO, "tests", "default_model", "passkey_8k.json")))
    fixture_ids = tok.encode(fixture["prompt"], add_special_tokens=False).ids
    with open(os.path.join(model_dir, "passkey_8k_ids.txt"), "w") as f:
        f.write(",".join(map(str, fixture_ids)) + "\n")
    if args.ablation_only:  # the target is a folder whose parity was checked when it was made
        results["not_run"].append("hf_parity (--ablation-only)")
    else:
        try:
            import check_hf

            sample = torch.from_numpy(val_rows[0, :700]).long()[None].to(device)
            results["hf_parity"] = check_hf.compare(model, tok, template, model_dir, sample, device, log)
            results["tokenizer_check"] = check_hf.check_tokenizer(model_dir, tok, fixture, log)
        except Exception as e:  # noqa: BLE001
            log("HF check failed: {!r}".format(e))
            results["not_run"].append("hf_parity: {!r}".format(e))
    if not args.ablation_only:  # the target is the initial weights: nothing new to return
        bundle(args.out, model_dir, "model", log)

    # ---------------------------------------------------------------- evaluation
    def stage(name, fn, need_s):
        if left() < need_s:
            log("skip {} ({:.0f}s left)".format(name, left()))
            results["not_run"].append(name)
            return
        try:
            ts = time.time()
            results[name] = fn()
            log("{} ({:.0f}s): {}".format(name, time.time() - ts, json.dumps(results[name])))
        except Exception as e:  # noqa: BLE001
            log("{} failed: {!r}".format(name, e))
            results["not_run"].append("{}: {!r}".format(name, e))
        dump(args.out, results)

    vr = val_rows[: (2 if args.smoke else 8)]
    if args.ablation_only:
        # The frozen target's own measures are its folder's (pipeline run that made it); only the
        # shipped MTP layer's acceptance stays, as the ablation table's reference row.
        log("--ablation-only: the target's validation loss, passkey and indexer recall not measured")
        results["not_run"] += ["val_loss", "passkey", "indexer_recall"]
    else:
        stage("val_loss", lambda: val_losses(vr), 15)
    pk = [it for i, it in enumerate(passkey_items) if i % 16 < (2 if args.smoke else args.passkey_n)]
    if args.cpu_smoke:
        pk = [it for it in pk if it["tokens"] <= 1024][:1]
    trained = cfg_len(args)
    short = [it for it in pk if it["tokens"] <= trained]
    long_ = [it for it in pk if it["tokens"] > trained]
    if args.cpu_smoke:
        short, long_ = pk, []
    dense_max = args.passkey_dense_max or float("inf")

    def passkey_all():
        # Sparse attention (as megactx runs the model) at every length first, up to the longest; then
        # dense up to --passkey-dense-max. A length whose turn comes too late is recorded as skipped.
        deadline = t0 + args.total_s - 5
        out = {"passkey": {}, "passkey_beyond": {}}
        for mode in ("sparse", "dense"):
            for name, items in (("passkey", short), ("passkey_beyond", long_)):
                if mode == "dense":
                    items = [it for it in items if it["tokens"] <= dense_max]
                out[name][mode] = evaluate.passkey(model, tok, items, mode, device, ids["<|endoftext|>"], deadline,
                                                   log, needle=True)
        above = sorted({it["tokens"] for it in short + long_ if it["tokens"] > dense_max})
        if above:
            out["passkey_beyond"]["dense_not_run"] = "lengths {} (above --passkey-dense-max)".format(above)
        if args.alt_topk:
            items = [it for it in short + long_ if it["tokens"] <= args.alt_topk_max]
            out["passkey_alt_topk"] = {"index_topk": args.alt_topk, "sparse": with_topk(
                cfg, args.alt_topk, lambda: evaluate.passkey(model, tok, items, "sparse", device, ids["<|endoftext|>"],
                                                             deadline, log, needle=True))}
        return out

    if not args.ablation_only:  # the target's own measures (see above)
        if left() < 20:
            log("skip passkey ({:.0f}s left)".format(left()))
            results["not_run"] += ["passkey", "passkey_beyond"]
        else:
            try:
                ts = time.time()
                pk_res = passkey_all()
                results.update(pk_res)
                log("passkey ({:.0f}s): {}".format(time.time() - ts, json.dumps(pk_res)))
            except Exception as e:  # noqa: BLE001
                log("passkey failed: {!r}".format(e))
                results["not_run"].append("passkey: {!r}".format(e))
            dump(args.out, results)
        stage("indexer_recall", lambda: evaluate.indexer_recall(model, val_rows[:2], device, cfg.index_topk), 10)
    prompt_len, prompt_count = 256 if args.cpu_smoke else 512, 16 if args.smoke else 32
    if args.mtp_prompts == "text":
        prompts = evaluate.text_prompts(val_rows, ids["<|endoftext|>"], prompt_len, prompt_count, seed=5)
    else:
        prompts = evaluate.assistant_prompts(val_rows, ids["<|assistant|>"], prompt_len, prompt_count, seed=5)
    new_tokens = 24 if args.smoke else 64
    if args.cpu_smoke:
        prompts, new_tokens = prompts[:2], 8
    stage("mtp_shipped", lambda: evaluate.mtp_acceptance(model, prompts, device, new_tokens=new_tokens), 20)

    # ---------------------------------------------------------------- MTP ablation (frozen target)
    def ablation():
        out = {}
        for p in model.parameters():
            p.requires_grad_(False)
        runs = ablation_runs(args.ablation_runs, args.ablation_seeds)
        mtp_prefix = "model.layers.{}.".format(cfg.num_hidden_layers)
        # The runs' MTP layers, bundled into OUT/ablation.tar.part* at the end (a device call
        # returns only a few files): `cat OUT/ablation.tar.part* | tar -x -C OUT`.
        tensors_dir = os.path.join(args.work, "ablation")
        shutil.rmtree(tensors_dir, ignore_errors=True)  # no earlier call's runs in this call's bundle
        os.makedirs(tensors_dir)
        # Every run at once (train.train_mtp_variants): the variants of one seed share its batches and
        # one target pass per step. The time cap leaves ~15 s per run for its evaluation and export.
        members = []
        for name, seed in runs:
            share, tv = ABLATION_VARIANTS[name]
            torch.manual_seed(1000 + seed)
            modules = train.mtp_modules(GlmMoeDsa(cfg))  # the same draws as the shipped layer's init
            for m in modules.values():
                m.to(device).requires_grad_(True)
            members.append({"name": "{}_seed{}".format(name, seed), "modules": modules, "share": share,
                            "tv": tv, "group": seed})
        cap_s = max(10.0, left() - 15.0 * len(runs) - 20.0)
        if args.ablation_steps <= 0 and not args.ablation_state:
            cap_s = min(cap_s, args.ablation_s)
        state_path = os.path.join(args.ablation_state, "state.pt") if args.ablation_state else ""
        # Without a state the schedule spans this call's cap, and whatever it trained is evaluated.
        steps, seconds, complete = train.train_mtp_variants(
            model, batches, members, cap_s, device, log, max_steps=args.ablation_steps,
            span_s=args.ablation_s if state_path else 0.0, state_path=state_path)
        if state_path and not complete:
            log("mtp ablation: {} steps, {:.0f}s trained, state in {}; the same command again goes on".format(
                steps, seconds, state_path))
            return {"state": state_path, "steps": steps, "seconds": seconds, "complete": False}
        original = train.mtp_modules(model)
        for member in members:
            run = member["name"]
            train.use_mtp(model, member["modules"])
            try:
                out[run] = evaluate.mtp_acceptance(model, prompts, device, new_tokens=new_tokens,
                                                   share=member["share"])
                out[run]["train_steps"] = steps
                # The run's MTP layer as HF names it, for the C++ engine's measurement
                # (tools/train/mtp_variant_model.py puts it into a copy of the target's folder).
                with torch.no_grad():
                    mtp = {k: v.detach().cpu() for k, v in export.hub_state_dict(model).items()
                           if k.startswith(mtp_prefix)}
                export.write_safetensors(os.path.join(tensors_dir, run + ".safetensors"), mtp)
            finally:
                train.use_mtp(model, original)
            log("mtp ablation {}: {}".format(run, json.dumps(out[run])))
        out.update(ablation_summary(out))
        bundle(args.out, tensors_dir, "ablation", log)
        return out

    if args.ablation_s > 0:
        # A step budget, or --ablation-only (whose whole call is the ablation), trains within whatever
        # time is left (the cap in ablation()); after training a target, the time budget needs all of it.
        need_s = 45 if args.ablation_steps > 0 or args.ablation_only else args.ablation_s + 15
        stage("mtp_ablation", ablation, need_s)
    else:
        results["not_run"].append("mtp_ablation (--ablation-s 0)")
    dump(args.out, results)
    log("done in {:.0f}s".format(time.time() - t0))


def curriculum_batches(args, tok, ids, train_docs, filler, left, log, results):
    """Run 3: per-phase rows (curriculum.py) sized from the expected training time and throughput."""
    import curriculum
    from sources import PLAIN_KINDS  # tools/data, on the path once curriculum is imported

    phases = curriculum.parse_curriculum(args.curriculum, args.seq_len)
    # --ablation-only: the MTP ablation's runs are the training that reads these rows.
    est_train_s = max(15.0, left() - args.prep_s - args.reserve_s - (0 if args.ablation_only else args.ablation_s))
    other = [d["text"] for d in train_docs if d["kind"] not in PLAIN_KINDS]
    text = [d["text"] for d in train_docs if d["kind"] in PLAIN_KINDS]
    template = open(os.path.join(REPO, "models", "default", "chat_template.jinja")).read()
    words = curriculum.words_of(filler)
    mix = curriculum.parse_mix(args.mix)
    log("curriculum {}; mix {}; {} filler paragraphs, {} words, {} chat documents, {} text documents".format(
        phases, {k: round(v, 3) for k, v in mix.items()}, len(filler), len(words), len(other), len(text)))
    built, info = [], {}
    with curriculum.make_pool(template, filler, words, args.workers) as pool:
        for i, (seq_len, frac) in enumerate(phases):
            target = min(args.max_phase_tokens, frac * est_train_s * phase_tokens_per_s(args.tokens_per_s, seq_len))
            if args.cpu_smoke:
                target = min(target, 40 * seq_len)
            rows, weights, phase_info = curriculum.build_phase(
                tok, ids, seq_len, target, other, text, 11 + i, pool, log, args.assistant_weight, args.retrieval_weight,
                mix)
            built.append((seq_len, frac, rows, weights))
            info[seq_len] = phase_info
    results["data"] = {"curriculum": phases, "mix": mix, "phases": info, "retrieval_weight": args.retrieval_weight,
                       "tokens_per_batch": args.batch * args.seq_len}
    return curriculum.CurriculumBatches(built, args.batch * args.seq_len)


def with_topk(cfg, k, fn):
    """fn() with the model's index_topk set to k (the config object the model reads at every forward)."""
    old, cfg.index_topk = cfg.index_topk, int(k)
    try:
        return fn()
    finally:
        cfg.index_topk = old


def phase_tokens_per_s(spec, seq_len):
    """--tokens-per-s: "110000" or "8192:90000,32768:60000" (a length not listed takes the nearest)."""
    if ":" not in str(spec):
        return float(spec)
    table = {int(a): float(b) for a, b in (part.split(":") for part in str(spec).split(","))}
    return table[min(table, key=lambda n: abs(n - seq_len))]


def cfg_len(args):
    """The longest trained row: --seq-len, or the longest curriculum phase."""
    if args.curriculum:
        import curriculum

        return max(n for n, _ in curriculum.parse_curriculum(args.curriculum, args.seq_len))
    return args.seq_len


def dump(out, results):
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)


def bundle(out, model_dir, name, log):
    """The run's file return allows 16 MiB a file and a few files: tar the folder and split it."""
    tar = os.path.join("/tmp", name + ".tar")
    subprocess.run(["tar", "cf", tar, "-C", os.path.dirname(model_dir), os.path.basename(model_dir)], check=True)
    subprocess.run(["split", "-b", "15m", "-d", tar, os.path.join(out, name + ".tar.part")], check=True)
    log("bundled {} ({:.1f} MB)".format(name, os.path.getsize(tar) / 1e6))


if __name__ == "__main__":
    main()
