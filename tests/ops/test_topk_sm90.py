"""decode_topk's kernels through Triton's whole sm_90a pipeline without a GPU (no spills).
Split from test_topk.py, whose interpreter and GPU tests check what these kernels compute."""

from __future__ import annotations

_COMPILE_SM90 = r'''
import json
from dsv4_decode.utils.sm90 import spill_stores
from dsv4_decode.ops.topk import _triton as K
from dsv4_decode.ops.topk.config import FOLD_STAGES, NSEG, TopkConfig


def build(fn, const, num_warps, pdl=True, maxnreg=0):  # on sm_90+ every launch is dependent
    # twice: as an odd shape compiles, and as the bench's shapes specialize it (row strides and
    # widths divisible by 16: 16-byte loads, other layouts, other registers)
    div = tuple(n for n in fn.arg_names if n.startswith("stride") or n == "cols")
    return sum(spill_stores(fn, dict(const, PDL=pdl), num_warps,
                            {"x_ptr": "*i16", "cbuf_ptr": "*i64"}, default_ptr="*i32",
                            maxnreg=maxnreg, divisible=d) for d in ((), div))


out = {}
for k in (512, 2048):  # plain mode's kernels (block mode: the radix select below)
    c = TopkConfig.pick(k)
    common = dict(CHUNK=c.chunk)
    rs = K.LIST_REGION * c.nseg // NSEG  # listed grids' segments: c.nseg a chunk (as launch)
    # fused only for k <= 512; folded grids with and without the pipelined fold, and strided
    for log_r, fuse, st, sd in ((0, k <= 512, 1, 0), (3, False, 1, 0),
                                (3, False, FOLD_STAGES, 0), (3, False, 1, 1)):
        spans = dict(LMAX=c.lmax, TARGET=c.target, GROUPS=c.groups, R=1 << log_r, LOG_R=log_r,
                     STRIDED=sd)
        out[f"gmax-k{k}-R{1 << log_r}-fuse{fuse}-stages{st}-strided{sd}"] = build(
            K._group_max_kernel, dict(STAGES=st, SEGS=log_r > 0, FUSE=fuse, TWIN=False,
                                      NSEG=c.nseg if log_r > 0 else NSEG, **spans, **common),
            4)
    # R = 2 (grids of 768-6,144 chunk programs), with and without the segment maxima, under
    # the register cap it runs with at k <= 512 (config.FOLD2_MAXNREG)
    for segs in (False, True):
        spans = dict(LMAX=c.lmax, TARGET=c.target, GROUPS=c.groups, R=2, LOG_R=1, STRIDED=0)
        out[f"gmax-k{k}-R2-segs{segs}"] = build(
            K._group_max_kernel, dict(STAGES=1, SEGS=segs, FUSE=False, TWIN=False, **spans,
                                      NSEG=c.nseg if segs else NSEG, **common),
            4, maxnreg=K.FOLD2_MAXNREG if k <= 512 else 0)
    for sd in (0, 1):
        spans = dict(LMAX=c.lmax, TARGET=c.target, GROUPS=c.groups, R=8, LOG_R=3, STRIDED=sd)
        out[f"threshold-k{k}-strided{sd}"] = build(K._threshold_kernel, dict(
            NSEG=c.nseg, RS=rs, LIST=1, P=64, **spans, **common), 8)
    # plain launches: T0 loaded first; ROW_PTX False: grids below config.ROW_PTX_PROGRAMS
    for lst, pdl, ptx in ((0, True, True), (1, True, True), (0, False, True), (0, True, False)):
        out[f"collect-k{k}-list{lst}-pdl{pdl}-ptx{ptx}"] = build(K._collect_kernel, dict(
            CAP=c.cap, LIST=lst, P=64, NSEG=c.nseg if lst else NSEG, RS=rs, NR=4, ROW_PTX=ptx,
            **common), 4, pdl,
            K.COLLECT_MAXNREG)
    out[f"select-k{k}"] = build(K._select_kernel, dict(
        NCH=c.max_chunks, SMALL=c.small, MID=min(2 * c.small, c.cap), CAP=c.cap, SCAN=2048,
        NSEG=c.nseg, LIST=1, NR=8,
        CHUNK=c.chunk, P=64), 8)
from dsv4_decode.ops.topk import _radix as RX
for block in (8, 2, 64):
    c = TopkConfig.pick(2048, block)
    for phase in range(4):
        out[f"radix-b{block}-phase{phase}"] = spill_stores(RX._radix_kernel, dict(
            NCH=c.rchunks, BLOCK=block, CE=c.rchunk, KP=2048, PHASE=phase, TWIN=False, PDL=True),
            RX.NUM_WARPS,
            {"x_ptr": "*i16", "bar_ptr": "*i64"}, default_ptr="*i32")
    out[f"radix-b{block}-one-row"] = spill_stores(RX._radix_kernel, dict(
            NCH=c.rchunks, BLOCK=block, CE=c.radix_chunk(1), KP=2048, PHASE=0, TWIN=False,
            PDL=True),
            RX.NUM_WARPS,
            {"x_ptr": "*i16", "bar_ptr": "*i64"}, default_ptr="*i32")
from dsv4_decode.ops.topk import _cluster as CL
# a cluster a row (8 warps up to WIDE_CTAS_GRID CTAs, 4 beyond), and the LONG form (4 warps;
# chunks of _radix's: half the size for one row). smem_off is always a multiple of 16. The
# LONG form is checked as the bench's widths specialize it: at a row stride or width that is
# not a multiple of 16 its blocks of 8 at LCE = 512 spill 4 bytes (session 30).
DIV = ("stride_x", "stride_o", "cols", "smem_off")
for block, ctas, long, warps in ((8, 16, False, 8), (8, 16, False, 4), (8, 1, False, 8),
                                 (2, 8, False, 4), (64, 16, False, 8), (8, 16, True, 4),
                                 (2, 16, True, 4), (16, 16, True, 4)):
    c = TopkConfig.pick(2048, block)
    for lce in (c.rchunk, c.radix_chunk(1)) if long else (c.rchunk,):
        for div in (DIV,) if long else (("smem_off",), DIV):
            out[f"cluster-b{block}-c{ctas}-long{long}-w{warps}-lce{lce}-{len(div)}"] = (
                spill_stores(CL._cluster_kernel, dict(
                    CTAS=ctas, BLOCK=block, CE=c.rchunk, KP=2048, PDL=True, LONG=long,
                    ATOMIC=c.rchunk >= 32 * warps, NCH=c.rchunks, LCE=lce), warps,
                    {"x_ptr": "*i16", "bar_ptr": "*i64"}, default_ptr="*i32", divisible=div))
from dsv4_decode.ops.topk import _row as RW
for k in (512, 2048):
    c = TopkConfig.pick(k)
    out[f"row-k{k}"] = build(RW._row_kernel, dict(
        TILE=RW.TILE, G=RW.groups(k), SEGS=8192, SMALL=c.small, CAP=c.cap, SCAN=2048,
        TWIN=False), RW.NUM_WARPS)
print(json.dumps(out))
'''


def test_compiles_for_sm90_without_spills():
    """The default paths' kernels go through Triton's whole sm_90 pipeline (TTIR -> PTX ->
    ptxas) without a GPU: the compiler's checks the interpreter skips (types across branches,
    layouts, reshapes) run here, for odd shapes and as the bench's shapes specialize the
    launches (integer strides and widths divisible by 16). No register spills."""
    from dsv4_decode.utils.sm90 import run_compile_script

    spills = run_compile_script(_COMPILE_SM90)
    assert spills == {k: 0 for k in spills}, spills
