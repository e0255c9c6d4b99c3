"""Probe: plain mode's folded grids at each fold factor R (one GPU).

    PYTHONPATH=. python3 scripts/topk_span_sweep.py [ROWSxCOLSxVALID ...]

``config.span_log2`` folds R chunks into one group-maxima program (the largest R <= 8 that
leaves >= 512 programs): at 12 x 1M that is 768 programs of 32 KB, and session 18's stamps
put that kernel at 10.8 µs for 25 MB (2.3 TB/s). Each cell is timed with R = 1 (the small
grids' path at any size), 2, 4 and 8 forced (``_triton.span_log2`` patched), the list twice,
the bench's method (CUDA graph of 20 calls, median of 20 replays, µs; k = 512); every answer
is compared with the first's. Cells default to the bench's folded k = 512 cells.
"""

import sys

import torch

from dsv4_decode.bench import topk as T
from dsv4_decode.ops.topk import _triton, config, make_topk_workspace

CELLS = [(r, c, v) for c in (262144, 524288, 1048576) for v in ("1/8", "all")
         for r in (6, 12, 24, 48, 64) if r * c // 2048 > config.UNFOLDED_PROGRAMS]
K = 512
LOGS = (0, 1, 2, 3)  # R = 16 lost in every cell of session 18's run 6


def run(rows, cols, valid) -> str:
    xs, lens, _ = T._inputs(rows, cols, valid)
    ws = make_topk_workspace(rows, K, "cuda")
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    pick = config.span_log2(rows, cols // 2048)
    times, same = {lg: [] for lg in LOGS}, True
    want = None
    for _ in range(2):
        for lg in LOGS:
            old = _triton.span_log2
            _triton.span_log2 = lambda r, n, lg=lg: lg
            try:
                times[lg].append(T._timed(lambda x: _triton.launch(
                    x.view(torch.int16), lens, out, ws, ws.cfg, K), xs))
                _triton.launch(xs[0].view(torch.int16), lens, out, ws, ws.cfg, K)
            finally:
                _triton.span_log2 = old
            want = out.clone() if want is None else want
            same &= torch.equal(out, want)
    txt = ", ".join(f"R={1 << lg}{'*' if lg == pick else ''} {a:.2f}/{b:.2f}"
                    for lg, (a, b) in times.items())
    return f"{rows}x{cols}x{valid} ({rows * cols // 2048} chunks): {txt}" + (
        "" if same else " DIFFERENT")


def main(argv) -> None:
    cells = [(int(r), int(c), v) for r, c, v in (a.split("x") for a in argv)] or CELLS
    print(torch.cuda.get_device_name(), "(* = the rule's R)", flush=True)
    for cell in cells:
        print(run(*cell), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
