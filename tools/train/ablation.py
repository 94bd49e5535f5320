"""The MTP ablation's runs and their summary, shared by pipeline.py (which trains the runs) and
ablation_table.py (which merges the results of several device calls).

A run is one variant trained from its own initialisation (torch seed 1000 + seed) on the frozen
target; its results are keyed "<variant>_seed<seed>". The spread over a variant's seeds (max - min)
is the run-to-run noise that the differences between variants must exceed.
"""

# variant -> (IndexShare + KVShare across draft steps, weight of the TV loss beside the CE loss)
ABLATION_VARIANTS = {
    "no_share_ce": (False, 0.0),
    "share_ce": (True, 0.0),
    "share_ce_tv": (True, 1.0),
}


def ablation_runs(spec, seeds):
    """[(variant, seed)]: the comma list "VARIANT:SEED,..." or, when empty, every variant with seeds
    0 .. seeds - 1. Unknown variants, bad seeds and repeated runs are errors (ValueError)."""
    if not spec.strip():
        return [(name, seed) for name in ABLATION_VARIANTS for seed in range(max(1, seeds))]
    runs = []
    for item in spec.split(","):
        name, sep, seed = item.strip().partition(":")
        if name not in ABLATION_VARIANTS:
            raise ValueError("unknown MTP ablation variant {!r} (known: {})".format(
                name, ", ".join(ABLATION_VARIANTS)))
        if not sep or not seed.isdigit():
            raise ValueError("MTP ablation run {!r}: expected VARIANT:SEED with SEED >= 0".format(item.strip()))
        run = (name, int(seed))
        if run in runs:
            raise ValueError("MTP ablation run {}:{} given twice".format(*run))
        runs.append(run)
    return runs


def split_run(key):
    """"share_ce_seed1" -> ("share_ce", 1); None for a key that is not a run's."""
    name, sep, seed = key.rpartition("_seed")
    if not sep or name not in ABLATION_VARIANTS or not seed.isdigit():
        return None
    return name, int(seed)


def ablation_summary(results):
    """Per variant with at least two seeds among `results` (run key -> {metric: value}): per metric
    the mean and the spread (max - min) over its seeds, and the seeds it rests on."""
    by_variant = {}
    for key, metrics in results.items():
        run = split_run(key)
        if run is not None:
            by_variant.setdefault(run[0], []).append((run[1], metrics))
    summary = {}
    for name, runs in by_variant.items():
        if len(runs) < 2:
            continue
        runs.sort(key=lambda r: r[0])
        metrics = [m for _, m in runs]
        summary[name] = {k: {"mean": sum(m[k] for m in metrics) / len(metrics),
                             "spread": max(m[k] for m in metrics) - min(m[k] for m in metrics)}
                         for k in metrics[0]}
        summary[name]["seeds"] = [seed for seed, _ in runs]
    return summary
