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
"""

import sys

import torch

from dsv4_decode.bench import topk as TB
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.topk import _cplain, decode_topk, decode_topk_ref, make_topk_workspace

CELLS = [(r, c, v) for c in (262144, 524288) for v in ("1/8", "all") for r in (6, 12, 24, 48, 64)]


def runner(name, rows, k):
    if name == "tree":
        ws = make_topk_workspace(rows, k, "cuda")
        return lambda x, lens, out: decode_topk(x, lens, k, out=out, workspace=ws)
    warps = int(name.split("-w")[1])
    return lambda x, lens, out: _cplain.launch(x.view(torch.int16), lens, out, k, warps=warps)


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
        else:
            r, c, v = a.split("x")
            cells.append((int(r), int(c), v))
    for rows, cols, valid in cells or CELLS:
        cell(variants, rows, cols, valid, k)


if __name__ == "__main__":
    main(sys.argv[1:])
