"""Probe: per-kernel profiler times of the MoE layer, this tree's kernels against copies of
``ops/moe/_triton.py`` (one Hopper GPU).

    PYTHONPATH=. python3 scripts/moe_kernels_ab.py OLD.py [OTHER.py ...]

e.g. ``git show REV:dsv4_decode/ops/moe/_triton.py > old.py`` (a device copy of the tree has
no git). Each copy is swapped into ``api.K`` (the launchers' kernel module) and timed as
``bench moe --kernels`` does (rows 1, 6, 48, TP=4), the variants alternated twice in one
process. The copies must keep the launchers' kernel signatures.
"""

import sys

import torch

from dsv4_decode.bench import moe as B
from dsv4_decode.ops.moe import api
from dsv4_decode.utils.module_copy import load_file


def main(paths) -> None:
    mods = {"tree": api.K} | {m.__name__: m for m in map(load_file, paths)}
    layer = B.Layer(384, 576, torch.Generator(device="cuda").manual_seed(0))
    for rep in range(2):
        for name, mod in mods.items():
            api.K = mod
            for rows in (1, 6, 48):
                print(f"[{name} rep {rep}]", B.kernels(layer, rows, 6), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
