"""Probe: plain mode's group-maxima pass (kernel 1 of ``_triton``) on the folded 1M-column
grids, its chunks loaded by TMA (a tensor descriptor, ``cp.async.bulk.tensor``) instead of
per-thread ``cp.async`` (one GPU, sm_90+).

    PYTHONPATH=. python3 scripts/topk_tma_probe.py [ROWSxCOLSxVALID ...] [--stages 3,4,6]

Session 21's Nsight Compute run read the pipelined fold at 3.6 TB/s at 64 x 1M all valid,
waiting on its bytes in flight with half its issue slots idle, and session 3's plain streaming
maximum over the same bytes at 4.2 TB/s. Variants, each kernel 1 alone (the bench's method:
CUDA graph of 20 calls, median of 20 replays, µs; each twice, alternated):
- ``tree``: ``_triton._group_max_kernel`` as ``_triton.launch`` ran it before TMA (``cp.async``
  by every thread); ``tree-tma``: the same kernel with its ``TMA`` boxes (unmasked spans);
- ``tma-S``: the same spans (R chunks a program, the segment maxima of each chunk, the group
  maxima at the row's level), each full chunk one TMA load of a ``[1, 16, 64]`` word box, in a
  loop pipelined over S stages; a chunk cut by the length by the tree's masked load;
- ``tma-S-noseg``: without the segment maxima (what they cost);
- ``tma-S-R16`` / ``-R32``: 16 / 32 chunks a program (fewer, longer programs; group maxima
  differ from the tree's, so not compared).
The group and segment maxima of ``tma-S`` are compared bitwise with the tree's (inside the
length). Prints one line a cell, with each variant's TB/s over the valid bytes.
"""

import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from dsv4_decode.bench import topk as TB
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.topk import _triton, make_topk_workspace
from dsv4_decode.ops.topk._triton import (
    _chunk_words,
    _level,
    _store_groups,
    _store_segments,
)
from dsv4_decode.ops.topk._words import NEG_WORD, _pdl_enter, _row_length, _wmax2
from dsv4_decode.ops.topk.config import FOLD_STAGES, NSEG, WARPS, listed, span_log2

K = 512
CELLS = ["64x1048576xall", "48x1048576xall", "64x1048576x1/8", "24x1048576xall"]


@triton.jit
def _tma_chunk(desc, acc, row, c, s_row, len_e, CHUNK: tl.constexpr, NSEG: tl.constexpr,
               SEGS: tl.constexpr, TWIN: tl.constexpr):
    W: tl.constexpr = CHUNK // NSEG // 2
    v = tl.reshape(desc.load([row, c * NSEG, 0]), [1, NSEG, W])
    if SEGS:
        _store_segments(v, s_row, c, len_e, CHUNK, NSEG, TWIN)
    return _wmax2(acc, tl.reshape(v, [NSEG, W]), TWIN)


@triton.jit
def _fold_tma_kernel(desc, x_ptr, lengths_ptr, gmax_ptr, smax_ptr, stride_x, stride_g,
                     stride_s, cols, CHUNK: tl.constexpr, LMAX: tl.constexpr,
                     TARGET: tl.constexpr, R: tl.constexpr, LOG_R: tl.constexpr,
                     STAGES: tl.constexpr, NSEG: tl.constexpr, SEGS: tl.constexpr,
                     TWIN: tl.constexpr, PDL: tl.constexpr):
    # _group_max_kernel's span path (rows at level >= LOG_R; the host checks the cells'), its
    # full chunks by TMA
    if PDL:
        _pdl_enter()
    row = tl.program_id(0)
    p = tl.program_id(1)
    _, len_e = _row_length(lengths_ptr, row, cols, 1)
    s = _level(len_e, TARGET, LMAX)
    x_row = x_ptr + tl.multiple_of(row.to(tl.int64) * stride_x, 8)
    g_ptr = gmax_ptr + row.to(tl.int64) * stride_g
    s_row = smax_ptr + row.to(tl.int64) * stride_s
    W: tl.constexpr = CHUNK // NSEG // 2
    start = p * (R * CHUNK)
    if start < len_e:
        acc = tl.full([NSEG, W], NEG_WORD, tl.int32)
        n_full = tl.minimum(R, (len_e - start) // CHUNK)
        if TWIN:  # the interpreter cannot range over a tensor bound
            for r in range(R):
                if r < n_full:
                    acc = _tma_chunk(desc, acc, row, p * R + r, s_row, len_e, CHUNK, NSEG,
                                     SEGS, TWIN)
        else:
            for r in tl.range(0, n_full, num_stages=STAGES):
                acc = _tma_chunk(desc, acc, row, p * R + r, s_row, len_e, CHUNK, NSEG, SEGS,
                                 TWIN)
        if (n_full < R) & (start + n_full * CHUNK < len_e):  # the chunk the length cuts
            c = p * R + n_full
            v = _chunk_words(x_row, c, len_e, CHUNK, NSEG, True)
            if SEGS:
                _store_segments(v, s_row, c, len_e, CHUNK, NSEG, TWIN)
            acc = _wmax2(acc, tl.reshape(v, [NSEG, W]), TWIN)
        _store_groups(tl.reshape(acc, [CHUNK // 2]), g_ptr, p, start, len_e, s - LOG_R, CHUNK,
                      LMAX, TWIN)


def tree_k1(x16, lens, ws, k, tma=False):
    """Kernel 1 as ``_triton.launch`` runs it, its chunks by ``cp.async`` or (``tma``) by
    ``_triton``'s own TMA boxes."""
    cfg = ws.cfg
    rows, cols = x16.shape
    n_chunks = triton.cdiv(cols, cfg.chunk)
    log_r = span_log2(rows, n_chunks)
    pdl = x16.is_cuda
    _triton._group_max_kernel[(rows, triton.cdiv(n_chunks, 1 << log_r))](
        x16, _triton._row_words(x16) if tma else x16, lens, ws.gmax, ws.smax, ws.thr, ws.cnt,
        ws.tick, x16.stride(0), ws.gmax.stride(0), ws.smax.stride(0), cols, k,
        STAGES=FOLD_STAGES if n_chunks > 256 and log_r >= 2 else 1, maxnreg=None,
        NSEG=NSEG, SEGS=listed(rows, n_chunks), FUSE=False, TMA=tma, TWIN=not x16.is_cuda,
        num_warps=WARPS["group_max"], CHUNK=cfg.chunk, LMAX=cfg.lmax, TARGET=cfg.target,
        GROUPS=cfg.groups, R=1 << log_r, LOG_R=log_r,
        STRIDED=_triton.strided_fold(rows, n_chunks, k), PDL=pdl,
        **({"launch_pdl": True} if pdl else {}))


def descriptor(x16):
    """The row's words as [rows, cols / 128, 64] int32, boxes of one chunk ([1, 16, 64])."""
    rows, cols = x16.shape
    x32 = x16.view(torch.int32)
    return TensorDescriptor(x32, [rows, cols // 128, 64], [x16.stride(0) // 2, 64, 1],
                            [1, NSEG, 64])


def tma_k1(x16, lens, ws, k, stages, log_r=None, segs=True, desc=None):
    cfg = ws.cfg
    rows, cols = x16.shape
    n_chunks = triton.cdiv(cols, cfg.chunk)
    log_r = span_log2(rows, n_chunks) if log_r is None else log_r
    pdl = x16.is_cuda
    _fold_tma_kernel[(rows, triton.cdiv(n_chunks, 1 << log_r))](
        desc if desc is not None else descriptor(x16), x16, lens, ws.gmax, ws.smax,
        x16.stride(0), ws.gmax.stride(0), ws.smax.stride(0), cols, CHUNK=cfg.chunk,
        LMAX=cfg.lmax, TARGET=cfg.target, R=1 << log_r, LOG_R=log_r, STAGES=stages, NSEG=NSEG,
        SEGS=segs and listed(rows, n_chunks), TWIN=not x16.is_cuda, PDL=pdl,
        num_warps=WARPS["group_max"], **({"launch_pdl": True} if pdl else {}))


def outputs(ws, rows, length, cfg):
    """The group maxima slots and the segment maxima inside the length."""
    nseg = triton.cdiv(length, cfg.chunk // NSEG)
    return ws.gmax[:rows].clone(), ws.smax[:rows, :nseg].clone()


def run(rows, cols, valid, stages_list, dev="cuda"):
    if dev == "cuda":
        xs, lens, length = TB._inputs(rows, cols, valid)
    else:  # the interpreter check
        g = torch.Generator().manual_seed(rows * cols)
        xs = [torch.randn(rows, cols, generator=g).to(torch.bfloat16)]
        length = cols if valid == "all" else int(valid) if valid.isdigit() else cols // 8
        lens = torch.full((rows,), length, dtype=torch.int32)
    ws = make_topk_workspace(rows, K, dev)
    cfg = ws.cfg
    n_chunks = cols // cfg.chunk
    log_r = span_log2(rows, n_chunks)
    assert not _triton.strided_fold(rows, n_chunks, K) and log_r > 0
    descs = [descriptor(x.view(torch.int16)) for x in xs]
    variants = {"tree": lambda i: tree_k1(xs[i].view(torch.int16), lens, ws, K),
                "tree-tma": lambda i: tree_k1(xs[i].view(torch.int16), lens, ws, K, True)}
    for s in stages_list:
        variants[f"tma-{s}"] = lambda i, s=s: tma_k1(xs[i].view(torch.int16), lens, ws, K, s,
                                                     desc=descs[i])
        if dev == "cuda":
            variants[f"tma-{s}-noseg"] = lambda i, s=s: tma_k1(
                xs[i].view(torch.int16), lens, ws, K, s, segs=False, desc=descs[i])
            for lr in (4, 5):
                variants[f"tma-{s}-R{1 << lr}"] = lambda i, s=s, lr=lr: tma_k1(
                    xs[i].view(torch.int16), lens, ws, K, s, log_r=lr, desc=descs[i])
    # bitwise: the group and segment maxima of the same spans
    ws.gmax.zero_()
    ws.smax.zero_()
    variants["tree"](0)
    want = outputs(ws, rows, length, cfg)
    same = {}
    for name, fn in variants.items():
        if name == "tree-tma" or (name.startswith("tma-") and name.count("-") == 1):
            ws.gmax.zero_()
            ws.smax.zero_()
            fn(0)
            got = outputs(ws, rows, length, cfg)
            same[name] = all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    if dev != "cuda":
        return f"{rows}x{cols}x{valid}: " + ", ".join(
            f"{n} {'same' if ok else 'DIFFERENT'}" for n, ok in same.items())
    times = {n: [] for n in variants}
    for _ in range(2):
        for name, fn in variants.items():
            def call(fn=fn, j=[0]):  # noqa: B006 (the call counter, one a variant and pass)
                fn(j[0] % len(xs))
                j[0] += 1

            times[name].append(graph_time_us(call))
    nbytes = rows * length * 2
    txt = ", ".join(f"{n} {a:.2f}/{b:.2f} ({nbytes / min(a, b) / 1e6:.2f} TB/s)"
                    + ("" if same.get(n, True) else " DIFFERENT")
                    for n, (a, b) in times.items())
    return f"{rows}x{cols}x{valid} R={1 << log_r}: {txt}"


def main(argv) -> None:
    stages = [FOLD_STAGES]
    if "--stages" in argv:
        i = argv.index("--stages")
        stages = [int(u) for u in argv[i + 1].split(",")]
        argv = argv[:i] + argv[i + 2:]
    if "--cpu" in argv:  # interpreter check at a small folded shape
        argv.remove("--cpu")
        for cell in argv or ["2x4194304xall"]:
            r, c, v = cell.split("x")
            print(run(int(r), int(c), v, stages, dev="cpu"), flush=True)
        return
    print(torch.cuda.get_device_name(), f"k = {K}, kernel 1 alone", flush=True)
    for cell in argv or CELLS:
        r, c, v = cell.split("x")
        print(run(int(r), int(c), v, stages), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
