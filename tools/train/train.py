"""Training loop of the default model: time-budgeted phases, resumable checkpoints.

Phase "dense" (warm-up): causal dense attention; LM loss + chained MTP loss; every full layer's
indexer learns KL(p || softmax(index scores)) on sampled query rows, p = the main attention summed
over heads and L1-normalized, averaged over the layers the indexer serves (IndexShare); the
indexer's inputs are detached, so this loss moves only the indexer.
Phase "sparse": top-k selected attention everywhere (as at inference), same losses, the KL restricted
to the selected set (runs 1-4) or, with kl_dense_target (run 5), against the dense attention over every
causal column, so the indexer also learns about keys it did not select.
Sparse from a time fraction (dense_until) or, run 5, from a row length on (sparse_from)."""
import math
import os
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from model import IndexerLoss


class Schedule:
    """Time-based: fraction f of the budget decides the phase and the learning rate. Attention is
    sparse from fraction dense_until on, and also (sparse_from > 0) in every batch whose rows have at
    least sparse_from tokens (run 5: sparse from the 16K phase of the curriculum on)."""

    def __init__(self, budget_s, lr, dense_until=0.6, warmup=0.03, final=0.1, sparse_from=0, decay_frac=1.0):
        self.budget_s, self.lr, self.dense_until, self.warmup, self.final = budget_s, lr, dense_until, warmup, final
        self.sparse_from = sparse_from
        # decay_frac < 1: warmup-stable-decay. The rate holds at lr after the warmup and the cosine
        # runs over the last decay_frac of the budget only, so a curriculum's last (longest) phase
        # is not trained at the cosine's tail (run 6: its 128K rows at 0.5-1.3e-4 of 5e-4).
        self.decay_frac = decay_frac

    def mode(self, f, seq_len=None):
        if f >= self.dense_until:
            return "sparse"
        if self.sparse_from and seq_len is not None and seq_len >= self.sparse_from:
            return "sparse"
        return "dense"

    def learning_rate(self, f):
        if f < self.warmup:
            return self.lr * (0.1 + 0.9 * f / self.warmup)
        start = max(self.warmup, 1.0 - self.decay_frac)
        p = min(1.0, max(0.0, f - start) / max(1e-9, 1.0 - start))
        return self.lr * (self.final + (1 - self.final) * 0.5 * (1 + math.cos(math.pi * p)))


def weighted_ce(logits, targets, weights):
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    w = weights.reshape(-1)
    return (ce * w).sum() / w.sum()


def mtp_losses(model, h, logits, inp, full, weights, steps, mode, share, tv_weight, index_loss=None, kl_rows=None):
    """Chained MTP losses. inp = full[:, :T]; step j at row t predicts full[:, t+2+j].
    Returns (sum over steps of CE + tv_weight * TV) / steps, and per-step CE values."""
    T = inp.shape[1]
    outs = model.mtp_forward(h, inp, steps, mode=mode, share=share, index_loss=index_loss, kl_rows=kl_rows)
    total, ces = 0.0, []
    for j, hj in enumerate(outs):
        n = T - 1 - j
        if n <= 0:
            break
        q_logits = model.logits(hj[:, :n])
        tgt = full[:, 2 + j:2 + j + n]
        w = weights[:, 1 + j:1 + j + n]
        ce = weighted_ce(q_logits, tgt, w)
        ces.append(ce.detach())
        loss = ce
        if tv_weight > 0:
            p = torch.softmax(logits[:, 1 + j:1 + j + n].detach().float(), dim=-1)
            q = torch.softmax(q_logits.float(), dim=-1)
            tv = 0.5 * (p - q).abs().sum(-1)
            loss = loss + tv_weight * (tv * w).sum() / w.sum()
        total = total + loss
    return total / len(outs), ces


def _head_chunk(model, h_c, hp_c, outs_c, tgt_c, w_c, full_c, wm_c, tv_weight):
    """Loss sums of rows [a, b) (see head_losses): main CE; per MTP step j CE and TV. h_c [B,C,hidden];
    hp_c = h of rows shifted by 1 + j for step j ([B,C+steps,hidden], detached: p of the TV term);
    outs_c[j] [B,C,hidden]; full_c [B,C+steps+1] the tokens from row a + 1; wm_c [B,C+steps] the weights
    from row a. Returns a tensor [1 + 2 * steps]."""
    C = h_c.shape[1]
    logits = model.logits(h_c)
    sums = [(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt_c.reshape(-1), reduction="none")
             * w_c.reshape(-1)).sum()]
    for j, hj in enumerate(outs_c):
        n = hj.shape[1]
        q_logits = model.logits(hj)
        tgt = full_c[:, 1 + j:1 + j + n]
        w = wm_c[:, 1 + j:1 + j + n]
        ce = F.cross_entropy(q_logits.float().reshape(-1, q_logits.shape[-1]), tgt.reshape(-1), reduction="none")
        sums.append((ce * w.reshape(-1)).sum())
        if tv_weight > 0:
            with torch.no_grad():
                p = torch.softmax(model.logits(hp_c[:, 1 + j:1 + j + n]).float(), dim=-1)
            q = torch.softmax(q_logits.float(), dim=-1)
            tv = 0.5 * (p - q).abs().sum(-1)
            sums.append((tv * w).sum())
        else:
            sums.append(q_logits.new_zeros((), dtype=torch.float32))
    return torch.stack(sums)


def head_losses(model, h, inp, full, weights, steps, mode, share, tv_weight, index_loss=None, kl_rows=None,
                chunk=4096):
    """weighted_ce + mtp_losses with the lm_head, softmaxes and the TV term computed over chunks of
    rows, each chunk checkpointed: the [T, vocab] logits of the four heads are never kept for the
    backward pass (~300 KB per token less; run 4's 64K-128K rows). Same values as
    weighted_ce(logits, ...) and mtp_losses(...). Returns (lm, mtp, per-step CE)."""
    T = inp.shape[1]
    outs = model.mtp_forward(h, inp, steps, mode=mode, share=share, index_loss=index_loss, kl_rows=kl_rows)
    outs = [o for j, o in enumerate(outs) if T - 1 - j > 0]
    hd = h.detach()
    total = None
    grad = torch.is_grad_enabled()
    for a in range(0, T, chunk):
        b = min(T, a + chunk)
        outs_c = [o[:, a:min(b, T - 1 - j)] for j, o in enumerate(outs)]
        outs_c = [o for o in outs_c if o.shape[1] > 0]
        args = (model, h[:, a:b], hd[:, a:b + len(outs_c)], outs_c, full[:, a + 1:b + 1], weights[:, a:b],
                full[:, a + 1:b + 1 + len(outs_c) + 1], weights[:, a:b + len(outs_c)], tv_weight)
        if grad:
            sums = torch.utils.checkpoint.checkpoint(_head_chunk, *args, use_reentrant=False)
        else:
            sums = _head_chunk(*args)
        sums = F.pad(sums, (0, 1 + 2 * len(outs) - sums.shape[0]))
        total = sums if total is None else total + sums
    lm = total[0] / weights.sum()
    mtp, ces = 0.0, []
    for j in range(len(outs)):
        wsum = weights[:, 1 + j:T].sum()
        ce = total[1 + 2 * j] / wsum
        ces.append(ce.detach())
        mtp = mtp + ce + (tv_weight * total[2 + 2 * j] / wsum if tv_weight > 0 else 0.0)
    return lm, mtp / len(outs), ces


def update_router_bias(model, rate=1e-3):
    """Aux-loss-free balancing (DeepSeek-V3): raise the choice bias of underloaded experts."""
    with torch.no_grad():
        for moe in model.moe_layers():
            if moe.last_load is not None:
                load = moe.last_load.float()
                moe.e_score_correction_bias += rate * torch.sign(load.mean() - load)


def sample_rows(T, count, device, generator):
    lo = min(64, T - 1)
    rows = torch.randint(lo, T, (count,), device="cpu", generator=generator).unique().sort().values
    return rows.to(device)


def save_atomic(path, payload):
    """torch.save through a temporary file, so a process killed while writing keeps the last file."""
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def save_checkpoint(path, model, opt, state):
    save_atomic(path, {"model": model.state_dict(), "opt": opt.state_dict(), "state": state})


def load_checkpoint(path, model, opt):
    ck = torch.load(path, map_location="cpu")
    model.load_state_dict(ck["model"])
    if opt is not None:
        opt.load_state_dict(ck["opt"])
    return ck["state"]


def make_optimizer(params, lr, weight_decay=0.1, index_params=(), index_lr_mult=1.0):
    """AdamW; index_params (the indexers' parameters, when given) get their own groups whose learning
    rate is index_lr_mult times the schedule's (the groups' "lr_mult")."""
    index_ids = {id(p) for p in index_params}
    groups = []
    for members, mult in (([p for p in params if id(p) not in index_ids], 1.0), (list(index_params), index_lr_mult)):
        decay = [p for p in members if p.dim() >= 2]
        no_decay = [p for p in members if p.dim() < 2]
        groups += [{"params": decay, "weight_decay": weight_decay, "lr_mult": mult},
                   {"params": no_decay, "weight_decay": 0.0, "lr_mult": mult}]
    groups = [g for g in groups if g["params"]]
    kwargs = {"fused": True} if torch.cuda.is_available() else {}
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **kwargs)


def indexer_parameters(model):
    """The DSA indexers' parameters (the target's full layers and the MTP layer's): only the indexer KL
    moves them (their inputs are detached)."""
    return [p for n, p in model.named_parameters() if ".indexer." in n]


def kl_row_weights(weights, rows, answer_weight, min_weight):
    """[B, R] weights of the KL query rows: answer_weight where the row's target is a retrieval answer
    (target weight above min_weight), 1 elsewhere. weights: numpy [B, T]; rows: tensor [R]."""
    import numpy as np

    ans = weights[:, rows.cpu().numpy()] > min_weight
    return torch.from_numpy(np.where(ans, answer_weight, 1.0).astype("float32"))


def step_loss(model, full, w, mode, rows, device, amp=True, mtp_steps=3, mtp_weight=0.3, tv_weight=1.0, head_chunk=0,
              index_loss=None, index_kl_weight=1.0):
    """Forward pass and losses of one training batch: full [B, T+1] tokens, w [B, T] target weights,
    rows the KL query rows; index_loss an IndexerLoss (its dense_target and row_weights options) or
    None for the default one; the indexer KL enters the loss times index_kl_weight. Returns (loss, lm,
    per-step MTP CE, indexer KL or None), the KL unweighted."""
    inp, tgt = full[:, :-1], full[:, 1:]
    if index_loss is None:
        index_loss = IndexerLoss()
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
        h = model(inp, mode=mode, index_loss=index_loss, kl_rows=rows)
        if head_chunk > 0:
            lm, mtp, mtp_ces = head_losses(model, h, inp, full, w, mtp_steps, mode, True, tv_weight, index_loss,
                                           rows, chunk=max(1, head_chunk // inp.shape[0]))
        else:
            logits = model.logits(h)
            lm = weighted_ce(logits, tgt, w)
            mtp, mtp_ces = mtp_losses(model, h, logits, inp, full, w, mtp_steps, mode, True, tv_weight,
                                      index_loss, rows)
        kl = index_loss.total()
        loss = lm + mtp_weight * mtp + (index_kl_weight * kl if kl is not None else 0.0)
    return loss, lm, mtp_ces, kl


def train(model, batches, schedule, device, log, ckpt_path=None, resume=False, mtp_steps=3, mtp_weight=0.3,
          tv_weight=1.0, kl_rows=256, ckpt_every_s=90.0, amp=True, head_chunk=0, kl_answer_rows=0,
          kl_answer_min_weight=3.0, index_kl_weight=1.0, kl_answer_weight=1.0, kl_dense_target=False,
          index_lr_mult=1.0, index_clip=0.0):
    """head_chunk > 0: the LM/MTP heads and their losses over checkpointed chunks of that many rows
    (head_losses; run 4's long rows), else the whole [B, T, vocab] logits as in runs 1-3.
    kl_answer_rows > 0: the indexer KL also takes up to that many query rows whose target weight is
    above kl_answer_min_weight (retrieval answers), where the attention should sit on the needle.
    Run 5 options (the defaults are runs 1-4's behaviour):
    index_kl_weight: the KL's factor in the loss. The indexers learn from the KL alone, so under AdamW
      this factor barely changes their steps; what it changes is the joint gradient-norm clip (a large
      KL gradient shrinks the LM's step) unless index_clip > 0.
    kl_answer_weight: weight of an answer row (kl_answer_min_weight) in the KL's mean over rows, against
      1 for a random row: this changes the direction of the indexers' steps.
    kl_dense_target: in sparse steps the KL target is the dense attention over every causal column
      (IndexerLoss.dense_target), not the attention over the selected set.
    index_lr_mult: the indexers' learning rate over the schedule's.
    index_clip > 0: the indexers' gradients are clipped to this norm on their own, the rest to 1.0
      (default: one clip to 1.0 over all parameters)."""
    index_params = indexer_parameters(model)
    separate = index_lr_mult != 1.0 or index_clip > 0
    opt = make_optimizer([p for p in model.parameters()], schedule.lr,
                         index_params=index_params if separate else (), index_lr_mult=index_lr_mult)
    index_ids = {id(p) for p in index_params}
    main_params = [p for p in model.parameters() if id(p) not in index_ids]
    state = {"step": 0, "elapsed": 0.0, "tokens": 0}
    if resume and ckpt_path and os.path.exists(ckpt_path):
        state = load_checkpoint(ckpt_path, model, opt)
        log("resumed from {} at step {} ({:.0f}s)".format(ckpt_path, state["step"], state["elapsed"]))
    gen = torch.Generator().manual_seed(1234 + state["step"])
    start = time.time() - state["elapsed"]
    last_ckpt = time.time()
    last_len = last_mode = None
    model.train()
    while True:
        elapsed = time.time() - start
        f = elapsed / schedule.budget_s
        if f >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = schedule.learning_rate(f) * g.get("lr_mult", 1.0)
        # Curriculum batches pick their phase (row length) from the time fraction.
        tokens, weights = batches.next(f) if hasattr(batches, "phases") else batches.next()
        mode = schedule.mode(f, tokens.shape[1] - 1)
        if mode != last_mode:
            log("step {} t={:.0f}s: {} attention".format(state["step"] + 1, elapsed, mode))
            last_mode = mode
        full = torch.from_numpy(tokens).to(device, non_blocking=True).long()
        w = torch.from_numpy(weights).to(device, non_blocking=True)
        inp = full[:, :-1]
        rows = sample_rows(inp.shape[1], kl_rows, device, gen)
        if kl_answer_rows > 0:
            answer = (weights > kl_answer_min_weight).any(0).nonzero()[0]  # weights: numpy [B, T]
            if len(answer) > 0:
                pick = torch.from_numpy(answer.astype("int64"))
                pick = pick[torch.randperm(len(pick), generator=gen)[:kl_answer_rows]].to(device)
                rows = torch.cat([rows, pick]).unique()
        row_w = kl_row_weights(weights, rows, kl_answer_weight, kl_answer_min_weight).to(device) \
            if kl_answer_weight != 1.0 else None
        index_loss = IndexerLoss(dense_target=kl_dense_target, row_weights=row_w)
        oom = None
        try:
            loss, lm, mtp_ces, kl = step_loss(model, full, w, mode, rows, device, amp, mtp_steps, mtp_weight,
                                              tv_weight, head_chunk, index_loss, index_kl_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
        except torch.cuda.OutOfMemoryError as e:
            # A curriculum phase whose rows do not fit: drop it (its time goes to the phase before) rather
            # than lose the run; without an earlier phase the error stands.
            if not (hasattr(batches, "drop_current") and batches.drop_current()):
                raise
            oom = str(e).split("\n")[0][:160]
        if oom is not None:
            loss = lm = mtp_ces = kl = None
            opt.zero_grad(set_to_none=True)
            log("step {}: out of memory with rows of {} x {}; that phase is dropped ({})".format(
                state["step"] + 1, inp.shape[1], inp.shape[0], oom))
            state.setdefault("oom_dropped", []).append(int(inp.shape[1]))
            full = w = inp = rows = None
            torch.cuda.empty_cache()
            continue
        if index_clip > 0:
            gnorm = torch.nn.utils.clip_grad_norm_(main_params, 1.0)
            gnorm_ix = torch.nn.utils.clip_grad_norm_(index_params, index_clip)
        else:
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            gnorm_ix = None
        opt.step()
        update_router_bias(model)
        state["step"] += 1
        state["tokens"] = state.get("tokens", 0) + inp.numel()
        if inp.shape[1] != last_len:
            if last_len is not None:
                log("phase of rows of {} done: {} steps, {:.1f}M tokens, {:.0f} tokens/s".format(
                    last_len, state["step"] - 1 - phase[0], (state["tokens"] - inp.numel() - phase[1]) / 1e6,
                    (state["tokens"] - inp.numel() - phase[1]) / max(1e-9, elapsed - phase[2])))
            phase = (state["step"] - 1, state["tokens"] - inp.numel(), elapsed)
            log("step {} t={:.0f}s: rows of {} tokens x {}".format(state["step"], elapsed, inp.shape[1], inp.shape[0]))
            last_len = inp.shape[1]
        if state["step"] % 25 == 1:
            log("step {} t={:.0f}s {} T={} lr={:.2e} lm={:.3f} mtp={} kl={:.3f} gnorm={:.2f}{} epoch={}".format(
                state["step"], elapsed, mode, inp.shape[1], opt.param_groups[0]["lr"], lm.item(),
                "/".join("{:.2f}".format(c.item()) for c in mtp_ces), kl.item() if kl is not None else 0.0,
                gnorm.item(), "" if gnorm_ix is None else " (indexers {:.2f})".format(gnorm_ix.item()),
                batches.epoch))
        if ckpt_path and time.time() - last_ckpt > ckpt_every_s:
            state["elapsed"] = time.time() - start
            save_checkpoint(ckpt_path, model, opt, state)
            last_ckpt = time.time()
    state["elapsed"] = time.time() - start
    if last_len is not None:
        log("phase of rows of {} done: {} steps, {:.1f}M tokens, {:.0f} tokens/s".format(
            last_len, state["step"] - phase[0], (state["tokens"] - phase[1]) / 1e6,
            (state["tokens"] - phase[1]) / max(1e-9, state["elapsed"] - phase[2])))
    if ckpt_path:
        save_checkpoint(ckpt_path, model, opt, state)
    return state


MTP_MODULES = ("mtp_enorm", "mtp_hnorm", "mtp_eh_proj", "mtp_layer", "mtp_head_norm")


def mtp_modules(model):
    """{name: module} of the MTP layer's parts (its parameters are the model's "mtp_*" ones)."""
    return {name: getattr(model, name) for name in MTP_MODULES}


def use_mtp(model, modules):
    """Puts an MTP ablation run's own modules (mtp_modules' names) into the model."""
    for name, module in modules.items():
        setattr(model, name, module)


def train_mtp_variants(model, batches, runs, budget_s, device, log, mtp_steps=3, lr=2e-3, amp=True, max_steps=0,
                       span_s=0.0, state_path="", stop_after=0):
    """MTP ablation: the target is frozen; every run learns its own MTP layer, all runs together.

    runs: [{"name", "modules" (mtp_modules of its own, initialised by the caller), "share" (IndexShare +
    KVShare across draft steps), "tv" (weight of the TV loss), "group"}]. Each step, every group reads
    a batch of its own; the runs of one group (the variants of one seed) share that batch and one
    forward pass of the target, so the variants are compared on the same rows and the target costs one
    pass per group rather than one per run. max_steps > 0: the schedule runs over that many steps; else
    over span_s seconds of training (0: budget_s). budget_s caps this call's time, stop_after > 0 its
    steps.

    state_path: a budget longer than one device call, trained over several. When the file exists, every
    run's MTP layer and optimizer state, the steps and the seconds trained are read from it and the
    batch stream is advanced past the batches already read, so the runs go on exactly where they
    stopped; the state is written back at the end. Returns (steps, seconds trained in all, whether the
    schedule's span is complete)."""
    original = mtp_modules(model)
    opts = [make_optimizer([p for m in run["modules"].values() for p in m.parameters()], lr) for run in runs]
    groups = sorted({run["group"] for run in runs})
    span_s = span_s or budget_s
    sched = Schedule(span_s, lr, dense_until=0.0)
    step, before_s, ces = 0, 0.0, {}
    if state_path and os.path.exists(state_path):
        state = torch.load(state_path, map_location=device)
        names = sorted(run["name"] for run in runs)
        if sorted(state["runs"]) != names:
            raise ValueError("{} holds the runs {}, this call trains {}".format(state_path, sorted(state["runs"]),
                                                                                names))
        for run, opt in zip(runs, opts):
            saved = state["runs"][run["name"]]
            for key, module in run["modules"].items():
                module.load_state_dict(saved["modules"][key])
            opt.load_state_dict(saved["optimizer"])
        step, before_s = state["step"], state["seconds"]
        for _ in range(step * len(groups)):
            batches.next()
        log("mtp ablation: resumed from {} at step {} ({:.0f}s trained)".format(state_path, step, before_s))
    first, start = step, time.time()

    def progress():  # the schedule's fraction done, over steps or seconds trained in all calls
        return step / max_steps if max_steps > 0 else (before_s + time.time() - start) / span_s

    try:
        while time.time() - start < budget_s and not (stop_after > 0 and step - first >= stop_after):
            f = progress()
            if f >= 1.0:
                break
            for group in groups:
                tokens, weights = batches.next()
                full = torch.from_numpy(tokens).to(device).long()
                w = torch.from_numpy(weights).to(device)
                inp = full[:, :-1]
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
                    with torch.no_grad():
                        h = model(inp, mode="sparse")
                        logits = model.logits(h)
                rows = sample_rows(inp.shape[1], 128, device, torch.Generator().manual_seed(step))
                for run, opt in zip(runs, opts):
                    if run["group"] != group:
                        continue
                    use_mtp(model, run["modules"])
                    for g in opt.param_groups:
                        g["lr"] = sched.learning_rate(f)
                    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
                        index_loss = IndexerLoss()
                        mtp, ces[run["name"]] = mtp_losses(model, h, logits, inp, full, w, mtp_steps, "sparse",
                                                           run["share"], run["tv"], index_loss, rows)
                        loss = mtp + index_loss.total()
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            step += 1
            if step % 100 == 0:
                log("mtp ablation step {}: CE {}".format(step, ", ".join(
                    "{} {:.2f}".format(name, c[0].item()) for name, c in sorted(ces.items()))))
    finally:
        use_mtp(model, original)
    seconds, complete = before_s + time.time() - start, progress() >= 1.0
    if state_path:
        runs_state = {run["name"]: {"modules": {k: m.state_dict() for k, m in run["modules"].items()},
                                    "optimizer": opt.state_dict()} for run, opt in zip(runs, opts)}
        os.makedirs(os.path.dirname(os.path.abspath(state_path)), exist_ok=True)
        save_atomic(state_path, {"step": step, "seconds": seconds, "runs": runs_state})
    log("mtp ablation: {} runs in {} groups, {} steps{} ({} this call) in {:.0f}s of training{}, last CE {}".format(
        len(runs), len(groups), step, " of {}".format(max_steps) if max_steps > 0 else "", step - first, seconds,
        "" if complete else " (span not complete: {})".format(
            "{} steps".format(max_steps) if max_steps > 0 else "{:.0f}s".format(span_s)),
        "; ".join("{} {}".format(name, "/".join("{:.2f}".format(c.item()) for c in c3))
                  for name, c3 in sorted(ces.items()))))
    return step, seconds, complete
