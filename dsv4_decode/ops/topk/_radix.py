"""Radix-select kernels of ``decode_topk_blocks`` (private). Design: docs/kernels/topk.md.

Block mode ranks at most 2**20 / block elements (131,072 blocks of 8), so an exact radix
select on the 17-bit ``key1`` is cheap enough to need no candidate buffer, no fallback and no
sampling. A row's elements are cut into chunks of ``CE``; program (row, c) owns chunk c, and
only the row's *active* chunks (those starting before its length) do any work. Three launches,
all rows at once, every length read on the device:

1. ``_radix_hist_kernel``: key1 of the chunk; the histogram of ``key1 >> 8`` (512 bins: the
   pinned key 65,537 lands in bin 256) added to the row's ``hist1`` with integer atomics. The
   last active program of the row (atomic ticket) finds bin B holding the K-th largest key1
   and the count above it, and re-arms ``hist1`` and the ticket for the next call.
2. ``_radix_refine_kernel``: the chunk's keys again (the logits are L2-resident by now); per
   chunk the count of keys above bin B and the 256-bin histogram of the low byte of the keys
   in bin B, stored per chunk and added to ``hist2``. The last active program finds
   tau = B * 256 + L (the K-th largest key1), the number of ties at tau to keep, and per chunk
   the output offset and the number of ties before it (a prefix over chunks in index order).
3. ``_radix_write_kernel``: the keys once more; each program writes its keys > tau and its
   first ties at tau (the tie quota runs in index order: ties go to the lower index) at its
   offset, ascending; program 0 of each row pads with -1.

Fewer than K candidates: no bin reaches K, so B = 0 and L = 0, tau = 0 and every candidate
(key1 > 0) is written. Integer atomics make the histograms order-independent: every call and
graph replay writes bitwise the same output.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton import _element_keys, _row_length

H1 = tl.constexpr(512)  # bins of key1 >> 8 (0..256)
H2 = tl.constexpr(256)  # bins of the low byte
# meta slots per row: B, count above B, tau, ties to keep, total written
M_BIN, M_ABOVE, M_TAU, M_TIES, M_TOTAL = (tl.constexpr(i) for i in range(5))
META = tl.constexpr(8)
CHUNK_TILE = 16  # chunks per step of the refine kernel's prefix loop


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
def _last_active(tick_ptr, row, n_act):
    """Ticket among the row's active programs: True in the last to arrive, which re-arms it.
    Every thread's atomics and stores precede it (CTA barrier, then the acq_rel gpu-scope
    atomic publishes them), so the last program sees all of them."""
    tl.debug_barrier()
    ticket = tl.atomic_add(tick_ptr + row, 1, sem="acq_rel", scope="gpu")
    last = ticket == n_act - 1
    if last:
        tl.store(tick_ptr + row, 0)
    return last


@triton.jit
def _radix_hist_kernel(x_ptr, lengths_ptr, tick_ptr, hist1_ptr, meta_ptr, stride_x, cols, K,
                       BLOCK: tl.constexpr, CE: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    n_act = _n_active(lengths_ptr, row, cols, BLOCK, CE)
    if c < n_act:
        key1, _ = _chunk_keys(x_ptr, lengths_ptr, row, c, stride_x, cols, BLOCK, CE)
        b = tl.arange(0, H1)
        h_row = hist1_ptr + row * H1
        h = tl.histogram(key1 >> 8, H1, mask=key1 > 0)
        tl.atomic_add(h_row + b, h, mask=h > 0, sem="relaxed")
        if _last_active(tick_ptr, row, n_act):
            g = tl.load(h_row + b, cache_modifier=".cg")
            tl.store(h_row + b, tl.zeros_like(g))
            at_least = tl.sum(g, axis=0) - tl.cumsum(g, axis=0) + g  # #{key1 >> 8 >= b}
            bsel = tl.max(tl.where(at_least >= K, b, 0), axis=0)  # 0 also when none reaches K
            tl.store(meta_ptr + row * META + M_BIN, bsel)
            tl.store(meta_ptr + row * META + M_ABOVE, tl.sum(tl.where(b > bsel, g, 0), axis=0))


@triton.jit
def _radix_refine_kernel(x_ptr, lengths_ptr, tick_ptr, hist2_ptr, meta_ptr, chist_ptr, cgt_ptr,
                         coff_ptr, stride_x, cols, K, NCH: tl.constexpr,
                         BLOCK: tl.constexpr, CE: tl.constexpr, CT: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    n_act = _n_active(lengths_ptr, row, cols, BLOCK, CE)
    if c < n_act:
        m_row = meta_ptr + row * META
        bsel = tl.load(m_row + M_BIN)
        key1, _ = _chunk_keys(x_ptr, lengths_ptr, row, c, stride_x, cols, BLOCK, CE)
        hi = key1 >> 8
        l = tl.arange(0, H2)
        h = tl.histogram(key1 & 0xFF, H2, mask=(key1 > 0) & (hi == bsel))
        ch_row = chist_ptr + row.to(tl.int64) * (NCH * H2)
        tl.store(ch_row + c * H2 + l, h)
        tl.store(cgt_ptr + row * NCH + c, tl.sum((hi > bsel).to(tl.int32), axis=0))
        h_row = hist2_ptr + row * H2
        tl.atomic_add(h_row + l, h, mask=h > 0, sem="relaxed")
        if _last_active(tick_ptr, row, n_act):
            g = tl.load(h_row + l, cache_modifier=".cg")
            tl.store(h_row + l, tl.zeros_like(g))
            above = tl.load(m_row + M_ABOVE)
            at_least = above + tl.sum(g, axis=0) - tl.cumsum(g, axis=0) + g
            lsel = tl.max(tl.where(at_least >= K, l, 0), axis=0)
            greater = above + tl.sum(tl.where(l > lsel, g, 0), axis=0)  # #{key1 > tau}
            ties = K - greater  # ties at tau to keep (< K - greater when fewer exist)
            n_eq = tl.sum(tl.where(l == lsel, g, 0), axis=0)
            tl.store(m_row + M_TAU, bsel * 256 + lsel)
            tl.store(m_row + M_TIES, ties)
            tl.store(m_row + M_TOTAL, greater + tl.minimum(n_eq, ties))
            # per chunk, in index order: output offset and ties at tau before it
            off = greater * 0
            tie = greater * 0
            for t0 in range(0, NCH, CT):  # a constant bound; steps past n_act skip
                if t0 < n_act:
                    cc = t0 + tl.arange(0, CT)
                    ok = cc < n_act
                    hh = tl.load(ch_row + cc[:, None] * H2 + l[None, :], mask=ok[:, None],
                                 other=0, cache_modifier=".cg")
                    gt_c = tl.load(cgt_ptr + row * NCH + cc, mask=ok, other=0,
                                   cache_modifier=".cg")
                    gt_c += tl.sum(tl.where(l[None, :] > lsel, hh, 0), axis=1)
                    eq_c = tl.sum(tl.where(l[None, :] == lsel, hh, 0), axis=1)
                    tie_c = tie + tl.cumsum(eq_c, axis=0) - eq_c
                    sel_c = gt_c + tl.minimum(tl.maximum(ties - tie_c, 0), eq_c)
                    o_row = coff_ptr + (row * NCH + cc) * 2
                    tl.store(o_row, off + tl.cumsum(sel_c, axis=0) - sel_c, mask=ok)
                    tl.store(o_row + 1, tie_c, mask=ok)
                    off += tl.sum(sel_c, axis=0)
                    tie += tl.sum(eq_c, axis=0)


@triton.jit
def _radix_write_kernel(x_ptr, lengths_ptr, meta_ptr, coff_ptr, out_ptr, stride_x, stride_o,
                        cols, K, NCH, BLOCK: tl.constexpr, CE: tl.constexpr, KP: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    n_act = _n_active(lengths_ptr, row, cols, BLOCK, CE)
    m_row = meta_ptr + row * META
    o_row = out_ptr + row.to(tl.int64) * stride_o
    if c < n_act:
        tau = tl.load(m_row + M_TAU)
        ties = tl.load(m_row + M_TIES)
        off = tl.load(coff_ptr + (row * NCH + c) * 2)
        tie0 = tl.load(coff_ptr + (row * NCH + c) * 2 + 1)
        key1, e = _chunk_keys(x_ptr, lengths_ptr, row, c, stride_x, cols, BLOCK, CE)
        eq = ((key1 == tau) & (key1 > 0)).to(tl.int32)
        keep = (key1 > tau) | ((eq == 1) & (tie0 + tl.cumsum(eq, axis=0) - eq < ties))
        ki = keep.to(tl.int32)
        tl.store(o_row + off + tl.cumsum(ki, axis=0) - ki, e, mask=keep)
    if c == 0:
        total = tl.where(n_act > 0, tl.load(m_row + M_TOTAL), 0)
        i = tl.arange(0, KP)
        tl.store(o_row + i, -1, mask=(i >= total) & (i < K))


def launch(x16, lengths, out, ws, cfg, k: int) -> None:
    """Run the three kernels. ``x16``: the bf16 logits viewed as int16 [rows, cols]."""
    rows, cols = x16.shape
    ce = cfg.rchunk
    grid = (rows, triton.cdiv(triton.cdiv(cols, cfg.block), ce))
    nch = ws.cgt.shape[1]
    common = dict(BLOCK=cfg.block, CE=ce, num_warps=4)
    _radix_hist_kernel[grid](x16, lengths, ws.tick, ws.hist1, ws.meta, x16.stride(0), cols, k,
                             **common)
    _radix_refine_kernel[grid](x16, lengths, ws.tick, ws.hist2, ws.meta, ws.chist, ws.cgt,
                               ws.coff, x16.stride(0), cols, k, nch, CT=CHUNK_TILE, **common)
    _radix_write_kernel[grid](x16, lengths, ws.meta, ws.coff, out, x16.stride(0), out.stride(0),
                              cols, k, nch, KP=triton.next_power_of_2(k), **common)
