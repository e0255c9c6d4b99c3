"""Triton kernels of the MoE op (private; the contract is in ``api.py``).

Three launches per MoE layer up to 3 rows (route 1, experts 2), four at 4 rows, five above,
all with grids fixed by the shapes (graph-safe, idle CTAs exit):

1. ``_router_logits_kernel``  split-K partial logits ``[S, T, E]`` fp32 (bf16 tensor-core dot);
2. ``_router_select_kernel``  one CTA a row: sums the S partials in order, sqrtsoftplus,
                              biased top-k, weights; its last CTA writes the routing record
                              (``_record_keys``: the ``T*k`` (expert, entry) keys sorted,
                              entries grouped by expert, each group padded to ``BLOCK_M``, and
                              each tile's expert); up to 4 rows the last logits CTA does all of
                              it instead (no launch); ``_route_record_kernel`` is the record
                              alone (``build_routing``);
3. ``_moe_up_kernel``         W1|W3 of each tile's expert + clamped SwiGLU -> ``h [T*k + T, I]``
                              (split K: fp32 partials; the last-arriving chunk CTA of each
                              (tile, n block) sums them in chunk order and applies the SwiGLU);
4. ``_moe_down_kernel``       W2 -> per-entry fp32 partials ``[T*k + T, D]``; up to 3 rows the
                              last-arriving CTA of each D column block also does 5 for it;
5. ``_moe_combine_kernel``    ``out[t] = sum_i w[t, i] * P[t*k + i] + P[T*k + t]`` in slot order
                              (above 3 rows).

No float atomics anywhere: every output element is written by one CTA with a fixed reduction
order, so replays are bitwise identical. The "last-arriving CTA" is decided by an int32 ticket
counter per group in the workspace (``_last_arrival``), which that CTA resets to 0, so the next
call or graph replay starts from zero; no CTA ever waits on another.
"""

from __future__ import annotations

import triton
import triton.language as tl

# --------------------------------------------------------------------------- router


@triton.jit
def _router_logits_kernel(x_ptr, w_ptr, part_ptr, bias_ptr, valid_ptr, ids_ptr, wts_ptr,
                          entries_ptr, tiles_ptr, tick_ptr, T, D, stride_x, route_scale,
                          E: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                          BLOCK_K: tl.constexpr, K_CHUNK: tl.constexpr, SELECT: tl.constexpr,
                          SPLIT: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                          SEL_ROWS: tl.constexpr, E_PAD: tl.constexpr, HAS_VALID: tl.constexpr,
                          CAP: tl.constexpr, NP: tl.constexpr, BLOCK_M: tl.constexpr,
                          FILL: tl.constexpr):
    """Partial logits of K chunk ``pid_s`` -> ``part[pid_s, T, E]``. SELECT (``T <= SEL_ROWS``):
    the last CTA to arrive (ticket ``tick_ptr``) then selects all T rows (``_select``) and
    writes the routing record from the ids it holds (``_record_keys``): route is one launch.
    ``SEL_ROWS * K_PAD >= 16`` (the record's tile)."""
    pid_e = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_t = tl.program_id(2)
    offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    acc = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.float32)
    for kk in range(0, K_CHUNK, BLOCK_K):
        offs_k = pid_s * K_CHUNK + kk + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + offs_t[:, None] * stride_x + offs_k[None, :],
                     mask=(offs_t[:, None] < T) & (offs_k[None, :] < D), other=0.0)
        wt = tl.load(w_ptr + offs_e[None, :].to(tl.int64) * D + offs_k[:, None],
                     mask=(offs_e[None, :] < E) & (offs_k[:, None] < D), other=0.0)
        acc = tl.dot(xt, wt, acc)
    mask = (offs_t[:, None] < T) & (offs_e[None, :] < E)
    tl.store(part_ptr + (pid_s * T + offs_t[:, None]) * E + offs_e[None, :], acc, mask=mask)
    if SELECT:
        if _last_arrival(tick_ptr, tl.num_programs(0) * tl.num_programs(1)):
            ids, ent = _select(part_ptr, bias_ptr, valid_ptr, ids_ptr, wts_ptr, 0, T,
                               route_scale, E, SPLIT, TOP_K, K_PAD, SEL_ROWS, E_PAD, HAS_VALID)
            # the record from the ids in registers: no store -> barrier -> L2 reload of them
            key = tl.where(ids >= 0, ids * NP + ent, E_PAD * NP)  # order-free: one tensor
            _record_keys(tl.reshape(key, (SEL_ROWS * K_PAD,), can_reorder=True), entries_ptr,
                         tiles_ptr, CAP, NP, E_PAD, BLOCK_M, FILL)


@triton.jit
def _router_select_kernel(part_ptr, bias_ptr, valid_ptr, ids_ptr, wts_ptr, entries_ptr,
                          tiles_ptr, tick_ptr, T, route_scale, E: tl.constexpr,
                          SPLIT: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                          BLOCK_T: tl.constexpr, E_PAD: tl.constexpr, HAS_VALID: tl.constexpr,
                          CAP: tl.constexpr, NP: tl.constexpr, BLOCK_M: tl.constexpr,
                          FILL: tl.constexpr):
    """Grid ``cdiv(T, BLOCK_T)`` (route: BLOCK_T = 1, one CTA per row, above the logits
    kernel's SELECT rows). ``_select`` of this CTA's rows; the last CTA to arrive (ticket
    ``tick_ptr``) writes the routing record from the ids in memory (all CTAs' rows)."""
    _select(part_ptr, bias_ptr, valid_ptr, ids_ptr, wts_ptr, tl.program_id(0) * BLOCK_T, T,
            route_scale, E, SPLIT, TOP_K, K_PAD, BLOCK_T, E_PAD, HAS_VALID)
    if _last_arrival(tick_ptr, tl.num_programs(0)):
        _record(ids_ptr, entries_ptr, tiles_ptr, T * TOP_K, CAP, NP, E_PAD, BLOCK_M, FILL)


@triton.jit
def _top2_combine(a1, sa1, a2, sa2, b1, sb1, b2, sb2):
    """The top two (key, sigma) pairs of two descending top-two lists: the larger head, then
    the larger of the loser's head and the winner's second. Keys are distinct (the
    sentinels aside, never picked), so the merge is associative and commutative."""
    a_wins = a1 > b1
    c = tl.where(a_wins, b1, a1)  # the loser's head
    d = tl.where(a_wins, a2, b2)  # the winner's second
    c_wins = c > d
    return (tl.where(a_wins, a1, b1), tl.where(a_wins, sa1, sb1), tl.where(c_wins, c, d),
            tl.where(c_wins, tl.where(a_wins, sb1, sa1), tl.where(a_wins, sa2, sb2)))


@triton.jit
def _select(part_ptr, bias_ptr, valid_ptr, ids_ptr, wts_ptr, row0, T, route_scale,
            E: tl.constexpr, SPLIT: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
            BLOCK_T: tl.constexpr, E_PAD: tl.constexpr, HAS_VALID: tl.constexpr):
    """Rows ``row0 .. row0 + BLOCK_T - 1``: sum of the SPLIT partial logits in chunk order,
    sqrtsoftplus, biased top-k, weights -> ``ids``, ``wts``. Returns ``[BLOCK_T, K_PAD]``
    tiles (the ids as stored, -1 past TOP_K / T / valid rows; the entry numbers
    ``t * TOP_K + i``) for the record.

    No serial chain of memory round trips: the SPLIT partial loads (``.cg``: other CTAs wrote
    them) are all issued before a CTA barrier and summed after it in chunk order (the same fp32
    sum as a loop); without the barrier, or with more values a thread than registers allow,
    ptxas interleaves them with the adds (one L2 round trip each). Each pass is one CTA
    reduction of the top two ``(key, sigma)`` pairs, key = ``(ordered score bits << 32) |
    (E_PAD - 1 - e)`` (largest score, ties to the lower id; keys are distinct, so each pair
    carries its own sigma: no gather afterwards): ceil(k/2) CTA reductions, not k. At 1 row a
    thread holds E_PAD / threads values: the SPLIT loads all fit in registers at once."""
    offs_t = row0 + tl.arange(0, BLOCK_T)
    offs_e = tl.arange(0, E_PAD)
    tmask = offs_t < T
    emask = offs_e < E
    mask = tmask[:, None] & emask[None, :]
    ptrs = part_ptr + offs_t[:, None] * E + offs_e[None, :]
    parts = ()
    for s in tl.static_range(SPLIT):
        parts = parts + (tl.load(ptrs + s * T * E, mask=mask, other=0.0, cache_modifier=".cg"),)
    tl.debug_barrier()  # pins every load above the first add (else ptxas interleaves them)
    z = tl.zeros((BLOCK_T, E_PAD), dtype=tl.float32)
    for s in tl.static_range(SPLIT):  # fixed order: deterministic logits
        z += parts[s]
    # softplus(z) = max(z, 0) + log1p(exp(-|z|)); log1p by its series where 1 + y rounds.
    y = tl.exp(-tl.abs(z))
    log1p = tl.where(y < 1e-4, y * (1.0 - 0.5 * y), tl.log(1.0 + y))
    sigma = tl.sqrt(tl.maximum(z, 0.0) + log1p)  # >= +0: score is never -0.0
    bias = tl.load(bias_ptr + offs_e, mask=emask, other=0.0)
    score = tl.where(emask[None, :], sigma + bias[None, :], float("-inf"))
    valid = tmask
    if HAS_VALID:
        valid = valid & (offs_t < tl.load(valid_ptr))
    bits = score.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # signed order == float order
    key = (ordered.to(tl.int64) << 32) | (E_PAD - 1 - offs_e)[None, :].to(tl.int64)
    # One pass per two slots; ids and their sigmas collect in [BT, K_PAD] tiles.
    kk = tl.arange(0, K_PAD)[None, :]
    ids = tl.full((BLOCK_T, K_PAD), -1, tl.int32)
    sel = tl.zeros((BLOCK_T, K_PAD), dtype=tl.float32)
    none = tl.full((BLOCK_T, E_PAD), -(2**63), tl.int64)  # below every key, masked ones too
    for i in tl.static_range(0, TOP_K, 2):
        k1, s1, k2, s2 = tl.reduce((key, sigma, none, tl.zeros_like(sigma)), 1, _top2_combine)
        # picked keys drop below every real key (-inf scores included)
        key = tl.where((key == k1[:, None]) | (key == k2[:, None]), -(2**63 - 1), key)
        ids = tl.where(kk == i, ((E_PAD - 1) - (k1 & (E_PAD - 1)).to(tl.int32))[:, None], ids)
        sel = tl.where(kk == i, s1[:, None], sel)
        if i + 1 < TOP_K:
            ids = tl.where(kk == i + 1, ((E_PAD - 1) - (k2 & (E_PAD - 1)).to(tl.int32))[:, None],
                           ids)
            sel = tl.where(kk == i + 1, s2[:, None], sel)
    # normaliser summed in slot order, then the only stores
    total = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for i in tl.static_range(TOP_K):
        total += tl.sum(tl.where(kk == i, sel, 0.0), axis=1)
    norm = route_scale / (total + 1e-20)
    smask = tmask[:, None] & (kk < TOP_K)
    ids = tl.where(valid[:, None] & (kk < TOP_K), ids, -1)
    ent = offs_t[:, None] * TOP_K + kk
    tl.store(ids_ptr + ent, ids, mask=smask)
    tl.store(wts_ptr + ent, tl.where(valid[:, None], sel * norm[:, None], 0.0), mask=smask)
    return ids, ent


@triton.jit
def _route_record_kernel(ids_ptr, entries_ptr, tiles_ptr, N, CAP: tl.constexpr,
                         NP: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                         FILL: tl.constexpr):
    _record(ids_ptr, entries_ptr, tiles_ptr, N, CAP, NP, E_PAD, BLOCK_M, FILL)


@triton.jit
def _record(ids_ptr, entries_ptr, tiles_ptr, N, CAP: tl.constexpr, NP: tl.constexpr,
            E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, FILL: tl.constexpr):
    """One CTA: ``_record_keys`` of the ``N`` ids in memory (entry ``n`` = ``ids[n]``)."""
    offs = tl.arange(0, NP)
    e = tl.load(ids_ptr + offs, mask=offs < N, other=-1, cache_modifier=".cg")  # other CTAs'
    _record_keys(tl.where(e >= 0, e * NP + offs, E_PAD * NP), entries_ptr, tiles_ptr, CAP, NP,
                 E_PAD, BLOCK_M, FILL)


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _record_keys(key, entries_ptr, tiles_ptr, CAP: tl.constexpr, NP: tl.constexpr,
                 E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, FILL: tl.constexpr):
    """One CTA. ``key`` (1-D, any order, length a power of two >= 16): ``e * NP + n`` for
    entry ``n < NP`` (row t, slot i: ``n = t*k + i``) routed to expert ``e``, ``E_PAD * NP``
    for none. Entry n goes to ``entries[pstart[e] + rank]`` where ``pstart`` is the prefix of
    the per-expert counts padded to BLOCK_M and ``rank`` its position among the expert's
    entries in entry order; the rest stays -1. ``tiles[j]`` = the expert of tile j (entries
    ``j*BLOCK_M ..``), -1 past the last group: every entry writes its tile's expert (equal
    values where several share a tile; a group's tiles all hold an entry), so the expert
    kernels find their weights with one load.

    All of it on the sorted keys, no per-expert histogram: sorted position i of an entry is
    the count prefix of its expert plus its rank, so its destination is i plus the padding
    of the groups before it, an exclusive sum over the groups' last positions (each adds
    its group's ``-count mod BLOCK_M``, a mask: BLOCK_M is a power of two, as every tile
    ``arange`` needs); a group's first position comes from a running max.
    (The histogram over ``E_PAD`` bins and its scan it replaces took ~2,850 cycles of the
    single CTA at every row count: session 15's clock stamps, docs/kernels/moe.md.)"""
    for c in range(0, CAP, FILL):
        offs_f = c + tl.arange(0, FILL)
        tl.store(entries_ptr + offs_f, tl.full((FILL,), -1, tl.int32), mask=offs_f < CAP)
        tl.store(tiles_ptr + offs_f, tl.full((FILL,), -1, tl.int32), mask=offs_f < CAP // BLOCK_M)
    key = tl.sort(key)  # the valid keys first, in (expert, entry) order
    n: tl.constexpr = key.shape[0]
    kvalid = key < E_PAD * NP
    ke = tl.where(kvalid, key // NP, E_PAD)
    i = tl.arange(0, n)
    first = (i == 0) | (ke != tl.gather(ke, tl.maximum(i - 1, 0), 0))
    last = (i == n - 1) | (ke != tl.gather(ke, tl.minimum(i + 1, n - 1), 0))
    rank = i - tl.associative_scan(tl.where(first, i, 0), 0, _max_combine)
    pad = tl.where(last & kvalid, (-(rank + 1)) & (BLOCK_M - 1), 0)
    dest = i + tl.cumsum(pad, 0) - pad
    tl.debug_barrier()  # the -1 fills are done before any thread writes over them
    tl.store(entries_ptr + dest, key % NP, mask=kvalid)
    tl.store(tiles_ptr + dest // BLOCK_M, ke, mask=kvalid)


# --------------------------------------------------------------------------- dequant helpers

# Routed weights are repacked at load time (api.repack_mxfp4): each 32-bit word of a row holds
# 8 e2m1 values (k = 8j .. 8j+7) with their bits placed so that four words of bf16 pairs come
# out of it with 1-3 shifts and masks each: ``q & M``, ``(q << 3) & M``, ``(q << 6) & M`` and
# one three-shift word, M = sign, exponent (2 bits) and mantissa msb of both bf16 halves. A
# code ``c`` at bf16 bits 6..8 reads as value * 2^-126 (the 0.5 code as a bf16 subnormal, kept
# by ``mul.bf16x2``); the scale multiply by 2^(s-64) makes it W * 2^-63 exactly (normal), and
# the accumulator is multiplied by 2^63 at the end. The halves of each word are k, k+1.
_M2 = tl.constexpr(-2118090304)  # 0x81C081C0
_SIGN2 = tl.constexpr(-2147450880)  # 0x80008000
_POW63 = tl.constexpr(9.223372036854775808e18)  # 2**63


@triton.jit
def _halves(bits, INTERPRETER: tl.constexpr):
    """int32 -> (low, high) int16 halves: a register split on the GPU (the interpreter has no
    inline PTX)."""
    if INTERPRETER:
        lo = bits.to(tl.int16)
        hi = (bits >> 16).to(tl.int16)
    else:
        lo, hi = tl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [bits],
                                           dtype=(tl.int16, tl.int16), is_pure=True, pack=1)
    return lo, hi


@triton.jit
def _mx4_dot(acc, x_ptr, rows, row_ok, stride_x, it, K: tl.constexpr, w_ptr, s_ptr, wrows,
             n_ok, SCALE_BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, GRANULE_N: tl.constexpr,
             INTERPRETER: tl.constexpr):
    """``acc [BN, BM] += W[wrows, k0:k0+BK] @ x[rows, k0:k0+BK]^T`` (``k0 = it * BK``,
    ``K % BK == 0``, so no K masks and 16-byte loads) for repacked MXFP4 ``W``: int32 words
    ``[N, K/8]`` (GRANULE_N = 0) or granule-major ``[K/64, N, 8]`` (GRANULE_N = N: W2 where
    I % 128 == 64, ``api.granule_major``), with ue8m0 scales ``[N, K/SCALE_BLOCK]``;
    ``wrows`` (``[BN]``) are the weight rows of the tile, ``n_ok`` masks them. The result is
    2^-63 times the true product (see above). INTERPRETER: the CPU interpreter's variant (no
    inline PTX; the exact scale product in fp32, as its bf16 arithmetic works on raw bit
    patterns)."""
    BN: tl.constexpr = acc.shape[0]
    offs_w = it * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
    if GRANULE_N:  # word c of row r at (c // 8) * 8N + 8r + c % 8
        w_ptrs = w_ptr + ((offs_w // 8)[None, :] * (8 * GRANULE_N) + wrows[:, None] * 8
                          + offs_w[None, :] % 8)
    else:
        w_ptrs = w_ptr + wrows[:, None] * (K // 8) + offs_w[None, :]
    q = tl.load(w_ptrs, mask=n_ok[:, None], other=0)
    l0, h0 = _halves(q & _M2, INTERPRETER)
    l1, h1 = _halves((q << 3) & _M2, INTERPRETER)
    l2, h2 = _halves((q << 6) & _M2, INTERPRETER)
    l3, h3 = _halves(((q >> 4) & 0x00C000C0) | ((q >> 5) & 0x01000100) | ((q << 1) & _SIGN2),
                     INTERPRETER)
    # k order within the word: l0 h0 l2 h2 l1 h1 l3 h3 (api.REPACK_BITS)
    w = tl.join(tl.join(tl.join(l0, l1), tl.join(l2, l3)),
                tl.join(tl.join(h0, h1), tl.join(h2, h3)))
    offs_s = it * (BLOCK_K // SCALE_BLOCK) + tl.arange(0, BLOCK_K // SCALE_BLOCK)
    # the [BN, BK/b] byte tile streams (cp.async) only from 4 bytes a thread: BN * BK/b >=
    # 4 x the CTA's threads (why W1|W3 takes its gate and up rows in one tile)
    ws = tl.load(s_ptr + wrows[:, None] * (K // SCALE_BLOCK) + offs_s[None, :],
                 mask=n_ok[:, None], other=127).to(tl.int32)
    sc = ((ws + 63) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)  # 2^(s-64)
    w = w.reshape(BN, BLOCK_K // SCALE_BLOCK, SCALE_BLOCK)
    if INTERPRETER:
        wf = ((w.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
        w = (wf * sc.to(tl.float32)[:, :, None]).to(tl.bfloat16)
    else:
        # packed bf16x2 multiplies; the 0.5 code enters as a bf16 subnormal (kept by HMUL2)
        w = w.to(tl.bfloat16, bitcast=True) * sc[:, :, None]
    w = w.reshape(BN, BLOCK_K)
    offs_k = it * BLOCK_K + tl.arange(0, BLOCK_K)
    xt = tl.load(x_ptr + rows[None, :] * stride_x + offs_k[:, None], mask=row_ok[None, :],
                 other=0.0)
    return tl.dot(w, xt, acc)


@triton.jit
def _ue8m0_to_f32(s):
    """ue8m0 byte -> fp32 ``2**(s-127)`` exactly (byte 0 reads as 0; never a weight scale)."""
    return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _fp8_dot(acc, x_ptr, rows, row_ok, stride_x, it, K: tl.constexpr, w_ptr, s_ptr, wrows,
             n_ok, BLOCK_K: tl.constexpr):
    """``acc [BN, BM] += W[wrows, k0:k0+BK] @ x[rows, k0:k0+BK]^T`` (``k0 = it * BK``,
    ``K % BK == 0``) for e4m3 ``W [N, K]`` with one ue8m0 scale per 32x32 block
    (``[ceil(N/32), K/32]``), applied to each 32-deep partial product in fp32."""
    for kk in tl.static_range(BLOCK_K // 32):
        offs_k = it * BLOCK_K + kk * 32 + tl.arange(0, 32)
        xt = tl.load(x_ptr + rows[None, :] * stride_x + offs_k[:, None], mask=row_ok[None, :],
                     other=0.0)
        wt = tl.load(w_ptr + wrows[:, None] * K + offs_k[None, :], mask=n_ok[:, None],
                     other=0.0)
        s = tl.load(s_ptr + (wrows // 32) * (K // 32) + it * (BLOCK_K // 32) + kk, mask=n_ok,
                    other=0)
        part = tl.dot(wt.to(tl.bfloat16), xt)
        acc += part * _ue8m0_to_f32(s)[:, None]
    return acc


@triton.jit
def _fp8_dot_prescaled(acc, x_ptr, rows, row_ok, stride_x, it, K: tl.constexpr, w_ptr, s_ptr,
                       wrows, n_ok, BLOCK_K: tl.constexpr, INTERPRETER: tl.constexpr):
    """``acc [BN, BM] += W[wrows, k0:k0+BK] @ x[rows, k0:k0+BK]^T`` (``k0 = it * BK``,
    ``K % BK == 0``) for e4m3 ``W [N, K]`` with one ue8m0 scale per 32x32 block
    (``[ceil(N/32), K/32]``). The scale multiplies the weights before the dot: e4m3 x 2^j
    is exact in bf16, so the tile is the dequantised weights exactly (in fp32 under the
    interpreter, whose bf16 arithmetic works on raw bit patterns). At most 128 columns a dot
    (the converted tile stays in registers); each chunk's scales are one ``[BN, 4]`` byte tile
    (4 bytes a thread at W1|W3's 64 rows: cp.async)."""
    BN: tl.constexpr = acc.shape[0]
    SUB: tl.constexpr = min(BLOCK_K, 128)
    for c in tl.static_range(BLOCK_K // SUB):
        offs_k = it * BLOCK_K + c * SUB + tl.arange(0, SUB)
        xt = tl.load(x_ptr + rows[None, :] * stride_x + offs_k[:, None], mask=row_ok[None, :],
                     other=0.0)
        wt = tl.load(w_ptr + wrows[:, None] * K + offs_k[None, :], mask=n_ok[:, None],
                     other=0.0)
        offs_s = (it * BLOCK_K + c * SUB) // 32 + tl.arange(0, SUB // 32)
        s = tl.load(s_ptr + (wrows // 32)[:, None] * (K // 32) + offs_s[None, :],
                    mask=n_ok[:, None], other=127)
        wt = wt.reshape(BN, SUB // 32, 32)
        if INTERPRETER:
            w = (wt.to(tl.float32) * _ue8m0_to_f32(s)[:, :, None]).to(tl.bfloat16)
        else:
            sc = (s.to(tl.int16) << 7).to(tl.bfloat16, bitcast=True)  # 2^(s-127)
            w = wt.to(tl.bfloat16) * sc[:, :, None]
        acc = tl.dot(w.reshape(BN, SUB), xt, acc)
    return acc


# --------------------------------------------------------------------------- experts


@triton.jit
def _last_arrival(tick_ptr, N_ARRIVALS):
    """Ticket of a group of ``N_ARRIVALS`` CTAs: True in the last one to arrive (which resets
    the counter). The CTA barrier puts every thread's stores before the release of the one
    ``atom.acq_rel.gpu``; its acquire puts the other CTAs' stores before the caller's loads
    (read with ``.cg``: L2, never a stale L1 line). The CUTLASS split-K semaphore pattern."""
    tl.debug_barrier()
    ticket = tl.atomic_add(tick_ptr, 1, sem="acq_rel", scope="gpu")
    last = ticket == N_ARRIVALS - 1
    if last:
        tl.store(tick_ptr, 0)
    return last


@triton.jit
def _swiglu(g, u):
    g = tl.minimum(g, 10.0)
    u = tl.minimum(tl.maximum(u, -10.0), 10.0)
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def _up_store(acc_g, acc_u, ent, ok, offs_n, n_ok, h_ptr, gu_ptr, tick_ptr, tick, pid_s, N_ROWS,
              I: tl.constexpr, SPLIT: tl.constexpr):
    """SPLIT == 1: ``h[ent, n] = swiglu(g, u)`` in bf16. Else this K chunk's fp32 partials go
    to ``gu[pid_s, ent, n]`` (g) and ``gu[pid_s, ent, I + n]`` (u); the last of the SPLIT CTAs
    of this (tile, n block) to arrive (ticket ``tick_ptr + tick``) sums the SPLIT partials in chunk
    order from memory (whatever CTA is last: deterministic), then ``h = swiglu(g, u)``."""
    mask = ok[None, :] & n_ok[:, None]
    h_dst = h_ptr + ent[None, :].to(tl.int64) * I + offs_n[:, None]
    if SPLIT == 1:
        tl.store(h_dst, _swiglu(acc_g, acc_u).to(tl.bfloat16), mask=mask)
    else:
        row = ent[None, :].to(tl.int64) * (2 * I) + offs_n[:, None]
        chunk = N_ROWS.to(tl.int64) * (2 * I)  # elements per K chunk of gu
        tl.store(gu_ptr + pid_s * chunk + row, acc_g, mask=mask)
        tl.store(gu_ptr + pid_s * chunk + row + I, acc_u, mask=mask)
        if _last_arrival(tick_ptr + tick, SPLIT):
            _sum_split_swiglu(gu_ptr, chunk, row, mask, h_dst, acc_g, I, SPLIT)


@triton.jit
def _sum_split_swiglu(gu_ptr, chunk, row, mask, h_dst, like, I: tl.constexpr,
                      SPLIT: tl.constexpr):
    """The last arrival's work: ``h = swiglu(sum_s g_s, sum_s u_s)`` over the SPLIT partials
    in chunk order (other CTAs wrote them: ``.cg``). Unrolled: each sum's SPLIT loads issue
    together (g's, then u's: 128 registers). ``like``: a tile of the partials' shape."""
    g = tl.zeros_like(like)
    for s in tl.static_range(SPLIT):
        g += tl.load(gu_ptr + s * chunk + row, mask=mask, other=0.0, cache_modifier=".cg")
    u = tl.zeros_like(like)
    for s in tl.static_range(SPLIT):
        u += tl.load(gu_ptr + s * chunk + row + I, mask=mask, other=0.0, cache_modifier=".cg")
    tl.store(h_dst, _swiglu(g, u).to(tl.bfloat16), mask=mask)


@triton.jit
def _grid_tick(I: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    """The (tile, n block) ticket of a ``_moe_up_kernel`` CTA, from the program ids after the
    K loop: nothing stays live across the loop for it (no spill under the 128-register cap)."""
    return tl.program_id(1) * tl.cdiv(I, BLOCK_N) + tl.program_id(0) // SPLIT


@triton.jit
def _moe_up_kernel(x_ptr, entries_ptr, tiles_ptr, w13_ptr, s13_ptr, sw13_ptr, ss13_ptr, h_ptr,
                   gu_ptr, tick_ptr, T, stride_x, N_ENTRIES, SH_TILES, D: tl.constexpr,
                   I: tl.constexpr, TOP_K: tl.constexpr, SCALE_BLOCK: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT: tl.constexpr, JOIN: tl.constexpr, INTERPRETER: tl.constexpr):
    """Grid ``(I/BLOCK_N * SPLIT, SH_TILES + max_tiles)``. Tile ``pid_m < SH_TILES``: BLOCK_M
    rows of the shared expert (first: its CTAs stream twice the bytes, so they start first);
    beyond: routed tile ``pid_m - SH_TILES`` (BLOCK_M entries of one expert). Each CTA takes
    BLOCK_N of the I outputs and K chunk ``pid_s`` of SPLIT (``_up_store``; ticket
    ``tick[pid_m * I/BLOCK_N + n block]``). Accumulators are ``[BLOCK_N, BLOCK_M]`` (weights
    as the MMA's M side: few rows per tile). JOIN (``api._join_gate_up``): W1's and W3's
    BLOCK_N rows in one ``[2 BLOCK_N, BLOCK_K]`` tile a step (one dot, one streaming scale
    tile; the shared expert's tile scaled before the dot), else one tile each."""
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(0) % SPLIT
    n0 = (tl.program_id(0) // SPLIT) * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < I
    offs_m = tl.arange(0, BLOCK_M)
    n_rows = N_ENTRIES + T
    # K chunk pid_s: steps it0 .. it0 + STEPS - 1 (a constant trip count; D % (SPLIT * BLOCK_K)
    # == 0, checked by the caller)
    STEPS: tl.constexpr = D // (SPLIT * BLOCK_K)
    it0 = pid_s * STEPS
    # JOIN: one tile of 2 x BLOCK_N weight rows, W1's n0.. then W3's (rows I + n0..): one dot
    # and one scale tile a step, twice the bytes, so that the tile streams (see _mx4_dot)
    offs_r = tl.arange(0, 2 * BLOCK_N)
    wrows = n0 + offs_r % BLOCK_N + (offs_r // BLOCK_N) * I
    r_ok = n0 + offs_r % BLOCK_N < I
    if pid_m >= SH_TILES:
        tile = pid_m - SH_TILES
        e = tl.load(tiles_ptr + tile).to(tl.int64)  # the tile's expert: one load to weights
        if e >= 0:  # tiles past the last expert's group are idle
            ent = tl.load(entries_ptr + tile * BLOCK_M + offs_m)
            ok = ent >= 0
            rows = tl.where(ok, ent // TOP_K, 0)
            w = w13_ptr + e * (2 * I) * (D // 8)
            s = s13_ptr + e * (2 * I) * (D // SCALE_BLOCK)
            if JOIN:
                acc = tl.zeros((2 * BLOCK_N, BLOCK_M), dtype=tl.float32)
                for j in range(STEPS):
                    acc = _mx4_dot(acc, x_ptr, rows, ok, stride_x, it0 + j, D, w, s, wrows,
                                   r_ok, SCALE_BLOCK, BLOCK_K, 0, INTERPRETER)
                acc_g, acc_u = _gate_up(acc)
            else:
                acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                for j in range(STEPS):
                    acc_g = _mx4_dot(acc_g, x_ptr, rows, ok, stride_x, it0 + j, D, w, s, offs_n,
                                     n_ok, SCALE_BLOCK, BLOCK_K, 0, INTERPRETER)
                    acc_u = _mx4_dot(acc_u, x_ptr, rows, ok, stride_x, it0 + j, D,
                                     w + I * (D // 8), s + I * (D // SCALE_BLOCK), offs_n, n_ok,
                                     SCALE_BLOCK, BLOCK_K, 0, INTERPRETER)
            _up_store(acc_g * _POW63, acc_u * _POW63, tl.where(ok, ent, 0), ok, offs_n, n_ok,
                      h_ptr, gu_ptr, tick_ptr, _grid_tick(I, BLOCK_N, SPLIT), pid_s, n_rows, I,
                      SPLIT)
    else:
        rows = pid_m * BLOCK_M + offs_m
        ok = rows < T
        if JOIN:
            acc = tl.zeros((2 * BLOCK_N, BLOCK_M), dtype=tl.float32)
            for j in range(STEPS):
                acc = _fp8_dot_prescaled(acc, x_ptr, rows, ok, stride_x, it0 + j, D, sw13_ptr,
                                         ss13_ptr, wrows, r_ok, BLOCK_K, INTERPRETER)
            acc_g, acc_u = _gate_up(acc)
        else:
            acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for j in range(STEPS):
                acc_g = _fp8_dot(acc_g, x_ptr, rows, ok, stride_x, it0 + j, D, sw13_ptr,
                                 ss13_ptr, offs_n, n_ok, BLOCK_K)
                acc_u = _fp8_dot(acc_u, x_ptr, rows, ok, stride_x, it0 + j, D, sw13_ptr + I * D,
                                 ss13_ptr + (I // 32) * (D // 32), offs_n, n_ok, BLOCK_K)
        _up_store(acc_g, acc_u, N_ENTRIES + tl.where(ok, rows, 0), ok, offs_n, n_ok, h_ptr,
                  gu_ptr, tick_ptr, _grid_tick(I, BLOCK_N, SPLIT), pid_s, n_rows, I, SPLIT)


@triton.jit
def _gate_up(acc):
    """``[2N, M]`` -> its first and last N rows (the gate's and the up projection's)."""
    N: tl.constexpr = acc.shape[0] // 2
    return tl.split(acc.reshape(2, N, acc.shape[1]).permute(1, 2, 0))


@triton.jit
def _moe_down_kernel(h_ptr, entries_ptr, tiles_ptr, w2_ptr, s2_ptr, sw2_ptr, ss2_ptr, part_ptr,
                     ids_ptr, wts_ptr, out_ptr, tick_ptr, T, N_ENTRIES, SH_TILES, stride_out,
                     D: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr,
                     SCALE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, COMBINE: tl.constexpr, W2_GRANULE: tl.constexpr,
                     INTERPRETER: tl.constexpr):
    """``P[entry, n] = (W2 h[entry])[n]`` in fp32 for this CTA's BLOCK_N of the D outputs;
    grid ``(D/BLOCK_N, SH_TILES + max_tiles)``, tiles as in ``_moe_up_kernel`` (shared rows
    first; they live at entries ``N_ENTRIES + t``). COMBINE (``T <= BLOCK_M``; the api sets it
    up to 3 rows): the last CTA of the column block to arrive (ticket ``tick[pid_n]``, every
    tile counts, idle ones too) does ``_moe_combine_kernel``'s work for it (``_combine_rows``).
    W2_GRANULE: the routed W2 is granule-major (``api.MoEWeights.w2_granule``)."""
    pid_m = tl.program_id(1)
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < D
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if pid_m >= SH_TILES:
        tile = pid_m - SH_TILES
        e = tl.load(tiles_ptr + tile).to(tl.int64)
        if e >= 0:
            ent = tl.load(entries_ptr + tile * BLOCK_M + offs_m)
            ok = ent >= 0
            hrows = tl.where(ok, ent, 0).to(tl.int64)
            w = w2_ptr + e * D * (I // 8)
            s = s2_ptr + e * D * (I // SCALE_BLOCK)
            for it in range(I // BLOCK_K):
                acc = _mx4_dot(acc, h_ptr, hrows, ok, I, it, I, w, s, offs_n, n_ok,
                               SCALE_BLOCK, BLOCK_K, W2_GRANULE * D, INTERPRETER)
            tl.store(part_ptr + hrows[None, :] * D + offs_n[:, None], acc * _POW63,
                     mask=ok[None, :] & n_ok[:, None])
    else:
        rows = pid_m * BLOCK_M + offs_m
        ok = rows < T
        hrows = (N_ENTRIES + tl.where(ok, rows, 0)).to(tl.int64)
        for it in range(I // BLOCK_K):
            acc = _fp8_dot(acc, h_ptr, hrows, ok, I, it, I, sw2_ptr, ss2_ptr, offs_n, n_ok,
                           BLOCK_K)
        tl.store(part_ptr + hrows[None, :] * D + offs_n[:, None], acc,
                 mask=ok[None, :] & n_ok[:, None])
    if COMBINE:
        if _last_arrival(tick_ptr + pid_n, tl.num_programs(1)):
            _combine_rows(part_ptr, ids_ptr, wts_ptr, out_ptr, offs_m, offs_m < T, offs_n, n_ok,
                          D, N_ENTRIES, SH_TILES > 0, stride_out, TOP_K)


@triton.jit
def _combine_rows(part_ptr, ids_ptr, wts_ptr, out_ptr, rows, row_ok, offs_d, d_ok, D,
                  N_ENTRIES, HAS_SHARED, stride_out, TOP_K: tl.constexpr):
    """``out[rows, offs_d] = sum_i w[t, i] * P[t*k + i] + P[N_ENTRIES + t]`` in slot order, fp32
    ``[len(offs_d), len(rows)]`` (the order of ``_moe_combine_kernel``: the same bits). P was
    written by other CTAs: loaded with ``.cg``. The slots' loads are unrolled (issued together)."""
    acc = tl.zeros((offs_d.shape[0], rows.shape[0]), dtype=tl.float32)
    for i in tl.static_range(TOP_K):
        n = rows * TOP_K + i
        e = tl.load(ids_ptr + n, mask=row_ok, other=-1)
        w = tl.load(wts_ptr + n, mask=row_ok, other=0.0)
        p = tl.load(part_ptr + n[None, :].to(tl.int64) * D + offs_d[:, None],
                    mask=d_ok[:, None] & (e >= 0)[None, :], other=0.0, cache_modifier=".cg")
        acc += tl.where(e >= 0, w, 0.0)[None, :] * p
    if HAS_SHARED:
        acc += tl.load(part_ptr + (N_ENTRIES + rows[None, :]).to(tl.int64) * D + offs_d[:, None],
                       mask=d_ok[:, None] & row_ok[None, :], other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + rows[None, :].to(tl.int64) * stride_out + offs_d[:, None],
             acc.to(tl.bfloat16), mask=d_ok[:, None] & row_ok[None, :])


@triton.jit
def _moe_combine_kernel(part_ptr, ids_ptr, wts_ptr, out_ptr, D, N_ENTRIES, stride_out,
                        TOP_K: tl.constexpr, HAS_SHARED: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for i in tl.static_range(TOP_K):  # slot order: deterministic
        n = row * TOP_K + i
        e = tl.load(ids_ptr + n)
        w = tl.load(wts_ptr + n)
        p = tl.load(part_ptr + n.to(tl.int64) * D + offs_d, mask=dmask & (e >= 0), other=0.0)
        acc += tl.where(e >= 0, w, 0.0) * p
    if HAS_SHARED:
        acc += tl.load(part_ptr + (N_ENTRIES + row).to(tl.int64) * D + offs_d, mask=dmask,
                       other=0.0)
    tl.store(out_ptr + row.to(tl.int64) * stride_out + offs_d, acc.to(tl.bfloat16), mask=dmask)
