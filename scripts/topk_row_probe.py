"""Probe: plain-mode top-k, one CTA a row (``_row``) at several warp counts and tile sizes
against the four-launch pipeline (``_triton``), same inputs, one process (one GPU).

    PYTHONPATH=. python3 scripts/topk_row_probe.py [ROWSxCOLSxVALID ...] [--k 2048]
        [--variants chunks,row-16-8192,row-8-8192] [--kernels]

A variant ``row-W-T`` runs ``_row.launch`` with ``NUM_WARPS = W`` and ``TILE = T``;
``chunks-strided`` / ``chunks-spans`` the four launches with every folded grid's group maxima
folded strided (program p folds chunks p, p + n_p, ...) / in spans of R chunks, whatever
``config.strided_fold`` picks (session 23: docs/kernels/topk.md); ``chunks-fold2-off`` the
four launches without session 27's fold by 2 (grids of ``config.FOLD2_PROGRAMS`` to
``CHUNK_PROGRAMS`` chunk programs unfolded, as before); ``chunks-nolist-N`` the four launches
with folded grids of at most N chunk programs collected by chunk instead of from segment
lists (session 27's ``chunks-collect2``, ``-collect2a`` and ``-rowasm`` are in 4c6192e's copy;
the last became the collect's span); ``file:PATH`` the four launches of another
``_triton.py`` (an earlier commit's: ``git show REV:dsv4_decode/ops/topk/_triton.py >
PATH``); ``rowfile:PATH`` the one-CTA-a-row kernel of another ``_row.py``; ``nseg-N`` the
four launches with a listed grid's segments of 2,048 / N columns (``TopkConfig.nseg = N``;
8cab489's ``nseg-N-RS`` set ``NSEG`` and ``LIST_REGION``); ``stages-S-C`` and ``lp-N-M`` the
four launches under another fold-pipeline or listed-collect rule (``rule_launch``).
Measured and not kept, their code in earlier copies: session 36's ``chunks-pf`` (the threshold
prefetching its listed segments into the L2; session 37) in 7d97dad's, session 37's
``lp2-N-M`` (the listed collect taking its spans two at a time; session 38) in e2b4259's.
Each cell is timed variant by variant, the list twice (CUDA graph of 20 calls, median of 20
replays, as ``bench topk``), after every variant's output was compared bitwise with the
first's; ``--kernels`` then prints each variant's per-kernel profiler table
(``bench.kernels``).
Cells default to the bench's 64K and 256K cells; VALID ``mix`` is row 0 at 1/8 valid and the
others all valid. Prints one line a cell.
"""

import sys
from dataclasses import replace

import torch

from dsv4_decode.bench import topk as TB
from dsv4_decode.bench.kernels import kernel_table
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.topk import _row, _triton, make_topk_workspace
from dsv4_decode.ops.topk.config import CHUNK_PROGRAMS, list_programs, span_log2
from dsv4_decode.utils.module_copy import load_file, load_source, patch

CELLS = [(r, c, v) for c in (65536, 262144) for v in ("1/8", "all")
         for r in (1, 6, 12, 24, 48, 64)]


def runner(name):
    """A launch function for variant ``name``."""
    if name == "chunks":
        return _triton.launch
    if name.startswith("file:"):  # an earlier _triton.py (git show REV:path > PATH)
        return load_file(name[5:], "dsv4_decode.ops.topk", "topk_old_").launch
    if name.startswith("rowfile:"):  # an earlier _row.py
        return load_file(name[8:], "dsv4_decode.ops.topk", "topk_row_old_").launch
    if name in ("chunks-strided", "chunks-spans"):  # every folded grid one way
        mod = load_source(open(_triton.__file__).read(), "topk_" + name[7:],
                          "dsv4_decode.ops.topk")
        mod.strided_fold = lambda rows, n_chunks, k: (name == "chunks-strided"
                                                      and span_log2(rows, n_chunks) > 0)
        return mod.launch
    if name == "chunks-fold2-off":
        return fold2_off_launch()
    if name.startswith("nseg-"):  # nseg-N: listed grids' segments of CHUNK / N columns
        n = int(name.split("-")[1])
        return lambda x16, lengths, out, ws, cfg, k: _triton.launch(
            x16, lengths, out, ws, replace(cfg, nseg=n), k)
    if name.startswith("chunks-nolist-"):
        return nolist_launch(int(name.split("-")[2]))
    if name.startswith(("stages-", "lp-")):
        return rule_launch(name)
    _, warps, tile = name.split("-")

    def launch(*args):
        old = _row.NUM_WARPS, _row.TILE
        _row.NUM_WARPS, _row.TILE = int(warps), int(tile)
        try:
            _row.launch(*args)
        finally:
            _row.NUM_WARPS, _row.TILE = old
    return launch


def fold2_off_launch():
    """``chunks-fold2-off``: a copy of ``_triton`` without session 27's fold by 2 on grids of
    ``FOLD2_PROGRAMS`` to ``CHUNK_PROGRAMS`` chunk programs (unfolded there, as before)."""
    mod = load_source(open(_triton.__file__).read(), "topk_fold2_off", "dsv4_decode.ops.topk")
    mod.span_log2 = lambda rows, nc: span_log2(rows, nc) if rows * nc > CHUNK_PROGRAMS else 0
    return mod.launch


def nolist_launch(n: int):
    """``chunks-nolist-N``: a copy of ``_triton`` whose folded grids of at most ``n`` chunk
    programs collect by chunk (no segment lists), the group maxima folded as the rule says."""
    src = patch(open(_triton.__file__).read(), [
        ("    lst = listed(rows, n_chunks)  # large grids collect from segment lists\n",
         f"    lst = log_r > 0 and rows * n_chunks > {n}\n")])
    return load_source(src, f"topk_nolist_{n}", "dsv4_decode.ops.topk").launch


def rule_launch(name: str):
    """``stages-S-C``: a copy of ``_triton`` whose folds of R >= 4 chunks are pipelined with S
    stages on rows of more than C chunks (``config.fold_stages``: 5 stages above 256, above
    64 from 64 rows at k <= 512);
    ``lp-N-M``: N listed collect programs a row from M rows (``config.list_programs``: 32 from
    64 rows at k <= 512, 40 from 48, else 64), the other row counts as the rule says."""
    mod = load_source(open(_triton.__file__).read(), "topk_" + name.replace("-", "_"),
                      "dsv4_decode.ops.topk")
    kind, a, b = name.split("-")
    if kind == "stages":
        mod.fold_stages = lambda rows, n_chunks, log_r, k: (int(a) if n_chunks > int(b)
                                                            and log_r >= 2 else 1)
    else:
        mod.list_programs = lambda rows, k: int(a) if rows >= int(b) else list_programs(rows, k)
    return mod.launch


def cell(variants, rows, cols, valid, k, kernels=False) -> None:
    xs, lens, _ = TB._inputs(rows, cols, "all" if valid == "mix" else valid)
    if valid == "mix":  # row 0 at 1/8 valid, the others all valid
        lens[0] = cols // 8
    ws = make_topk_workspace(rows, k, "cuda")
    nseg = max([int(v.split("-")[1]) for v in variants if v.startswith("nseg-")], default=0)
    if nseg > ws.cfg.nseg:  # segment maxima and lists for the finest segments (strides passed)
        ws = replace(ws, smax=ws.smax.new_empty(rows, ws.cfg.max_chunks * nseg),
                     seglist=ws.seglist.new_empty(rows, ws.cfg.max_chunks * nseg))
    outs = [torch.empty(rows, k, dtype=torch.int32, device="cuda") for _ in variants]
    runs = [runner(v) for v in variants]

    def make_fn(v):
        i = [0]

        def fn():
            runs[v](xs[i[0] % len(xs)].view(torch.int16), lens, outs[v], ws, ws.cfg, k)
            i[0] += 1
        return fn

    for v, run in enumerate(runs):
        run(xs[0].view(torch.int16), lens, outs[v], ws, ws.cfg, k)
    same = all(torch.equal(outs[0], o) for o in outs[1:])
    t = [[graph_time_us(make_fn(v), calls=20) for v in range(len(variants))] for _ in range(2)]
    cols_txt = "  ".join(f"{n} {a:6.2f}/{b:6.2f}" for n, a, b in zip(variants, *t, strict=True))
    print(f"{rows}x{cols}x{valid} k{k}: {cols_txt}  {'same' if same else 'DIFFERENT'}",
          flush=True)
    if kernels:  # the profiler's per-kernel table of each variant (as bench topk --kernels)
        for v, name in enumerate(variants):
            print(kernel_table(make_fn(v), 20).format(f"{rows}x{cols}x{valid} k{k} {name}"),
                  flush=True)


def main(argv) -> None:
    k, variants = 512, ["chunks", "row-16-8192", "row-8-8192"]
    if "--k" in argv:
        i = argv.index("--k")
        k = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if "--variants" in argv:
        i = argv.index("--variants")
        variants = argv[i + 1].split(",")
        argv = argv[:i] + argv[i + 2:]
    kernels = "--kernels" in argv
    argv = [a for a in argv if a != "--kernels"]
    cells = [(int(r), int(c), v) for r, c, v in (a.split("x", 2) for a in argv)] or CELLS
    print(torch.cuda.get_device_name())
    for rows, cols, valid in cells:
        cell(variants, rows, cols, valid, k, kernels)


if __name__ == "__main__":
    main(sys.argv[1:])
