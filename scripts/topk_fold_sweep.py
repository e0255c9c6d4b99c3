"""Probe: plain mode's folded grids (``config.span_log2`` > 0: the collect from the
threshold's segment lists) against the same cells run unfolded (one chunk a program: the
small-grid path), with the threshold as its own launch or fused into the group-maxima pass
(k = 512). ``folded`` folds and lists from 1,024 programs, as before session 10
(``CHUNK_PROGRAMS`` set to 0); ``unfolded`` neither folds nor lists (``CHUNK_PROGRAMS`` and
``FOLD2_PROGRAMS`` past any grid); session 10's run 5 named ``folded`` ``pick`` (its fuse
flag had no effect on a folded grid). The bench's method (CUDA graph of 20 calls, median of
20 replays, µs); each variant's answer is checked against the first's.
``PYTHONPATH=. python3 scripts/topk_fold_sweep.py``
"""

import torch

from dsv4_decode.bench import topk as T
from dsv4_decode.ops.topk import _triton, config, make_topk_workspace

# (rows, cols, valid) at k = 512 whose grid folded before session 10 (rows x chunks >= 1,024)
CELLS = [(48, 65536, "1/8"), (48, 65536, "all"), (64, 65536, "all"), (12, 262144, "1/8"),
         (12, 262144, "all"), (24, 262144, "1/8"), (24, 262144, "all"), (48, 262144, "all"),
         (6, 524288, "1/8"), (6, 524288, "all"), (12, 524288, "1/8"), (12, 524288, "all"),
         (24, 524288, "all"), (6, 1048576, "1/8"), (6, 1048576, "all"), (12, 1048576, "1/8"),
         (12, 1048576, "all"), (24, 1048576, "all"), (64, 1048576, "all")]
K = 512


def run(rows, cols, valid) -> str:
    xs, lens, _ = T._inputs(rows, cols, valid)
    ws = make_topk_workspace(rows, K, "cuda")
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    res, want = [], None
    saved = config.CHUNK_PROGRAMS, config.FOLD2_PROGRAMS
    for name, fold, fuse in (("folded", True, False), ("unfolded_fused", False, True),
                             ("unfolded", False, False)):
        config.CHUNK_PROGRAMS, config.FOLD2_PROGRAMS = (0, 0) if fold else (1 << 30, 1 << 30)
        try:
            us = T._timed(lambda x, fuse=fuse: _triton.launch(
                x.view(torch.int16), lens, out, ws, ws.cfg, K, fuse=fuse), xs)
            _triton.launch(xs[0].view(torch.int16), lens, out, ws, ws.cfg, K, fuse=fuse)
            got = out.clone()
            want = got if want is None else want
            res.append(f"{name} {us:.2f}{'' if torch.equal(got, want) else ' DIFFERENT'}")
        finally:
            config.CHUNK_PROGRAMS, config.FOLD2_PROGRAMS = saved
    return f"{rows}x{cols}x{valid}: " + ", ".join(res)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), flush=True)
    for cell in CELLS:
        print(run(*cell), flush=True)
