"""Probe: plain mode's four kernels at other warp counts (``_triton.WARPS``), each variant
timed twice, alternated, in one process (the bench's method: CUDA graph of 20 calls, median of
20 replays, µs, k = 512); every answer checked against the default's.

    PYTHONPATH=. python3 scripts/topk_warps.py [ROWSxCOLSxVALID ...] [--variants default,collect8]

Cells default to ``CELLS``, variants to all of ``VARIANTS`` (the default always runs first: the
answers are checked against it). Session 22 (run 1): ``collect8`` +1.0 µs at 48 / 64 x 256K all.
"""

import sys

import torch

from dsv4_decode.bench import topk as T
from dsv4_decode.ops.topk import _triton, make_topk_workspace

# small-grid cells and the near misses of session 10's table
CELLS = [(1, 65536, "all"), (1, 65536, "1/8"), (6, 65536, "all"), (12, 65536, "all"),
         (24, 65536, "1/8"), (48, 65536, "all"), (64, 65536, "1/8"), (1, 262144, "all"),
         (1, 262144, "1/8"), (1, 524288, "1/8"), (1, 1048576, "1/8"), (6, 1048576, "all"),
         (12, 1048576, "all"), (48, 1048576, "1/8")]
K = 512
BASE = dict(_triton.WARPS)
VARIANTS = {"default": {}, "select4": {"select": 4}, "select16": {"select": 16},
            "thr4": {"threshold": 4}, "thr16": {"threshold": 16}, "collect8": {"collect": 8},
            "collect2": {"collect": 2},
            "gmax8": {"group_max": 8}, "sel16thr16": {"select": 16, "threshold": 16},
            "sel16col8": {"select": 16, "collect": 8}}


def run(rows, cols, valid) -> str:
    xs, lens, _ = T._inputs(rows, cols, valid)
    ws = make_topk_workspace(rows, K, "cuda")
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    times, want, diff = {}, None, []
    for name in list(VARIANTS) * 2:
        _triton.WARPS.update(BASE, **VARIANTS[name])
        try:
            us = T._timed(lambda x: _triton.launch(x.view(torch.int16), lens, out, ws, ws.cfg,
                                                   K), xs)
            _triton.launch(xs[0].view(torch.int16), lens, out, ws, ws.cfg, K)
            got = out.clone()
        finally:
            _triton.WARPS.update(BASE)
        want = got if want is None else want
        if not torch.equal(got, want):
            diff.append(name)
        times.setdefault(name, []).append(us)
    cells = ", ".join(f"{n} {t[0]:.2f}/{t[1]:.2f}" for n, t in times.items())
    return f"{rows}x{cols}x{valid}: {cells}" + (f" DIFFERENT {diff}" if diff else "")


def main(argv) -> None:
    global VARIANTS
    if "--variants" in argv:
        i = argv.index("--variants")
        names = ["default"] + [n for n in argv[i + 1].split(",") if n != "default"]
        VARIANTS = {n: VARIANTS[n] for n in names}
        argv = argv[:i] + argv[i + 2:]
    cells = [(int(r), int(c), v) for r, c, v in (a.split("x", 2) for a in argv)] or CELLS
    print(torch.cuda.get_device_name(), flush=True)
    for cell in cells:
        print(run(*cell), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
