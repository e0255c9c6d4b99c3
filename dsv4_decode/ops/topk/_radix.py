"""Radix-select kernels of ``decode_topk_blocks`` (private). Design: docs/kernels/topk.md.

Block mode ranks at most 2**20 / block elements (131,072 blocks of 8), so an exact radix
select on the 17-bit ``key1`` is cheap enough to need no candidate buffer, no fallback and no
sampling. A row's elements are cut into chunks of ``CE``; program (row, c) owns chunk c, and
only the row's *active* chunks (those starting before its length) touch the logits. Three
launches, all rows at once, every length read on the device, no tickets and no single-program
phase: each program recomputes the row's few shared decisions from the previous launch's
histogram (a 256- or 512-entry load) instead of waiting for one program to make them.

1. ``_radix_hist_kernel``: key1 of the chunk; the histogram of ``key1 >> 8`` (512 bins: the
   pinned key 65,537 lands in bin 256) added to the row's ``hist1`` with integer atomics.
2. ``_radix_refine_kernel``: every program reads ``hist1`` and finds bin B holding the K-th
   largest key1; then its chunk's keys again (L2-resident by now): the 256-bin histogram of the
   low byte of the keys in bin B, added to ``hist2``, and stored per chunk as suffix counts
   ``csuf[c, l] = #{key1 >= B * 256 + l}`` (``cgt[c] = #{key1 >> 8 > B}``).
3. ``_radix_write_kernel``: every program reads ``hist2``, finds tau = B * 256 + L (the K-th
   largest key1) and the ties at tau to keep, and gathers two suffix counts per earlier chunk
   of its row for its output offset and the ties before it (ties go to the lower index). Then
   its keys once more: keys > tau and its share of the ties, written ascending at its offset.
   Program 0 of each row pads with -1.

The histograms are re-zeroed where nobody reads them: ``hist2`` by launch 1 of the next call's
program 0, ``hist1`` by launch 3's program 0 (launch 2 read it). Fewer than K candidates: no bin
reaches K, so B = 0 and L = 0, tau = 0 and every candidate (key1 > 0) is written. Integer
atomics make the histograms order-independent: every call and graph replay writes bitwise the
same output.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton import _element_keys, _row_length

H1 = tl.constexpr(512)  # bins of key1 >> 8 (0..256)
H2 = tl.constexpr(256)  # bins of the low byte
# meta slots per row (written by launch 2's program 0): B, count above B
M_BIN, M_ABOVE = (tl.constexpr(i) for i in range(2))
META = tl.constexpr(8)


@triton.jit
def _chunk_keys(x_ptr, lengths_ptr, row, c, stride_x, cols, BLOCK: tl.constexpr,
                CE: tl.constexpr):
    length, len_e = _row_length(lengths_ptr, row, cols, BLOCK)
    x_row = x_ptr + row.to(tl.int64) * tl.multiple_of(stride_x, 8)
    e = c * CE + tl.arange(0, CE)
    return _element_keys(x_row, e, length, len_e, BLOCK), e


@triton.jit
def _n_active(lengths_ptr, row, cols, BLOCK: tl.constexpr, CE: tl.constexpr):
    _, len_e = _row_length(lengths_ptr, row, cols, BLOCK)
    return (len_e + CE - 1) // CE


@triton.jit
def _largest_bin(g, base, K, NB: tl.constexpr):
    """The largest bin b with base + #{values in bins >= b} >= K (0 when none reaches K), and
    base + the count above it. ``g``: the [NB] histogram."""
    b = tl.arange(0, NB)
    at_least = base + tl.sum(g, axis=0) - tl.cumsum(g, axis=0) + g
    bsel = tl.max(tl.where(at_least >= K, b, 0), axis=0)
    return bsel, base + tl.sum(tl.where(b > bsel, g, 0), axis=0)


@triton.jit
def _radix_hist_kernel(x_ptr, lengths_ptr, hist1_ptr, hist2_ptr, stride_x, cols,
                       BLOCK: tl.constexpr, CE: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    if c == 0:  # launch 3 of the previous call was the last to read it
        tl.store(hist2_ptr + row * H2 + tl.arange(0, H2), tl.zeros([H2], tl.int32))
    if c < _n_active(lengths_ptr, row, cols, BLOCK, CE):
        key1, _ = _chunk_keys(x_ptr, lengths_ptr, row, c, stride_x, cols, BLOCK, CE)
        h = tl.histogram(key1 >> 8, H1, mask=key1 > 0)
        tl.atomic_add(hist1_ptr + row * H1 + tl.arange(0, H1), h, mask=h > 0, sem="relaxed")


@triton.jit
def _radix_refine_kernel(x_ptr, lengths_ptr, hist1_ptr, hist2_ptr, meta_ptr, csuf_ptr, cgt_ptr,
                         stride_x, cols, K, NCH: tl.constexpr, BLOCK: tl.constexpr,
                         CE: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    if c < _n_active(lengths_ptr, row, cols, BLOCK, CE):
        key1, _ = _chunk_keys(x_ptr, lengths_ptr, row, c, stride_x, cols, BLOCK, CE)
        bsel, above = _largest_bin(tl.load(hist1_ptr + row * H1 + tl.arange(0, H1)), 0, K, H1)
        if c == 0:
            tl.store(meta_ptr + row * META + M_BIN, bsel)
            tl.store(meta_ptr + row * META + M_ABOVE, above)
        hi = key1 >> 8
        l = tl.arange(0, H2)
        h = tl.histogram(key1 & 0xFF, H2, mask=(key1 > 0) & (hi == bsel))
        tl.atomic_add(hist2_ptr + row * H2 + l, h, mask=h > 0, sem="relaxed")
        n_gt = tl.sum((hi > bsel).to(tl.int32), axis=0)
        suf = n_gt + tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h  # #{key1 >= bsel * 256 + l}
        tl.store(csuf_ptr + (row.to(tl.int64) * NCH + c) * H2 + l, suf)
        tl.store(cgt_ptr + row * NCH + c, n_gt)


@triton.jit
def _radix_write_kernel(x_ptr, lengths_ptr, hist1_ptr, hist2_ptr, meta_ptr, csuf_ptr, cgt_ptr,
                        out_ptr, stride_x, stride_o, cols, K, NCH: tl.constexpr,
                        BLOCK: tl.constexpr, CE: tl.constexpr, KP: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    n_act = _n_active(lengths_ptr, row, cols, BLOCK, CE)
    o_row = out_ptr + row.to(tl.int64) * stride_o
    if c == 0:  # launch 2, its only reader, is done
        tl.store(hist1_ptr + row * H1 + tl.arange(0, H1), tl.zeros([H1], tl.int32))
    if (c < n_act) | (c == 0):
        above = tl.load(meta_ptr + row * META + M_ABOVE)
        lsel, greater = _largest_bin(tl.load(hist2_ptr + row * H2 + tl.arange(0, H2)), above,
                                     K, H2)
        tau = tl.load(meta_ptr + row * META + M_BIN) * 256 + lsel
        ties = K - greater  # ties at tau to keep, lowest index first (more than exist: all)
        # earlier chunks of the row: #{key1 > tau} and #{key1 == tau} from their suffix counts
        p = tl.arange(0, NCH)
        before = p < c
        s_row = csuf_ptr + row.to(tl.int64) * (NCH * H2) + p * H2
        ge = tl.load(s_row + lsel, mask=before, other=0)
        gt = tl.where(lsel < H2 - 1, tl.load(s_row + lsel + 1, mask=before & (lsel < H2 - 1),
                                             other=0),
                      tl.load(cgt_ptr + row * NCH + p, mask=before, other=0))
        eq = ge - gt
        tie_p = tl.cumsum(eq, axis=0) - eq
        kept = gt + tl.minimum(tl.maximum(ties - tie_p, 0), eq)
        if c < n_act:
            off = tl.sum(kept, axis=0)
            tie0 = tl.sum(eq, axis=0)
            key1, e = _chunk_keys(x_ptr, lengths_ptr, row, c, stride_x, cols, BLOCK, CE)
            is_eq = ((key1 == tau) & (key1 > 0)).to(tl.int32)
            keep = (key1 > tau) | ((is_eq == 1) & (tie0 + tl.cumsum(is_eq, axis=0) - is_eq < ties))
            ki = keep.to(tl.int32)
            tl.store(o_row + off + tl.cumsum(ki, axis=0) - ki, e, mask=keep)
        if c == 0:
            n_eq = tl.sum(tl.where(tl.arange(0, H2) == lsel, tl.load(
                hist2_ptr + row * H2 + tl.arange(0, H2)), 0), axis=0)
            total = tl.where(n_act > 0, greater + tl.minimum(n_eq, ties), 0)
            i = tl.arange(0, KP)
            tl.store(o_row + i, -1, mask=(i >= total) & (i < K))


def launch(x16, lengths, out, ws, cfg, k: int) -> None:
    """Run the three kernels. ``x16``: the bf16 logits viewed as int16 [rows, cols]."""
    rows, cols = x16.shape
    grid = (rows, triton.cdiv(triton.cdiv(cols, cfg.block), cfg.rchunk))
    nch = ws.cgt.shape[1]
    common = dict(BLOCK=cfg.block, CE=cfg.rchunk, num_warps=4)
    _radix_hist_kernel[grid](x16, lengths, ws.hist1, ws.hist2, x16.stride(0), cols, **common)
    _radix_refine_kernel[grid](x16, lengths, ws.hist1, ws.hist2, ws.meta, ws.csuf, ws.cgt,
                               x16.stride(0), cols, k, nch, **common)
    _radix_write_kernel[grid](x16, lengths, ws.hist1, ws.hist2, ws.meta, ws.csuf, ws.cgt, out,
                              x16.stride(0), out.stride(0), cols, k, nch,
                              KP=triton.next_power_of_2(k), **common)
