"""Probe: plain mode's four kernels at other warp counts (``_triton.WARPS``), and the
threshold's and the select's k-th largest by a bitwise search instead of a histogram
(``_triton.KTH_HIST``), each variant timed twice, alternated, in one process (the bench's
method: CUDA graph of 20 calls, median of 20 replays, µs, k = 512); every answer checked
against the default's. ``PYTHONPATH=. python3 scripts/topk_warps.py [--warps]``: by default
the search variants, ``--warps`` session 14 run 3's warp counts."""

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
BASE, BASE_HIST = dict(_triton.WARPS), dict(_triton.KTH_HIST)
WARP_VARIANTS = {"default": {}, "select4": {"select": 4}, "select16": {"select": 16},
                 "thr4": {"threshold": 4}, "thr16": {"threshold": 16},
                 "collect8": {"collect": 8}, "gmax8": {"group_max": 8}}
# (warps, search) overrides: "select" / "threshold" warps, "*_hist" False = bitwise search
SEARCH_VARIANTS = {"default": {}, "sel1s": {"select": 1, "select_hist": False},
                   "sel2s": {"select": 2, "select_hist": False}, "sel2h": {"select": 2},
                   "sel8s": {"select_hist": False},
                   "thr2s": {"threshold": 2, "threshold_hist": False},
                   "thr8s": {"threshold_hist": False},
                   "both2s": {"select": 2, "select_hist": False, "threshold": 2,
                              "threshold_hist": False}}
VARIANTS = SEARCH_VARIANTS


def run(rows, cols, valid) -> str:
    xs, lens, _ = T._inputs(rows, cols, valid)
    ws = make_topk_workspace(rows, K, "cuda")
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    times, want, diff = {}, None, []
    for name in list(VARIANTS) * 2:
        v = VARIANTS[name]
        _triton.WARPS.update(BASE, **{k: w for k, w in v.items() if not k.endswith("_hist")})
        _triton.KTH_HIST.update(BASE_HIST, **{k[:-5]: h for k, h in v.items()
                                              if k.endswith("_hist")})
        try:
            us = T._timed(lambda x: _triton.launch(x.view(torch.int16), lens, out, ws, ws.cfg,
                                                   K), xs)
            _triton.launch(xs[0].view(torch.int16), lens, out, ws, ws.cfg, K)
            got = out.clone()
        finally:
            _triton.WARPS.update(BASE)
            _triton.KTH_HIST.update(BASE_HIST)
        want = got if want is None else want
        if not torch.equal(got, want):
            diff.append(name)
        times.setdefault(name, []).append(us)
    cells = ", ".join(f"{n} {t[0]:.2f}/{t[1]:.2f}" for n, t in times.items())
    return f"{rows}x{cols}x{valid}: {cells}" + (f" DIFFERENT {diff}" if diff else "")


if __name__ == "__main__":
    if "--warps" in sys.argv[1:]:
        VARIANTS = WARP_VARIANTS
    print(torch.cuda.get_device_name(), flush=True)
    for cell in CELLS:
        print(run(*cell), flush=True)
