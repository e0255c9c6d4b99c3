"""Probe: sparse_attn configs or kernels per cell, same inputs, one process (one Hopper GPU).

    PYTHONPATH=. python3 scripts/sparse_ab.py [RxQxH ...] [--warps | --triton | --splits W/C,..]
        [--kernels OLD.py[,..]]

For each cell (default: the benchmark's 24) it times each config of ``variants``, twice,
alternated (CUDA graph of 20 calls, median of 20 replays, as the benchmark), and checks each
against the first (bitwise where the splits are the same, else the largest difference relative
to the output's largest value). Variants: the default (``wgmma_config``) and the same config
with each row's splits launched one after the other (``long_first=False``); ``--warps``: the
wgmma kernel's split rule at 8 and at 4 warps throughout (``wgmma_config(..., num_warps=)``)
and the default; ``--splits 2/2,1/4``: the default, then 4-warp configs of W window and C
index-list steps a split (``long_first`` where W != C); ``--triton``: the Triton kernels'
default with and without ``long_first``. Prints one line a cell. No CSV.

``--kernels``: instead, the default config run by this tree's wgmma kernel and by each given
copy of ``_gluon.py`` (e.g. ``git show REV:dsv4_decode/ops/sparse_attn/_gluon.py > old.py``;
a device copy of the tree has no git), its ``_wgmma_attn_kernel`` swapped into the launcher:
a kernel change timed against its predecessor in one process. Session 36's ``--kernels
prefetch`` (the splits prefetching their records into the L2; measured in session 37, not
kept) is in 7d97dad's copy.
"""

import sys
from dataclasses import replace

import torch

from dsv4_decode.bench import sparse_attn as SB
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.sparse_attn import (
    SparseAttnConfig,
    make_workspace,
    sparse_attn,
    wgmma_config,
)
from dsv4_decode.ops.sparse_attn import _triton as launcher
from dsv4_decode.utils.module_copy import load_file

CELLS = [(b, ql, h) for h in (16, 64) for ql in (6, 1) for b in (1, 2, 4, 8, 16, 32)]


def split_config(w_steps, c_steps):
    """The wgmma kernel at 4 warps with w_steps / c_steps steps a window / index-list split."""
    return SparseAttnConfig.with_steps(16, 64, w_steps, SB.WINDOW, SB.SELECTED,
                                       c_steps=c_steps, num_warps=4, wgmma=True, pdl=True,
                                       pdl_entry=True, long_first=w_steps != c_steps)


def variants(rows, heads, warps=False, splits=(), triton=False):
    default = wgmma_config(rows, heads, SB.WINDOW, SB.SELECTED)
    if triton:  # the Triton kernels' default, with and without long-first
        tri = SB.triton_default(rows, heads)
        return {"triton": tri, "triton_interleaved": replace(tri, long_first=False)}
    if splits:
        return {"default": default} | {f"{w}/{c}": split_config(w, c) for w, c in splits}
    if not warps:
        return {"default": default, "interleaved": replace(default, long_first=False)}
    return {"w8": wgmma_config(rows, heads, SB.WINDOW, SB.SELECTED, num_warps=8),
            "w4": wgmma_config(rows, heads, SB.WINDOW, SB.SELECTED, num_warps=4),
            "default": default}


KERNELS = {}  # name -> the _wgmma_attn_kernel it runs (``--kernels``); empty: this tree's


def load_kernel(path):
    """``_wgmma_attn_kernel`` of a copy of ``_gluon.py`` at ``path``."""
    mod = load_file(path, prefix="alt_")
    return mod.__name__, mod._wgmma_attn_kernel


def cell(requests, q_len, heads, warps=False, splits=(), triton=False) -> None:
    inp = SB.Inputs(requests, q_len, heads, SB.SELECTED, SB.CALLS)
    if KERNELS:
        names = tuple(KERNELS)
        cfgs = (wgmma_config(inp.rows, heads, SB.WINDOW, SB.SELECTED),) * len(names)
    else:
        names, cfgs = zip(*variants(inp.rows, heads, warps, splits, triton).items(),
                          strict=True)
    kernels = [KERNELS.get(n, launcher._wgmma_attn_kernel) for n in names]
    wss = [make_workspace(inp.rows, heads, SB.D, SB.WINDOW, SB.SELECTED, "cuda", c)
           for c in cfgs]
    outs = [[torch.empty_like(s["out"]) for s in inp.sets] for _ in cfgs]

    def call(v, s):
        a, kw = inp.call_args(s)
        launcher._wgmma_attn_kernel = kernels[v]
        sparse_attn(*a, **kw, out=outs[v][s], workspace=wss[v], config=cfgs[v])

    def make_fn(v):
        i = [0]

        def fn():
            call(v, i[0] % SB.CALLS)
            i[0] += 1
        return fn

    line = f"{requests}x{q_len}x{heads:<3d}"
    ref = None
    times = {}
    for v in range(len(cfgs)):
        call(v, 0)
    for v in list(range(len(cfgs))) * 2:
        times.setdefault(v, []).append(graph_time_us(make_fn(v), calls=20))
    for v, (name, c) in enumerate(zip(names, cfgs, strict=True)):
        o = outs[v][0].float()
        ref = o if ref is None else ref
        same = "bitwise" if torch.equal(o, ref) else \
            f"rel {((o - ref).abs().max() / ref.abs().max()).item():.1e}"
        t = times[v]
        line += f" | {name} {t[0]:7.2f} / {t[1]:7.2f} ({c.w_steps}/{c.c_steps}, {same})"
    print(line, flush=True)


def main(argv) -> None:
    print(torch.cuda.get_device_name())
    if "--kernels" in argv:
        i = argv.index("--kernels")
        KERNELS["tree"] = launcher._wgmma_attn_kernel
        KERNELS.update(load_kernel(p) for p in argv[i + 1].split(","))
        argv = argv[:i] + argv[i + 2:]
    splits = ()
    if "--splits" in argv:
        i = argv.index("--splits")
        splits = [tuple(int(v) for v in s.split("/")) for s in argv[i + 1].split(",")]
        argv = argv[:i] + argv[i + 2:]
    warps, triton = "--warps" in argv, "--triton" in argv
    cells = [tuple(int(x) for x in a.split("x")) for a in argv
             if a not in ("--warps", "--triton")] or CELLS
    for c in cells:
        cell(*c, warps=warps, splits=splits, triton=triton)


if __name__ == "__main__":
    main(sys.argv[1:])
