"""Probe: plain mode's folded grids at each fold factor R (one GPU).

    PYTHONPATH=. python3 scripts/topk_span_sweep.py [ROWSxCOLSxVALID ...] [--unroll 2,4]

``config.span_log2`` folds R chunks into one group-maxima program (its rule: docs/kernels/
topk.md, sessions 18 and 19). Each cell is timed with R = 2, 4 and 8 forced
(``_triton.span_log2`` patched), the list twice, the bench's method (CUDA graph of 20 calls,
median of 20 replays, µs; k = 512); every answer is compared with the first's. Cells default
to the bench's folded k = 512 cells. ``--unroll`` also varies ``_triton.FOLD_UNROLL`` (the
chunks a folding program loads at once; R >= it).
"""

import sys

import torch

from dsv4_decode.bench import topk as T
from dsv4_decode.ops.topk import _triton, config, make_topk_workspace

CELLS = [(r, c, v) for c in (262144, 524288, 1048576) for v in ("1/8", "all")
         for r in (6, 12, 24, 48, 64) if r * c // 2048 > config.UNFOLDED_PROGRAMS]
K = 512
LOGS = (1, 2, 3)  # R = 16 lost in every cell of session 18's run 6, R = 1 in session 19's


def run(rows, cols, valid, unrolls) -> str:
    xs, lens, _ = T._inputs(rows, cols, valid)
    ws = make_topk_workspace(rows, K, "cuda")
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    pick = config.span_log2(rows, cols // 2048)
    combos = [(lg, u) for lg in LOGS for u in unrolls if u <= max(1 << lg, unrolls[0])]
    times, same = {c: [] for c in combos}, True
    want = None
    for _ in range(2):
        for lg, u in combos:
            old = _triton.span_log2, _triton.FOLD_UNROLL
            _triton.span_log2, _triton.FOLD_UNROLL = (lambda r, n, lg=lg: lg), u
            try:
                times[(lg, u)].append(T._timed(lambda x: _triton.launch(
                    x.view(torch.int16), lens, out, ws, ws.cfg, K), xs))
                _triton.launch(xs[0].view(torch.int16), lens, out, ws, ws.cfg, K)
            finally:
                _triton.span_log2, _triton.FOLD_UNROLL = old
            want = out.clone() if want is None else want
            same &= torch.equal(out, want)
    txt = ", ".join(
        f"R={1 << lg}{'*' if lg == pick else ''}{f' U={u}' if len(unrolls) > 1 else ''} "
        f"{a:.2f}/{b:.2f}" for (lg, u), (a, b) in times.items())
    return f"{rows}x{cols}x{valid} ({rows * cols // 2048} chunks): {txt}" + (
        "" if same else " DIFFERENT")


def main(argv) -> None:
    unrolls = [_triton.FOLD_UNROLL]
    if "--unroll" in argv:
        i = argv.index("--unroll")
        unrolls = [int(u) for u in argv[i + 1].split(",")]
        argv = argv[:i] + argv[i + 2:]
    cells = [(int(r), int(c), v) for r, c, v in (a.split("x") for a in argv)] or CELLS
    print(torch.cuda.get_device_name(), "(* = the rule's R)", flush=True)
    for cell in cells:
        print(run(*cell, unrolls), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
