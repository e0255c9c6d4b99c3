"""Block mode's radix select on thread-block clusters (private; sm_90+). Design:
docs/kernels/topk.md (sessions 30 and 31).

The exact two-level radix select of ``_radix`` (histogram of ``key1 >> 8``, then of the low
byte inside the threshold bin B, then the write), for rows of at most ``MAX_CTAS`` chunks of
``cfg.rchunk`` blocks (4,096 columns at blocks of 8): a row is one cluster of C CTAs (the
chunks of the widest row, rounded up to a power of two), CTA q owns chunk q, and the CTAs
meet in distributed shared memory and at cluster barriers where ``_radix`` meets through
global atomics and a software barrier across the grid (each about a kernel boundary,
session 6). The chunk's loads do not wait for the length (``_chunk_keys``'s ``EAGER``);
chunks past the length give no keys.

The LONG form (``launch``) takes rows wider than one cluster's chunks: G clusters of
``MAX_CTAS`` a row, G as many as the GPU holds at once (the driver's cluster occupancy). A
row whose length fits one cluster's chunks (a 512K row at 1/8 valid) runs the select above on
its first cluster while the others exit; a longer one runs ``_radix``'s select on all G
clusters' CTAs (``_radix_row``: global histograms, a barrier across them). The length is read
on the device, so one launch serves both.

Shared region of each CTA (``cluster.launch``; words): ``[0, 512)`` the row's ``key1 >> 8``
histogram and ``[512, 768)`` its low-byte histogram, each spread over the cluster (CTA r holds
the r-th of C equal slices of the bins: every CTA adds its counts into the owners and reads the
whole histogram back from them, so no CTA serves more than a slice's requests; session 30: one
owner for all bins cost 1,160 cycles more at 1 x 512K); ``[768, 1025)`` the chunk's suffix
counts ``#{key1 >= 256 B + l}``, word 1024 (l = 256) its count above bin B; ``[1028, 1540)``
and ``[1540, 1796)`` the chunk's own two histograms, counted there by shared-memory atomics
(``ATOMIC``; ``tl.histogram`` spent about 400 instructions a thread on each, and the atomics
took a call from 6.9 to 5.4 µs at 1 x 64K, session 31). Barriers: B0 after
every CTA zeroed its slices (its wait just before the first add), B1 after the high-byte adds,
B2 after the low-byte adds and the suffix counts, B3 after the last remote read (its wait just
before the CTA exits, so no CTA's shared memory goes while another may read it).

The write: chunk q's offset and the ties at tau before it come from the suffix counts of the
chunks before it (ties go to the lower index). Rank 0 pads with -1. No global scratch; integer
adds: every call and graph replay writes bitwise the same output.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsv4_decode.utils import cluster

from . import _radix
from ._radix import H1, H2, _chunk_keys, _largest_bin, _radix_row
from ._words import _pdl_enter, _row_length

MAX_CTAS = 16  # the largest cluster Hopper runs (a non-portable size)
# CTAs in all (rows x C) up to which one cluster a row beats _radix, and up to which a CTA
# takes 8 warps, not 4. Session 31 (``scripts/topk_cluster_ab.py``, runs 5-6, with the
# atomics histograms; µs, radix / 4 warps / 8 warps): 64K columns, 1/8 and all valid: 12 rows
# 8.2 / 6.6 / 7.4 and 10.1 / 6.4 / 6.9, 24 rows 8.9 / 9.0 / 13.5 and 12.4 / 8.9 / 13.2; 8
# warps at 1 and 6 rows (run 5): 5.35 and 5.71 at 1/8, 5.4 and 5.6 all valid.
MAX_CTAS_GRID = 384
WIDE_CTAS_GRID = 96
# The LONG form (rows of more than MAX_CTAS chunks), up to LONG_CHUNKS chunks (512K columns
# at blocks of 8) and LONG_CTAS_GRID CTAs of its first clusters (12 rows), at 4 warps.
# Session 31, run 7 (µs, radix / LONG at 4 warps / at 8): 512K 1/8 valid at 1 / 6 / 12 rows
# 7.6 / 5.8 / 5.7, 9.4 / 6.1 / 6.0, 10.5 / 7.3 / 7.3; 6 x 512K all valid 18.6 / 18.0 / 26.6.
# 1M rows lose at 1 and 12 rows (1/8 valid: 7.9 / 8.1, 12.3 / 12.6; all valid: 20.3 / 25.3,
# 54.7 / 63.0; their 32 chunks at 1/8 are past one cluster's): _radix keeps them.
LONG_CHUNKS = 128
LONG_CTAS_GRID = 192
W_H2, W_SUF = tl.constexpr(512), tl.constexpr(768)  # region words (module docstring)
W_L1, W_L2 = tl.constexpr(1028), tl.constexpr(1540)
# The histograms by shared-memory atomics (``ATOMIC``), which count every thread holding a
# key, so only where none is replicated (a chunk of at least one key a thread: blocks of 64
# have 64-key chunks and keep ``tl.histogram``).
SMEM_HIST = True
REGION = 4 * (1540 + 256)  # bytes, a multiple of 16


def _chunks(cols: int, cfg) -> int:
    """Chunks of ``cfg.rchunk`` blocks of ``cfg.block`` columns in a row of ``cols``."""
    return -(-cols // (cfg.block * cfg.rchunk))


def cluster_ctas(rows: int, cols: int, cfg) -> int:
    """CTAs a row's cluster for ``rows`` rows of ``cols`` columns (blocks of ``cfg.block``,
    chunks of ``cfg.rchunk`` blocks, as ``_radix``'s from 2 rows): a power of two covering the
    row's chunks; 0 when the rows are too wide or too many for clusters to beat ``_radix``."""
    c = 1 << max(0, (_chunks(cols, cfg) - 1).bit_length())
    return c if c <= MAX_CTAS and rows * c <= MAX_CTAS_GRID else 0


@triton.jit
def _write_chunk(key1, e, tau, quota, offset, o_row):
    """Write a chunk's keys > tau and its first ``quota`` ties at tau from ``offset``,
    ascending. One scan counts both kinds (ties << 16: a chunk has fewer than 2**16
    elements)."""
    gt = (key1 > tau).to(tl.int32)
    eq = ((key1 == tau) & (key1 > 0)).to(tl.int32)
    v = gt | (eq << 16)
    before = tl.cumsum(v, axis=0) - v
    keep = (gt == 1) | ((eq == 1) & ((before >> 16) < quota))
    tl.store(o_row + offset + (before & 0xFFFF) + tl.minimum(before >> 16, quota), e, mask=keep)


@triton.jit
def _local_hist(bins, mask, smem_off, W: tl.constexpr, NB: tl.constexpr):
    """The [NB] histogram of ``bins`` where ``mask``, counted by shared-memory atomics into the
    zeroed words ``[W, W + NB)`` of the region (a CTA barrier after the zeroing is the
    caller's), then read back after a CTA barrier."""
    cluster.count_local(cluster.smem_addr(smem_off + 4 * (W + bins)), mask)
    tl.debug_barrier()
    return cluster.ld_local(cluster.smem_addr(smem_off + 4 * (W + tl.arange(0, NB))))


@triton.jit
def _cluster_kernel(x_ptr, lengths_ptr, hist1_ptr, hist2_ptr, meta_ptr, csuf_ptr, cgt_ptr,
                    bar_ptr, out_ptr, stride_x, stride_o, cols, K, smem_off,
                    CTAS: tl.constexpr, BLOCK: tl.constexpr, CE: tl.constexpr,
                    KP: tl.constexpr, PDL: tl.constexpr, ATOMIC: tl.constexpr,
                    LONG: tl.constexpr, NCH: tl.constexpr, LCE: tl.constexpr):
    # LONG: x holds G clusters a row; a row longer than one cluster's chunks runs _radix's
    # select on all of them (``_radix_row``: global histograms, a barrier across the row's
    # programs, chunks of LCE), a shorter one runs on the first cluster alone
    if PDL:  # launched as a programmatic dependent: wait for the kernel before
        _pdl_enter()
    cluster.check_cluster(CTAS)
    q = tl.program_id(0)
    row = tl.program_id(1)
    if LONG:
        _, len_e = _row_length(lengths_ptr, row, cols, BLOCK)
        if len_e > CTAS * CE:
            _radix_row(x_ptr, lengths_ptr, hist1_ptr, hist2_ptr, meta_ptr, csuf_ptr, cgt_ptr,
                       bar_ptr, out_ptr, stride_x, stride_o, cols, K, row, q,
                       tl.num_programs(0), NCH, BLOCK, LCE, KP, 0, False)
        elif q < CTAS:
            _cluster_row(x_ptr, lengths_ptr, out_ptr, stride_x, stride_o, cols, K, smem_off,
                         row, q, CTAS, BLOCK, CE, KP, ATOMIC)
    else:
        _cluster_row(x_ptr, lengths_ptr, out_ptr, stride_x, stride_o, cols, K, smem_off, row,
                     q, CTAS, BLOCK, CE, KP, ATOMIC)


@triton.jit
def _cluster_row(x_ptr, lengths_ptr, out_ptr, stride_x, stride_o, cols, K, smem_off, row, q,
                 CTAS: tl.constexpr, BLOCK: tl.constexpr, CE: tl.constexpr, KP: tl.constexpr,
                 ATOMIC: tl.constexpr):
    """The row's select on one cluster: q is the CTA's rank and its chunk."""
    w1 = tl.arange(0, H1)
    w2 = tl.arange(0, H2)
    own1 = w1 // (H1 // CTAS)  # the CTA holding each bin
    own2 = w2 // (H2 // CTAS)
    a_h1 = cluster.smem_addr(smem_off + 4 * w1)
    a_h2 = cluster.smem_addr(smem_off + 4 * (W_H2 + w2))
    cluster.st_local(a_h1, tl.zeros([H1], tl.int32))
    cluster.st_local(a_h2, tl.zeros([H2], tl.int32))
    if ATOMIC:
        cluster.st_local(cluster.smem_addr(smem_off + 4 * (W_L1 + w1)), tl.zeros([H1], tl.int32))
        cluster.st_local(cluster.smem_addr(smem_off + 4 * (W_L2 + w2)), tl.zeros([H2], tl.int32))
    cluster.arrive()  # B0
    key1, e = _chunk_keys(x_ptr, lengths_ptr, row, q, stride_x, cols, BLOCK, CE, False, True)
    if ATOMIC:
        tl.debug_barrier()  # the local zeros
        h = _local_hist(key1 >> 8, key1 > 0, smem_off, W_L1, H1)
    else:
        h = tl.histogram(key1 >> 8, H1, mask=key1 > 0)
    cluster.wait()
    cluster.red_add_rank(a_h1, h, h > 0, own1)
    cluster.arrive()  # B1
    cluster.wait()
    bsel, above = _largest_bin(cluster.ld_rank(a_h1, own1), 0, K, H1)
    hi = key1 >> 8
    if ATOMIC:
        h2 = _local_hist(key1 & 0xFF, (key1 > 0) & (hi == bsel), smem_off, W_L2, H2)
    else:
        h2 = tl.histogram(key1 & 0xFF, H2, mask=(key1 > 0) & (hi == bsel))
    n_gt = tl.sum((hi > bsel).to(tl.int32), axis=0)
    cluster.red_add_rank(a_h2, h2, h2 > 0, own2)
    cluster.st_local(cluster.smem_addr(smem_off + 4 * (W_SUF + w2)),
                     n_gt + tl.cumsum(h2, axis=0, reverse=True))
    cluster.st_local(cluster.smem_addr(smem_off + 4 * (W_SUF + H2)), n_gt)
    cluster.arrive()  # B2
    cluster.wait()
    g2 = cluster.ld_rank(a_h2, own2)
    lsel, greater = _largest_bin(g2, above, K, H2)
    tau = bsel * 256 + lsel
    ties = K - greater  # ties at tau to keep, lowest index first (more than exist: all)
    # the chunks before this one: their keys >= tau and > tau (word l + 1; l = 255: above B)
    p = tl.arange(0, CTAS)
    ge = cluster.ld_rank(cluster.smem_addr(smem_off + 4 * (W_SUF + lsel) + 0 * p), p)
    gt = cluster.ld_rank(cluster.smem_addr(smem_off + 4 * (W_SUF + lsel + 1) + 0 * p), p)
    cluster.arrive()  # B3: no CTA reads this one's shared memory after this
    before = p < q
    n_above = tl.sum(tl.where(before, gt, 0), axis=0)
    n_ties = tl.sum(tl.where(before, ge - gt, 0), axis=0)
    o_row = out_ptr + row.to(tl.int64) * stride_o
    _write_chunk(key1, e, tau, tl.maximum(ties - n_ties, 0),
                 n_above + tl.minimum(n_ties, ties), o_row)
    if q == 0:
        n_eq = tl.sum(tl.where(w2 == lsel, g2, 0), axis=0)
        i = tl.arange(0, KP)
        tl.store(o_row + i, -1, mask=(i >= greater + tl.minimum(n_eq, ties)) & (i < K))
    cluster.wait()  # B3


def launch(x16, lengths, out, ws, cfg, k: int, pdl: bool = True) -> None:
    """Run the select in one launch on clusters: ``cluster_ctas(rows, cols, cfg)`` CTAs a row
    where that is not 0; else (at most ``LONG_CTAS_GRID // MAX_CTAS`` rows of at most
    ``LONG_CHUNKS`` chunks, blocks of at most 16) G clusters of ``MAX_CTAS`` a row, as many
    as keep the whole grid resident at once (the driver's occupancy for clusters), rows
    longer than one cluster's chunks on all of them (``LONG``); else, or when not one such
    cluster a row fits, ``_radix.launch`` (sm_90+ only). ``x16``: the bf16 logits viewed as
    int16 [rows, cols]; ``pdl``: a programmatic dependent launch (in the LONG form up to
    ``_radix.PDL_ROWS`` rows, as ``_radix``)."""
    rows, cols = x16.shape
    ctas = cluster_ctas(rows, cols, cfg)
    long_rows = not ctas
    if long_rows:
        ctas = MAX_CTAS
        # (blocks of 32 spill registers in the LONG form)
        if rows * ctas > LONG_CTAS_GRID or _chunks(cols, cfg) > LONG_CHUNKS or cfg.block > 16:
            _radix.launch(x16, lengths, out, ws, cfg, k, pdl=pdl)
            return
        pdl = pdl and rows <= _radix.PDL_ROWS
    warps = 8 if rows * ctas <= WIDE_CTAS_GRID and not long_rows else 4
    lce = cfg.radix_chunk(rows)
    consts = dict(CTAS=ctas, BLOCK=cfg.block, CE=cfg.rchunk, KP=triton.next_power_of_2(k),
                  PDL=pdl, ATOMIC=SMEM_HIST and cfg.rchunk >= 32 * warps, LONG=long_rows,
                  NCH=ws.cgt.shape[1], LCE=lce, num_warps=warps,
                  **({"launch_pdl": True} if pdl else {}))
    args = (x16, lengths, ws.hist1, ws.hist2, ws.meta, ws.csuf, ws.cgt, ws.bar, out,
            x16.stride(0), out.stride(0), cols, k)
    groups = 1
    if long_rows:
        _, clusters = cluster.prepare(_cluster_kernel, args, consts, ctas, REGION)
        groups = min(-(-triton.cdiv(triton.cdiv(cols, cfg.block), lce) // ctas),
                     clusters // rows)
        if groups == 0:
            _radix.launch(x16, lengths, out, ws, cfg, k, pdl=pdl)
            return
    cluster.launch(_cluster_kernel, (groups, rows), args, consts, ctas, REGION)
