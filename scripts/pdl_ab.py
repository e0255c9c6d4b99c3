"""Probe: programmatic dependent launches on and off, same inputs, one process (one GPU).

    PYTHONPATH=. python3 scripts/pdl_ab.py [topk] [blocks] [sparse]

For each cell it times ``pdl`` then plain launches, twice, alternated (CUDA graph of 20 calls,
median of 20 replays, as the benchmarks), and checks that both give the same output bitwise.
topk: ``_triton.launch(..., pdl=)`` (every kernel of the call a dependent launch) on k = 512
cells; blocks: ``_radix.launch(..., pdl=)``; sparse: the Triton kernels' default config with
and without ``pdl_entry`` (the attention kernel a dependent launch; the merge keeps the
default's rule), then on Hopper the wgmma kernel's config with ``pdl`` and ``pdl_entry`` both
on and both off (session 11: prepared, not yet run).
Prints one line a cell: on / off / on / off and the mean difference. No CSV.

The rules that session 10 took from its run 1 apply on both sides now, so a rerun is not run
1: plain mode runs its four launches (run 1 had the fused threshold where it applied), block
mode above ``_radix.PDL_ROWS`` rows is plain either way (its 12-row cells time the same
launches twice), and ``pdl_entry`` is the flag the sparse cells toggle whatever their layout.
"""

import dataclasses
import sys

import torch

from dsv4_decode.bench import sparse_attn as SB
from dsv4_decode.bench import topk as TB
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.sparse_attn import make_workspace, sparse_attn, wgmma_config
from dsv4_decode.ops.sparse_attn.config import pick_default
from dsv4_decode.ops.topk import _radix, _triton, make_topk_workspace
from dsv4_decode.utils.device import is_hopper

TOPK_CELLS = [(1, 65536, "all"), (1, 65536, "1/8"), (6, 65536, "all"), (12, 65536, "all"),
              (24, 65536, "all"), (48, 65536, "1/8"), (64, 65536, "1/8"), (1, 262144, "1/8"),
              (6, 262144, "all"), (1, 524288, "all"), (6, 524288, "1/8"), (48, 524288, "1/8"),
              (1, 1048576, "1/8"), (1, 1048576, "all"), (6, 1048576, "all"),
              (12, 1048576, "all"), (24, 1048576, "all"), (48, 1048576, "1/8"),
              (64, 1048576, "all")]
BLOCK_CELLS = [(1, 524288), (6, 524288), (12, 524288), (1, 1048576), (6, 1048576),
               (12, 1048576)]
SPARSE_CASES = [(1, 1, 16), (1, 1, 64), (2, 1, 16), (1, 6, 16), (2, 6, 16), (8, 6, 16),
                (32, 6, 16), (1, 6, 64), (32, 1, 16)]


def ab(name, make_fn, check) -> None:
    """Time ``make_fn(True)`` / ``make_fn(False)`` alternated twice; ``check()`` -> outputs
    of one call each way, compared bitwise."""
    same = check()
    t = [graph_time_us(make_fn(flag), calls=20) for flag in (True, False, True, False)]
    diff = (t[0] + t[2] - t[1] - t[3]) / 2
    print(f"{name:34s} pdl {t[0]:7.2f} / {t[2]:7.2f}  plain {t[1]:7.2f} / {t[3]:7.2f}  "
          f"diff {diff:+6.2f} us ({100 * diff / ((t[1] + t[3]) / 2):+5.1f} %)  "
          f"{'same' if same else 'DIFFERENT'}", flush=True)


def topk_cell(rows, cols, valid, block=1) -> None:
    xs, lens, _ = TB._inputs(rows, cols, valid)
    k = 512 if block == 1 else 2048
    ws = make_topk_workspace(rows, k, "cuda", block)
    outs = {f: torch.empty(rows, k, dtype=torch.int32, device="cuda") for f in (True, False)}
    mod = _triton if block == 1 else _radix

    def make_fn(flag):
        i = [0]

        def fn():
            mod.launch(xs[i[0] % len(xs)].view(torch.int16), lens, outs[flag], ws, ws.cfg, k,
                       pdl=flag)
            i[0] += 1
        return fn

    def check():
        for flag in (True, False):
            mod.launch(xs[0].view(torch.int16), lens, outs[flag], ws, ws.cfg, k, pdl=flag)
        return torch.equal(outs[True], outs[False])

    mode = "" if block == 1 else " blocks"
    ab(f"topk {rows}x{cols}x{valid}{mode}", make_fn, check)


def sparse_case(requests, q_len, heads, kernel="triton") -> None:
    inp = SB.Inputs(requests, q_len, heads, SB.SELECTED, SB.CALLS)
    if kernel == "wgmma":  # the Hopper default (session 11): both flags on against both off
        cfg = wgmma_config(inp.rows, heads, SB.WINDOW, SB.SELECTED)
        cfgs = {f: dataclasses.replace(cfg, pdl=f, pdl_entry=f) for f in (True, False)}
    else:  # the Triton kernels' default: pdl_entry on against off
        cfg = pick_default(inp.rows, heads, SB.D, SB.WINDOW, SB.SELECTED)
        cfgs = {f: dataclasses.replace(cfg, pdl_entry=f) for f in (True, False)}
    wss = {f: make_workspace(inp.rows, heads, SB.D, SB.WINDOW, SB.SELECTED, "cuda", c)
           for f, c in cfgs.items()}
    outs = {f: [torch.empty_like(s["out"]) for s in inp.sets] for f in (True, False)}

    def call(flag, s):
        a, kw = inp.call_args(s)
        sparse_attn(*a, **kw, out=outs[flag][s], workspace=wss[flag], config=cfgs[flag])

    def make_fn(flag):
        i = [0]

        def fn():
            call(flag, i[0] % SB.CALLS)
            i[0] += 1
        return fn

    def check():
        for flag in (True, False):
            call(flag, 0)
        return torch.equal(outs[True][0], outs[False][0])

    ab(f"sparse {kernel} {requests}x{q_len}x{heads}", make_fn, check)


def main(argv) -> None:
    parts = set(argv) or {"topk", "blocks", "sparse"}
    print(torch.cuda.get_device_name(), flush=True)
    if "sparse" in parts:
        for case in SPARSE_CASES:
            sparse_case(*case)
        if is_hopper(torch.device("cuda")):
            for case in SPARSE_CASES:
                sparse_case(*case, kernel="wgmma")
    if "topk" in parts:
        for cell in TOPK_CELLS:
            topk_cell(*cell)
    if "blocks" in parts:
        for rows, cols in BLOCK_CELLS:
            topk_cell(rows, cols, "1/8", block=8)


if __name__ == "__main__":
    main(sys.argv[1:])
