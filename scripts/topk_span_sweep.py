"""Probe: plain mode's folded grids at each fold factor R (one GPU).

    PYTHONPATH=. python3 scripts/topk_span_sweep.py [ROWSxCOLSxVALID ...] [--stages 3,4]
        [--k 2048]

``config.span_log2`` folds R chunks into one group-maxima program (its rule: docs/kernels/
topk.md, sessions 18, 19 and 21). Each cell is timed with R = 2, 4, 8 and 16 forced
(``_triton.span_log2`` patched), the list twice, the bench's method (CUDA graph of 20 calls,
median of 20 replays, µs; k = 512 unless ``--k``); every answer is compared with the
first's. Cells default to the bench's folded k = 512 cells, from ``FOLD2_PROGRAMS`` chunk
programs (below 2,048 the rule folds R = 2, never timed against R = 4: session 39).
``--stages`` also varies ``config.FOLD_STAGES`` (the pipeline stages of a folding program's
loop over its R chunks; the launch uses them on 1M-column grids at R >= 4 only).
"""

import sys

import torch

from dsv4_decode.bench import topk as T
from dsv4_decode.ops.topk import _triton, config, make_topk_workspace

CELLS = [(r, c, v) for c in (262144, 524288, 1048576) for v in ("1/8", "all")
         for r in (6, 12, 24, 48, 64) if r * c // 2048 >= config.FOLD2_PROGRAMS]
K = 512
LOGS = (1, 2, 3, 4)  # R = 1 lost in every cell of session 19's run 6


def run(rows, cols, valid, stages) -> str:
    xs, lens, _ = T._inputs(rows, cols, valid)
    ws = make_topk_workspace(rows, K, "cuda")
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    pick = config.span_log2(rows, cols // 2048)
    combos = [(lg, u) for lg in LOGS for u in stages]
    times, same = {c: [] for c in combos}, True
    want = None
    for _ in range(2):
        for lg, u in combos:
            old = _triton.span_log2, config.FOLD_STAGES
            _triton.span_log2, config.FOLD_STAGES = (lambda r, n, lg=lg: lg), u
            try:
                times[(lg, u)].append(T._timed(lambda x: _triton.launch(
                    x.view(torch.int16), lens, out, ws, ws.cfg, K), xs))
                _triton.launch(xs[0].view(torch.int16), lens, out, ws, ws.cfg, K)
            finally:
                _triton.span_log2, config.FOLD_STAGES = old
            want = out.clone() if want is None else want
            same &= torch.equal(out, want)
    txt = ", ".join(
        f"R={1 << lg}{'*' if lg == pick else ''}{f' S={u}' if len(stages) > 1 else ''} "
        f"{a:.2f}/{b:.2f}" for (lg, u), (a, b) in times.items())
    return f"{rows}x{cols}x{valid} ({rows * cols // 2048} chunks): {txt}" + (
        "" if same else " DIFFERENT")


def main(argv) -> None:
    global K
    stages = [config.FOLD_STAGES]
    if "--k" in argv:
        i = argv.index("--k")
        K = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if "--stages" in argv:
        i = argv.index("--stages")
        stages = [int(u) for u in argv[i + 1].split(",")]
        argv = argv[:i] + argv[i + 2:]
    cells = [(int(r), int(c), v) for r, c, v in (a.split("x") for a in argv)] or CELLS
    print(torch.cuda.get_device_name(), f"k = {K} (* = the rule's R)", flush=True)
    for cell in cells:
        print(run(*cell, stages), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
