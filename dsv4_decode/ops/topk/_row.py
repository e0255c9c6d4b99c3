"""One-CTA-a-row kernel of ``decode_topk`` (private): short rows, one launch. Design and
measurements: docs/kernels/topk.md (sessions 17, 18).

The four-launch pipeline (``_triton``) spreads a row over many programs and pays a kernel
boundary (about 2 µs in a dependent-launch chain) for each hand-off between them. A row of up
to ``config.ROW_COLS`` columns is little enough work for one CTA, so ``_row_kernel`` runs the
same algorithm with every hand-off a CTA barrier instead:

1. The row in tiles of ``TILE`` columns (``[TILE / 8, 4]`` words of two bf16: 8 consecutive
   columns a thread row, one 16-byte load), folded elementwise with a NaN-propagating packed
   bf16 max (``_words._wmax2``; columns past the length read -inf), the next tile's loads in
   flight while one is folded; the key1 maximum of every segment of 8 columns is stored
   (``smax``).
2. T0 from ``G`` strided group maxima of the fold (group b = columns b + j * G), as key1; a
   group is valid when b < length. T0 is ``_kth._part_bound`` (each warp's own K/8-th
   largest, the least of the eight), or, when that has no bound, the exact K-th largest. At
   least K group maxima are >= T0 and each is an element, so the top K are >= T0. With fewer
   than K valid groups T0 = 1: every valid element is a candidate.
3. Every element >= T0 is written to the row's candidate buffer *in column order* (a
   per-thread count, one scan over the thread rows, a running base), as one int32: its 16-bit
   key above its column (rows of at most 65,536 columns), so no span bookkeeping is needed:
   a row of one tile from the registers of step 1; a longer one lists the segments whose
   maximum reaches T0 (ascending, ``seglist``) and re-reads only those.
4. A CTA barrier, then the exact top K of the candidates: tau = the K-th largest key1, the
   ties at tau kept lowest column first, written ascending, ``-1`` after (``_write_kept``).
   More than ``CAP`` candidates (heavy ties) takes ``_words._exact_fallback`` (counting
   scans of the row).

No atomics and no counters to re-arm: graph-safe and bitwise deterministic. The grid is (rows,).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4_decode.utils.device import pdl_capable

from ._kth import _kth_above, _kth_largest, _part_bound, _write_kept
from ._words import (
    _exact_fallback,
    _key1,
    _mask_words,
    _pdl_enter,
    _row_length,
    _wmax,
    _wmax2,
    _word_key1,
)
from .config import ROW_COLS

NUM_WARPS = 8
PARTS = tl.constexpr(8)  # T0's parts (_part_bound): one a warp at NUM_WARPS
TILE = 8192  # columns a fold step: 32 a thread at 8 warps (four 16-byte loads)


@triton.jit
def _cols(t, TILE: tl.constexpr):
    """Columns of tile t as [TILE / 8, 8]."""
    return t * TILE + tl.arange(0, TILE // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]


@triton.jit
def _words(t, TILE: tl.constexpr):
    """Word indices (two columns a word, column 2j in the low half) of tile t as
    [TILE / 8, 4]: a thread row's 8 columns."""
    return t * (TILE // 2) + tl.arange(0, TILE // 8)[:, None] * 4 + tl.arange(0, 4)[None, :]


@triton.jit
def _tile(x_row, t, len_e, TILE: tl.constexpr):
    """Words of tile t ([TILE / 8, 4] int32). A tile inside the length loads unmasked (no
    per-element compare); the others are masked per 16 bytes, so up to 7 columns past the
    length are read (the API checks the storage)."""
    w = _words(t, TILE)
    x32 = x_row.to(tl.pointer_type(tl.int32))
    if (t + 1) * TILE <= len_e:
        u = tl.load(x32 + w)
    else:
        u = tl.load(x32 + w, mask=(w // 4) * 8 < len_e, other=0)
    return u


@triton.jit
def _collect(e, key1, t0, kb, base, CAP: tl.constexpr):
    """Append the elements ``e`` ([S, 8], in column order) with key1 >= t0 at ``base`` onward
    as ``(key1 - 1) << 16 | column``; return the new base. Positions at or past CAP are
    counted, not written."""
    cand = (key1 >= t0).to(tl.int32)
    n_r = tl.sum(cand, axis=1)
    pos = base + (tl.cumsum(n_r, axis=0) - n_r)[:, None] + tl.cumsum(cand, axis=1) - 1
    keep = (cand == 1) & (pos < CAP)
    tl.store(kb + pos, ((key1 - 1) << 16) | e, mask=keep)  # key and column: 16 bits each
    return base + tl.sum(n_r, axis=0)


@triton.jit
def _fold(s_row, t, u, len_e, TILE: tl.constexpr, TWIN: tl.constexpr):
    """Tile t's words ``u`` with -inf past the length, storing the key1 maxima of its segments
    of 8 columns (0 past the length) for ``_collect_listed``. The fold's maxima are packed bf16
    ones (``_words._wmax``): two columns an instruction."""
    r = t * (TILE // 8) + tl.arange(0, TILE // 8)
    if (t + 1) * TILE <= len_e:  # inside the length: no per-element masks
        v = u
        tl.store(s_row + r, _word_key1(_wmax(v, 1, TWIN), TWIN))
    else:
        v = _mask_words(_words(t, TILE), u, len_e)
        tl.store(s_row + r, tl.where(r * 8 < len_e, _word_key1(_wmax(v, 1, TWIN), TWIN), 0))
    return v


@triton.jit
def _collect_listed(x_row, s_row, l_row, len_e, t0, kb, TILE: tl.constexpr,
                    SEGS: tl.constexpr, CAP: tl.constexpr):
    """Collect a row of several tiles: the segments whose maximum reaches T0, listed ascending
    (each holds a candidate, so more than CAP of them is an overflow: CAP + 1 is returned),
    then only those re-read, TILE / 8 at a time. Returns the candidate count."""
    tl.debug_barrier()  # the segment maxima were stored by other threads of this CTA
    i = tl.arange(0, SEGS)
    act = (tl.load(s_row + i, mask=i < (len_e + 7) // 8, other=0) >= t0).to(tl.int32)
    n_act = tl.sum(act, axis=0)
    tl.store(l_row + tl.cumsum(act, axis=0) - 1, i, mask=act == 1)
    tl.debug_barrier()
    n_go = tl.where(n_act <= CAP, n_act, 0)
    n = len_e * 0
    b0 = len_e * 0
    while b0 < n_go:
        j = b0 + tl.arange(0, TILE // 8)
        ok = j < n_go
        e = tl.load(l_row + j, mask=ok, other=0)[:, None] * 8 + tl.arange(0, 8)[None, :]
        u = tl.load(x_row + e, mask=ok[:, None], other=0).to(tl.int32) & 0xFFFF
        n = _collect(e, tl.where(ok[:, None] & (e < len_e), _key1(u), 0), t0, kb, n, CAP)
        b0 += TILE // 8
    return tl.where(n_act <= CAP, n, CAP + 1)


@triton.jit
def _select(kb, n, t0, o_ptr, K, SIZE: tl.constexpr):
    """Exact top K of the n (<= SIZE) candidates ``kb`` (``_collect``'s entries, in column
    order, all >= ``t0``), written ascending to ``o_ptr``, -1 filling the tail."""
    i = tl.arange(0, SIZE)
    m = i < n
    p = tl.load(kb + i, mask=m, other=0)
    key1 = tl.where(m, ((p >> 16) & 0xFFFF) + 1, 0)
    # tau 0 when n < K: every candidate is kept; need: the ties at tau to keep, lowest first
    tau, need = _kth_above(key1, m, n, t0, K, SIZE <= 4096)
    gt = m & (key1 > tau)
    _write_kept(gt, m & (key1 == tau), need, p & 0xFFFF, n, o_ptr, K)


@triton.jit
def _row_kernel(x_ptr, lengths_ptr, smax_ptr, list_ptr, cnt_ptr, kbuf_ptr, out_ptr,
                stride_x, stride_s, stride_b, stride_o, cols, K, TILE: tl.constexpr,
                G: tl.constexpr, SEGS: tl.constexpr, SMALL: tl.constexpr, CAP: tl.constexpr,
                SCAN: tl.constexpr, TWIN: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # the logits and lengths are the previous kernel's; the buffers its last reader's
        _pdl_enter()
    row = tl.program_id(0)
    _, len_e = _row_length(lengths_ptr, row, cols, 1)
    # 16-byte loads whatever the stride's own divisibility (the API checks it is a multiple of
    # 8 elements; stated on the product, as on the stride alone it does not carry)
    x_row = x_ptr + tl.multiple_of(row.to(tl.int64) * stride_x, 8)
    kb = kbuf_ptr + row.to(tl.int64) * stride_b
    s_row = smax_ptr + row.to(tl.int64) * stride_s
    l_row = list_ptr + row.to(tl.int64) * stride_s
    n_t = (len_e + TILE - 1) // TILE
    # The fold keeps the next tile's load in flight. Neither deeper register loads (session
    # 17) nor a cp.async pipeline of 3 tiles (session 24: +1.9 µs a 64K row) made a long row
    # faster; packed bf16 maxima did (docs/kernels/topk.md). The first tile stays in
    # registers: a row of one tile is collected from them.
    u0 = _tile(x_row, 0, len_e, TILE)
    u_n = _tile(x_row, 1, len_e, TILE)
    acc = _fold(s_row, 0, u0, len_e, TILE, TWIN)
    t = 1
    while t < n_t:  # (while loops: the interpreter cannot range over a tensor)
        u = u_n
        u_n = _tile(x_row, t + 1, len_e, TILE)
        acc = _wmax2(acc, _fold(s_row, t, u, len_e, TILE, TWIN), TWIN)
        t += 1
    # group b's maximum (columns b + j G): word j of the reduction holds groups 2j and 2j + 1
    m = _wmax(tl.reshape(acc, [TILE // G, G // 2]), 0, TWIN)
    b = tl.arange(0, G)
    gk = tl.reshape(tl.join(_key1(m & 0xFFFF), _key1((m >> 16) & 0xFFFF)), [G])
    gk = tl.where(b < len_e, gk, 0)
    # T0 by parts: warp w holds groups G / 8 w .. (8 a thread), so each part's reductions
    # stay in its warp (_part_bound); the exact K-th when a part has no bound
    t0 = _part_bound(tl.reshape(gk, [1, PARTS, G // PARTS]), K, PARTS)
    if t0 == 0:
        t0 = tl.maximum(_kth_largest(gk, gk > 0, tl.minimum(len_e, G), K, G <= 4096), 1)
    if n_t <= 1:
        e = _cols(0, TILE)
        u = tl.reshape(tl.join(u0 & 0xFFFF, (u0 >> 16) & 0xFFFF), [TILE // 8, 8])
        key1 = tl.where(e < len_e, _key1(u), 0)
        n = _collect(e, key1, t0, kb, len_e * 0, CAP)
    else:
        n = _collect_listed(x_row, s_row, l_row, len_e, t0, kb, TILE, SEGS, CAP)
    tl.store(cnt_ptr + row, n)  # (the candidate count: for the tests and diagnostics)
    tl.debug_barrier()  # the candidates were written by other threads of this CTA
    o_ptr = out_ptr + row.to(tl.int64) * stride_o
    if n <= SMALL:
        _select(kb, n, t0, o_ptr, K, SMALL)
    elif n <= CAP:
        _select(kb, n, t0, o_ptr, K, CAP)
    else:
        _exact_fallback(x_row, lengths_ptr, row, cols, o_ptr, K, SCAN)


def groups(k: int) -> int:
    """G: the group maxima T0 is taken from. 4K of them keep about G ln(G / (G - K)) = 1.15 K
    candidates on random data (K = 512: ~590 of the 1,024-slot tile); at most 4,096, where
    the select's histogram (``_kth_above``) still pays (K = 2,048: ~2,840 of 4,096)."""
    return min(1 << max(6, (4 * k - 1).bit_length()), 4096, TILE // 2)


def launch(x16, lengths, out, ws, cfg, k: int, pdl: bool = True) -> None:
    """Run ``_row_kernel`` over all rows (``x16``: the bf16 logits as int16 [rows, cols]).
    ``pdl`` (sm_90+): a programmatic dependent launch, as ``_triton.launch``'s kernels."""
    rows, cols = x16.shape
    # the segment buffers (smax, seglist) hold ROW_COLS / 8 a row; a candidate's column is 16 bits
    if cols > ROW_COLS:
        raise ValueError(f"_row.launch: {cols} columns, at most {ROW_COLS}")
    pdl = pdl and pdl_capable(x16.device)
    kb = ws.cbuf.view(torch.int32)  # its int32 candidates in the first cfg.cap words of a row
    _row_kernel[(rows,)](
        x16, lengths, ws.smax, ws.seglist, ws.cnt, kb, out, x16.stride(0),
        ws.smax.stride(0), kb.stride(0), out.stride(0), cols, k, TILE=TILE, G=groups(k),
        SEGS=triton.next_power_of_2(triton.cdiv(cols, 8)), SMALL=cfg.small, CAP=cfg.cap,
        SCAN=2048, TWIN=not x16.is_cuda, PDL=pdl, num_warps=NUM_WARPS,
        **({"launch_pdl": True} if pdl else {}))
