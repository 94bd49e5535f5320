#!/usr/bin/python3
"""A model folder whose MTP layer is one MTP-ablation run's (pipeline.py --ablation-only writes each
run's MTP tensors to OUT/ablation/<run>.safetensors): a copy of the target's folder with those
tensors in place of its own, for measuring the run's accepted length in the C++ engine
(tools/bench/mtp_serve_bench.py on the folder).

    /usr/bin/python3 tools/train/mtp_variant_model.py models/default OUT/ablation/share_ce_seed0.safetensors \\
        /tmp/variants/share_ce_seed0
"""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import export  # noqa: E402


def variant_folder(target, run, out):
    """Writes OUT: the TARGET folder with RUN's MTP tensors in place of its own. ValueError when RUN
    holds no tensors, tensors of another or more than one layer, or shapes / dtypes the target's
    MTP layer does not have."""
    tensors = export.read_safetensors(os.path.join(target, "model.safetensors"))
    mtp = export.read_safetensors(run)
    if not mtp:
        raise ValueError("{} holds no tensors".format(run))
    prefixes = {name[:name.index(".", len("model.layers.")) + 1] for name in mtp}
    if len(prefixes) != 1:
        raise ValueError("{}: tensors of more than one layer ({})".format(run, sorted(prefixes)))
    prefix = prefixes.pop()
    own = {name for name in tensors if name.startswith(prefix)}
    if own != set(mtp):
        raise ValueError("{}: its tensors are not the target's {}* ({} missing, {} unexpected)".format(
            run, prefix, len(own - set(mtp)), len(set(mtp) - own)))
    for name, tensor in mtp.items():
        if tuple(tensor.shape) != tuple(tensors[name].shape) or tensor.dtype != tensors[name].dtype:
            raise ValueError("{}: {} is {} {}, the target's {} {}".format(
                run, name, tensor.dtype, tuple(tensor.shape), tensors[name].dtype, tuple(tensors[name].shape)))
        tensors[name] = tensor
    os.makedirs(out, exist_ok=True)
    for entry in os.listdir(target):
        if entry != "model.safetensors" and os.path.isfile(os.path.join(target, entry)):
            shutil.copy(os.path.join(target, entry), os.path.join(out, entry))
    export.write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    return len(mtp), prefix


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: mtp_variant_model.py TARGET_DIR RUN.safetensors OUT_DIR")
    target, run, out = sys.argv[1:]
    try:
        count, prefix = variant_folder(target, run, out)
    except ValueError as error:
        sys.exit(str(error))
    print("{}: {} MTP tensors of {} from {}".format(out, count, prefix, run))


if __name__ == "__main__":
    main()
