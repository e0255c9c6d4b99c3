"""Probe: plain mode's select on a thread-block cluster a row (``_cplain``) against the tree's
``decode_topk`` (its four launches, or ``_row``), same inputs, one process (one GPU).

    PYTHONPATH=. python3 scripts/topk_cplain_ab.py [ROWSxCOLSxVALID ...] [--k K]
        [--variants tree,cplain-w8,cplain-w4]

``cplain-wN``: ``_cplain.launch`` at N warps a CTA (clusters of 16); ``cplain-unroll-wN``: a
copy whose loops over the tile's slices are unrolled (``tl.static_range``). Random BF16 logits as
``bench topk`` (``valid``: ``1/8`` or ``all`` of each row before its length), k = 512 unless
``--k``. Each variant's output is compared bitwise with the twin's (``decode_topk_ref``) first,
then the variants are timed one after another, the list twice (CUDA graph of 20 calls, median
of 20 replays). Prints one line a cell: the grid's clusters at once (the driver's occupancy)
beside each cplain variant.

``--phases``: instead, for each cell, the SM cycles from a CTA's start to each step of
``_cplain`` at 8 warps (a patched copy with ``module_copy.STAMPS``; a CTA barrier before each
stamp): the copy landed, the keys, B1, B2, the gather, the write, B3; the median over row 0's
CTAs and the slowest.
"""

import sys

import torch

from dsv4_decode.bench import topk as TB
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.topk import _cplain, decode_topk, decode_topk_ref, make_topk_workspace
from dsv4_decode.utils.module_copy import STAMPS, load_source, patch

CELLS = [(r, c, v) for c in (262144, 524288) for v in ("1/8", "all") for r in (6, 12, 24, 48, 64)]


def runner(name, rows, k):
    if name == "tree":
        ws = make_topk_workspace(rows, k, "cuda")
        return lambda x, lens, out: decode_topk(x, lens, k, out=out, workspace=ws)
    warps = int(name.split("-w")[1])
    mod = _cplain
    if "unroll" in name:
        src = patch(open(_cplain.__file__).read(),
                    [("for r in range(S):", "for r in tl.static_range(S):")])
        mod = load_source(src, "topk_cplain_unroll", "dsv4_decode.ops.topk")
    return lambda x, lens, out: mod.launch(x.view(torch.int16), lens, out, k, warps=warps)


STEPS = ["copy", "keys", "B1", "B2", "gather", "write", "B3"]


def phases(rows, cols, valid, k) -> None:
    """Cycles from a CTA's start to each step (``--phases``)."""
    stamp = lambda i: f"    _clk(dbg_ptr + (row * 16 + q) * 8, {i})\n"
    src = patch(open(_cplain.__file__).read(), [
        ("@triton.jit\ndef _counts", STAMPS + "@triton.jit\ndef _counts"),
        ("out_ptr, stride_x, stride_o, cols, K, smem_off,",
         "out_ptr, dbg_ptr, stride_x, stride_o, cols, K, smem_off,"),
        ("    row = tl.program_id(1)\n", "    row = tl.program_id(1)\n" + stamp(0)),
        ("    cluster.copy_wait()\n    tl.debug_barrier()\n",
         "    cluster.copy_wait()\n    tl.debug_barrier()\n" + stamp(1)),
        ("    gk = tl.where(", stamp(2) + "    gk = tl.where("),
        ("    cluster.arrive()  # B1\n    cluster.wait()\n",
         "    cluster.arrive()  # B1\n    cluster.wait()\n" + stamp(3)),
        ("    cluster.arrive()  # B2\n    cluster.wait()\n",
         "    cluster.arrive()  # B2\n    cluster.wait()\n" + stamp(4)),
        ("    cluster.arrive()  # B3: no CTA", stamp(5) + "    cluster.arrive()  # B3: no CTA"),
        ("    if q == 0:\n        n_eq", stamp(6) + "    if q == 0:\n        n_eq"),
        ("    cluster.wait()  # B3\n", "    cluster.wait()  # B3\n" + stamp(7)),
        ("(x16, lengths, out, x16.stride(0),", "(x16, lengths, out, DBG, x16.stride(0),")])
    mod = load_source(src, "topk_cplain_phases", "dsv4_decode.ops.topk")
    xs, lens, _ = TB._inputs(rows, cols, valid)
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    mod.DBG = torch.zeros(rows, 16, 8, dtype=torch.int64, device="cuda")
    for i in range(5):  # the last call (data out of L2) is read
        mod.launch(xs[i % len(xs)].view(torch.int16), lens, out, k, warps=8)
    torch.cuda.synchronize()
    d = (mod.DBG[0] - mod.DBG[0, :, :1]).cpu()  # [16, 8] cycles from each CTA's start
    med, worst = d.median(dim=0).values.tolist(), d.max(dim=0).values.tolist()
    txt = "  ".join(f"{n} {m}/{w}" for n, m, w in zip(STEPS, med[1:], worst[1:], strict=True))
    print(f"{rows}x{cols}x{valid} cycles median/max: {txt}", flush=True)


def cell(variants, rows, cols, valid, k) -> None:
    xs, lens, _ = TB._inputs(rows, cols, valid)
    outs = [torch.full((rows, k), -7, dtype=torch.int32, device="cuda") for _ in variants]
    runs = [runner(v, rows, k) for v in variants]
    want = decode_topk_ref(xs[0], lens, k)
    ok, held = [], []
    for v, run in enumerate(runs):
        got = run(xs[0], lens, outs[v])
        ok.append(torch.equal(outs[v], want))
        held.append(f" ({got} at once)" if variants[v] != "tree" else "")

    def make_fn(v):
        i = [0]

        def fn():
            runs[v](xs[i[0] % len(xs)], lens, outs[v])
            i[0] += 1
        return fn

    t = [[graph_time_us(make_fn(v), calls=20) for v in range(len(variants))] for _ in range(2)]
    txt = "  ".join(f"{n} {a:6.2f}/{b:6.2f}{'' if g else ' WRONG'}{h}"
                    for n, a, b, g, h in zip(variants, *t, ok, held, strict=True))
    print(f"{rows}x{cols}x{valid} k{k}: {txt}", flush=True)


def main(argv) -> None:
    variants = ["tree", "cplain-w8", "cplain-w4"]
    k = 512
    cells = []
    it = iter(argv)
    for a in it:
        if a == "--variants":
            variants = next(it).split(",")
        elif a == "--k":
            k = int(next(it))
        elif a != "--phases":
            r, c, v = a.split("x")
            cells.append((int(r), int(c), v))
    for rows, cols, valid in cells or CELLS:
        if "--phases" in argv:
            phases(rows, cols, valid, k)
        else:
            cell(variants, rows, cols, valid, k)


if __name__ == "__main__":
    main(sys.argv[1:])
