"""Triton kernels of ``sparse_attn`` (private; the contract is in ``api.py``).

``_sparse_attn_kernel``: one CTA per (split, head block, row). Splits ``0 .. N_WSPLIT-1`` walk
the row's window keys, the others its index list, ``BLOCK_N`` keys per step. The CTA loads the
row's ``[BLOCK_H, D]`` queries once; per step it gathers the records (window ring, or the paged
compressed cache through the block table), dequantises them to an exact bf16 tile
``K [BLOCK_N, D]`` and uses it twice: ``S = Q K^T`` and ``acc += P K`` (K = V), with an online
softmax in the log2 domain. The next step's loads are issued before each step's math. One split
finalises in place; several write (m, l, acc) partials and the last CTA to arrive (atomic
counter, reset by that CTA) or ``_merge_kernel`` merges them, adds the sink to the denominator,
normalises, applies the inverse RoPE and writes bf16 (``PDL``: the merge kernel is a programmatic
dependent launch). ``DIM_SPLIT > 1`` replaces the 2-d products by products batched over
per-warp dim chunks (see the dim-split note below)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv4_decode.utils.device import pdl_capable

from ._gluon import _wgmma_attn_kernel

LOG2E = 1.4426950408889634
MERGE_VALUES = 8192  # partial values (splits x heads x dims) per merge CTA, see merge_dims
FUSED_MERGE_DIMS = 64  # dims per chunk of the fused (last-CTA) merge
# The FP4 key tiles hold the keys x 2^-8 (one multiply a value, see _compressed_dequant_pairs);
# the compressed splits scale the scores and acc back by this exact power of two.
FP4_TILE_SCALE: tl.constexpr = tl.constexpr(256.0)
FP4_SCALE_2_118: tl.constexpr = tl.constexpr(2.0 ** 118)  # scale x this stays finite (<= 448)


@triton.jit
def _window_load(win_ptr, slot, pos, row_ok, i0, i_hi, ring,
                 WINDOW: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Raw FP8 records of window keys ``i0 .. i0+BLOCK_N`` (key i = position
    pos - WINDOW + 1 + i; keys >= i_hi masked) -> (codes [BLOCK_N, D/32, 32],
    ue8m0 scales [BLOCK_N, D/32], valid [BLOCK_N])."""
    i = i0 + tl.arange(0, BLOCK_N)
    kpos = pos - WINDOW + 1 + i
    valid = (i < i_hi) & (kpos >= 0) & row_ok
    rec = (slot.to(tl.int64) * ring + tl.where(valid, kpos % ring, 0)) * (D + D // 32)
    blk = tl.arange(0, D // 32)
    e = tl.arange(0, 32)
    codes = tl.load(win_ptr + rec[:, None, None] + blk[None, :, None] * 32 + e[None, None, :],
                    mask=valid[:, None, None], other=0)
    sc = tl.load(win_ptr + rec[:, None] + D + blk[None, :], mask=valid[:, None], other=0)
    return codes, sc, valid


@triton.jit
def _window_dequant_pairs(codes, sc, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """-> exact bf16 keys of the even and of the odd dims, each [BLOCK_N, D/2] (split in
    registers: a thread's 16 contiguous bytes hold both)."""
    # ue8m0 byte b -> 2^(b-127) built from its exponent bits (b = 0 of a masked key -> 0.0)
    scale = (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True)[:, :, None]
    c_e, c_o = tl.split(tl.reshape(codes, (BLOCK_N, D // 32, 16, 2)))
    k_e = c_e.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale
    k_o = c_o.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale
    return (tl.reshape(k_e, (BLOCK_N, D // 2)).to(tl.bfloat16),
            tl.reshape(k_o, (BLOCK_N, D // 2)).to(tl.bfloat16))


@triton.jit
def _compressed_index(idx_ptr, row, c0, c_hi, k_sel, BLOCK_N: tl.constexpr):
    """Index-list columns ``c0 .. c0+BLOCK_N`` of ``row`` (columns >= c_hi read as -1) -> int32
    [BLOCK_N]. The row's list is read whatever its slot (it is valid memory for every row), so
    this load does not wait for the slot's."""
    c = c0 + tl.arange(0, BLOCK_N)
    return tl.load(idx_ptr + row.to(tl.int64) * k_sel + c, mask=c < c_hi, other=-1)


@triton.jit
def _compressed_page(bt_ptr, j, slot, sel_ok, max_pages, PAGE: tl.constexpr):
    """Block-table entries of the index values ``j`` (``_compressed_index``): -1 where j is -1
    or past the table, or the slot has no table (nothing read there)."""
    ok = (j >= 0) & (j < max_pages * PAGE) & sel_ok
    return tl.load(bt_ptr + slot.to(tl.int64) * max_pages + tl.where(ok, j, 0) // PAGE, mask=ok,
                   other=-1)


@triton.jit
def _compressed_rec(j, page, n_pages, D: tl.constexpr, PAGE: tl.constexpr):
    """(index values, their pages) -> (int64 record byte offsets, valid). A page of -1 (no
    entry, ``_compressed_page``) or past the cache is masked."""
    valid = (page >= 0) & (page < n_pages)
    rec = (tl.where(valid, page, 0).to(tl.int64) * PAGE + tl.where(valid, j, 0) % PAGE) * \
        (D // 2 + D // 16)
    return rec, valid


@triton.jit
def _compressed_addr(idx_ptr, bt_ptr, row, slot, row_ok, c0, c_hi, k_sel, n_pages, max_pages,
                     D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Record offsets of index-list columns ``c0 .. c0+BLOCK_N`` (columns >= c_hi masked)
    through the block table -> (int64 byte offsets [BLOCK_N], valid [BLOCK_N]): the index,
    page and offset steps above in one (two dependent loads)."""
    j = _compressed_index(idx_ptr, row, c0, c_hi, k_sel, BLOCK_N)
    page = _compressed_page(bt_ptr, j, slot, row_ok, max_pages, PAGE)
    return _compressed_rec(j, page, n_pages, D, PAGE)


@triton.jit
def _compressed_load_2d(comp_ptr, rec, valid, D: tl.constexpr):
    """Raw NVFP4 records -> (packed e2m1 [BLOCK_N, D/2], e4m3 scales [BLOCK_N, D/16]). Loaded
    as a 2-d tile so that the layout runs along the record (16 B per thread) and the bf16 tiles
    derived from it go to shared memory row-major in 16 B stores."""
    packed = tl.load(comp_ptr + rec[:, None] + tl.arange(0, D // 2)[None, :],
                     mask=valid[:, None], other=0)
    sc = tl.load(comp_ptr + rec[:, None] + D // 2 + tl.arange(0, D // 16)[None, :],
                 mask=valid[:, None], other=0)
    return packed, sc


@triton.jit
def _compressed_dequant_pairs(packed, sc, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Packed e2m1 [BLOCK_N, D/2] and e4m3 scales [BLOCK_N, D/16] -> exact bf16 keys x 2^-8
    (``FP4_TILE_SCALE``) of the even dims (low nibbles) and of the odd dims (high nibbles), each
    [BLOCK_N, D/2]. No interleave, so no shared-memory shuffle per step. Nibble ``s e1 e0 m``
    goes to fp32 bits 31 and 24..22: that float is the e2m1 value x 2^-126 (e = 0 gives the
    subnormal m x 2^-127; mul.f32 keeps subnormals). One multiply by scale x 2^118 (finite:
    scale <= 448) then gives value x scale x 2^-8, exact and a normal bf16 for every code
    (>= 2^-18): 3 integer ops and 1 multiply a value. The callers fold the 2^8 into the score
    scale and into acc after the last step."""
    scale = sc.to(tl.float8e4nv, bitcast=True).to(tl.float32)[:, :, None] * FP4_SCALE_2_118
    p = tl.reshape(packed, (BLOCK_N, D // 16, 8)).to(tl.uint32)
    # one OR of two shifts and one mask: no carries, the fields of the two shifts only meet
    # outside the mask (for `hi` after the shift right)
    lo = ((p << 22) | (p << 28)) & 0x81C00000
    q = p >> 4
    hi = ((q << 22) | (q << 28)) & 0x81C00000
    k_e = lo.to(tl.float32, bitcast=True) * scale
    k_o = hi.to(tl.float32, bitcast=True) * scale
    return (tl.reshape(k_e, (BLOCK_N, D // 2)).to(tl.bfloat16),
            tl.reshape(k_o, (BLOCK_N, D // 2)).to(tl.bfloat16))


@triton.jit
def _attend_pairs(q_e, q_o, k_e, k_o, valid, m_i, l_i, acc_e, acc_o, qk_scale):
    """``_attend`` (``l_i`` per key column too) with the dims split into even and odd halves:
    ``S = Q_e K_e^T + Q_o K_o^T``, ``acc_e += P K_e``, ``acc_o += P K_o``."""
    s = tl.dot(q_e, tl.trans(k_e)) * qk_scale + tl.dot(q_o, tl.trans(k_o)) * qk_scale
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha[:, None] + p
    pb = p.to(tl.bfloat16)
    acc_e = acc_e * alpha[:, None] + tl.dot(pb, k_e)
    acc_o = acc_o * alpha[:, None] + tl.dot(pb, k_o)
    return m_new, l_i, acc_e, acc_o


@triton.jit
def _tail_inputs(cos_ptr, sin_ptr, sink_ptr, h, hmask, pos, n_cos, d0, D: tl.constexpr,
                 DM: tl.constexpr, R2: tl.constexpr, BLOCK_H: tl.constexpr,
                 HAS_SINK: tl.constexpr):
    """What the finalisation of dims ``d0 .. d0+DM`` reads besides the partials, loaded up
    front so that it overlaps them: the RoPE table row of ``pos`` for the pairs of the chunk
    (cos 1 / sin 0 before the rope slice and for positions outside the table; such chunks read
    nothing) -> ``cs, sn [1, DM/2]``, and the sink in the log2 domain (-inf without sinks,
    which adds nothing to the denominator) -> ``sink [BLOCK_H, 1]``."""
    i = d0 // 2 + tl.arange(0, DM // 2) - (D // 2 - R2)
    ok = (i >= 0) & (pos >= 0) & (pos < n_cos)
    cs = tl.load(cos_ptr + pos * R2 + i, mask=ok, other=1.0)[None, :]
    sn = tl.load(sin_ptr + pos * R2 + i, mask=ok, other=0.0)[None, :]
    if HAS_SINK:
        sink = tl.load(sink_ptr + h, mask=hmask, other=0.0)[:, None] * 1.4426950408889634
    else:
        sink = tl.full([BLOCK_H, 1], float("-inf"), tl.float32)
    return cs, sn, sink


@triton.jit
def _finalize(acc, m, l, sink, cs, sn, row, h, hmask, out_ptr, n_heads, d0, D: tl.constexpr,
              DM: tl.constexpr, BLOCK_H: tl.constexpr):
    """acc [BLOCK_H, DM] (dims d0 .. d0+DM) unnormalised, m (log2 domain), l and sink
    [BLOCK_H, 1], RoPE rows cs / sn [1, DM/2] (``_tail_inputs``) -> sink, normalise, inverse
    RoPE, store bf16."""
    m_f = tl.maximum(m, sink)
    m_use = tl.where(m_f == float("-inf"), 0.0, m_f)
    alpha = tl.exp2(m - m_use)
    den = l * alpha + tl.exp2(sink - m_use)
    w = tl.where(den > 0, alpha / tl.where(den > 0, den, 1.0), 0.0)
    o = acc * w
    # inverse RoPE: rotate pairs (2i, 2i+1) by -pos*f; pairs before the rope slice get cos 1, sin 0
    a, b = tl.split(tl.reshape(o, (BLOCK_H, DM // 2, 2)))
    o = tl.reshape(tl.join(a * cs + b * sn, b * cs - a * sn), (BLOCK_H, DM))
    d = d0 + tl.arange(0, DM)
    offs = (row.to(tl.int64) * n_heads + h)[:, None] * D + d[None, :]
    tl.store(out_ptr + offs, o.to(tl.bfloat16), mask=hmask[:, None])


@triton.jit
def _merge_loads(ws_acc_ptr, ws_m_ptr, ws_l_ptr, base, d0, D: tl.constexpr, DM: tl.constexpr,
                 BLOCK_H: tl.constexpr, N_SPLIT: tl.constexpr, NS: tl.constexpr,
                 CACHE: tl.constexpr):
    """Dims ``d0 .. d0+DM`` of the N_SPLIT partials at ``base`` (first split's index) ->
    (acc [BLOCK_H, DM, NS], m, l [BLOCK_H, NS]): one masked load each (NS = N_SPLIT rounded
    up to a power of two; the padding reads nothing), all issued before any is used, so the
    merge waits for one memory round trip, not one per split. The split dim is last so that
    Triton's layout keeps it in registers (its order puts dims of equal contiguity in index
    order, fastest first): the sum over splits is in-thread. CACHE ".cg" (fused merge: written
    by other CTAs of the same launch) bypasses L1."""
    s = tl.arange(0, NS)[None, :]
    r = (base + s) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]  # [BLOCK_H, NS]
    ok = s < N_SPLIT
    d = d0 + tl.arange(0, DM)[None, :, None]
    part = tl.load(ws_acc_ptr + r.to(tl.int64)[:, None, :] * D + d, mask=ok[:, None, :],
                   other=0.0, cache_modifier=CACHE).to(tl.float32)  # fp32 or bf16 partials
    # Without this barrier ptxas issues the m loads first and starts their cross-lane max
    # (waiting for them) before it issues the acc loads: two round trips instead of one.
    tl.debug_barrier()
    m_s = tl.load(ws_m_ptr + r, mask=ok, other=float("-inf"), cache_modifier=CACHE)
    l_s = tl.load(ws_l_ptr + r, mask=ok, other=0.0, cache_modifier=CACHE)
    return part, m_s, l_s


@triton.jit
def _merge_combine(part, m_s, l_s):
    """``_merge_loads``' partials -> (m, l [BLOCK_H, 1], acc [BLOCK_H, DM]) against the
    largest m of the splits (log2 domain)."""
    m = tl.max(m_s, 1)[:, None]
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(m_s - m_use)  # 0 for splits that saw no key and for the padding
    return m, tl.sum(w * l_s, 1)[:, None], tl.sum(part * w[:, None, :], 2)


@triton.jit
def _window_split(q_ptr, win_ptr, row, h, hmask, n_heads, slot, pos, win_ok, w_i0, w_hi, ring,
                  qk_scale, WINDOW: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_N: tl.constexpr, W_STEPS: tl.constexpr):
    """Window keys ``w_i0 .. w_hi`` of one row -> (m, l, acc [BLOCK_H, D]), in even / odd dim
    halves as the index-list split (two independent Q K^T chains)."""
    q_e, q_o = _load_q_pairs(q_ptr, row, h, hmask, n_heads, D)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
    acc_e = tl.zeros([BLOCK_H, D // 2], tl.float32)
    acc_o = tl.zeros([BLOCK_H, D // 2], tl.float32)
    codes, sc, valid = _window_load(win_ptr, slot, pos, win_ok, w_i0, w_hi, ring, WINDOW, D,
                                    BLOCK_N)
    for it in range(W_STEPS):
        codes_n, sc_n, valid_n = _window_load(win_ptr, slot, pos, win_ok,
                                              w_i0 + (it + 1) * BLOCK_N, w_hi, ring, WINDOW, D,
                                              BLOCK_N)
        k_e, k_o = _window_dequant_pairs(codes, sc, D, BLOCK_N)
        m_i, l_i, acc_e, acc_o = _attend_pairs(q_e, q_o, k_e, k_o, valid, m_i, l_i, acc_e,
                                               acc_o, qk_scale)
        codes, sc, valid = codes_n, sc_n, valid_n
    return m_i, tl.sum(l_i, 1), tl.reshape(tl.join(acc_e, acc_o), (BLOCK_H, D))


@triton.jit
def _load_q_pairs(q_ptr, row, h, hmask, n_heads, D: tl.constexpr):
    """The row's queries of the even and of the odd dims, bf16 [BLOCK_H, D/2] each."""
    i = tl.arange(0, D // 2)
    q_row = q_ptr + (row.to(tl.int64) * n_heads + h)[:, None] * D + 2 * i[None, :]
    return (tl.load(q_row, mask=hmask[:, None], other=0.0),
            tl.load(q_row + 1, mask=hmask[:, None], other=0.0))


@triton.jit
def _compressed_split_pairs(q_ptr, comp_ptr, bt_ptr, idx_ptr, row, h, hmask, n_heads, slot,
                            sel_ok, c_0, c_hi, k_sel, n_pages, max_pages, qk_scale,
                            D: tl.constexpr, PAGE: tl.constexpr, BLOCK_H: tl.constexpr,
                            BLOCK_N: tl.constexpr, C_STEPS: tl.constexpr):
    """Index-list columns ``c_0 .. c_hi`` of one row -> (m, l, acc [BLOCK_H, D]), with q, the
    keys and acc split into even and odd dims (low / high nibbles: no per-step interleave;
    measured 1.21-1.46x faster than dequantising in dim order); the halves are interleaved
    back once, after the last step."""
    q_e, q_o = _load_q_pairs(q_ptr, row, h, hmask, n_heads, D)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
    acc_e = tl.zeros([BLOCK_H, D // 2], tl.float32)
    acc_o = tl.zeros([BLOCK_H, D // 2], tl.float32)
    # The address chain index -> page -> record runs three / two / one step ahead: each
    # iteration issues the record loads of step + 1, the page loads of step + 2 and the index
    # loads of step + 3, and turns step + 2's pages into offsets only after its own math, so no
    # step waits on a load it issued (before: the index -> page -> offset chain of step + 2 sat
    # at the top of the iteration, one exposed round trip a step; Nsight Compute, session 5).
    j = _compressed_index(idx_ptr, row, c_0, c_hi, k_sel, BLOCK_N)
    j_n = _compressed_index(idx_ptr, row, c_0 + BLOCK_N, c_hi, k_sel, BLOCK_N)
    j_nn = _compressed_index(idx_ptr, row, c_0 + 2 * BLOCK_N, c_hi, k_sel, BLOCK_N)
    page = _compressed_page(bt_ptr, j, slot, sel_ok, max_pages, PAGE)
    page_n = _compressed_page(bt_ptr, j_n, slot, sel_ok, max_pages, PAGE)
    rec, valid = _compressed_rec(j, page, n_pages, D, PAGE)
    packed, sc = _compressed_load_2d(comp_ptr, rec, valid, D)
    rec_n, valid_n = _compressed_rec(j_n, page_n, n_pages, D, PAGE)
    for it in range(C_STEPS):
        packed_n, sc_n = _compressed_load_2d(comp_ptr, rec_n, valid_n, D)
        page_nn = _compressed_page(bt_ptr, j_nn, slot, sel_ok, max_pages, PAGE)
        j_nnn = _compressed_index(idx_ptr, row, c_0 + (it + 3) * BLOCK_N, c_hi, k_sel, BLOCK_N)
        k_e, k_o = _compressed_dequant_pairs(packed, sc, D, BLOCK_N)
        m_i, l_i, acc_e, acc_o = _attend_pairs(q_e, q_o, k_e, k_o, valid, m_i, l_i, acc_e,
                                               acc_o, qk_scale * FP4_TILE_SCALE)
        rec_n, valid_nn = _compressed_rec(j_nn, page_nn, n_pages, D, PAGE)
        packed, sc, valid, valid_n = packed_n, sc_n, valid_n, valid_nn
        j_nn = j_nnn
    acc = tl.reshape(tl.join(acc_e, acc_o), (BLOCK_H, D)) * FP4_TILE_SCALE
    return m_i, tl.sum(l_i, 1), acc


# ----------------------------------------------------------------------------- dim split
# DIM_SPLIT = DS > 1: both products are batched over DS chunks of DC = D / DS dims, so that
# Triton's batched mma layout gives each warp its own chunk (warpsPerCTA [num_warps, 1, 1];
# DS = num_warps): S = sum over chunks of Q_c K_c^T (one cross-warp sum), acc_c += P K_c.
# Every warp does distinct MMA work with short HMMA chains (the 2-d form at 8 warps computes
# Q K^T twice, one 32-deep HMMA chain per warp, and re-reads all of q from shared memory each
# step; here a warp reads its 16 x DC slice of q). Chunk c of a window key is dims
# c*DC .. c*DC+DC-1; for the NVFP4 keys chunk c = par * DS/2 + j is the nibble `par` of record
# bytes j*DC .. j*DC+DC-1 (dims 2*(j*DC+i)+par), so a chunk dequantises without interleave.
# Registers: with the next step's raw records held across a step (as in the 2-d path),
# 254 a thread at 8 warps x 32 keys and at 4 warps x 16 keys, no spills (ptxas, sm_90a): the
# 4-warp CTAs fit two per SM.


@triton.jit
def _chunk_dims(DS: tl.constexpr, DC: tl.constexpr, PAIRS: tl.constexpr):
    """Dim of each chunk element, int32 [DS, 1, DC] (see the dim-split note above)."""
    b = tl.arange(0, DS)[:, None, None]
    i = tl.arange(0, DC)[None, None, :]
    if PAIRS:
        return 2 * ((b % (DS // 2)) * DC + i) + b // (DS // 2)
    else:
        return b * DC + i


@triton.jit
def _chunks_to_dims(acc, BLOCK_H: tl.constexpr, DS: tl.constexpr, DC: tl.constexpr,
                    PAIRS: tl.constexpr):
    """acc [DS, BLOCK_H, DC] in chunk order -> [BLOCK_H, DS * DC] in dim order (once, after
    the last step)."""
    if PAIRS:
        a = tl.permute(tl.reshape(acc, (2, DS // 2, BLOCK_H, DC)), (2, 1, 3, 0))
        return tl.reshape(a, (BLOCK_H, DS * DC))
    else:
        return tl.reshape(tl.permute(acc, (1, 0, 2)), (BLOCK_H, DS * DC))


@triton.jit
def _load_qt_chunks(q_ptr, row, h, hmask, n_heads, D: tl.constexpr, DS: tl.constexpr,
                    PAIRS: tl.constexpr):
    """The row's queries in chunk order, transposed: bf16 [DS, DC, BLOCK_H]."""
    dims = tl.permute(_chunk_dims(DS, D // DS, PAIRS), (0, 2, 1))
    offs = (row.to(tl.int64) * n_heads + h)[None, None, :] * D + dims
    return tl.load(q_ptr + offs, mask=hmask[None, None, :], other=0.0)


@triton.jit
def _window_load_chunks(win_ptr, slot, pos, row_ok, i0, i_hi, ring, WINDOW: tl.constexpr,
                        D: tl.constexpr, BLOCK_N: tl.constexpr, DS: tl.constexpr):
    """``_window_load`` in chunk order: (codes [DS, BLOCK_N, DC], ue8m0 scales
    [DS, BLOCK_N, DC/32], valid [BLOCK_N])."""
    DC: tl.constexpr = D // DS
    i = i0 + tl.arange(0, BLOCK_N)
    kpos = pos - WINDOW + 1 + i
    valid = (i < i_hi) & (kpos >= 0) & row_ok
    rec = (slot.to(tl.int64) * ring + tl.where(valid, kpos % ring, 0)) * (D + D // 32)
    b = tl.arange(0, DS)[:, None, None]
    rec3 = rec[None, :, None]
    m3 = valid[None, :, None]
    codes = tl.load(win_ptr + rec3 + b * DC + tl.arange(0, DC)[None, None, :], mask=m3, other=0)
    sc = tl.load(win_ptr + rec3 + D + b * (DC // 32) + tl.arange(0, DC // 32)[None, None, :],
                 mask=m3, other=0)
    return codes, sc, valid


@triton.jit
def _window_dequant_chunks(codes, sc, BLOCK_N: tl.constexpr, DS: tl.constexpr,
                           DC: tl.constexpr):
    """-> exact bf16 keys [DS, BLOCK_N, DC] (as ``_window_dequant``)."""
    scale = (sc.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    c4 = tl.reshape(codes, (DS, BLOCK_N, DC // 32, 32))
    vals = c4.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale[:, :, :, None]
    return tl.reshape(vals, (DS, BLOCK_N, DC)).to(tl.bfloat16)


@triton.jit
def _compressed_load_chunks(comp_ptr, rec, valid, D: tl.constexpr, DS: tl.constexpr):
    """Raw NVFP4 records in chunk order: (packed bytes [DS, BLOCK_N, DC], e4m3 scales
    [DS, BLOCK_N, DC/8]). Chunks c and c + DS/2 load the same bytes (their two nibbles): twice
    the load instructions of the packed half, in exchange for no interleave."""
    DC: tl.constexpr = D // DS
    j = tl.arange(0, DS)[:, None, None] % (DS // 2)
    rec3 = rec[None, :, None]
    m3 = valid[None, :, None]
    packed = tl.load(comp_ptr + rec3 + j * DC + tl.arange(0, DC)[None, None, :], mask=m3,
                     other=0)
    sc = tl.load(comp_ptr + rec3 + D // 2 + j * (DC // 8) + tl.arange(0, DC // 8)[None, None, :],
                 mask=m3, other=0)
    return packed, sc


@triton.jit
def _compressed_dequant_chunks(packed, sc, BLOCK_N: tl.constexpr, DS: tl.constexpr,
                               DC: tl.constexpr):
    """-> exact bf16 keys x 2^-8 [DS, BLOCK_N, DC]: chunk c takes nibble c // (DS/2) of each
    byte, decoded as in ``_compressed_dequant_pairs``."""
    scale = sc.to(tl.float8e4nv, bitcast=True).to(tl.float32)[:, :, :, None] * FP4_SCALE_2_118
    sh = 4 * (tl.arange(0, DS) // (DS // 2)).to(tl.uint32)[:, None, None, None]
    p = tl.reshape(packed, (DS, BLOCK_N, DC // 8, 8)).to(tl.uint32) >> sh
    bits = ((p << 22) | (p << 28)) & 0x81C00000  # as in _compressed_dequant_pairs
    k = bits.to(tl.float32, bitcast=True) * scale
    return tl.reshape(k, (DS, BLOCK_N, DC)).to(tl.bfloat16)


@triton.jit
def _attend_chunks(qt, k, valid, m_i, l_i, acc, qk_scale, DS: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    """``_attend`` on chunked keys k [DS, BLOCK_N, DC], queries qt [DS, DC, BLOCK_H] and acc
    [DS, BLOCK_H, DC]. The scores are computed transposed, S^T = sum over chunks of
    K_c Q_c^T [BLOCK_N, BLOCK_H], so that K is not a transposed operand in either product
    (with Q K^T, Triton kept a second, transposed copy of the tile in shared memory). m_i is
    [BLOCK_H] along the columns of S^T, l_i [BLOCK_N, BLOCK_H] per element (as ``_attend``)."""
    st = tl.sum(tl.dot(k, qt), 0) * qk_scale
    st = tl.where(valid[:, None], st, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(st, 0))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    pt = tl.exp2(st - m_use[None, :])
    l_i = l_i * alpha[None, :] + pt
    pb = tl.broadcast_to(tl.trans(pt.to(tl.bfloat16))[None, :, :], (DS, BLOCK_H, BLOCK_N))
    acc = acc * alpha[None, :, None] + tl.dot(pb, k)
    return m_new, l_i, acc


@triton.jit
def _window_split_chunks(q_ptr, win_ptr, row, h, hmask, n_heads, slot, pos, win_ok, w_i0, w_hi,
                         ring, qk_scale, WINDOW: tl.constexpr, D: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, W_STEPS: tl.constexpr,
                         DS: tl.constexpr):
    """Window keys ``w_i0 .. w_hi`` of one row, dim-split -> (m, l, acc [BLOCK_H, D])."""
    DC: tl.constexpr = D // DS
    qt = _load_qt_chunks(q_ptr, row, h, hmask, n_heads, D, DS, False)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_N, BLOCK_H], tl.float32)
    acc = tl.zeros([DS, BLOCK_H, DC], tl.float32)
    codes, sc, valid = _window_load_chunks(win_ptr, slot, pos, win_ok, w_i0, w_hi, ring,
                                           WINDOW, D, BLOCK_N, DS)
    for it in range(W_STEPS):
        codes_n, sc_n, valid_n = _window_load_chunks(win_ptr, slot, pos, win_ok,
                                                     w_i0 + (it + 1) * BLOCK_N, w_hi, ring,
                                                     WINDOW, D, BLOCK_N, DS)
        k = _window_dequant_chunks(codes, sc, BLOCK_N, DS, DC)
        m_i, l_i, acc = _attend_chunks(qt, k, valid, m_i, l_i, acc, qk_scale, DS, BLOCK_H,
                                       BLOCK_N)
        codes, sc, valid = codes_n, sc_n, valid_n
    return m_i, tl.sum(l_i, 0), _chunks_to_dims(acc, BLOCK_H, DS, DC, False)


@triton.jit
def _compressed_split_chunks(q_ptr, comp_ptr, bt_ptr, idx_ptr, row, h, hmask, n_heads, slot,
                             sel_ok, c_0, c_hi, k_sel, n_pages, max_pages, qk_scale,
                             D: tl.constexpr, PAGE: tl.constexpr, BLOCK_H: tl.constexpr,
                             BLOCK_N: tl.constexpr, C_STEPS: tl.constexpr, DS: tl.constexpr):
    """Index-list columns ``c_0 .. c_hi`` of one row, dim-split -> (m, l, acc [BLOCK_H, D])."""
    DC: tl.constexpr = D // DS
    qt = _load_qt_chunks(q_ptr, row, h, hmask, n_heads, D, DS, True)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_N, BLOCK_H], tl.float32)
    acc = tl.zeros([DS, BLOCK_H, DC], tl.float32)
    rec, valid = _compressed_addr(idx_ptr, bt_ptr, row, slot, sel_ok, c_0, c_hi, k_sel, n_pages,
                                  max_pages, D, PAGE, BLOCK_N)
    packed, sc = _compressed_load_chunks(comp_ptr, rec, valid, D, DS)
    rec_n, valid_n = _compressed_addr(idx_ptr, bt_ptr, row, slot, sel_ok, c_0 + BLOCK_N, c_hi,
                                      k_sel, n_pages, max_pages, D, PAGE, BLOCK_N)
    for it in range(C_STEPS):
        packed_n, sc_n = _compressed_load_chunks(comp_ptr, rec_n, valid_n, D, DS)
        rec_nn, valid_nn = _compressed_addr(idx_ptr, bt_ptr, row, slot, sel_ok,
                                            c_0 + (it + 2) * BLOCK_N, c_hi, k_sel, n_pages,
                                            max_pages, D, PAGE, BLOCK_N)
        k = _compressed_dequant_chunks(packed, sc, BLOCK_N, DS, DC)
        m_i, l_i, acc = _attend_chunks(qt, k, valid, m_i, l_i, acc, qk_scale * FP4_TILE_SCALE,
                                       DS, BLOCK_H, BLOCK_N)
        packed, sc, valid = packed_n, sc_n, valid_n
        rec_n, valid_n = rec_nn, valid_nn
    return m_i, tl.sum(l_i, 0), _chunks_to_dims(acc * FP4_TILE_SCALE, BLOCK_H, DS, DC, True)


@triton.jit
def _sparse_attn_kernel(
    # inputs
    q_ptr, win_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, sink_ptr, comp_ptr, bt_ptr, idx_ptr,
    # outputs and workspace
    out_ptr, ws_acc_ptr, ws_m_ptr, ws_l_ptr, cnt_ptr,
    # sizes
    n_heads, n_slots, ring, n_bt_slots, n_pages, max_pages, k_sel, n_cos,
    qk_scale,  # softmax scale * log2(e)
    # constants
    WINDOW: tl.constexpr, D: tl.constexpr, R2: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, W_STEPS: tl.constexpr,
    N_WSPLIT: tl.constexpr, C_STEPS: tl.constexpr, N_SPLIT: tl.constexpr, HAS_SEL: tl.constexpr,
    HAS_SINK: tl.constexpr, FUSED_MERGE: tl.constexpr, DIM_SPLIT: tl.constexpr,
    PDL: tl.constexpr, NS: tl.constexpr, FUSED_DM: tl.constexpr, WAIT: tl.constexpr,
    LONG_FIRST: tl.constexpr,
):
    if WAIT:  # launched as a programmatic dependent: every input is the kernels' before us
        gdc_wait()
    if PDL or WAIT:  # the next launch (the merge) may start once every CTA here has started
        gdc_launch_dependents()
    if LONG_FIRST:  # grid (head blocks, rows, splits): the kind with more steps starts first
        pid_h = tl.program_id(0)
        row = tl.program_id(1)
        pid_s = tl.program_id(2)
        if C_STEPS >= W_STEPS:
            pid_s = (pid_s + N_WSPLIT) % N_SPLIT
        n_hb = tl.num_programs(0)
    else:  # grid (splits, head blocks, rows)
        pid_s = tl.program_id(0)
        pid_h = tl.program_id(1)
        row = tl.program_id(2)
        n_hb = tl.num_programs(1)
    pos = tl.load(pos_ptr + row)
    slot = tl.load(slot_ptr + row)
    win_ok = (slot >= 0) & (slot < n_slots)
    sel_ok = (slot >= 0) & (slot < n_bt_slots)
    w_slot = tl.where(win_ok, slot, 0)
    c_slot = tl.where(sel_ok, slot, 0)

    h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < n_heads
    d = tl.arange(0, D)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    # Each step issues the next step's loads before its own math (one-step prefetch; for the
    # compressed keys the index and block-table loads run two steps ahead).
    if pid_s < N_WSPLIT:
        w_i0 = pid_s * (W_STEPS * BLOCK_N)
        w_hi = tl.minimum(w_i0 + W_STEPS * BLOCK_N, WINDOW)
        if DIM_SPLIT > 1:
            m_i, l_i, acc = _window_split_chunks(
                q_ptr, win_ptr, row, h, hmask, n_heads, w_slot, pos, win_ok, w_i0, w_hi, ring,
                qk_scale, WINDOW, D, BLOCK_H, BLOCK_N, W_STEPS, DIM_SPLIT)
        else:
            m_i, l_i, acc = _window_split(
                q_ptr, win_ptr, row, h, hmask, n_heads, w_slot, pos, win_ok, w_i0, w_hi, ring,
                qk_scale, WINDOW, D, BLOCK_H, BLOCK_N, W_STEPS)
    else:
        if HAS_SEL:
            c_0 = (pid_s - N_WSPLIT) * (C_STEPS * BLOCK_N)
            c_hi = tl.minimum(c_0 + C_STEPS * BLOCK_N, k_sel)
            if DIM_SPLIT > 1:
                m_i, l_i, acc = _compressed_split_chunks(
                    q_ptr, comp_ptr, bt_ptr, idx_ptr, row, h, hmask, n_heads, c_slot, sel_ok,
                    c_0, c_hi, k_sel, n_pages, max_pages, qk_scale, D, PAGE, BLOCK_H, BLOCK_N,
                    C_STEPS, DIM_SPLIT)
            else:
                m_i, l_i, acc = _compressed_split_pairs(
                    q_ptr, comp_ptr, bt_ptr, idx_ptr, row, h, hmask, n_heads, c_slot, sel_ok,
                    c_0, c_hi, k_sel, n_pages, max_pages, qk_scale, D, PAGE, BLOCK_H, BLOCK_N,
                    C_STEPS)

    if N_SPLIT == 1:
        cs, sn, sink = _tail_inputs(cos_ptr, sin_ptr, sink_ptr, h, hmask, pos, n_cos, 0, D, D,
                                    R2, BLOCK_H, HAS_SINK)
        _finalize(acc, m_i[:, None], l_i[:, None], sink, cs, sn, row, h, hmask, out_ptr,
                  n_heads, 0, D, D, BLOCK_H)
    else:
        group = row * n_hb + pid_h
        r = (group * N_SPLIT + pid_s) * BLOCK_H + tl.arange(0, BLOCK_H)
        # the workspace's dtype: fp32, or bf16 (``partials_bf16``: half the partial bytes)
        tl.store(ws_acc_ptr + r.to(tl.int64)[:, None] * D + d[None, :],
                 acc.to(ws_acc_ptr.dtype.element_ty))
        tl.store(ws_m_ptr + r, m_i)
        tl.store(ws_l_ptr + r, l_i)
        if FUSED_MERGE:
            # Every thread's partial is written before one thread's release-acquire increment;
            # the CTA that brings the count to N_SPLIT merges and resets it for the next call.
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + group, 1, sem="acq_rel", scope="gpu")
            if arrived == N_SPLIT - 1:
                for c in range(D // FUSED_DM):  # a loop: one chunk's registers at a time
                    d0 = c * FUSED_DM
                    cs, sn, sink = _tail_inputs(cos_ptr, sin_ptr, sink_ptr, h, hmask, pos, n_cos,
                                                d0, D, FUSED_DM, R2, BLOCK_H, HAS_SINK)
                    part, m_s, l_s = _merge_loads(ws_acc_ptr, ws_m_ptr, ws_l_ptr,
                                                  group * N_SPLIT, d0, D, FUSED_DM, BLOCK_H,
                                                  N_SPLIT, NS, ".cg")
                    m, l, acc_m = _merge_combine(part, m_s, l_s)
                    _finalize(acc_m, m, l, sink, cs, sn, row, h, hmask, out_ptr, n_heads, d0, D,
                              FUSED_DM, BLOCK_H)
                tl.atomic_xchg(cnt_ptr + group, 0, sem="relaxed", scope="gpu")


@triton.jit
def _merge_kernel(ws_acc_ptr, ws_m_ptr, ws_l_ptr, pos_ptr, out_ptr, cos_ptr, sin_ptr, sink_ptr,
                  n_heads, n_cos, D: tl.constexpr, DM: tl.constexpr, R2: tl.constexpr,
                  BLOCK_H: tl.constexpr, N_SPLIT: tl.constexpr, NS: tl.constexpr,
                  HAS_SINK: tl.constexpr, PDL: tl.constexpr):
    """One CTA per (head block, row, DM-dim chunk), DM from ``merge_dims`` (~8K partial values
    a CTA). Each CTA issues all its loads at once: the position, RoPE rows and sinks (inputs of
    the step), then every split's m, l and acc chunk in one 3-d load each; so its time is about
    one L2 round trip plus the arithmetic, whatever the split count. PDL: launched as a
    programmatic dependent of the attention kernel; the inputs are read before
    griddepcontrol.wait, the partials after."""
    pid_h = tl.program_id(0)
    row = tl.program_id(1)
    d0 = tl.program_id(2) * DM
    h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < n_heads
    base = (row * tl.num_programs(0) + pid_h) * N_SPLIT
    if PDL:
        gdc_launch_dependents()  # the next call's attention kernel may launch (it waits)
        # the step's inputs (not written by the attention kernel) while it still runs
        pos = tl.load(pos_ptr + row)
        cs, sn, sink = _tail_inputs(cos_ptr, sin_ptr, sink_ptr, h, hmask, pos, n_cos, d0, D, DM,
                                    R2, BLOCK_H, HAS_SINK)
        gdc_wait()
        part, m_s, l_s = _merge_loads(ws_acc_ptr, ws_m_ptr, ws_l_ptr, base, d0, D, DM, BLOCK_H,
                                      N_SPLIT, NS, "")
    else:
        # the partials first: the position -> RoPE row chain overlaps their round trip
        part, m_s, l_s = _merge_loads(ws_acc_ptr, ws_m_ptr, ws_l_ptr, base, d0, D, DM, BLOCK_H,
                                      N_SPLIT, NS, "")
        pos = tl.load(pos_ptr + row)
        cs, sn, sink = _tail_inputs(cos_ptr, sin_ptr, sink_ptr, h, hmask, pos, n_cos, d0, D, DM,
                                    R2, BLOCK_H, HAS_SINK)
    m, l, acc = _merge_combine(part, m_s, l_s)
    _finalize(acc, m, l, sink, cs, sn, row, h, hmask, out_ptr, n_heads, d0, D, DM, BLOCK_H)


def merge_dims(d: int, n_split: int, block_h: int) -> int:
    """Dims per merge CTA: ``MERGE_VALUES`` partial values (all splits x heads x dims), so that
    the CTA's loads are all in flight at once without spilling (64 fp32 a thread at 4 warps),
    at least 16 dims."""
    ns = triton.next_power_of_2(n_split)
    return min(d, max(16, MERGE_VALUES // (ns * block_h)))


def launch(q, window_cache, positions, row_slots, cos, sin, sinks, compressed, block_table,
           indices, out, ws, cfg, window: int, softmax_scale: float):
    """Launch the kernel(s) for validated arguments (``ws``: workspace tensors or None)."""
    t, n_heads, d = q.shape
    has_sel = indices is not None and indices.shape[1] > 0
    n_hb = triton.cdiv(n_heads, cfg.block_h)
    k_sel = indices.shape[1] if has_sel else 0
    # Unused pointers get a valid tensor of the right element type (never dereferenced).
    comp = compressed if has_sel else window_cache
    bt = block_table if has_sel else row_slots
    idx = indices if has_sel else row_slots
    sink = sinks if sinks is not None else cos
    ws_acc, ws_m, ws_l, cnt = ws if ws is not None else (out, cos, cos, row_slots)
    # long_first: splits slowest, so all rows' long splits start first
    grid = (n_hb, t, cfg.n_split) if cfg.long_first else (cfg.n_split, n_hb, t)
    # programmatic dependent launches (sm_90+): the merge (``pdl``), the split kernel itself
    # (``pdl_entry``)
    pdl = cfg.pdl and cfg.n_split > 1 and not cfg.fused_merge and pdl_capable(q.device)
    wait = cfg.pdl_entry and pdl_capable(q.device)
    if cfg.wgmma:  # Hopper: the splits on warpgroup MMAs, then the merge kernel below
        # registers for two CTAs a SM (128 at 8 warps; 4 warps need no cap)
        opts = dict(num_warps=cfg.num_warps, **({"maxnreg": 128} if cfg.num_warps == 8 else {}))
        _wgmma_attn_kernel[grid](
            q, window_cache, positions, row_slots, comp, bt, idx, ws_acc, ws_m, ws_l,
            n_heads, window_cache.shape[0], window_cache.shape[1],
            block_table.shape[0] if has_sel else 0, compressed.shape[0] if has_sel else 0,
            block_table.shape[1] if has_sel else 0, k_sel, softmax_scale * LOG2E,
            WINDOW=window, D=d, PAGE=compressed.shape[1] if has_sel else 1,
            W_STEPS=cfg.w_steps, N_WSPLIT=cfg.n_wsplit, C_STEPS=cfg.c_steps,
            N_SPLIT=cfg.n_split, HAS_SEL=has_sel, PDL=pdl, WAIT=wait, LONG_FIRST=cfg.long_first,
            **opts, **({"launch_pdl": True} if wait else {}))
    else:
        _launch_split_kernel(q, window_cache, positions, row_slots, cos, sin, sink, comp, bt,
                             idx, out, ws_acc, ws_m, ws_l, cnt, has_sel, sinks is not None,
                             k_sel, grid, cfg, window, softmax_scale, block_table, compressed,
                             pdl, wait)
    if cfg.n_split > 1 and not cfg.fused_merge:
        dm = merge_dims(d, cfg.n_split, cfg.block_h)
        _merge_kernel[(n_hb, t, d // dm)](
            ws_acc, ws_m, ws_l, positions, out, cos, sin, sink, n_heads, cos.shape[0],
            D=d, DM=dm, R2=cos.shape[1], BLOCK_H=cfg.block_h, N_SPLIT=cfg.n_split,
            NS=triton.next_power_of_2(cfg.n_split),
            HAS_SINK=sinks is not None, PDL=pdl, num_warps=4,
            **({"launch_pdl": True} if pdl else {}),
        )


def _launch_split_kernel(q, window_cache, positions, row_slots, cos, sin, sink, comp, bt, idx,
                         out, ws_acc, ws_m, ws_l, cnt, has_sel, has_sink, k_sel, grid, cfg,
                         window, softmax_scale, block_table, compressed, pdl, wait):
    """``_sparse_attn_kernel`` on the grid (the Triton path of ``launch``)."""
    n_heads, d = q.shape[1], q.shape[2]
    _sparse_attn_kernel[grid](
        q, window_cache, positions, row_slots, cos, sin, sink, comp, bt, idx,
        out, ws_acc, ws_m, ws_l, cnt,
        n_heads, window_cache.shape[0], window_cache.shape[1],
        block_table.shape[0] if has_sel else 0, compressed.shape[0] if has_sel else 0,
        block_table.shape[1] if has_sel else 0, k_sel, cos.shape[0],
        softmax_scale * LOG2E,
        WINDOW=window, D=d, R2=cos.shape[1],
        PAGE=compressed.shape[1] if has_sel else 1, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
        W_STEPS=cfg.w_steps, N_WSPLIT=cfg.n_wsplit, C_STEPS=cfg.c_steps, N_SPLIT=cfg.n_split,
        HAS_SEL=has_sel,
        HAS_SINK=has_sink, FUSED_MERGE=cfg.fused_merge, DIM_SPLIT=cfg.dim_split,
        PDL=pdl, NS=triton.next_power_of_2(cfg.n_split), FUSED_DM=min(d, FUSED_MERGE_DIMS),
        WAIT=wait, LONG_FIRST=cfg.long_first, num_warps=cfg.num_warps,
        **({"launch_pdl": True} if wait else {}),
        num_stages=cfg.num_stages, **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
    )
