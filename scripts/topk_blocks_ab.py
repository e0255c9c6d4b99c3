"""Probe: block mode's one-CTA form (``_radix._row_radix_kernel`` for rows of at most
``config.RADIX_ROW_COLS`` valid columns) against every row across CTAs (``RADIX_ROW_COLS`` 0),
same inputs, one process (one GPU).

    PYTHONPATH=. python3 scripts/topk_blocks_ab.py [ROWSxCOLSxVALID ...] [--variants ...]

Variants: ``rowcta`` (the default configuration), ``across`` (``RADIX_ROW_COLS`` 0),
``nopipe`` (the one-CTA form with each tile's loads issued after the previous tile's keys).
Each cell is timed variant by variant, the list twice (the bench's method: CUDA graph of 20
calls, median of 20 replays, µs; top 2,048 blocks of 8), after every variant's answer was
compared bitwise with the first's. Cells default to the bench's block cells at 1/8 valid and
three all-valid ones. Prints one line a cell.
"""

import sys

import torch

from dsv4_decode.bench import topk as TB
from dsv4_decode.ops.topk import _radix, config, decode_topk_blocks, make_topk_workspace
from dsv4_decode.utils.module_copy import load_source, patch

CELLS = [(r, c, "1/8") for c in (524288, 1048576) for r in (1, 6, 12, 24, 64)] + [
    (1, 1048576, "all"), (12, 1048576, "all"), (12, 131072, "all")]
NB, BLOCK = 2048, 8

# nopipe: tile t + 1's words loaded after tile t's keys (one tile's words live at a time)
NOPIPE = [("            if t + 1 < NT:  # in flight while tile t's keys are made\n"
           "                u_next = _chunk_words(x_ptr, row, t + 1, stride_x, length, BLOCK, TB)\n"
           "            keys = keys + (_words_keys(u, t, length, BLOCK, TB, TWIN),)\n"
           "            if t + 1 < NT:\n"
           "                u = u_next\n",
           "            keys = keys + (_words_keys(u, t, length, BLOCK, TB, TWIN),)\n"
           "            if t + 1 < NT:\n"
           "                u = _chunk_words(x_ptr, row, t + 1, stride_x, length, BLOCK, TB)\n")]


def runner(name):
    """A call of variant ``name``: (x, lens, out, ws) -> None."""
    if name == "rowcta":
        return lambda x, n, out, ws: decode_topk_blocks(x, n, NB, BLOCK, out=out, workspace=ws)
    if name == "across":
        def run(x, n, out, ws):
            old = config.RADIX_ROW_COLS
            config.RADIX_ROW_COLS = 0
            try:
                _radix.launch(x.view(torch.int16), n, out, ws, ws.cfg, NB)
            finally:
                config.RADIX_ROW_COLS = old
        return run
    if name == "nopipe":
        mod = load_source(patch(open(_radix.__file__).read(), NOPIPE), "radix_nopipe",
                          "dsv4_decode.ops.topk")
        return lambda x, n, out, ws: mod.launch(x.view(torch.int16), n, out, ws, ws.cfg, NB)
    raise SystemExit(f"unknown variant {name!r}")


def cell(variants, rows, cols, valid) -> None:
    xs, lens, _ = TB._inputs(rows, cols, valid)
    runs = [runner(v) for v in variants]
    wss = [make_topk_workspace(rows, NB, "cuda", BLOCK) for _ in variants]
    outs = [torch.empty(rows, NB, dtype=torch.int32, device="cuda") for _ in variants]
    for v, run in enumerate(runs):
        run(xs[0], lens, outs[v], wss[v])
    same = all(torch.equal(outs[0], o) for o in outs[1:])
    t = [[TB._timed(lambda x, v=v: runs[v](x, lens, outs[v], wss[v]), xs)
          for v in range(len(variants))] for _ in range(2)]
    txt = "  ".join(f"{n} {a:6.2f}/{b:6.2f}" for n, a, b in zip(variants, *t, strict=True))
    print(f"{rows}x{cols}x{valid}: {txt}  {'same' if same else 'DIFFERENT'}", flush=True)


def main(argv) -> None:
    variants = ["rowcta", "across"]
    if "--variants" in argv:
        i = argv.index("--variants")
        variants = argv[i + 1].split(",")
        argv = argv[:i] + argv[i + 2:]
    cells = [(int(r), int(c), v) for r, c, v in (a.split("x", 2) for a in argv)] or CELLS
    print(torch.cuda.get_device_name())
    for rows, cols, valid in cells:
        cell(variants, rows, cols, valid)


if __name__ == "__main__":
    main(sys.argv[1:])
