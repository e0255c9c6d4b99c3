"""The fold of ``decode_topk``'s first launch (private): helpers of ``_triton._group_max_kernel``
that read a row's chunks as words of two bf16, fold them elementwise (``_fold_span``,
``_fold_strided``), store each chunk's segment maxima on listed grids and the maxima of the
strided groups at the row's level (``_store_groups``). Split from ``_triton.py``, which also
reads ``_level`` and ``_strided_units`` for the threshold. The design and its measurements:
docs/kernels/topk.md."""

from __future__ import annotations

import triton
import triton.language as tl

from ._words import NEG_WORD, _key1, _mask_words, _wmax, _wmax2, _word_key1


@triton.jit
def _level(len_e, TARGET: tl.constexpr, LMAX: tl.constexpr):
    """Group level: the largest l <= LMAX with len_e >= TARGET * 2**l (0 if none)."""
    s = len_e * 0
    for l in tl.static_range(1, LMAX + 1):
        s += (len_e >= (TARGET << l)).to(tl.int32)
    return s


@triton.jit
def _chunk_words(x_row, c, len_e, CHUNK: tl.constexpr, NSEG: tl.constexpr,
                 MASKED: tl.constexpr):
    """Chunk c as a [1, NSEG, CHUNK / NSEG / 2] tile of words (a segment a row; the leading
    axis of one is the layout every caller was measured with), -inf in the halves past the
    length (MASKED; unmasked spans skip the per-column masks)."""
    W: tl.constexpr = CHUNK // NSEG // 2
    w = ((c + tl.arange(0, 1))[:, None, None] * (CHUNK // 2)
         + tl.arange(0, NSEG)[None, :, None] * W + tl.arange(0, W)[None, None, :])
    return _load_words(x_row, w, len_e, MASKED)


@triton.jit
def _load_words(x_row, w, len_e, MASKED: tl.constexpr):
    """The row's words w, -inf in the halves past the length (MASKED: per 8 columns, 16-byte
    vectors, then per column)."""
    x32 = x_row.to(tl.pointer_type(tl.int32))
    if MASKED:
        u = _mask_words(w, tl.load(x32 + w, mask=(w // 4) * 8 < len_e, other=0), len_e)
    else:
        u = tl.load(x32 + w)
    return u


@triton.jit
def _chunk_half(x_row, c, h, len_e, CHUNK: tl.constexpr, NSEG: tl.constexpr,
                MASKED: tl.constexpr):
    """Half h (0, 1) of every segment of chunk c: a [NSEG, W / 2] tile of words (W = CHUNK /
    NSEG / 2). The two halves are separate tiles of one layout, so a thread holds the same
    words of both: a segment's maximum is one elementwise maximum, then half as many lanes as
    a ``_chunk_words`` tile's (one value a thread, one shuffle level fewer); ``_halves_words``
    puts the words back in order."""
    H: tl.constexpr = CHUNK // NSEG // 4
    w = (c * (CHUNK // 2) + h * H + tl.arange(0, NSEG)[:, None] * (2 * H)
         + tl.arange(0, H)[None, :])
    return _load_words(x_row, w, len_e, MASKED)


@triton.jit
def _halves_words(a, b):
    """Two ``_chunk_half`` tiles (halves 0 and 1) as one [NSEG, W] tile of words in row order."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), [a.shape[0], 2 * a.shape[1]])


@triton.jit
def _store_segments(v, s_row, c0, len_e, CHUNK: tl.constexpr, NSEG: tl.constexpr,
                    TWIN: tl.constexpr):
    """key1 maxima of the contiguous segments of ``v`` (``_chunk_words`` of chunks c0..; 0 for
    segments past the length): the collect pass re-reads only segments whose maximum reaches
    the threshold."""
    NCH: tl.constexpr = v.shape[0]
    i = (c0 + tl.arange(0, NCH))[:, None] * NSEG + tl.arange(0, NSEG)[None, :]
    k = _word_key1(_wmax(v, 2, TWIN), TWIN)
    tl.store(s_row + i, tl.where(i * (CHUNK // NSEG) < len_e, k, 0))


@triton.jit
def _store_halves(v0, v1, s_row, c, len_e, CHUNK: tl.constexpr, NSEG: tl.constexpr,
                  INLINE: tl.constexpr, TWIN: tl.constexpr):
    """``_store_segments`` of chunk c from its two ``_chunk_half`` tiles. INLINE (sm_90+, the
    pipelined fold: H200, session 35, -0.1 to -0.45 µs at 24-64 x 1M; in the unpipelined fold
    -0.2 / +0.7 µs at 64 / 48 x 256K on an H100) stores from the reduction's own lanes."""
    i = c * NSEG + tl.arange(0, NSEG)
    k = _word_key1(_wmax(_wmax2(v0, v1, TWIN), 1, TWIN), TWIN)
    k = tl.where(i * (CHUNK // NSEG) < len_e, k, 0)
    if not INLINE:
        tl.store(s_row + i, k)
    else:  # from every lane holding it (the same value, one address): tl.store would first
        # move the reduction's result through shared memory, behind a CTA barrier
        tl.inline_asm_elementwise("st.global.b32 [$1], $2; mov.b32 $0, 0;", "=r,l,r",
                                  [s_row + i, k], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _fold_span(x_row, p, len_e, s_row, R: tl.constexpr, STAGES: tl.constexpr,
               CHUNK: tl.constexpr, NSEG: tl.constexpr, MASKED: tl.constexpr,
               SEGS: tl.constexpr, TWIN: tl.constexpr):
    """Elementwise maximum of the R chunks of span p ([NSEG, CHUNK / NSEG / 2] words), storing
    each chunk's segment maxima on the way. STAGES > 1: a chunk an iteration,
    software-pipelined (``cp.async`` to shared memory, STAGES - 1 chunks in flight at no
    register cost), for busy grids; STAGES == 1: two chunks an iteration, both loads in
    flight, no pipeline (``config.FOLD_STAGES`` says where each wins), or the one chunk at
    R = 1. Separate tiles of one layout fold elementwise (as one [2, ...] tile their axis fell
    across lanes: shuffles). At R >= 4 a chunk of segments of at least 128 columns is loaded
    as the two tiles of its segments' halves (``_chunk_half``): H200, session 35, -0.3 to -1.0
    µs at k = 512 on 256K-1M rows; not at R = 2 (the halves' order made the group maxima
    cost more and spilled under ``FOLD2_MAXNREG``) nor on segments of 64 columns (k = 2,048:
    +2 µs at 48-64 x 1M, half-line tiles)."""
    W: tl.constexpr = CHUNK // NSEG // 2
    if R >= 4 and CHUNK // NSEG >= 128:  # segments' halves
        acc0 = tl.full([NSEG, W // 2], NEG_WORD, tl.int32)
        acc1 = tl.full([NSEG, W // 2], NEG_WORD, tl.int32)
        if STAGES > 1:
            for r in tl.range(0, R, num_stages=STAGES):
                v0 = _chunk_half(x_row, p * R + r, 0, len_e, CHUNK, NSEG, MASKED)
                v1 = _chunk_half(x_row, p * R + r, 1, len_e, CHUNK, NSEG, MASKED)
                if SEGS:
                    _store_halves(v0, v1, s_row, p * R + r, len_e, CHUNK, NSEG, not TWIN, TWIN)
                acc0 = _wmax2(acc0, v0, TWIN)
                acc1 = _wmax2(acc1, v1, TWIN)
        else:
            for r in range(0, R, 2):
                a0 = _chunk_half(x_row, p * R + r, 0, len_e, CHUNK, NSEG, MASKED)
                a1 = _chunk_half(x_row, p * R + r, 1, len_e, CHUNK, NSEG, MASKED)
                b0 = _chunk_half(x_row, p * R + r + 1, 0, len_e, CHUNK, NSEG, MASKED)
                b1 = _chunk_half(x_row, p * R + r + 1, 1, len_e, CHUNK, NSEG, MASKED)
                if SEGS:
                    _store_halves(a0, a1, s_row, p * R + r, len_e, CHUNK, NSEG, False, TWIN)
                    _store_halves(b0, b1, s_row, p * R + r + 1, len_e, CHUNK, NSEG, False, TWIN)
                acc0 = _wmax2(acc0, _wmax2(a0, b0, TWIN), TWIN)
                acc1 = _wmax2(acc1, _wmax2(a1, b1, TWIN), TWIN)
        acc = _halves_words(acc0, acc1)
    else:  # whole chunks
        acc = tl.full([NSEG, W], NEG_WORD, tl.int32)
        if STAGES > 1:
            for r in tl.range(0, R, num_stages=STAGES):
                v = _chunk_words(x_row, p * R + r, len_e, CHUNK, NSEG, MASKED)
                if SEGS:
                    _store_segments(v, s_row, p * R + r, len_e, CHUNK, NSEG, TWIN)
                acc = _wmax2(acc, tl.reshape(v, [NSEG, W]), TWIN)
        elif R == 1:  # unfolded grids' rows long enough for the level (LOG_R = 0)
            v = _chunk_words(x_row, p, len_e, CHUNK, NSEG, MASKED)
            if SEGS:
                _store_segments(v, s_row, p, len_e, CHUNK, NSEG, TWIN)
            acc = tl.reshape(v, [NSEG, W])
        else:
            for r in range(0, R, 2):
                va = _chunk_words(x_row, p * R + r, len_e, CHUNK, NSEG, MASKED)
                vb = _chunk_words(x_row, p * R + r + 1, len_e, CHUNK, NSEG, MASKED)
                if SEGS:
                    _store_segments(va, s_row, p * R + r, len_e, CHUNK, NSEG, TWIN)
                    _store_segments(vb, s_row, p * R + r + 1, len_e, CHUNK, NSEG, TWIN)
                v = _wmax2(tl.reshape(va, [NSEG, W]), tl.reshape(vb, [NSEG, W]), TWIN)
                acc = _wmax2(acc, v, TWIN)
    return acc


@triton.jit
def _fold_strided(x_row, p, n_p, len_e, s_row, R: tl.constexpr, CHUNK: tl.constexpr,
                  NSEG: tl.constexpr, SEGS: tl.constexpr, TWIN: tl.constexpr):
    """Elementwise maximum of chunks p, p + n_p, ... (R of them, those inside the length) of
    a strided-fold program, one chunk a load, storing each chunk's segment maxima on the way:
    ``[NSEG, CHUNK / NSEG / 2]`` words."""
    acc = tl.full([NSEG, CHUNK // NSEG // 2], NEG_WORD, tl.int32)
    for r in range(R):
        c = p + r * n_p
        if c * CHUNK < len_e:
            v = _one_chunk(x_row, c, len_e, s_row, CHUNK, NSEG, SEGS, TWIN)
            acc = _wmax2(acc, _wmax(v, 0, TWIN), TWIN)
    return acc


@triton.jit
def _one_chunk(x_row, c, len_e, s_row, CHUNK: tl.constexpr, NSEG: tl.constexpr,
               SEGS: tl.constexpr, TWIN: tl.constexpr):
    """Chunk c's words (``_chunk_words``; masked only where the length cuts it), its segment
    maxima stored when SEGS."""
    if (c + 1) * CHUNK <= len_e:
        v = _chunk_words(x_row, c, len_e, CHUNK, NSEG, False)
    else:
        v = _chunk_words(x_row, c, len_e, CHUNK, NSEG, True)
    if SEGS:
        _store_segments(v, s_row, c, len_e, CHUNK, NSEG, TWIN)
    return v


@triton.jit
def _strided_units(len_e, cols, CHUNK: tl.constexpr, R: tl.constexpr, TARGET: tl.constexpr,
                   LMAX: tl.constexpr):
    """A strided-fold row: (programs a row n_p, programs holding data u = min(n_p, chunks
    inside the length), the group level of u units of CHUNK elements)."""
    n_p = ((cols + CHUNK - 1) // CHUNK + R - 1) // R
    u = tl.minimum(n_p, (len_e + CHUNK - 1) // CHUNK)
    return n_p, u, _level(u * CHUNK, TARGET, LMAX)


@triton.jit
def _store_groups(w, g_ptr, unit, start, len_e, lvl, CHUNK: tl.constexpr, LMAX: tl.constexpr,
                  TWIN: tl.constexpr):
    """Store the level-``lvl`` group maxima of ``w`` ([CHUNK / 2] words: the CHUNK values of
    the unit starting at element ``start``) as key1 at ``g_ptr + unit * (CHUNK >> lvl)``. Level
    l group b is the maximum of element b + j * (CHUNK >> l), j < 2**l (strided groups), so
    below LMAX word j of the reduction holds groups 2j and 2j + 1; a group whose first element
    lies past the length holds no candidate and stores 0. One branch per level, only the
    taken one runs (a single reduction)."""
    for l in tl.static_range(LMAX):
        if lvl == l:
            G: tl.constexpr = CHUNK >> l
            m = _wmax(tl.reshape(w, [1 << l, G // 2]), 0, TWIN)
            gk = tl.reshape(tl.join(_key1(m & 0xFFFF), _key1((m >> 16) & 0xFFFF)), [G])
            b = tl.arange(0, G)
            tl.store(g_ptr + unit * G + b, tl.where(start + b < len_e, gk, 0))
    if lvl == LMAX:  # one group: the whole unit
        tl.store(g_ptr + unit, tl.where(start < len_e, _word_key1(_wmax(w, 0, TWIN), TWIN), 0))
