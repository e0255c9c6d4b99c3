"""Probe: plain mode's select on a thread-block cluster a row (``_cplain``) against the tree's
``decode_topk`` (its four launches, or ``_row``), same inputs, one process (one GPU).

    PYTHONPATH=. python3 scripts/topk_cplain_ab.py [ROWSxCOLSxVALID ...] [--k K]
        [--variants tree,cplain-w8,cplain-w4]

``cplain-wN``: ``_cplain.launch`` at N warps a CTA (clusters of 16). Random BF16 logits as
``bench topk`` (``valid``: ``1/8`` or ``all`` of each row before its length), k = 512 unless
``--k``. Each variant's output is compared bitwise with the twin's (``decode_topk_ref``) first,
then the variants are timed one after another, the list twice (CUDA graph of 20 calls, median
of 20 replays). Prints one line a cell: the grid's clusters at once (the driver's occupancy)
beside each cplain variant.

``--phases``: instead, for each cell, the SM cycles from a CTA's start to each step of
``_cplain`` at 8 warps (a patched copy with ``module_copy.STAMPS``; a CTA barrier before each
stamp): the group keys, T0's two rounds, tau's round, the gather, the write, the end; the
median over row 0's CTAs and the slowest.
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
    if "-r" in name:  # cplain-rN-wM: registers capped at N (two CTAs a SM at 8 warps, N = 128)
        cap = int(name.split("-r")[1].split("-")[0])
        src = patch(open(_cplain.__file__).read(),
                    [("num_warps=warps,", f"num_warps=warps, maxnreg={cap},")])
        mod = load_source(src, f"topk_cplain_r{cap}", "dsv4_decode.ops.topk")
    return lambda x, lens, out: mod.launch(x.view(torch.int16), lens, out, k, warps=warps)


STEPS = ["keys", "B0", "T0", "tau", "gather", "write", "end"]


def phases(rows, cols, valid, k) -> None:
    """Cycles from a CTA's start to each step (``--phases``)."""
    stamp = lambda i: f"    _clk(dbg_ptr + (row * 16 + q) * 8, {i})\n"
    src = open(_cplain.__file__).read()
    n = src.count("    _sync()\n    b0, above")  # the three main rounds' barriers, in order
    assert n == 1
    src = patch(src, [
        ("@triton.jit\ndef _below", STAMPS + "@triton.jit\ndef _below"),
        ("out_ptr, stride_x, stride_o, cols, K, smem_off,",
         "out_ptr, dbg_ptr, stride_x, stride_o, cols, K, smem_off,"),
        ("    row = tl.program_id(1)\n", "    row = tl.program_id(1)\n" + stamp(0)),
        ("    tl.debug_barrier()  # the local zeros\n",
         stamp(1) + "    tl.debug_barrier()  # the local zeros\n"),
        ("    _sync()\n    b0, above", "    _sync()\n" + stamp(2) + "    b0, above"),
        ("    _sync()\n    t0 = ", "    _sync()\n" + stamp(3) + "    t0 = "),
        ("    _sync()\n    g = _gather", "    _sync()\n" + stamp(4) + "    g = _gather"),
        ("    cluster.arrive()  # no CTA", stamp(5) + "    cluster.arrive()  # no CTA"),
        ("    if q == 0:\n        n_eq", stamp(6) + "    if q == 0:\n        n_eq"),
        ("    cluster.wait()\n\n\ndef launch",
         "    cluster.wait()\n" + stamp(7) + "\n\ndef launch"),
        ("    lsel, greater = _largest_bin(g, 0, K, NB)\n",
         "    lsel, greater = _largest_bin(g, 0, K, NB)\n"
         "    two = tl.arange(0, 2)\n"
         "    tl.store(dbg_ptr + (row * 16 + q) * 8 + 128 * tl.num_programs(1) + two,"
         " tl.where(two == 0, t0, tl.sum(g, axis=0)))\n"
         "    tl.store(dbg_ptr + (row * 16 + q) * 8 + 128 * tl.num_programs(1) + 2,"
         " n_list)\n"),
        ("(x16, lengths, out, x16.stride(0),", "(x16, lengths, out, DBG, x16.stride(0),")])
    mod = load_source(src, "topk_cplain_phases", "dsv4_decode.ops.topk")
    xs, lens, _ = TB._inputs(rows, cols, valid)
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    mod.DBG = torch.zeros(2 * rows * 16 * 8, dtype=torch.int64, device="cuda")
    for i in range(5):  # the last call (data out of L2) is read
        mod.launch(xs[i % len(xs)].view(torch.int16), lens, out, k, warps=8)
    torch.cuda.synchronize()
    dbg = mod.DBG.view(2, rows, 16, 8)
    d = (dbg[0, 0] - dbg[0, 0, :, :1]).cpu()  # [16, 8] cycles from each CTA's start
    t0, n = dbg[1, 0, 0, :2].tolist()  # row 0's T0 and its keys >= T0
    words = dbg[1, 0, :, 2].sum().item()  # row 0's listed words
    med, worst = d.median(dim=0).values.tolist(), d.max(dim=0).values.tolist()
    txt = "  ".join(f"{n} {m}/{w}" for n, m, w in zip(STEPS, med[1:], worst[1:], strict=True))
    print(f"{rows}x{cols}x{valid} T0 {t0} keys >= T0 {n} in {words} words; cycles "
          f"median/max: {txt}",
          flush=True)


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
