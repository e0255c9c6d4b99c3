"""Sweep of block mode's radix kernel: warps a CTA x columns a chunk, on the goal cells (top
2,048 blocks of 8, 1/8 valid; the bench's method: CUDA graph of 20 calls, median of 20 replays,
µs). Every answer is checked against the default configuration's.
``python3 scripts/topk_radix_sweep.py``
"""

import torch

from dsv4_decode.bench import topk as T
from dsv4_decode.ops.topk import _radix, config, decode_topk_blocks, make_topk_workspace

CELLS = [(1, 524288), (1, 1048576), (6, 1048576), (12, 1048576), (24, 1048576)]
DEFAULT = (_radix.NUM_WARPS, config.RADIX_COLS, config.RADIX_ELEMENTS)


def time_cell(rows, cols, warps, chunk_cols):
    _radix.NUM_WARPS = warps
    config.RADIX_COLS, config.RADIX_ELEMENTS = chunk_cols, chunk_cols // 8
    _radix._CAPACITY.clear()
    xs, lens, _ = T._inputs(rows, cols, "1/8")
    out = torch.empty(rows, 2048, dtype=torch.int32, device="cuda")
    ws = make_topk_workspace(rows, 2048, "cuda", 8)
    us = T._timed(lambda x: decode_topk_blocks(x, lens, 2048, 8, out=out, workspace=ws), xs)
    decode_topk_blocks(xs[0], lens, 2048, 8, out=out, workspace=ws)
    return us, out.clone(), xs[0], lens


for rows, cols in CELLS:
    _radix.NUM_WARPS, config.RADIX_COLS, config.RADIX_ELEMENTS = DEFAULT
    line = [f"rows={rows} cols={cols}"]
    want = None
    for warps in (2, 4, 8):
        for chunk_cols in (2048, 4096, 8192):
            us, got, x, lens = time_cell(rows, cols, warps, chunk_cols)
            if want is None:
                _radix.NUM_WARPS, config.RADIX_COLS, config.RADIX_ELEMENTS = DEFAULT
                _radix._CAPACITY.clear()
                ws = make_topk_workspace(rows, 2048, "cuda", 8)
                want = decode_topk_blocks(x, lens, 2048, 8, workspace=ws)
            ok = torch.equal(got, want)
            line.append(f"w{warps}/c{chunk_cols} {us:6.2f}{'' if ok else ' WRONG'}")
    print("  ".join(line), flush=True)
_radix.NUM_WARPS, config.RADIX_COLS, config.RADIX_ELEMENTS = DEFAULT
