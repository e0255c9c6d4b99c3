"""The few-row expert kernels (private; the contract is in ``api.py``): W1|W3 and W2 as
register GEMVs, two launches after the router and no routing record.

Where each routed entry has its own expert (1 row: 6 experts of one row), a tile of 16 padded
rows per expert wastes the tensor cores' work and, worse, the tensor-core kernels' pipeline
keeps only 2-3 K steps of each CTA in flight, then a split-K ticket and a combine. Here each
CTA issues every weight load of its tile before its first multiply (one HBM round trip
instead of a chain of them), reduces over K within the CTA, and writes its result once:

1. ``_gemv_up_kernel``    grid ``(SH_ITEMS + T*k*NB,)``: item = (routed entry n, block of
                          BLOCK_N outputs) or (shared expert, block of BLOCK_N/2 outputs, all T
                          rows); the W1 and W3 rows of the block in one tile over all of K,
                          fp32 FMAs with x, clamped SwiGLU -> ``h[n]`` bf16 (the shared
                          expert's rows at ``h[T*k + t]``, as the tensor-core kernels lay h);
2. ``_gemv_down_kernel``  grid ``(D/BLOCK_D, T)``: the BLOCK_D outputs of row t from all k
                          slots at once (a ``[K_PAD, BLOCK_D, 8]`` word tile per 64 inputs) and
                          the shared expert -> ``out[t]`` bf16: no partials, no combine.

The weights are the tensor-core kernels' layouts (``api.MoEWeights``); the MXFP4 decode is
theirs (``_triton._mx4_dequant``: exact bf16 times 2^-63), then fp32 FMAs. Deterministic (a
fixed reduction tree, no atomics), graph-safe (grids from shapes; slots with expert -1 load
nothing and add 0)."""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton import _POW63, _mx4_dequant, _swiglu, _ue8m0_to_f32


@triton.jit
def _fp8_dequant(wt, s):
    """e4m3 ``[R, C]`` and its ue8m0 block scales ``[R, C/32]`` -> fp32 ``[R, C]`` (exact)."""
    R: tl.constexpr = wt.shape[0]
    C: tl.constexpr = wt.shape[1]
    w = wt.to(tl.float32).reshape(R, C // 32, 32) * _ue8m0_to_f32(s)[:, :, None]
    return w.reshape(R, C)


@triton.jit
def _row_dot(w, x_ptr, k0, BK: tl.constexpr):
    """``w [R, BK] * x[k0 : k0 + BK]`` summed over each 8 consecutive inputs (within a
    thread) -> ``[R, BK/8]``: the K reduction's last step is one ``tl.sum`` at the end.
    x is loaded as ``[4, BK/32, 8]`` (16-byte pieces, 32 inputs a lane) and permuted back, so
    that a lane holds the inputs of its own 4 weight words (one 16-byte weight load)."""
    R: tl.constexpr = w.shape[0]
    r = tl.arange(0, 4)[:, None, None]
    a = tl.arange(0, BK // 32)[None, :, None]
    i = tl.arange(0, 8)[None, None, :]
    xv = tl.load(x_ptr + k0 + 32 * a + 8 * r + i).to(tl.float32)
    xv = xv.permute(1, 0, 2).reshape(BK // 8, 8)
    return tl.sum(w.reshape(R, BK // 8, 8) * xv[None, :, :], axis=2)


@triton.jit
def _gate_up_store(acc, h_row, n0, I: tl.constexpr, SCALE):
    """``acc [2N, KW]`` (W1's N rows, then W3's) -> ``h_row[n0 : n0 + N] = swiglu`` bf16."""
    N: tl.constexpr = acc.shape[0] // 2
    tot = tl.sum(acc, axis=1) * SCALE
    g, u = tl.split(tot.reshape(2, N).permute(1, 0))
    offs = n0 + tl.arange(0, N)
    tl.store(h_row + offs, _swiglu(g, u).to(tl.bfloat16), mask=offs < I)


@triton.jit
def _gemv_up_kernel(x_ptr, ids_ptr, w13_ptr, s13_ptr, sw13_ptr, ss13_ptr, h_ptr, stride_x,
                    SH_ITEMS, T: tl.constexpr, D: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr,
                    SCALE_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
                    HOIST: tl.constexpr, INTERPRETER: tl.constexpr):
    """W1|W3 + SwiGLU of one item (module docstring). The K loop is unrolled in chunks of
    ``8 BLOCK_KW`` inputs (``D % (8 BLOCK_KW) == 0``); the loads of HOIST chunks at a time
    are issued before any of them is used (a CTA barrier keeps the compiler from sinking
    them into the multiplies). Shared items carry BLOCK_N/2 outputs: their e4m3 rows are
    twice the bytes of MXFP4 rows, so every item streams the same bytes, and loop over the T
    rows (a constant: the path serves a few rows) with the weights in registers."""
    NB: tl.constexpr = (I + BLOCK_N - 1) // BLOCK_N
    BK: tl.constexpr = 8 * BLOCK_KW
    NCH: tl.constexpr = D // BK
    pid = tl.program_id(0)
    if pid >= SH_ITEMS:
        item = pid - SH_ITEMS
        n = item // NB
        n0 = (item % NB) * BLOCK_N
        e = tl.load(ids_ptr + n)
        if e >= 0:  # padding rows' slots: nothing to do (W2 skips them too)
            offs_r = tl.arange(0, 2 * BLOCK_N)
            wrows = n0 + offs_r % BLOCK_N + (offs_r // BLOCK_N) * I  # W1's rows, then W3's
            r_ok = (n0 + offs_r % BLOCK_N < I)[:, None]
            w_rows = w13_ptr + e.to(tl.int64) * (2 * I) * (D // 8) + wrows[:, None] * (D // 8)
            s_rows = (s13_ptr + e.to(tl.int64) * (2 * I) * (D // SCALE_BLOCK)
                      + wrows[:, None] * (D // SCALE_BLOCK))
            offs_w = tl.arange(0, BLOCK_KW)[None, :]
            offs_s = tl.arange(0, BK // SCALE_BLOCK)[None, :]
            x_row = x_ptr + (n // TOP_K).to(tl.int64) * stride_x
            acc = None
            for c0 in tl.static_range(0, NCH, HOIST):
                qs = ()
                ss = ()
                for c in tl.static_range(c0, min(c0 + HOIST, NCH)):
                    qs += (tl.load(w_rows + c * BLOCK_KW + offs_w, mask=r_ok, other=0),)
                    ss += (tl.load(s_rows + c * (BK // SCALE_BLOCK) + offs_s, mask=r_ok,
                                   other=127),)
                tl.debug_barrier()
                for c in tl.static_range(c0, min(c0 + HOIST, NCH)):
                    w = _mx4_dequant(qs[c - c0], ss[c - c0], SCALE_BLOCK, INTERPRETER)
                    part = _row_dot(w.to(tl.float32), x_row, c * BK, BK)
                    acc = part if c == 0 else acc + part
            _gate_up_store(acc, h_ptr + n.to(tl.int64) * I, n0, I, _POW63)
    else:
        SN: tl.constexpr = BLOCK_N // 2
        n0 = pid * SN
        offs_r = tl.arange(0, BLOCK_N)
        wrows = n0 + offs_r % SN + (offs_r // SN) * I
        r_ok = (n0 + offs_r % SN < I)[:, None]
        w_rows = sw13_ptr + wrows[:, None] * D
        s_rows = ss13_ptr + (wrows // 32)[:, None] * (D // 32)
        offs_k = tl.arange(0, BK)[None, :]
        offs_s = tl.arange(0, BK // 32)[None, :]
        for t in tl.static_range(T):
            x_row = x_ptr + t * stride_x
            acc = None
            for c0 in tl.static_range(0, NCH, HOIST):
                qs = ()
                ss = ()
                for c in tl.static_range(c0, min(c0 + HOIST, NCH)):
                    qs += (tl.load(w_rows + c * BK + offs_k, mask=r_ok, other=0.0),)
                    ss += (tl.load(s_rows + c * (BK // 32) + offs_s, mask=r_ok, other=127),)
                tl.debug_barrier()
                for c in tl.static_range(c0, min(c0 + HOIST, NCH)):
                    w = _fp8_dequant(qs[c - c0], ss[c - c0])
                    part = _row_dot(w, x_row, c * BK, BK)
                    acc = part if c == 0 else acc + part
            _gate_up_store(acc, h_ptr + (T * TOP_K + t) * I, n0, I, 1.0)


@triton.jit
def _gemv_down_kernel(h_ptr, ids_ptr, wts_ptr, w2_ptr, s2_ptr, sw2_ptr, ss2_ptr, out_ptr,
                      stride_out, N_ENTRIES, D: tl.constexpr, I: tl.constexpr,
                      TOP_K: tl.constexpr, K_PAD: tl.constexpr, SCALE_BLOCK: tl.constexpr,
                      BLOCK_D: tl.constexpr, HOIST: tl.constexpr, W2_GRANULE: tl.constexpr,
                      HAS_SHARED: tl.constexpr, INTERPRETER: tl.constexpr):
    """``out[t, d0 : d0 + BLOCK_D] = sum_i w[t, i] * (W2_{e_i} h[t*k + i]) + S2 h[N_ENTRIES +
    t]`` (module docstring), over I in granules of 64 inputs (``I % 64 == 0``; W2 row-major
    ``[E, D, I/8]`` or granule-major ``[E, I/64, D, 8]``), HOIST granules' loads issued
    together. The slots are summed by one fixed tree (``tl.sum`` over the slot axis), then
    the shared expert is added."""
    t = tl.program_id(1)
    d0 = tl.program_id(0) * BLOCK_D
    NG: tl.constexpr = I // 64
    GS: tl.constexpr = 64 // SCALE_BLOCK
    slot = tl.arange(0, K_PAD)
    e = tl.load(ids_ptr + t * TOP_K + slot, mask=slot < TOP_K, other=-1)
    wt = tl.load(wts_ptr + t * TOP_K + slot, mask=slot < TOP_K, other=0.0)
    e_ok = e >= 0
    e64 = tl.where(e_ok, e, 0).to(tl.int64)
    offs_d = d0 + tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    ld_ok = e_ok[:, None, None] & d_ok[None, :, None]
    j = tl.arange(0, 8)[None, None, :]
    if W2_GRANULE:  # word 8g + j of row d at (g * D + d) * 8 + j
        w_base = w2_ptr + e64[:, None, None] * (D * (I // 8)) + offs_d[None, :, None] * 8 + j
        G_STRIDE: tl.constexpr = 8 * D
    else:
        w_base = w2_ptr + e64[:, None, None] * (D * (I // 8)) + offs_d[None, :, None] * (I // 8) + j
        G_STRIDE: tl.constexpr = 8
    s_base = (s2_ptr + e64[:, None, None] * (D * (I // SCALE_BLOCK))
              + offs_d[None, :, None] * (I // SCALE_BLOCK) + tl.arange(0, GS)[None, None, :])
    h_base = (h_ptr + (t * TOP_K + slot).to(tl.int64)[:, None, None, None] * I
              + 8 * tl.arange(0, 4)[None, :, None, None] + 32 * tl.arange(0, 2)[None, None, :, None]
              + tl.arange(0, 8)[None, None, None, :])  # [K_PAD, 4, 2, 8]: input 32a + 8r + i
    acc = None
    for g0 in tl.static_range(0, NG, HOIST):
        qs = ()
        ss = ()
        for g in tl.static_range(g0, min(g0 + HOIST, NG)):
            qs += (tl.load(w_base + g * G_STRIDE, mask=ld_ok, other=0),)
            ss += (tl.load(s_base + g * GS, mask=ld_ok, other=127),)
        tl.debug_barrier()
        for g in tl.static_range(g0, min(g0 + HOIST, NG)):
            w = _mx4_dequant(qs[g - g0].reshape(K_PAD * BLOCK_D, 8),
                             ss[g - g0].reshape(K_PAD * BLOCK_D, GS), SCALE_BLOCK, INTERPRETER)
            # h in 16-byte pieces, 32 inputs a lane (see _row_dot)
            hv = tl.load(h_base + g * 64, mask=e_ok[:, None, None, None], other=0.0)
            hv = hv.to(tl.float32).permute(0, 2, 1, 3).reshape(K_PAD, 1, 8, 8)
            part = tl.sum(w.to(tl.float32).reshape(K_PAD, BLOCK_D, 8, 8) * hv, axis=3)
            acc = part if g == 0 else acc + part  # no zeros: acc takes the product's layout
    y = tl.sum(tl.sum(acc, axis=2) * (wt * _POW63)[:, None], axis=0)
    if HAS_SHARED:
        sw_rows = sw2_ptr + offs_d[:, None] * I + tl.arange(0, 64)[None, :]
        ss_rows = ss2_ptr + (offs_d // 32)[:, None] * (I // 32) + tl.arange(0, 2)[None, :]
        h_sh = h_ptr + (N_ENTRIES + t).to(tl.int64) * I + tl.arange(0, 64)
        acc_s = None
        for g0 in tl.static_range(0, NG, HOIST):
            qs = ()
            ss = ()
            for g in tl.static_range(g0, min(g0 + HOIST, NG)):
                qs += (tl.load(sw_rows + g * 64, mask=d_ok[:, None], other=0.0),)
                ss += (tl.load(ss_rows + g * 2, mask=d_ok[:, None], other=127),)
            tl.debug_barrier()
            for g in tl.static_range(g0, min(g0 + HOIST, NG)):
                w = _fp8_dequant(qs[g - g0], ss[g - g0])
                hv = tl.load(h_sh + g * 64).to(tl.float32)
                part = tl.sum(w.reshape(BLOCK_D, 8, 8) * hv.reshape(1, 8, 8), axis=2)
                acc_s = part if g == 0 else acc_s + part
        y += tl.sum(acc_s, axis=1)
    tl.store(out_ptr + t.to(tl.int64) * stride_out + offs_d, y.to(tl.bfloat16), mask=d_ok)


def up_grid(rows: int, top_k: int, inter: int, block_n: int, shared: bool) -> tuple[int, int]:
    """(SH_ITEMS, grid size) of ``_gemv_up_kernel``."""
    nb = triton.cdiv(inter, block_n)
    sh = triton.cdiv(inter, block_n // 2) if shared else 0
    return sh, sh + rows * top_k * nb
