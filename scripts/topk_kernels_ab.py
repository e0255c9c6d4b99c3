"""Probe: plain-mode top-k, this tree's kernels against a copy of ``ops/topk/_triton.py``,
same inputs, one process (one GPU).

    PYTHONPATH=. python3 scripts/topk_kernels_ab.py OLD.py [ROWSxCOLSxVALID ...] [--k 2048]

e.g. ``git show REV:dsv4_decode/ops/topk/_triton.py > old.py`` (a device copy of the tree has
no git). The copy's relative imports are made absolute (``utils.module_copy``), and its
``launch`` gets this tree's workspace (with ``seglist`` / ``rcnt`` allocated here should this
tree lack them; a copy needing fewer buffers ignores the rest). Each cell is timed tree /
copy / tree / copy (CUDA graph of 20 calls, median of 20 replays, as ``bench topk``) and the
outputs are compared bitwise. Cells default to folded grids of the bench and two unfolded
ones (session 15 ran it with the tree and the copy swapped: the copy was the change). Prints
one line a cell.
"""

import sys
import types

import torch

from dsv4_decode.bench import topk as TB
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.topk import _triton, make_topk_workspace
from dsv4_decode.ops.topk.config import NSEG
from dsv4_decode.utils.module_copy import load_file

CELLS = [(6, 1048576, "all"), (12, 1048576, "all"), (24, 1048576, "all"),
         (48, 1048576, "1/8"), (64, 1048576, "all"), (12, 1048576, "1/8"),
         (6, 1048576, "1/8"), (12, 524288, "all"), (24, 262144, "all"), (48, 262144, "all"),
         (1, 65536, "all"), (6, 262144, "all")]


def old_workspace(ws):
    """This tree's workspace plus the buffers older launchers read."""
    rows, cfg = ws.rows, ws.cfg
    extra = {}
    if not hasattr(ws, "seglist"):
        dev = ws.thr.device
        extra["seglist"] = torch.empty(rows, cfg.max_chunks * NSEG, dtype=torch.int32,
                                       device=dev)
        extra["rcnt"] = torch.empty(rows, cfg.max_chunks, dtype=torch.int32, device=dev)
    return types.SimpleNamespace(**{f: getattr(ws, f) for f in ws.__dataclass_fields__},
                                 **extra)


def cell(old, rows, cols, valid, k) -> None:
    xs, lens, _ = TB._inputs(rows, cols, valid)
    ws = make_topk_workspace(rows, k, "cuda")
    variants = [(_triton, ws), (old, old_workspace(ws))]
    outs = [torch.empty(rows, k, dtype=torch.int32, device="cuda") for _ in variants]

    def make_fn(v):
        mod, w = variants[v]
        i = [0]

        def fn():
            mod.launch(xs[i[0] % len(xs)].view(torch.int16), lens, outs[v], w, ws.cfg, k)
            i[0] += 1
        return fn

    for v, (mod, w) in enumerate(variants):
        mod.launch(xs[0].view(torch.int16), lens, outs[v], w, ws.cfg, k)
    same = torch.equal(outs[0], outs[1])
    t = [graph_time_us(make_fn(v), calls=20) for v in (0, 1, 0, 1)]
    print(f"{rows}x{cols}x{valid} k{k}: tree {t[0]:7.2f} / {t[2]:7.2f}  copy {t[1]:7.2f} / "
          f"{t[3]:7.2f}  diff {(t[0] + t[2] - t[1] - t[3]) / 2:+6.2f} us  "
          f"{'same' if same else 'DIFFERENT'}", flush=True)


def main(argv) -> None:
    k = 512
    if "--k" in argv:
        i = argv.index("--k")
        k = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    old = load_file(argv[0], package="dsv4_decode.ops.topk")
    cells = [(int(r), int(c), v) for r, c, v in (a.split("x") for a in argv[1:])] or CELLS
    print(torch.cuda.get_device_name())
    for rows, cols, valid in cells:
        cell(old, rows, cols, valid, k)


if __name__ == "__main__":
    main(sys.argv[1:])
