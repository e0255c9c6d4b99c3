"""Triton kernels of ``decode_topk`` (private). Algorithm and work split: docs/kernels/topk.md.

Four launches per call (three with ``fuse=True`` on unfolded grids at k <= 512), all rows at
once, every length read on the device; on sm_90+ each is a programmatic dependent launch that
waits at its start (``_pdl_enter``; the threshold first loads the row's length, the collect
the length and its chunk of the logits: inputs written before the call, hence before the first
kernel's wait):

1. ``_group_max_kernel``  grid (rows, chunks / R): one read of the row, as words of two bf16
   folded by packed maxima (``_words._bmax2``; the fold's helpers are ``_fold``'s); the
   maxima of strided groups (group b of a chunk = elements b, b + g, b + 2g, ... with
   g = chunk >> level) at the level the row's length selects, so a row has
   ``target .. 2*target`` groups; a program first folds R chunks elementwise
   (``config.span_log2``): chunks p R .. p R + R - 1, or on the grids ``config.strided_fold``
   picks chunks p, p + n_p, ... Fused: the row's last program (atomic ticket) runs step 2.
2. ``_row_threshold`` (fused into kernel 1, else ``_threshold_kernel`` grid (rows, regions)):
   T0 = a value at least k group maxima reach: ``_part_bound`` (each warp's own k/8-th
   largest, the least of the eight: reductions inside warps) unless the row is listed (3.),
   else, or when that has no bound, the k-th largest group maximum (``_kth_largest``: a
   256-bin histogram below the maximum, else a bitwise search). At least k elements are >= T0
   (every one of those k groups holds its maximum), so the top k are >= T0.
3. ``_collect_kernel``    grid (rows, chunks) on grids of at most ``config.CHUNK_PROGRAMS``
   chunk programs, (rows, ``list_programs(rows, k)``) on larger ones (``config.listed``):
   re-reads the row (whole chunks, a program each; on the larger grids a row of more than
   that many chunks is *listed* (``_listed``): only the 128-element segments whose maximum,
   stored by pass 1, reaches T0, from the threshold's lists) and appends every element >= T0
   (one unordered compare: on sm_90 grids of ``config.row_ptx`` one packed bf16x2 compare a
   word into a row's candidate bits, ``_row_candidates``; elsewhere ``_at_least_t0`` an
   element) to the row's candidate buffer (its bf16 bits, and its index with its rank inside
   its span; there a PTX loop over each row's candidates, ``_store_rows``), one atomic a
   span; stores each span's candidate count and buffer base.
4. ``_select_kernel``     grid (rows,): in the smallest tile that holds the row's candidates
   (``small``, twice that, ``cap``) finds the exact k-th largest candidate key (a histogram
   of key1 - T0, ``_kth_above``) and writes the selected indices in ascending order
   (deterministic whatever order the atomics gave). Above ``cap`` candidates (heavy ties,
   adversarial rows) it selects exactly by counting scans over the row in one CTA: slow, but
   exact and deterministic.

Keys: ``key1`` is 0 for "not a candidate", else 1 + the 16-bit order-preserving key of the bf16
value (``ref.rank_keys``). These kernels run plain mode, but for the shapes
``config.one_cta_per_row`` gives to ``_row`` (one CTA a row, sharing their helpers). Block mode
is ``_radix``, which shares the packed maxima (blocks ranked by their largest key1, one pinned
above everything with ``PIN_KEY1``) and ``_row_length``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv4_decode.utils.device import pdl_capable

from . import ref
from ._fold import _fold_span, _fold_strided, _level, _one_chunk, _store_groups, _strided_units
from ._kth import _kth_above, _kth_largest, _part_bound, _store_kept, _write_kept
from ._words import _exact_fallback, _key1, _pdl_enter, _row_length
from .config import (
    COLLECT_MAXNREG,
    FOLD2_MAXNREG,
    LIST_REGION,
    NSEG,
    WARPS,
    fold_stages,
    list_programs,
    listed,
    row_ptx,
    span_log2,
    strided_fold,
)

# Kernels may only read module globals that are constexpr.
COL_BITS = tl.constexpr(ref.COL_BITS)
COL_MASK = tl.constexpr(ref.COL_MASK)
TIE_SHIFT = tl.constexpr(ref.COL_BITS + 1)  # scratch entries: flag << 21 | index
# _store_rows, per row: $1 candidate bits, $2 candidates before the row, $3 span base, $4-$7
# the row's words, $8 q << COL_BITS | the row's first column, $9 buffer, $10 CAP. Candidate
# j (lowest set bit first): rank r, slot $3 + r, bf16 bits from word j / 2, half j % 2.
ROW_STORE = tl.constexpr(
    "{ .reg .pred %p<3>; .reg .b32 %m, %low, %t, %k, %r, %pos, %w, %h, %lo, %hi; "
    ".reg .b64 %a; mov.b32 $0, 0; setp.eq.s32 %p0, $1, 0; @%p0 bra done_${:uid}; "
    "mov.b32 %m, $1; mov.b32 %r, $2; loop_${:uid}: neg.s32 %t, %m; and.b32 %low, %m, %t; "
    "add.s32 %t, %low, -1; popc.b32 %k, %t; shr.u32 %t, %k, 1; setp.eq.s32 %p1, %t, 1; "
    "selp.b32 %w, $5, $4, %p1; setp.eq.s32 %p1, %t, 2; selp.b32 %w, $6, %w, %p1; "
    "setp.eq.s32 %p1, %t, 3; selp.b32 %w, $7, %w, %p1; and.b32 %h, %k, 1; "
    "shl.b32 %h, %h, 4; shr.u32 %w, %w, %h; and.b32 %w, %w, 65535; add.s32 %pos, %r, $3; "
    "setp.lt.s32 %p2, %pos, $10; shl.b32 %lo, %r, 17; or.b32 %lo, %lo, %w; "
    "add.s32 %hi, $8, %k; mul.wide.s32 %a, %pos, 8; add.s64 %a, %a, $9; "
    "@%p2 st.global.v2.b32 [%a], {%lo, %hi}; add.s32 %r, %r, 1; xor.b32 %m, %m, %low; "
    "setp.ne.s32 %p0, %m, 0; @%p0 bra loop_${:uid}; done_${:uid}: }")
RANK_SHIFT = tl.constexpr(17)  # buffer entries' low word: rank inside the span << 17 | bf16 bits


@triton.jit
def _kth_group_max(g_row, n, n_valid, parts, K, SIZE: tl.constexpr):
    """T0 of the row's first ``n`` group maxima, ``n_valid`` of them valid (the others store
    0): with ``parts`` ``_part_bound``, else (or when that has no bound) their exact K-th
    largest."""
    i = tl.arange(0, SIZE)
    # .cg: in the fused path these maxima were just written by other CTAs (read from L2)
    g = tl.load(g_row + i, mask=i < n, other=0, cache_modifier=".cg")
    t = n * 0
    if parts:
        # parts of the [SIZE] load's layout (8 warps, 4 a thread): warp w holds
        # 128 w .. 128 w + 127 of every 1,024 (the threshold kernel's 8 warps)
        t = _part_bound(tl.reshape(g, [SIZE // 1024, 8, 128]), K, 8)
    if t == 0:
        t = _kth_largest(g, g > 0, n_valid, K, SIZE <= 4096)
    return t


@triton.jit
def _row_threshold(len_e, gmax_ptr, row, stride_g, cols, K, listed, CHUNK: tl.constexpr,
                   LMAX: tl.constexpr, TARGET: tl.constexpr, GROUPS: tl.constexpr,
                   R: tl.constexpr, LOG_R: tl.constexpr, STRIDED: tl.constexpr):
    """T0 of one row of ``len_e`` elements from its group maxima (``_kth_group_max``; 1 =
    every valid element a candidate when fewer than K groups are valid). ``listed``: the row
    is collected from segment lists (``_listed``), which take the exact K-th group maximum."""
    s = _level(len_e, TARGET, LMAX)
    if STRIDED:  # as in _group_max_kernel: u units of one chunk, groups at level lvl
        n_p, u, lvl = _strided_units(len_e, cols, CHUNK, R, TARGET, LMAX)
        per = (s * 0 + CHUNK) >> lvl
        n_groups = u * per
        # valid: the full chunks' groups, and of the last unit those whose element b is
        full = tl.minimum(n_p, len_e // CHUNK)
        n_valid = full * per + tl.where(u > full, tl.minimum(per, len_e % CHUNK), 0)
    else:
        folded = s >= LOG_R  # as in _group_max_kernel: spans of R chunks, or single chunks
        span = tl.where(folded, R * CHUNK, CHUNK)
        per_span = (s * 0 + CHUNK) >> tl.where(folded, s - LOG_R, s)
        n_groups = ((len_e + span - 1) // span) * per_span
        # valid: those whose first element (span start + b, b < per_span) is inside the length
        n_valid = (len_e // span) * per_span + tl.minimum(per_span, len_e % span)
    g_row = gmax_ptr + row.to(tl.int64) * stride_g
    # T0 by parts (_part_bound) unless the row is listed: its T0, a little lower, lets more
    # segments into the lists (measured, session 18: +5 to +13 µs at 48-64 rows x 256K-1M
    # all valid); groups of 1-2 elements rarely have a bound (k = 2,048)
    parts = (s >= 2) & (listed == 0)
    # The smallest tile that holds the row's groups (typically T..2T = GROUPS / 4 .. / 2): the
    # selection costs per tile slot, masked or not.
    if n_groups <= GROUPS // 4:
        t = _kth_group_max(g_row, n_groups, n_valid, parts, K, GROUPS // 4)
    elif n_groups <= GROUPS // 2:
        t = _kth_group_max(g_row, n_groups, n_valid, parts, K, GROUPS // 2)
    else:
        t = _kth_group_max(g_row, n_groups, n_valid, parts, K, GROUPS)
    return tl.maximum(t, 1)


@triton.jit
def _listed(len_e, CHUNK: tl.constexpr, P: tl.constexpr):
    """1 when a row of ``len_e`` elements on a folded grid (P collect programs a row) is
    collected from segment lists: it has more than P chunks. A shorter row is collected a
    chunk a program, as on small grids: listing its segments is slower than re-reading them
    all (session 19: 24 x 256K at 1/8 valid, the threshold 3.9 µs and the collect 6.6 against
    1.7 and 2.1 at 12 rows on the small grid)."""
    return ((len_e + CHUNK - 1) // CHUNK > P).to(tl.int32)


@triton.jit
def _group_max_kernel(x_ptr, lengths_ptr, gmax_ptr, smax_ptr, thr_ptr, cnt_ptr, tick_ptr,
                      stride_x, stride_g, stride_s, cols, K, CHUNK: tl.constexpr,
                      LMAX: tl.constexpr, TARGET: tl.constexpr, GROUPS: tl.constexpr,
                      R: tl.constexpr, LOG_R: tl.constexpr, STAGES: tl.constexpr,
                      STRIDED: tl.constexpr, NSEG: tl.constexpr, SEGS: tl.constexpr,
                      FUSE: tl.constexpr, TWIN: tl.constexpr, PDL: tl.constexpr):
    # Program p covers R chunks: the only full read of the row. SEGS (grids that collect from
    # the threshold's segment list): per chunk it also stores the NSEG segment maxima. Rows
    # long enough (level >= LOG_R) fold the R chunks with an elementwise max (groups strided by
    # CHUNK), so the level reduction runs once per R chunks. STRIDED (``config.strided_fold``):
    # program p folds chunks p, p + n_p, ... instead of p R .. p R + R - 1, one chunk a load
    # (63 registers against 96: one wave), every row whatever its length; its groups are
    # those of one chunk at the level of the u programs holding data (``_strided_units``).
    # FUSE: the row's last program to finish (an atomic ticket) computes the threshold,
    # saving the separate threshold launch.
    if PDL:  # the logits and lengths are the previous kernel's; the workspace its last reader's
        _pdl_enter()
    row = tl.program_id(0)
    p = tl.program_id(1)
    _, len_e = _row_length(lengths_ptr, row, cols, 1)
    s = _level(len_e, TARGET, LMAX)
    # 16-byte loads whatever the stride's own divisibility: the hint stated on the product (on
    # the stride alone it does not carry: a stride of 8 mod 16 elements loaded 2 bytes a load)
    x_row = x_ptr + tl.multiple_of(row.to(tl.int64) * stride_x, 8)
    g_ptr = gmax_ptr + row.to(tl.int64) * stride_g
    s_row = smax_ptr + row.to(tl.int64) * stride_s
    if STRIDED:
        n_p, u, lvl = _strided_units(len_e, cols, CHUNK, R, TARGET, LMAX)
        if p < u:
            acc = _fold_strided(x_row, p, n_p, len_e, s_row, R, CHUNK, NSEG, SEGS, TWIN)
            _store_groups(tl.reshape(acc, [CHUNK // 2]), g_ptr, p, p * CHUNK, len_e, lvl,
                          CHUNK, LMAX, TWIN)
    elif s >= LOG_R:
        if p * (R * CHUNK) < len_e:
            if (p + 1) * (R * CHUNK) <= len_e:
                acc = _fold_span(x_row, p, len_e, s_row, R, STAGES, CHUNK, NSEG, False, SEGS,
                                 TWIN)
            else:
                acc = _fold_span(x_row, p, len_e, s_row, R, STAGES, CHUNK, NSEG, True, SEGS,
                                 TWIN)
            _store_groups(tl.reshape(acc, [CHUNK // 2]), g_ptr, p, p * (R * CHUNK), len_e,
                          s - LOG_R, CHUNK, LMAX, TWIN)
    else:
        for r in range(R):
            c = p * R + r
            if c * CHUNK < len_e:
                v = _one_chunk(x_row, c, len_e, s_row, CHUNK, NSEG, SEGS, TWIN)
                _store_groups(tl.reshape(v, [CHUNK // 2]), g_ptr, c, c * CHUNK, len_e, s, CHUNK,
                              LMAX, TWIN)
    if FUSE:
        # Every thread's maxima are stored before the ticket (CTA barrier, then the ticket's
        # acq_rel gpu-scope atomic publishes them); the last of the row's programs (every
        # program takes a ticket, past the length too) reads them all and re-arms the ticket.
        tl.debug_barrier()
        ticket = tl.atomic_add(tick_ptr + row, 1, sem="acq_rel", scope="gpu")
        if ticket == tl.num_programs(1) - 1:
            tl.store(tick_ptr + row, 0)
            tl.store(thr_ptr + row, _row_threshold(len_e, gmax_ptr, row, stride_g, cols, K, 0,
                                                   CHUNK, LMAX, TARGET, GROUPS, R, LOG_R,
                                                   STRIDED))
            tl.store(cnt_ptr + row, 0)


@triton.jit
def _threshold_kernel(lengths_ptr, gmax_ptr, thr_ptr, cnt_ptr, smax_ptr, list_ptr, rcnt_ptr,
                      stride_g, stride_s, stride_r, cols, K, CHUNK: tl.constexpr,
                      LMAX: tl.constexpr, TARGET: tl.constexpr, GROUPS: tl.constexpr,
                      R: tl.constexpr, LOG_R: tl.constexpr, STRIDED: tl.constexpr,
                      NSEG: tl.constexpr, RS: tl.constexpr, LIST: tl.constexpr,
                      P: tl.constexpr, PDL: tl.constexpr):
    """Grid (rows, regions): T0 of row ``program_id(0)`` (every program whose region holds
    segments of the row computes it; region 0 stores it and resets the candidate counter).
    LIST (folded grids), for a row of more than P chunks (``_listed``): program c also lists,
    ascending, the segments of its region [c * RS, (c + 1) * RS) whose maximum reaches T0, at
    the region's slice of the row's list, and their number (the collect pass's work; regions
    in parallel: one CTA a row scanning 8,192 segments took 8-12 µs).
    PDL: the length (written before the first kernel's wait, as the collect reads its
    logits) is read before this kernel's wait: after it, T0's loads go out at once."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    SEG: tl.constexpr = CHUNK // NSEG
    _, len_e = _row_length(lengths_ptr, row, cols, 1)
    if PDL:
        _pdl_enter()
    n_seg = (len_e + SEG - 1) // SEG
    listed = _listed(len_e, CHUNK, P) * LIST
    if (c == 0) | ((listed == 1) & (c * RS < n_seg)):  # regions past the length skip T0 too
        if LIST:  # issued before T0's loads (they do not depend on it): their L2 round trip
            i = c * RS + tl.arange(0, RS)  # overlaps T0's instead of following it
            smax = tl.load(smax_ptr + row.to(tl.int64) * stride_s + i,
                           mask=(i < n_seg) & (listed == 1), other=0)
        t0 = _row_threshold(len_e, gmax_ptr, row, stride_g, cols, K, listed, CHUNK, LMAX, TARGET,
                            GROUPS, R, LOG_R, STRIDED)
        if c == 0:
            tl.store(thr_ptr + row, t0)
            tl.store(cnt_ptr + row, 0)
        if LIST:
            if listed == 1:
                act = smax >= t0  # t0 >= 1
                pos = c * RS + tl.cumsum(act.to(tl.int32), axis=0) - 1
                tl.store(list_ptr + row.to(tl.int64) * stride_s + pos, i, mask=act)
                tl.store(rcnt_ptr + row.to(tl.int64) * stride_r + c,
                         tl.sum(act.to(tl.int32), axis=0))
    elif LIST:
        tl.store(rcnt_ptr + row.to(tl.int64) * stride_r + c, 0)


@triton.jit
def _region_prefix(rcnt_ptr, row, stride_r, n_reg, NR: tl.constexpr):
    """The row's active-segment count per region (``_threshold_kernel``), its exclusive
    prefix and the total."""
    r = tl.arange(0, NR)
    rc = tl.load(rcnt_ptr + row.to(tl.int64) * stride_r + r, mask=r < n_reg, other=0)
    return r, tl.cumsum(rc, axis=0) - rc, tl.sum(rc, axis=0)


@triton.jit
def _collect_kernel(x_ptr, lengths_ptr, thr_ptr, cnt_ptr, list_ptr, rcnt_ptr, cbuf_ptr, cc_ptr,
                    stride_x, stride_s, stride_r, stride_b, stride_cc, cols, n_reg,
                    CHUNK: tl.constexpr, NSEG: tl.constexpr, CAP: tl.constexpr,
                    LIST: tl.constexpr, P: tl.constexpr, RS: tl.constexpr, NR: tl.constexpr,
                    ROW_PTX: tl.constexpr, PDL: tl.constexpr):
    # Appends the row's elements >= T0 to its buffer in units ("spans") of NSEG segments of
    # SEG elements: each candidate is written with its span (cbuf bits 52..) and its rank inside
    # the span (cbuf bits 17..), and each span's count goes to cc, so the buffer order the
    # atomics give never matters to the select. One load and ONE atomic a span.
    # LIST == 0 (small grids: latency-bound, the row in L2): program = one chunk, all of it;
    #   so on folded grids (LIST == 1) for a row of at most P chunks (``_listed``).
    # LIST == 1, a longer row: the P programs of a row take spans q = p, p + P, ... of the
    #   row's list of segments whose maximum reaches T0 (~730 of a random 1M row's 8,192 at
    #   k = 512: a few % of the row is re-read), the list being the regions' lists one after
    #   the other; usually one span a program, so nothing waits on a chain. More than CAP
    #   listed segments (each holds a candidate) is an overflow: nothing is collected, the
    #   select's exact fallback runs.
    # PDL: the logits and lengths (written before the first kernel's wait) are read before
    # this kernel's wait, on small grids while the threshold still runs; T0 and the rest after.
    if PDL:
        gdc_launch_dependents()
    row = tl.program_id(0)
    p = tl.program_id(1)
    _, len_e = _row_length(lengths_ptr, row, cols, 1)
    x_row = x_ptr + tl.multiple_of(row.to(tl.int64) * stride_x, 8)
    cb_ptr = cbuf_ptr + row.to(tl.int64) * stride_b
    cc_row = cc_ptr + row.to(tl.int64) * stride_cc
    # The whole chunk as [CHUNK / 8, 8] (8 consecutive elements a thread: the in-row count and
    # scan stay in the thread; round 2's layout, measured faster than [16, 128] at 1-24 rows x
    # 64K), loaded before T0 arrives, masked by the length (read before the wait, as the
    # chunk: the two round trips fit in the wait) and only for rows collected by chunk.
    # Programs with nothing to collect (past the length: a listed row has more than P chunks,
    # so none of its P programs is) leave before the wait: on two-wave grids their slots go to
    # the rest at once. Program 0 always waits, so this kernel ends after the threshold has,
    # and whatever waits on it waits on the whole chain.
    if not PDL:
        t0 = tl.load(thr_ptr + row)
    e0 = p * CHUNK + tl.arange(0, CHUNK // 8) * 8  # each row's first column
    e = e0[:, None] + tl.arange(0, 8)[None, :]
    n_in = tl.minimum(tl.maximum(len_e - e0, 0), 8)
    listed = len_e * 0
    if LIST:
        listed = _listed(len_e, CHUNK, P)
    u = tl.load(x_row + e, mask=((e // 8) * 8 < len_e) & (listed == 0), other=0)
    if (p * CHUNK < len_e) | (p == 0):
        if PDL:
            gdc_wait()
            t0 = tl.load(thr_ptr + row)
        if LIST:
            # issued with T0's load, whatever the row (their round trip overlaps T0's)
            r, pre, n_act = _region_prefix(rcnt_ptr, row, stride_r, n_reg, NR)
            if listed == 1:
                _collect_listed(x_row, len_e, p, t0, cnt_ptr + row,
                                list_ptr + row.to(tl.int64) * stride_s, r, pre, n_act, cb_ptr,
                                cc_row, CHUNK, NSEG, CAP, P, RS, NR, ROW_PTX)
            else:
                _collect_span(u, e0, n_in, p, t0, cnt_ptr + row, cb_ptr, cc_row, CAP, ROW_PTX)
        else:
            _collect_span(u, e0, n_in, p, t0, cnt_ptr + row, cb_ptr, cc_row, CAP, ROW_PTX)


@triton.jit
def _collect_listed(x_row, len_e, p, t0, cnt_ptr, l_row, r, pre, n_act, cb_ptr, cc_row,
                    CHUNK: tl.constexpr, NSEG: tl.constexpr, CAP: tl.constexpr,
                    P: tl.constexpr, RS: tl.constexpr, NR: tl.constexpr,
                    ROW_PTX: tl.constexpr):
    """Program p of a listed row: spans q = p, p + P, ... of NSEG places of the row's list of
    segments (the regions' lists one after the other; ``r``, ``pre``, ``n_act``:
    ``_region_prefix``)."""
    SEG: tl.constexpr = CHUNK // NSEG
    n_spans = tl.where(n_act <= CAP, (n_act + NSEG - 1) // NSEG, 0)
    if (p == 0) & (n_act > CAP):
        tl.store(cnt_ptr, CAP + 1)
    # The span as [CHUNK / 8, 8], 8 consecutive elements a thread, as the chunk path: one
    # 16-byte load and an in-thread count and scan (the [NSEG, SEG] tile loaded 2 bytes an
    # element and converted layouts through shared memory: 1,001 instructions a thread a span
    # against 591, sm_90a). Each 8-element row finds its own segment.
    t = tl.arange(0, CHUNK // 8)
    # the regions' prefixes (< 2**14, NR <= 4) packed in one scalar: a [rows, NR] search
    # reduced across lanes (34 shuffles a span at NR = 4)
    tl.static_assert(NR <= 4)
    pk = tl.sum(pre.to(tl.int64) << (16 * r).to(tl.int64), axis=0)
    q = p
    while q < n_spans:  # (a while: the interpreter cannot range over a tensor)
        u, e0, n_in = _span_load(x_row, len_e, l_row, pk, q, t, n_act, NSEG, SEG, RS, NR)
        _collect_span(u, e0, n_in, q, t0, cnt_ptr, cb_ptr, cc_row, CAP, ROW_PTX)
        q += P


@triton.jit
def _span_load(x_row, len_e, l_row, pk, q, t, n_act, NSEG: tl.constexpr, SEG: tl.constexpr,
               RS: tl.constexpr, NR: tl.constexpr):
    """Span q of a listed row as ``_collect_span`` takes it: its list places' segments (region
    prefixes packed in ``pk``), their elements ``u`` [CHUNK / 8, 8] (8 a thread row
    ``t``), each thread row's first column ``e0`` and elements inside the length ``n_in``;
    places past the list (``n_act``) load nothing."""
    g = q * NSEG + t // (SEG // 8)  # places in the row's list
    ok = g < n_act
    # region c of place g: the last one whose prefix is <= g (prefixes never decrease)
    c = tl.zeros_like(g)
    base = tl.zeros_like(g)
    for j in tl.static_range(1, NR):
        pj = ((pk >> (16 * j)) & 0xFFFF).to(tl.int32)
        c += (pj <= g).to(tl.int32)
        base = tl.where(pj <= g, pj, base)
    seg = tl.load(l_row + c * RS + g - base, mask=ok, other=0)
    e0 = tl.multiple_of(seg * SEG + (t % (SEG // 8)) * 8, 8)
    e = e0[:, None] + tl.arange(0, 8)[None, :]
    u = tl.load(x_row + e, mask=ok[:, None] & ((e // 8) * 8 < len_e), other=0)
    return u, e0, tl.where(ok, tl.minimum(tl.maximum(len_e - e0, 0), 8), 0)


@triton.jit
def _at_least_t0(u, valid, t0):
    """Elements (int16 bf16 bits ``u``, ``valid``) whose key1 is >= ``t0``, by one unordered
    compare against a value instead of the key transform: keys order as values, so key1 >= t0
    is x > v, v the value of the largest key below T0's that a value takes (-0 has none: it is
    +0's), and ``~(x <= v)`` puts NaN on top. Clamped: above +inf's key only NaN passes
    (v = +inf); at or below -inf's, all pass (v is a NaN).
    Session 21 (run 8, the compare x >= T0's value): -0.6 to -1.6 µs at 12-64 x 256K-1M all
    valid, +0.17 at 6 x 64K all; session 22: one compare, not two and a select."""
    k = tl.minimum(tl.maximum(t0 - 2, 0), 0xFF80)  # t0 - 1 is T0's key; 0xFF80 is +inf's
    k = tl.where(k == 0x7FFF, 0x7FFE, k)  # -0's pattern: below +0 is the largest negative
    bits = tl.where(k >= 0x8000, k - 0x8000, 0xFFFF - k)
    # compared in fp32, both sides made by bit shifts (sm_90a: a shift or a byte permute and
    # one setp, no .ftz); the interpreter orders bf16 compares by raw bits and flushes the
    # subnormals of a bf16 -> fp32 convert
    v = (bits << 16).to(tl.float32, bitcast=True)
    x = (u.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return ~(x <= v) & valid


@triton.jit
def _collect_span(u, e0, n_in, q, t0, cnt_ptr, cb_ptr, cc_row, CAP: tl.constexpr,
                  ROW_PTX: tl.constexpr):
    """Span q = rows of 8 elements (bf16 bits ``u`` [R, 8]; row r holds columns e0[r] ..
    e0[r] + 7, of which the first ``n_in[r]`` are inside the length): append those whose key1
    is >= t0, each with its rank inside the span and its bf16 bits (the select takes the key
    of its few candidates); store ``count | base << 16`` at ``cc_row + q`` (base: the span's
    first buffer slot, its candidates follow in rank order; counts < 2**16).

    ``ROW_PTX`` (sm_90+, session 27): each row's candidates as a bit mask
    (``_row_candidates``: one packed bf16x2 compare a word) and the stores by ``_store_rows``
    (inline PTX), which loops over a row's set bits only: an element that is not a candidate
    (all but about 1 in 40 of a random 64K row at k = 512, 1 in 600 of a 1M row) costs no
    address, packing or store.
    Otherwise (the interpreter, older GPUs: ``set.bf16x2`` needs sm_90, and grids below
    ``config.ROW_PTX_PROGRAMS``, whose few busy programs wait on latency, not on issue) the
    same selection elementwise (``_at_least_t0``, a rank by scans, masked stores)."""
    R: tl.constexpr = u.shape[0]
    j = tl.arange(0, 8)[None, :]
    if not ROW_PTX:
        cand = _at_least_t0(u, j < n_in[:, None], t0)
        n_a = tl.sum(cand.to(tl.int32), axis=1)
    else:
        lo16, hi16 = tl.split(tl.reshape(u, [R, 4, 2]))
        w = (hi16.to(tl.int32) << 16) | (lo16.to(tl.int32) & 0xFFFF)  # element 2i low
        bits = _row_candidates(w, t0) & ((1 << n_in) - 1)
        n_a = tl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [bits], dtype=tl.int32,
                                        is_pure=True, pack=1)
    n_q = tl.sum(n_a, axis=0)
    cc = n_q
    if n_q > 0:
        # relaxed: only the count must be atomic (the select runs after a kernel boundary)
        base = tl.atomic_add(cnt_ptr, n_q, sem="relaxed")
        cc = n_q | (tl.minimum(base, 32767) << 16)  # the base beside the count: see the select
        pre = tl.cumsum(n_a, axis=0) - n_a  # the span's candidates before each row
        if not ROW_PTX:
            rank = pre[:, None] + tl.cumsum(cand.to(tl.int32), axis=1) - 1
            pos = base + rank
            # one 8-byte store a candidate (against two 4-byte ones: -0.35 to -2.7 µs, s. 22)
            lo = (rank << RANK_SHIFT) | (u.to(tl.int32) & 0xFFFF)
            hi = (q << COL_BITS) | (e0[:, None] + j)
            lo64 = lo.to(tl.uint32, bitcast=True).to(tl.int64)  # zero-extended: no sign word
            tl.store(cb_ptr + pos, (hi.to(tl.int64) << 32) | lo64, mask=cand & (pos < CAP))
        else:
            _store_rows(bits, pre, base, w, (q << COL_BITS) | e0, cb_ptr, CAP)
    tl.store(cc_row + q, cc)


@triton.jit
def _row_candidates(w, t0):
    """[R] bit masks: bit j set when element j of the row (words ``w`` [R, 4] of two bf16,
    element 2i in word i's low half) has key1 >= t0. ``_at_least_t0``'s compare ``~(x <= v)``
    as one ``set.gtu.bf16x2`` a word (greater or unordered: NaN passes; a bf16 compare, so
    subnormals are compared as they are, as in the fp32 form)."""
    k = tl.minimum(tl.maximum(t0 - 2, 0), 0xFF80)  # as _at_least_t0
    k = tl.where(k == 0x7FFF, 0x7FFE, k)
    v = tl.where(k >= 0x8000, k - 0x8000, 0xFFFF - k)
    b2 = tl.inline_asm_elementwise(
        "{ .reg .b32 %d, %t; set.gtu.u32.bf16x2 %d, $1, $2; and.b32 $0, %d, 1; "
        "shr.u32 %t, %d, 15; and.b32 %t, %t, 2; or.b32 $0, $0, %t; }",
        "=r,r,r", [w, w * 0 + ((v << 16) | v)], dtype=tl.int32, is_pure=True, pack=1)
    return tl.sum(b2 << (2 * tl.arange(0, 4)[None, :]), axis=1)


@triton.jit
def _store_rows(bits, pre, base, w, qe0, cb_ptr, CAP: tl.constexpr):
    """The buffer entries of the rows' candidates (``bits`` [R]): a loop over each row's set
    bits in inline PTX, candidate j at slot base + pre + (its rank in the row) if below CAP,
    ``rank << RANK_SHIFT | bits`` and ``qe0 + j`` (= q << COL_BITS | its column) in one
    8-byte store, as ``_collect_span``'s elementwise form writes them."""
    wa, wb = tl.split(tl.reshape(w, [w.shape[0], 2, 2]))
    w0, w2 = tl.split(wa)
    w1, w3 = tl.split(wb)
    z = bits * 0
    tl.inline_asm_elementwise(
        ROW_STORE, "=r,r,r,r,r,r,r,r,r,l,r",
        [bits, pre, z + base, w0, w1, w2, w3, qe0, z.to(tl.int64) + cb_ptr.to(tl.int64),
         z + CAP], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _select_tile(packed, pk, n, cc, t0, sc_ptr, o_ptr, K, SIZE: tl.constexpr):
    """Exact top-K of the row's candidates (``packed`` / ``pk``: the low and high words of the
    buffer entries, the first ``n`` live, every key1 >= ``t0``; ``cc``: ``count | base << 16``
    per span), written in ascending index order.

    tau = the K-th largest key1 (``_kth_above``). The kept candidates are then placed in index
    order, independent of the order the atomics gave the buffer. Tiles of at most 2,048 slots
    (``_place_onchip``): by prefix sums and gathers in registers. Larger tiles (k = 512's
    4,096-slot tile spilled that way; k = 2,048 measured 0.3-0.5 µs slower): the candidates
    are permuted into index order (span prefix + rank inside the span) through global scratch
    (Triton has no register scatter), where ``_write_kept`` keeps the ties at tau lowest index
    first.
    """
    i = tl.arange(0, SIZE)
    m = i < n
    key1 = _key1(packed & 0xFFFF)
    idx = pk & COL_MASK
    # tau 0 when n < K: every candidate is kept; need: the ties at tau to keep, lowest first
    tau, need = _kth_above(key1, m, n, t0, K, SIZE <= 4096)
    gt = m & (key1 > tau)
    if SIZE <= 2048:
        _place_onchip(gt, m & (key1 == tau), need, idx, packed >> RANK_SHIFT, pk >> COL_BITS,
                      cc, n, o_ptr, K)
    else:
        cnt = cc & 0xFFFF
        pre = tl.cumsum(cnt, axis=0) - cnt
        order = tl.gather(pre, tl.where(m, pk >> COL_BITS, 0), 0) + (packed >> RANK_SHIFT)
        flag = tl.where(gt, 2, tl.where(key1 == tau, 1, 0))
        tl.store(sc_ptr + order, (flag << TIE_SHIFT) | idx, mask=m)
        tl.debug_barrier()  # global scratch written and read back by other threads of this CTA
        v = tl.load(sc_ptr + i, mask=m, other=0)  # the candidates in index order
        _write_kept((v >> TIE_SHIFT) == 2, (v >> TIE_SHIFT) == 1, need, v & COL_MASK, n, o_ptr,
                    K)


@triton.jit
def _place_onchip(gt, tie, need, idx, rank, span, cc, n, o_ptr, K):
    """``_write_kept`` for candidates in buffer order, unpermuted: a span's candidates sit
    contiguous in rank order (its base in ``cc``), so the kept before one in index order are
    those before it in its span plus those of the spans before, both from one prefix sum over
    the buffer (``gt | ties << 16``), gathered at span starts and ends. Session 21: -0.09 to
    -0.57 µs a call at k = 512 against the scratch permutation (16 of 18 cells)."""
    i = tl.arange(0, gt.shape[0])
    m = i < n
    w = gt.to(tl.int32) + (tie.to(tl.int32) << 16)
    c = tl.cumsum(w, axis=0)
    cx = c - w
    inner = cx - tl.gather(cx, tl.where(m, i - rank, 0), 0)  # ahead of it in its span
    # spans past the length hold stale words (not stored this call; garbage before the first
    # call): only spans inside the n live slots count, which also keeps every gather index in
    # the tile (a stale span could only be followed by more past the length)
    cnt = cc & 0xFFFF
    first = cc >> 16
    live = (cnt > 0) & (first >= 0) & (first + cnt <= n)
    first = tl.where(live, first, 0)
    last = first + tl.where(live, cnt, 1) - 1
    tot = tl.where(live, tl.gather(c, last, 0) - tl.gather(cx, first, 0), 0)
    before = tl.gather(tl.cumsum(tot, axis=0) - tot, tl.where(m, span, 0), 0) + inner
    _store_kept(gt, tie, need, before, idx, n, o_ptr, K)


@triton.jit
def _select_loaded(b_ptr, n, cc, t0, sc_ptr, o_ptr, K, SIZE: tl.constexpr):
    """``_select_tile`` on the row's first ``n`` buffer entries (``b_ptr``) as a SIZE tile."""
    c = tl.arange(0, SIZE)
    w = tl.load(b_ptr + c, mask=c < n, other=0)
    _select_tile(w.to(tl.int32), (w >> 32).to(tl.int32), n, cc, t0, sc_ptr, o_ptr, K, SIZE)


@triton.jit
def _select_kernel(x_ptr, lengths_ptr, thr_ptr, cnt_ptr, cbuf_ptr, cc_ptr, sc_ptr,
                   rcnt_ptr, out_ptr, stride_x, stride_b, stride_cc, stride_r, stride_o, cols,
                   n_chunks, n_reg, K, NCH: tl.constexpr, NSEG: tl.constexpr, LIST: tl.constexpr,
                   NR: tl.constexpr, CHUNK: tl.constexpr, P: tl.constexpr,
                   SMALL: tl.constexpr, MID: tl.constexpr, CAP: tl.constexpr,
                   SCAN: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        _pdl_enter()
    row = tl.program_id(0)
    b_off = row.to(tl.int64) * stride_b
    o_ptr = out_ptr + row.to(tl.int64) * stride_o
    # The count, T0, the span counts and the first SMALL buffer entries load together
    # (entries past the count are stale and masked off afterwards): one memory round trip.
    n = tl.load(cnt_ptr + row)
    t0 = tl.load(thr_ptr + row)
    n_spans = n_chunks + 0 * n  # a span a chunk (spans past the length have no candidates)
    if LIST:  # a listed row: spans of NSEG listed segments (both loads issued together)
        _, len_e = _row_length(lengths_ptr, row, cols, 1)
        _, _, n_act = _region_prefix(rcnt_ptr, row, stride_r, n_reg, NR)
        n_spans = tl.where(_listed(len_e, CHUNK, P) == 1, (n_act + NSEG - 1) // NSEG, n_spans)
    j = tl.arange(0, NCH)
    cc = tl.load(cc_ptr + row.to(tl.int64) * stride_cc + j, mask=j < n_spans, other=0)
    i = tl.arange(0, SMALL)
    v = tl.load(cbuf_ptr + b_off + i)
    if n <= SMALL:
        _select_tile(v.to(tl.int32), (v >> 32).to(tl.int32), n, cc, t0, sc_ptr + b_off, o_ptr, K,
                     SMALL)
    elif n <= CAP:
        # a row past SMALL takes the smallest tile that holds it: 2 x SMALL slots are still
        # placed on chip at k = 512, where the 4,096-slot tile goes through global scratch
        # (session 23: one such row of 1,058 candidates held 64 x 512K 1/8 for 16,500 cycles)
        if MID < CAP:
            if n <= MID:
                _select_loaded(cbuf_ptr + b_off, n, cc, t0, sc_ptr + b_off, o_ptr, K, MID)
            else:
                _select_loaded(cbuf_ptr + b_off, n, cc, t0, sc_ptr + b_off, o_ptr, K, CAP)
        else:
            _select_loaded(cbuf_ptr + b_off, n, cc, t0, sc_ptr + b_off, o_ptr, K, CAP)
    else:
        x_row = x_ptr + tl.multiple_of(row.to(tl.int64) * stride_x, 8)
        _exact_fallback(x_row, lengths_ptr, row, cols, o_ptr, K, SCAN)


def launch(x16, lengths, out, ws, cfg, k: int, fuse: bool = False, pdl: bool = True) -> None:
    """Run the kernels. ``x16``: the bf16 logits viewed as int16 [rows, cols].

    Four launches by default. ``fuse=True`` (the default until session 10, kept for the
    benchmark's comparison): for k <= 512 on unfolded grids (R = 1) the threshold runs in the
    last group-maxima program of each row, three launches. With the launches dependent
    (``pdl``) the separate threshold launch costs less than the fused ticket chain: session 10,
    same run, the four launches were faster in 12 of the 16 k = 512 cells the fusion took
    (1 x 1M all 13.17 -> 11.30 us, 1 x 64K 1/8 11.19 -> 10.04; slower at most +0.40, 6 x 64K
    1/8). Per-kernel times: ``bench topk --kernels`` (profiler).

    ``pdl`` (default; used on sm_90+ only): every kernel is a programmatic dependent launch
    (``_pdl_enter``): its launch overlaps the tail of the kernel before it, the first one's
    included (whatever precedes the call in the stream); ``pdl=False`` is the plain launches,
    kept for the benchmark's comparison.
    """
    rows, cols = x16.shape
    n_chunks = triton.cdiv(cols, cfg.chunk)
    log_r = span_log2(rows, n_chunks)
    # measured (H200, bec0572): fused cost up to 7.4 us at k = 2048 (13 of 16 cells slower:
    # the 8,192-slot tile in the last CTA), so k <= 512 only
    fuse = fuse and log_r == 0 and k <= 512
    pdl = pdl and pdl_capable(x16.device)
    dep = dict(PDL=pdl, **({"launch_pdl": True} if pdl else {}))
    lst = listed(rows, n_chunks)  # large grids collect from segment lists
    nseg = cfg.nseg if lst else NSEG  # segments a chunk (only listed grids store them)
    lp = list_programs(rows, k)
    common = dict(CHUNK=cfg.chunk)
    spans = dict(LMAX=cfg.lmax, TARGET=cfg.target, GROUPS=cfg.groups, R=1 << log_r, LOG_R=log_r,
                 STRIDED=strided_fold(rows, n_chunks, k))
    _group_max_kernel[(rows, triton.cdiv(n_chunks, 1 << log_r))](
        x16, lengths, ws.gmax, ws.smax, ws.thr, ws.cnt, ws.tick, x16.stride(0),
        ws.gmax.stride(0), ws.smax.stride(0), cols, k,
        STAGES=fold_stages(rows, n_chunks, log_r, k),
        maxnreg=FOLD2_MAXNREG if log_r == 1 and k <= 512 else None,  # one wave at 1,536
        NSEG=nseg, SEGS=lst, FUSE=fuse, TWIN=not x16.is_cuda, num_warps=WARPS["group_max"],
        **spans, **common, **dep)
    rs = LIST_REGION * nseg // NSEG  # a region covers the same chunks whatever the segments
    n_reg = triton.cdiv(n_chunks * nseg, rs) if lst else 1
    regions = dict(stride_r=ws.rcnt.stride(0), n_reg=n_reg, NR=triton.next_power_of_2(n_reg))
    if not fuse:
        _threshold_kernel[(rows, n_reg)](
            lengths, ws.gmax, ws.thr, ws.cnt, ws.smax, ws.seglist, ws.rcnt, ws.gmax.stride(0),
            ws.smax.stride(0), ws.rcnt.stride(0), cols, k, NSEG=nseg, RS=rs, LIST=lst, P=lp,
            num_warps=WARPS["threshold"], **spans, **common, **dep)
    _collect_kernel[(rows, lp if lst else n_chunks)](
        x16, lengths, ws.thr, ws.cnt, ws.seglist, ws.rcnt, ws.cbuf, ws.cc,
        stride_x=x16.stride(0), stride_s=ws.smax.stride(0), stride_b=ws.cbuf.stride(0),
        stride_cc=ws.cc.stride(0), cols=cols, NSEG=nseg, CAP=cfg.cap, LIST=lst,
        P=lp if lst else n_chunks, RS=rs,
        ROW_PTX=pdl_capable(x16.device) and row_ptx(rows, n_chunks),
        num_warps=WARPS["collect"],
        maxnreg=COLLECT_MAXNREG, **regions, **common, **dep)
    # the span counts the select scans: a chunk each on small grids; on folded ones up to
    # list_programs chunks or cap / nseg listed spans (more listed segments than cap is an
    # overflow, where the fallback runs); not cfg.max_chunks whatever the row (session 20)
    nch = triton.next_power_of_2(max(lp, cfg.cap // nseg) if lst else n_chunks)
    _select_kernel[(rows,)](
        x16, lengths, ws.thr, ws.cnt, ws.cbuf, ws.cc, ws.scratch, ws.rcnt, out,
        stride_x=x16.stride(0), stride_b=ws.cbuf.stride(0), stride_cc=ws.cc.stride(0),
        stride_o=out.stride(0), cols=cols, n_chunks=n_chunks, K=k, NCH=nch,
        NSEG=nseg, LIST=lst, P=lp, SMALL=cfg.small, MID=min(2 * cfg.small, cfg.cap), CAP=cfg.cap,
        SCAN=2048,
        num_warps=WARPS["select"], **regions, **common, **dep)
