"""Probe: the time a block-mode call cannot go below in ``bench topk``'s harness (CUDA graph of
20 back-to-back calls, median of 20 replays), from skeleton kernels that do a block-mode
call's fixed parts and nothing of the select (one GPU, sm_90+).

    PYTHONPATH=. python3 scripts/topk_floor_probe.py [ROWSxCOLS ...]

Every skeleton is a programmatic dependent launch (``launch_pdl``, ``_pdl_enter`` first, as
block mode's kernels), 16 CTAs a row (one chunk of 4,096 columns each at 64K columns), and
writes the row's 2,048 output slots:
- ``write``: reads the row's length, writes -1 (no logits read);
- ``load``: also loads its chunk (eagerly, as ``_cluster``), reduces it to one maximum, and
  writes that (so the load cannot be dropped);
- ``load-c16``: ``load`` on a cluster of the row's 16 CTAs (``utils.cluster``);
- ``load-c16-bN``: ``load-c16`` with N release / acquire cluster barriers between the load
  and the write (a two-level radix select needs at least two: after each histogram's adds);
- ``select``: ``_cluster.launch`` itself, the block-mode select (the API's pick at these
  shapes), for the same inputs.
Inputs are ``bench topk --blocks``'s (all valid: the whole chunk is loaded). Prints one line a
cell: each variant twice, µs.
"""

import sys

import torch
import triton
import triton.language as tl

from dsv4_decode.bench import topk as TB
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.topk import _cluster, make_topk_workspace
from dsv4_decode.ops.topk._words import _pdl_enter
from dsv4_decode.utils import cluster

NB, BLOCK, CTAS, CHUNK = 2048, 8, 16, 4096


@triton.jit
def _skel(x_ptr, lengths_ptr, out_ptr, stride_x, stride_o, cols, smem_off, CTAS: tl.constexpr,
          CHUNK: tl.constexpr, NB: tl.constexpr, LOAD: tl.constexpr, CLUSTER: tl.constexpr,
          BARRIERS: tl.constexpr):
    _pdl_enter()
    if CLUSTER:
        cluster.check_cluster(CTAS)
    q = tl.program_id(0)
    row = tl.program_id(1)
    length = tl.load(lengths_ptr + row)
    w = q * (CHUNK // 2) + tl.arange(0, CHUNK // 2)
    v = tl.full([], -1, tl.int32)
    if LOAD:  # eager: masked by the width, not the length (as _cluster's chunk loads)
        x32 = (x_ptr + row.to(tl.int64) * stride_x).to(tl.pointer_type(tl.int32))
        u = tl.load(x32 + w, mask=2 * w < cols, other=0)
        v = tl.max(tl.where(2 * w < length, u, 0), axis=0)
    for _ in tl.static_range(BARRIERS):
        cluster.arrive()
        cluster.wait()
    i = q * (NB // CTAS) + tl.arange(0, NB // CTAS)
    tl.store(out_ptr + row.to(tl.int64) * stride_o + i, v + 0 * i)


def runner(name):
    if name == "select":
        return lambda x16, lens, out, ws: _cluster.launch(x16, lens, out, ws, ws.cfg, NB)
    parts = name.split("-")
    load = "load" in parts
    ctas = CTAS if "c16" in parts else 1
    bars = next((int(p[1:]) for p in parts if p[0] == "b"), 0)

    def run(x16, lens, out, ws):
        rows, cols = x16.shape
        consts = dict(CTAS=CTAS, CHUNK=CHUNK, NB=NB, LOAD=load, CLUSTER=ctas > 1,
                      BARRIERS=bars, num_warps=8, launch_pdl=True)
        grid = (CTAS // ctas, rows)
        cluster.launch(_skel, grid, (x16, lens, out, x16.stride(0), out.stride(0), cols),
                       consts, ctas, 16)
    return run


def cell(variants, rows, cols) -> None:
    xs, lens, _ = TB._inputs(rows, cols, "all")
    ws = make_topk_workspace(rows, NB, "cuda", BLOCK)
    out = torch.empty(rows, NB, dtype=torch.int32, device="cuda")
    runs = [runner(v) for v in variants]

    def make_fn(run):
        i = [0]

        def fn():
            run(xs[i[0] % len(xs)].view(torch.int16), lens, out, ws)
            i[0] += 1
        return fn

    t = [[graph_time_us(make_fn(r), calls=20) for r in runs] for _ in range(2)]
    txt = "  ".join(f"{n} {a:6.2f}/{b:6.2f}" for n, a, b in zip(variants, *t, strict=True))
    print(f"{rows}x{cols}: {txt}", flush=True)


def main(argv) -> None:
    variants = ["write", "load", "load-c16", "load-c16-b2", "load-c16-b4", "select"]
    cells = [tuple(int(v) for v in a.split("x")) for a in argv] or [(1, 65536), (6, 65536),
                                                                     (12, 65536)]
    print(torch.cuda.get_device_name())
    for rows, cols in cells:
        if cols != CTAS * CHUNK:
            raise SystemExit(f"{cols} columns: the skeletons take {CTAS * CHUNK}")
        cell(variants, rows, cols)


if __name__ == "__main__":
    main(sys.argv[1:])
