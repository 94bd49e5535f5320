#!/usr/bin/python3
"""CPU check (Debian's python3-torch) of the MTP ablation's joint trainer (tools/train/train.py
train_mtp_variants), on a tiny model of the default recipe:

- every run trained together ends with exactly the MTP layer it gets when trained alone on the same
  batches from the same initialisation: runs share the target's pass, not their parameters, their
  optimizer state or their gradients;
- the runs of one group (one seed's variants) read the same batches and each group its own, in turn
  (group g of G reads batches g, g + G, ...);
- the model's own MTP layer is back in place, unchanged, afterwards, and the target is never updated;
- a budget trained over two calls through a state file (the device-call split of pipeline.py
  --ablation-state) ends exactly where one call ends: fresh modules in the second call get every
  run's layer and optimizer state from the file and the stream is advanced past the batches read;
  the first call reports its span incomplete, and a state of other runs is refused;
- the PyTorch acceptance's text prompts (evaluate.text_prompts, `pipeline.py --mtp-prompts text`) are
  windows of the packed short documents: after the row's first eos, free of padding, seeded.

    /usr/bin/python3 tests/default_model/mtp_variants_test.py

CTest `default_model_mtp_variants`; without PyTorch it exits 77 (skipped). ~10 s."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train"))

try:
    import numpy as np  # noqa: E402
    import torch  # noqa: E402
except ImportError as error:
    print("SKIPPED: needs PyTorch and numpy (Debian: apt-get install python3-torch):", error)
    sys.exit(77)

import evaluate  # noqa: E402
import model as M  # noqa: E402
import train as tr  # noqa: E402
from config import ModelConfig  # noqa: E402

CFG = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, q_lora_rank=16,
           kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, intermediate_size=48,
           moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, index_n_heads=2,
           index_head_dim=16, index_topk=8)
B, T = 2, 40  # rows longer than the top-k, so the sparse attention and the sharing matter


class Replay:
    """A batch stream over fixed batches that records which ones it handed out."""

    def __init__(self, batches, order=None):
        self.batches, self.order, self.given = batches, order or list(range(len(batches))), []

    def next(self):
        i = self.order[len(self.given) % len(self.order)]
        self.given.append(i)
        return self.batches[i]


def fresh_modules(seed):
    torch.manual_seed(1000 + seed)
    modules = tr.mtp_modules(M.GlmMoeDsa(ModelConfig(**CFG)))
    for m in modules.values():
        m.requires_grad_(True)
    return modules


def params(modules):
    return {"{}.{}".format(k, n): p.detach().clone() for k, m in modules.items() for n, p in m.named_parameters()}


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def train(target, runs, batches, steps, **kwargs):
    return tr.train_mtp_variants(target, batches, runs, 1e9, torch.device("cpu"), lambda msg: None, amp=False,
                                 max_steps=steps, **kwargs)


def check_resume(target, batches, variants, together):
    """Three steps as two calls through a state file equal the three steps of one call."""
    def fresh_runs():
        return [{"name": "{}_seed{}".format(name, seed), "modules": fresh_modules(seed), "share": share, "tv": tv,
                 "group": seed} for seed in (0, 1) for name, share, tv in variants]

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state", "state.pt")
        first = Replay(batches)
        steps, _, complete = train(target, fresh_runs(), first, 3, state_path=path, stop_after=2)
        assert (steps, complete, first.given) == (2, False, [0, 1, 2, 3]), (steps, complete, first.given)
        runs, second = fresh_runs(), Replay(batches)
        steps, _, complete = train(target, runs, second, 3, state_path=path)
        assert (steps, complete, second.given) == (3, True, [0, 1, 2, 3, 4, 5]), (steps, complete, second.given)
        worst = max(max_diff(params(run["modules"]), together[run["name"]]) for run in runs)
        print("two calls through a state file vs one call: max |difference| {:.2e}".format(worst))
        assert worst == 0.0, "a run resumed from the state file differs from the run trained in one call"
        try:
            train(target, fresh_runs()[:3], Replay(batches), 3, state_path=path)
        except ValueError as error:
            assert "this call trains" in str(error), error
        else:
            raise AssertionError("a state of other runs was taken")


def check_text_prompts():
    eos, length = 0, 8
    rng = np.random.default_rng(1)
    # Row 0: a long document (40 tokens), eos, short documents to the end. Row 1: short documents,
    # then padding from position 50. Row 2: no eos at all (one document filling the row).
    row0 = np.concatenate([rng.integers(1, 50, 40), [eos], rng.integers(1, 50, 59)])
    row1 = np.concatenate([rng.integers(1, 50, 20), [eos], rng.integers(1, 50, 28), [eos], [eos] * 50])
    row2 = rng.integers(1, 50, 100)
    rows = np.stack([row0, row1, row2])
    got = evaluate.text_prompts(rows, eos, length, 100, seed=3, room=4)
    again = evaluate.text_prompts(rows, eos, length, 100, seed=3, room=4)
    assert torch.equal(got, again) and got.shape[1] == length and got.shape[0] > 0
    found = 0
    for window in got.numpy():
        for r, row in enumerate(rows):
            first_eos = np.nonzero(row == eos)[0]
            for start in range(len(row) - length + 1):
                if np.array_equal(row[start:start + length], window):
                    assert r != 2, "a window from a row without an eos"
                    assert start > first_eos[0], "a window inside the row's opening document"
                    assert start + length + 4 <= (50 if r == 1 else 100), "a window reaching padding"
                    found += 1
    assert found >= got.shape[0], "a window that is not in the rows"
    assert evaluate.text_prompts(rows, eos, length, 2, seed=3, room=4).shape == (2, length)
    assert evaluate.text_prompts(rows[2:], eos, length, 5, seed=3).shape == (0, length)
    print("text prompts: {} windows after the opening document, none reaching padding".format(got.shape[0]))


def main():
    check_text_prompts()
    torch.manual_seed(0)
    target = M.GlmMoeDsa(ModelConfig(**CFG))
    target.sparse_impl = "gather"
    for p in target.parameters():
        p.requires_grad_(False)
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, CFG["vocab_size"], (B, T + 1)).astype(np.int64),
                rng.uniform(0.5, 2.0, (B, T)).astype(np.float32)) for _ in range(6)]
    before = {n: p.detach().clone() for n, p in target.named_parameters()}
    own = tr.mtp_modules(target)

    variants = [("no_share_ce", False, 0.0), ("share_ce", True, 0.0), ("share_ce_tv", True, 1.0)]
    runs = [{"name": "{}_seed{}".format(name, seed), "modules": fresh_modules(seed), "share": share, "tv": tv,
             "group": seed} for seed in (0, 1) for name, share, tv in variants]
    initial = {run["name"]: params(run["modules"]) for run in runs}
    stream = Replay(batches)
    assert train(target, runs, stream, 3)[::2] == (3, True)
    # Two groups, three steps: group 0 reads batches 0, 2, 4 and group 1 reads 1, 3, 5.
    assert stream.given == [0, 1, 2, 3, 4, 5], stream.given
    print("batches: 2 groups x 3 steps read {} in turn".format(stream.given))

    worst = 0.0
    for run in runs:
        seed = run["group"]
        assert max_diff(params(run["modules"]), initial[run["name"]]) > 1e-4, run["name"] + " did not train"
        alone = dict(run, modules=fresh_modules(seed))
        assert max_diff(params(alone["modules"]), initial[run["name"]]) == 0.0
        train(target, [alone], Replay(batches, order=[seed, seed + 2, seed + 4]), 3)
        diff = max_diff(params(run["modules"]), params(alone["modules"]))
        worst = max(worst, diff)
        print("{}: trained together vs alone, max |difference| {:.2e}".format(run["name"], diff))
    if worst > 1e-6:
        print("FAILED: a run trained together differs from the same run trained alone")
        return 1
    check_resume(target, batches, variants, {run["name"]: params(run["modules"]) for run in runs})
    for name, module in own.items():
        assert getattr(target, name) is module, name + " was not put back"
    after = {n: p.detach() for n, p in target.named_parameters()}
    assert max_diff(before, after) == 0.0, "the target or its own MTP layer changed"
    print("the model's own MTP layer is back and no target weight moved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
