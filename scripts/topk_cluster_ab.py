"""Probe: block mode's radix select on a thread-block cluster a row (``_cluster``) against the
grid-barrier form (``_radix``), same inputs, one process (one GPU).

    PYTHONPATH=. python3 scripts/topk_cluster_ab.py [ROWSxCOLSxVALID ...]
        [--variants radix,cluster,cluster-nopdl,cluster-w4] [--phases]

``cluster`` runs ``_cluster.launch`` (the cluster size and warps its rules pick; ``-nopdl``: a
plain launch, ``-w4`` / ``-w8``: 4 / 8 warps whatever the grid, ``-any``: also grids past the
rule's CTA limit (``MAX_CTAS_GRID``); ``cluster-ce2``: a copy that takes 1M rows into the LONG
form too, each CTA of a row's first cluster two chunks there, so a 1/8-valid 1M row fits one
cluster; ``cluster-tlhist``: a copy
whose histograms are ``tl.histogram``'s, as before session 31); ``radix`` is ``_radix.launch``
(``radix-oldbin``: with session 29's ``_largest_bin``). Top 2,048 blocks of 8, as ``bench topk
--blocks``. Each cell is timed variant by variant, the list twice (CUDA graph of 20 calls,
median of 20 replays), after every variant's output was compared bitwise with the twin's
(``decode_topk_blocks_ref``). Prints one line a cell.

``--phases``: instead, for each cell, the SM cycles from a CTA's start (after the dependent
launch's wait) to each step of ``_cluster`` (a patched copy with ``module_copy.STAMPS``; a CTA
barrier before each stamp): after the chunk's histogram, B1, the threshold bin, B2, the
gather, the write, B3; the median over row 0's CTAs and the slowest.
"""

import sys

import torch

from dsv4_decode.bench import topk as TB
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.topk import _cluster, _radix, decode_topk_blocks_ref, make_topk_workspace
from dsv4_decode.utils import cluster
from dsv4_decode.utils.module_copy import STAMPS, load_source, patch

CELLS = [(r, 65536, v) for v in ("1/8", "all") for r in (1, 6, 12, 24, 48)]
NB, BLOCK = 2048, 8


OLD_BIN = """@triton.jit
def _largest_bin(g, base, K, NB: tl.constexpr):
    b = tl.arange(0, NB)
    at_least = base + tl.sum(g, axis=0) - tl.cumsum(g, axis=0) + g
    bsel = tl.max(tl.where(at_least >= K, b, 0), axis=0)
    return bsel, base + tl.sum(tl.where(b > bsel, g, 0), axis=0)
"""


def runner(name):
    if name == "radix":
        return _radix.launch
    if name == "radix-oldbin":  # session 29's _largest_bin: a sum, a scan, a max, a sum
        src = open(_radix.__file__).read()
        a = src.index("@triton.jit\ndef _largest_bin")
        b = src.index("@triton.jit", a + 1)
        return load_source(src[:a] + OLD_BIN + "\n\n" + src[b:], "topk_radix_oldbin",
                           "dsv4_decode.ops.topk").launch
    mod = _cluster
    if name.startswith("cluster-ce2"):  # the LONG form for 1M rows, two chunks a CTA there
        src = patch(open(_cluster.__file__).read(), [
            ("LONG_CHUNKS = 128", "LONG_CHUNKS = 256"),
            ("CE=cfg.rchunk,", "CE=cfg.rchunk * (2 if long_rows and cols > 524288 else 1),")])
        mod = load_source(src, "topk_cluster_ce2", "dsv4_decode.ops.topk")
    if name.startswith("cluster-tlhist"):  # the histograms by tl.histogram (before session 31)
        src = patch(open(_cluster.__file__).read(),
                    [("SMEM_HIST = True", "SMEM_HIST = False")])
        mod = load_source(src, "topk_cluster_tlhist", "dsv4_decode.ops.topk")
    parts = name.split("-")
    pdl = "nopdl" not in parts
    warps = next((int(v[1:]) for v in parts if v[0] == "w"), 0)

    def launch(*args):  # -wN: every grid at N warps; -any: past the rule's CTA limit
        old = mod.WIDE_CTAS_GRID, mod.MAX_CTAS_GRID
        mod.WIDE_CTAS_GRID = {0: old[0], 4: 0, 8: 1 << 30}[warps]
        if "any" in parts:
            mod.MAX_CTAS_GRID = 1 << 30
        try:
            mod.launch(*args, pdl=pdl)
        finally:
            mod.WIDE_CTAS_GRID, mod.MAX_CTAS_GRID = old
    return launch


GRIDS = {}  # variant -> the grid of its last clustered launch (the LONG form's G clusters)
_launch = cluster.launch


def _recording_launch(fn, grid, *args):
    GRIDS["last"] = grid
    return _launch(fn, grid, *args)


cluster.launch = _recording_launch


def cell(variants, rows, cols, valid) -> None:
    xs, lens, _ = TB._inputs(rows, cols, valid)
    ws = make_topk_workspace(rows, NB, "cuda", BLOCK)
    outs = [torch.full((rows, NB), -7, dtype=torch.int32, device="cuda") for _ in variants]
    runs = [runner(v) for v in variants]
    want = decode_topk_blocks_ref(xs[0], lens, NB, BLOCK)

    def make_fn(v):
        i = [0]

        def fn():
            runs[v](xs[i[0] % len(xs)].view(torch.int16), lens, outs[v], ws, ws.cfg, NB)
            i[0] += 1
        return fn

    ok = []
    grids = []
    for v, run in enumerate(runs):
        GRIDS.pop("last", None)
        run(xs[0].view(torch.int16), lens, outs[v], ws, ws.cfg, NB)
        ok.append(torch.equal(outs[v], want))
        grids.append(GRIDS.get("last"))
    t = [[graph_time_us(make_fn(v), calls=20) for v in range(len(variants))] for _ in range(2)]
    txt = "  ".join(f"{n} {a:6.2f}/{b:6.2f}{'' if g else ' WRONG'}{f' grid {d}' if d else ''}"
                    for n, a, b, g, d in zip(variants, *t, ok, grids, strict=True))
    print(f"{rows}x{cols}x{valid}: {txt}", flush=True)


STEPS = ["hist", "B1", "bin", "B2", "gather", "write", "B3"]
CTAS = 16  # stamp slots a row


def phases(rows, cols, valid) -> None:
    """Cycles from a CTA's start to each step (``--phases``)."""
    src = open(_cluster.__file__).read()
    stamp = lambda i: f"    _clk(dbg_ptr + (row * {CTAS} + q) * 8, {i})\n"
    src = patch(src, [
        ("@triton.jit\ndef _write_chunk", STAMPS + "@triton.jit\ndef _write_chunk"),
        ("out_ptr, stride_x, stride_o, cols, K, smem_off,",
         "out_ptr, dbg_ptr, stride_x, stride_o, cols, K, smem_off,"),
        ("    row = tl.program_id(1)\n", "    row = tl.program_id(1)\n" + stamp(0)),
        ("        h = tl.histogram(key1 >> 8, H1, mask=key1 > 0)\n",
         "        h = tl.histogram(key1 >> 8, H1, mask=key1 > 0)\n" + stamp(1)),
        ("    cluster.arrive()  # B1\n    cluster.wait()\n",
         "    cluster.arrive()  # B1\n    cluster.wait()\n" + stamp(2)),
        ("0, K, H1)\n", "0, K, H1)\n" + stamp(3)),
        ("    cluster.arrive()  # B2\n    cluster.wait()\n",
         "    cluster.arrive()  # B2\n    cluster.wait()\n" + stamp(4)),
        ("    cluster.arrive()  # B3: no CTA reads this one's shared memory after this\n",
         "    cluster.arrive()  # B3: no CTA reads this one's shared memory after this\n"
         + stamp(5)),
        ("    if q == 0:\n        n_eq", stamp(6) + "    if q == 0:\n        n_eq"),
        ("    cluster.wait()  # B3\n", "    cluster.wait()  # B3\n" + stamp(7)),
        ("(x16, lengths, out, x16.stride(0),", "(x16, lengths, out, DBG, x16.stride(0),")])
    mod = load_source(src, "topk_cluster_phases", "dsv4_decode.ops.topk")
    xs, lens, _ = TB._inputs(rows, cols, valid)
    ws = make_topk_workspace(rows, NB, "cuda", BLOCK)
    out = torch.empty(rows, NB, dtype=torch.int32, device="cuda")
    mod.DBG = torch.zeros(rows, CTAS, 8, dtype=torch.int64, device="cuda")
    for i in range(5):  # the last call (data out of L2) is read
        mod.launch(xs[i % len(xs)].view(torch.int16), lens, out, ws, ws.cfg, NB)
    torch.cuda.synchronize()
    n = _cluster.cluster_ctas(rows, cols, ws.cfg)
    d = (mod.DBG[0, :n] - mod.DBG[0, :n, :1]).cpu()  # [n, 8] cycles from each CTA's start
    med, worst = d.median(dim=0).values.tolist(), d.max(dim=0).values.tolist()
    txt = "  ".join(f"{n} {m}/{w}" for n, m, w in zip(STEPS, med[1:], worst[1:], strict=True))
    print(f"{rows}x{cols}x{valid} cycles median/max: {txt}", flush=True)


def main(argv) -> None:
    variants = ["radix", "cluster"]
    if "--variants" in argv:
        i = argv.index("--variants")
        variants = argv[i + 1].split(",")
        argv = argv[:i] + argv[i + 2:]
    cells = [(int(r), int(c), v) for r, c, v in (a.split("x", 2) for a in argv if a[0] != "-")]
    cells = cells or CELLS
    print(torch.cuda.get_device_name())
    for rows, cols, valid in cells:
        if "--phases" in argv:
            phases(rows, cols, valid)
        else:
            cell(variants, rows, cols, valid)


if __name__ == "__main__":
    main(sys.argv[1:])
