"""Triton kernels of ``decode_topk`` (private). Algorithm and work split: docs/kernels/topk.md.

Four launches per call, all rows at once, every length read on the device:

1. ``_group_max_kernel``  grid (rows, chunks): one read of the row; per chunk, the maxima of
   strided groups (group b of a chunk = elements b, b + g, b + 2g, ... with g = chunk >> level)
   at the level the row's length selects, so a row has ``target .. 2*target`` groups.
2. ``_threshold_kernel``  grid (rows,): T0 = the k-th largest group maximum. At least k
   elements are >= T0 (every one of those k groups holds its maximum), so the top k are >= T0.
3. ``_collect_kernel``    grid (rows, chunks): re-reads the row (from L2 when it fits) and
   appends every element >= T0 to the row's candidate buffer as ``key1 << 20 | (2**20-1-idx)``.
4. ``_select_kernel``     grid (rows,): sorts the candidates (a few k on real data) and writes
   the first k. Above ``cap`` candidates (heavy ties, adversarial rows) it selects exactly by a
   bitwise search over the row in one CTA: slow, but exact and deterministic.

Keys: ``key1`` is 0 for "not a candidate", else 1 + the 16-bit order-preserving key of the bf16
value (``ref.rank_keys``); block mode ranks blocks by their largest key1 and pins a block above
everything with ``PIN_KEY1``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import ref

# Kernels may only read module globals that are constexpr.
COL_BITS = tl.constexpr(ref.COL_BITS)
COL_MASK = tl.constexpr(ref.COL_MASK)
NEG_INF_KEY1 = tl.constexpr(ref.NEG_INF_KEY1)
PIN_KEY1 = tl.constexpr(ref.PIN_KEY1)


@triton.jit
def _key1(u):
    """int32 bf16 bit patterns (0..0xFFFF) -> 1 + order-preserving key; -0 -> +0, NaN on top."""
    u = tl.where(u == 0x8000, 0, u)
    key = tl.where(u >= 0x8000, 0xFFFF - u, u + 0x8000)
    key = tl.where((u & 0x7FFF) > 0x7F80, 0xFFFF, key)
    return key + 1


@triton.jit
def _element_keys(x_row_ptr, e, length, len_e, BLOCK: tl.constexpr):
    """key1 of elements ``e`` (int32 [N]) of one row; 0 for elements at or past the length."""
    if BLOCK == 1:
        m = e < len_e
        u = tl.load(x_row_ptr + e, mask=m, other=0).to(tl.int32) & 0xFFFF
        key1 = tl.where(m, _key1(u), 0)
    else:
        c = e[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]  # [N, BLOCK] columns
        m = c < length
        u = tl.load(x_row_ptr + c, mask=m, other=0).to(tl.int32) & 0xFFFF
        key1 = tl.max(tl.where(m, _key1(u), 0), axis=1)
        key1 = tl.where(key1 > NEG_INF_KEY1, key1, 0)  # spec §5.4: only blocks above -inf
        key1 = tl.where((e == (length - 1) // BLOCK) & (length > 0), PIN_KEY1, key1)
    return key1


@triton.jit
def _row_length(lengths_ptr, row, cols, BLOCK: tl.constexpr):
    length = tl.minimum(tl.maximum(tl.load(lengths_ptr + row), 0), cols)
    return length, (length + BLOCK - 1) // BLOCK


@triton.jit
def _level(len_e, TARGET: tl.constexpr, LMAX: tl.constexpr):
    """Group level: the largest l <= LMAX with len_e >= TARGET * 2**l (0 if none)."""
    s = len_e * 0
    for l in tl.static_range(1, LMAX + 1):
        s += (len_e >= (TARGET << l)).to(tl.int32)
    return s


@triton.jit
def _group_max_kernel(x_ptr, lengths_ptr, gmax_ptr, stride_x, stride_g, cols,
                      BLOCK: tl.constexpr, CHUNK: tl.constexpr, LMAX: tl.constexpr,
                      TARGET: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    length, len_e = _row_length(lengths_ptr, row, cols, BLOCK)
    s = _level(len_e, TARGET, LMAX)
    if c * CHUNK < len_e:
        e = c * CHUNK + tl.arange(0, CHUNK)
        key1 = _element_keys(x_ptr + row.to(tl.int64) * stride_x, e, length, len_e, BLOCK)
        g_ptr = gmax_ptr + row.to(tl.int64) * stride_g
        g = key1
        for l in tl.static_range(LMAX):  # g: CHUNK >> l group maxima, group b = {b + j*(CHUNK>>l)}
            tl.store(g_ptr + c * (CHUNK >> l) + tl.arange(0, CHUNK >> l), g, mask=s == l)
            if l + 1 < LMAX:
                g = tl.max(tl.reshape(g, [2, CHUNK >> (l + 1)]), axis=0)
        tl.store(g_ptr + c, tl.max(key1, axis=0), mask=s == LMAX)


@triton.jit
def _threshold_kernel(lengths_ptr, gmax_ptr, thr_ptr, cnt_ptr, stride_g, cols, K,
                      BLOCK: tl.constexpr, CHUNK: tl.constexpr, LMAX: tl.constexpr,
                      TARGET: tl.constexpr, GROUPS: tl.constexpr):
    row = tl.program_id(0)
    length, len_e = _row_length(lengths_ptr, row, cols, BLOCK)
    s = _level(len_e, TARGET, LMAX)
    n_groups = ((len_e + CHUNK - 1) // CHUNK) * ((s * 0 + CHUNK) >> s)  # tensor first: s varies
    i = tl.arange(0, GROUPS)
    g = tl.load(gmax_ptr + row.to(tl.int64) * stride_g + i, mask=i < n_groups, other=0)
    # T0 = max t with #{g >= t} >= K, bit by bit (the predicate is monotone in t); 1 when fewer
    # than K groups are valid, i.e. every valid element is a candidate.
    t = len_e * 0
    for b in tl.static_range(16, -1, -1):
        cand = t | (1 << b)
        t = tl.where(tl.sum((g >= cand).to(tl.int32), axis=0) >= K, cand, t)
    tl.store(thr_ptr + row, tl.maximum(t, 1))
    tl.store(cnt_ptr + row, 0)


@triton.jit
def _collect_kernel(x_ptr, lengths_ptr, thr_ptr, cnt_ptr, cbuf_ptr, stride_x, stride_c, cols,
                    BLOCK: tl.constexpr, CHUNK: tl.constexpr, CAP: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    length, len_e = _row_length(lengths_ptr, row, cols, BLOCK)
    if c * CHUNK < len_e:
        e = c * CHUNK + tl.arange(0, CHUNK)
        key1 = _element_keys(x_ptr + row.to(tl.int64) * stride_x, e, length, len_e, BLOCK)
        cand = key1 >= tl.load(thr_ptr + row)
        n = tl.sum(cand.to(tl.int32), axis=0)
        if n > 0:
            base = tl.atomic_add(cnt_ptr + row, n)
            pos = base + tl.cumsum(cand.to(tl.int32), axis=0) - 1
            comb = (key1.to(tl.int64) << COL_BITS) | (e.to(tl.int64) ^ COL_MASK)
            tl.store(cbuf_ptr + row.to(tl.int64) * stride_c + pos, comb, mask=cand & (pos < CAP))


@triton.jit
def _sort_store(src_ptr, n, dst_ptr, K, SIZE: tl.constexpr):
    """Sort the first ``n`` (<= SIZE) combined values descending; write the first K indices."""
    i = tl.arange(0, SIZE)
    v = tl.sort(tl.load(src_ptr + i, mask=i < n, other=-1), descending=True)
    idx = tl.where(v >= 0, (v & COL_MASK) ^ COL_MASK, -1)
    tl.store(dst_ptr + i, idx.to(tl.int32), mask=i < K)


@triton.jit
def _exact_fallback(x_row, lengths_ptr, row, cols, c_ptr, o_ptr, K, BLOCK: tl.constexpr,
                    SMALL: tl.constexpr, SCAN: tl.constexpr):
    """Exact selection when the candidate buffer overflowed (heavy ties, adversarial rows).

    One CTA: tau = the K-th largest key1 by 17 counting scans of the row, then one scan in
    column order keeps every element above tau and the first K - #{> tau} equal to it; the kept
    K go through the candidate buffer and the same sort as the fast path.
    """
    length, len_e = _row_length(lengths_ptr, row, cols, BLOCK)
    tau = len_e * 0
    for b in tl.static_range(16, -1, -1):
        cand = tau | (1 << b)
        count = len_e * 0
        start = len_e * 0
        while start < len_e:  # (a while loop: the interpreter cannot range over a tensor)
            key1 = _element_keys(x_row, start + tl.arange(0, SCAN), length, len_e, BLOCK)
            count += tl.sum((key1 >= cand).to(tl.int32), axis=0)
            start += SCAN
        tau = tl.where(count >= K, cand, tau)
    above = len_e * 0
    start = len_e * 0
    while start < len_e:
        key1 = _element_keys(x_row, start + tl.arange(0, SCAN), length, len_e, BLOCK)
        above += tl.sum((key1 > tau).to(tl.int32), axis=0)
        start += SCAN
    kept = len_e * 0
    ties = len_e * 0
    start = len_e * 0
    while start < len_e:
        e = start + tl.arange(0, SCAN)
        key1 = _element_keys(x_row, e, length, len_e, BLOCK)
        eq = key1 == tau
        keep = (key1 > tau) | (eq & (ties + tl.cumsum(eq.to(tl.int32), axis=0) <= K - above))
        pos = kept + tl.cumsum(keep.to(tl.int32), axis=0) - 1
        comb = (key1.to(tl.int64) << COL_BITS) | (e.to(tl.int64) ^ COL_MASK)
        tl.store(c_ptr + pos, comb, mask=keep)
        kept += tl.sum(keep.to(tl.int32), axis=0)
        ties += tl.sum(eq.to(tl.int32), axis=0)
        start += SCAN
    tl.debug_barrier()  # the CTA's own global writes above are read back by other threads
    _sort_store(c_ptr, K, o_ptr, K, SMALL)


@triton.jit
def _select_kernel(x_ptr, lengths_ptr, cnt_ptr, cbuf_ptr, out_ptr, stride_x, stride_c,
                   stride_o, cols, K, BLOCK: tl.constexpr, SMALL: tl.constexpr,
                   CAP: tl.constexpr, SCAN: tl.constexpr):
    row = tl.program_id(0)
    n = tl.load(cnt_ptr + row)
    c_ptr = cbuf_ptr + row.to(tl.int64) * stride_c
    o_ptr = out_ptr + row.to(tl.int64) * stride_o
    if n <= SMALL:
        _sort_store(c_ptr, n, o_ptr, K, SMALL)
    elif CAP > SMALL:
        if n <= CAP:
            _sort_store(c_ptr, n, o_ptr, K, CAP)
        else:
            _exact_fallback(x_ptr + row.to(tl.int64) * stride_x, lengths_ptr, row, cols, c_ptr,
                            o_ptr, K, BLOCK, SMALL, SCAN)
    else:
        _exact_fallback(x_ptr + row.to(tl.int64) * stride_x, lengths_ptr, row, cols, c_ptr,
                        o_ptr, K, BLOCK, SMALL, SCAN)


def launch(x16, lengths, out, ws, cfg, k: int, stages: int = 4) -> None:
    """Run the four kernels. ``x16``: the bf16 logits viewed as int16 [rows, cols].

    ``stages < 4`` runs only the first kernels (the benchmark's per-kernel breakdown).
    """
    rows, cols = x16.shape
    n_chunks = triton.cdiv(triton.cdiv(cols, cfg.block), cfg.chunk)
    common = dict(BLOCK=cfg.block, CHUNK=cfg.chunk)
    _group_max_kernel[(rows, n_chunks)](
        x16, lengths, ws.gmax, x16.stride(0), ws.gmax.stride(0), cols,
        LMAX=cfg.lmax, TARGET=cfg.target, num_warps=4, **common)
    if stages >= 2:
        _threshold_kernel[(rows,)](
            lengths, ws.gmax, ws.thr, ws.cnt, ws.gmax.stride(0), cols, k,
            LMAX=cfg.lmax, TARGET=cfg.target, GROUPS=cfg.groups, num_warps=8, **common)
    if stages >= 3:
        _collect_kernel[(rows, n_chunks)](
            x16, lengths, ws.thr, ws.cnt, ws.cbuf, x16.stride(0), ws.cbuf.stride(0), cols,
            CAP=cfg.cap, num_warps=4, **common)
    if stages >= 4:
        _select_kernel[(rows,)](
            x16, lengths, ws.cnt, ws.cbuf, out, x16.stride(0), ws.cbuf.stride(0),
            out.stride(0), cols, k, BLOCK=cfg.block, SMALL=cfg.small, CAP=cfg.cap,
            SCAN=2048 // cfg.block, num_warps=8)
