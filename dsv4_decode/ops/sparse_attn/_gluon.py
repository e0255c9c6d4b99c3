"""Hopper (sm_90) kernel of ``sparse_attn`` on wgmma (private; the contract is in ``api.py``).

``_wgmma_attn_kernel`` computes the same split partials as ``_triton._sparse_attn_kernel``
(grid ``(n_split, head blocks, rows)``, 16 heads a CTA, partials ``(m, l, acc)`` in the
workspace, merged by ``_triton._merge_kernel``), with both products on warpgroup MMAs and the
keys in the MMA's M, 64 keys a step, one warpgroup (4 warps) a CTA:

- ``S^T [64 keys, 16 heads] = K Q^T``: A = the step's key tile ``k_s`` (bf16 ``[64, 512]`` in
  shared memory, 128-byte swizzle), B = the row's queries ``q_s`` (``[16, 512]``, stored once).
- ``acc^T [512, 16] += K^T P^T``: A = the same tile through a transposed descriptor (wgmma
  reads 16-bit operands in either major order), B = ``P^T`` (``p_s``, bf16 ``[64, 16]``).

So each key is dequantised once, into shared memory, and read by the tensor cores only: no
``ldmatrix`` round trips of the tile, no copy of q in every warp, and M = 64 keys instead of
16 heads (wgmma's M is 64 a warpgroup; with heads in M, 16 of 64 rows would be real).

Written in Gluon (``triton.experimental.gluon``: Triton with explicit layouts), because
Triton's own pass picks ``mma.sync`` or spills for these shapes (docs/kernels/sparse_attn.md,
"Tried offline"). Gluon has no interpreter, so the CPU suite only compiles this kernel for
sm_90a (``tests/ops/test_sparse_attn.py``); the comparisons with the twin are GPU tests.

Per step: the CTA waits at a barrier until the previous step's wgmmas are done with ``k_s``,
dequantises the records loaded during the previous step into ``k_s`` (4 chunks of 128 dims for
the FP8 window records; even dims then odd dims for the NVFP4 records, as the Triton kernel's
``fp4_pairs``, with q permuted the same way), issues the next step's record loads, then runs
the two wgmmas around the online softmax (log2 domain; ``l`` kept per key and summed after the
last step, so that the only cross-warp reduction a step is the max). The NVFP4 tiles hold the
keys x 2^-8 (``_triton.FP4_TILE_SCALE``), folded back into the score scale and acc.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

BLOCK_N = 64  # keys a step: wgmma's M for one warpgroup
BLOCK_H = 16


@gluon.jit
def _load_q(q_ptr, q_s, row, h0, n_heads, D: gl.constexpr, PAIRS: gl.constexpr):
    """The row's 16 queries of this head block (0 past n_heads) into ``q_s``; PAIRS: the even
    dims first, then the odd ones (the NVFP4 tile's order)."""
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
    h = h0 + gl.arange(0, 16, layout=gl.SliceLayout(1, blk))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, blk))
    offs = gl.expand_dims((row.to(gl.int64) * n_heads + h) * D, 1) + gl.expand_dims(d, 0)
    q = gl.load(q_ptr + offs, mask=gl.expand_dims(h < n_heads, 1), other=0.0)
    if PAIRS:
        q = q.reshape([16, D // 2, 2]).permute(0, 2, 1).reshape([16, D])
    q_s.store(q)


@gluon.jit
def _attend(k_s, q_s, p_s, valid, m_i, l_i, acc, qk_scale, mma_s: gl.constexpr,
            mma_o: gl.constexpr):
    """One step's products and online softmax on the tile in ``k_s`` (valid: [64] keys).
    S^T is computed by the two warpgroups as two 8-head halves (``mma_s``), acc^T as two
    256-dim halves (``mma_o``)."""
    fence_async_shared()  # the tile's generic-proxy stores, before the async-proxy reads
    gl.thread_barrier()
    s = warpgroup_mma(k_s, q_s.permute((1, 0)), gl.zeros([64, 16], gl.float32, mma_s),
                      use_acc=False)
    vm = gl.convert_layout(valid, gl.SliceLayout(1, mma_s))
    s = gl.where(gl.expand_dims(vm, 1), s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 0))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - gl.expand_dims(m_use, 0))
    l_i = l_i * gl.expand_dims(alpha, 0) + p
    p_s.store(p.to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()
    alpha_o = gl.convert_layout(alpha, gl.SliceLayout(0, mma_o))
    acc = warpgroup_mma(k_s.permute((1, 0)), p_s, acc * gl.expand_dims(alpha_o, 0))
    return m_new, l_i, acc


# ----------------------------------------------------------------------------- window (FP8)
@gluon.constexpr_function
def _win_layout(warps):
    """A window chunk ``[64 keys, 4 scale blocks, 32 codes]`` (128 dims): 16 contiguous bytes a
    thread, 4 keys a thread."""
    return gl.BlockedLayout([1, 1, 16], [4, 4, 2], [warps, 1, 1], [2, 1, 0])


@gluon.jit
def _window_rec(slot, pos, win_ok, i0, i_hi, ring, WINDOW: gl.constexpr, D: gl.constexpr):
    """Window keys ``i0 .. i0+64`` (key i = position pos - WINDOW + 1 + i; i >= i_hi masked)
    -> (int64 record offsets, valid) [64]."""
    rows_l: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, _win_layout(gl.num_warps())))
    i = i0 + gl.arange(0, 64, layout=rows_l)
    kpos = pos - WINDOW + 1 + i
    valid = (i < i_hi) & (kpos >= 0) & win_ok
    rec = (slot.to(gl.int64) * ring + gl.where(valid, kpos % ring, 0)) * (D + D // 32)
    return rec, valid


@gluon.jit
def _window_chunk(win_ptr, rec, valid, C: gl.constexpr, D: gl.constexpr):
    """Dims ``128C .. 128C+127`` of the records -> (e4m3 codes [64, 4, 32], ue8m0 [64, 4])."""
    L3: gl.constexpr = _win_layout(gl.num_warps())
    b = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    e = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    r2 = gl.expand_dims(rec, 1)
    m2 = gl.expand_dims(valid, 1)
    col = gl.expand_dims(gl.expand_dims(b, 0) * 32, 2) + gl.expand_dims(gl.expand_dims(e, 0), 1)
    codes = gl.load(win_ptr + gl.expand_dims(r2, 2) + (C * 128 + col),
                    mask=gl.expand_dims(m2, 2), other=0)
    sc = gl.load(win_ptr + r2 + (D + C * 4 + gl.expand_dims(b, 0)), mask=m2, other=0)
    return codes, sc


@gluon.jit
def _window_store(k_s, codes, sc, C: gl.constexpr):
    """e4m3 codes x 2^(ue8m0 - 127) -> the exact bf16 keys of chunk C in ``k_s``."""
    scale = (sc.to(gl.int32) << 23).to(gl.float32, bitcast=True)
    k = codes.to(gl.float8e4nv, bitcast=True).to(gl.float32) * gl.expand_dims(scale, 2)
    k_s.slice(C * 128, 128, dim=1).store(k.reshape([64, 128]).to(gl.bfloat16))


@gluon.jit
def _window_split(win_ptr, k_s, q_s, p_s, m_i, l_i, acc, slot, pos, win_ok, w_i0, w_hi, ring,
                  qk_scale, WINDOW: gl.constexpr, D: gl.constexpr, W_STEPS: gl.constexpr,
                  mma_s: gl.constexpr, mma_o: gl.constexpr):
    for it in range(W_STEPS):
        rec, valid = _window_rec(slot, pos, win_ok, w_i0 + it * 64, w_hi, ring, WINDOW, D)
        c0, s0 = _window_chunk(win_ptr, rec, valid, 0, D)
        c1, s1 = _window_chunk(win_ptr, rec, valid, 1, D)
        gl.thread_barrier()  # every warp's wgmmas of the previous step are done with k_s
        _window_store(k_s, c0, s0, 0)
        c2, s2 = _window_chunk(win_ptr, rec, valid, 2, D)
        _window_store(k_s, c1, s1, 1)
        c3, s3 = _window_chunk(win_ptr, rec, valid, 3, D)
        _window_store(k_s, c2, s2, 2)
        _window_store(k_s, c3, s3, 3)
        m_i, l_i, acc = _attend(k_s, q_s, p_s, valid, m_i, l_i, acc, qk_scale, mma_s, mma_o)
    return m_i, l_i, acc


# ----------------------------------------------------------------------------- index list (NVFP4)
@gluon.constexpr_function
def _fp4_layout(warps):
    """An NVFP4 chunk ``[64 keys, 8 scale groups, 8 bytes]`` (64 packed bytes = 128 dims): 8
    contiguous bytes a thread, 4 keys a thread."""
    return gl.BlockedLayout([1, 1, 8], [4, 8, 1], [warps, 1, 1], [2, 1, 0])


@gluon.jit
def _index(idx_ptr, row, c0, c_hi, k_sel):
    """Index-list columns ``c0 .. c0+64`` of ``row`` (>= c_hi read as -1)."""
    rows_l: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, _fp4_layout(gl.num_warps())))
    c = c0 + gl.arange(0, 64, layout=rows_l)
    return gl.load(idx_ptr + row.to(gl.int64) * k_sel + c, mask=c < c_hi, other=-1)


@gluon.jit
def _page(bt_ptr, j, slot, sel_ok, max_pages, PAGE: gl.constexpr):
    """Block-table entries of the index values j (-1: no entry, nothing read)."""
    ok = (j >= 0) & (j < max_pages * PAGE) & sel_ok
    return gl.load(bt_ptr + slot.to(gl.int64) * max_pages + gl.where(ok, j, 0) // PAGE, mask=ok,
                   other=-1)


@gluon.jit
def _rec(j, page, n_pages, D: gl.constexpr, PAGE: gl.constexpr):
    """(index values, pages) -> (int64 record offsets, valid)."""
    valid = (page >= 0) & (page < n_pages)
    rec = (gl.where(valid, page, 0).to(gl.int64) * PAGE + gl.where(valid, j, 0) % PAGE) * \
        (D // 2 + D // 16)
    return rec, valid


@gluon.jit
def _fp4_chunk(comp_ptr, rec, valid, C: gl.constexpr, D: gl.constexpr):
    """Packed bytes ``64C .. 64C+63`` (dims 128C .. 128C+127) -> (bytes [64, 8, 8], e4m3
    scales [64, 8])."""
    L3: gl.constexpr = _fp4_layout(gl.num_warps())
    g = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    e = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    r2 = gl.expand_dims(rec, 1)
    m2 = gl.expand_dims(valid, 1)
    col = gl.expand_dims(gl.expand_dims(g, 0) * 8, 2) + gl.expand_dims(gl.expand_dims(e, 0), 1)
    packed = gl.load(comp_ptr + gl.expand_dims(r2, 2) + (C * 64 + col),
                     mask=gl.expand_dims(m2, 2), other=0)
    sc = gl.load(comp_ptr + r2 + (D // 2 + C * 8 + gl.expand_dims(g, 0)), mask=m2, other=0)
    return packed, sc


@gluon.jit
def _fp4_store(k_s, packed, sc, C: gl.constexpr, D: gl.constexpr):
    """Chunk C's bytes -> exact bf16 keys x 2^-8 of its even dims (low nibbles, ``k_s`` columns
    64C ..) and odd dims (high nibbles, columns D/2 + 64C ..): nibble ``s e1 e0 m`` to fp32
    bits 31 and 24..22, times scale x 2^118 (as ``_triton._compressed_dequant_pairs``)."""
    scale = gl.expand_dims(sc.to(gl.float8e4nv, bitcast=True).to(gl.float32) * 2.0 ** 118, 2)
    p = packed.to(gl.uint32)
    lo = ((p << 22) | (p << 28)) & 0x81C00000
    q = p >> 4
    hi = ((q << 22) | (q << 28)) & 0x81C00000
    k_e = lo.to(gl.float32, bitcast=True) * scale
    k_o = hi.to(gl.float32, bitcast=True) * scale
    k_s.slice(C * 64, 64, dim=1).store(k_e.reshape([64, 64]).to(gl.bfloat16))
    k_s.slice(D // 2 + C * 64, 64, dim=1).store(k_o.reshape([64, 64]).to(gl.bfloat16))


@gluon.jit
def _compressed_split(comp_ptr, bt_ptr, idx_ptr, k_s, q_s, p_s, m_i, l_i, acc, row, slot,
                      sel_ok, c_0, c_hi, k_sel, n_pages, max_pages, qk_scale, D: gl.constexpr,
                      PAGE: gl.constexpr, C_STEPS: gl.constexpr, mma_s: gl.constexpr,
                      mma_o: gl.constexpr):
    # the chain index -> page -> record runs three / two / one step ahead (as the Triton kernel)
    j = _index(idx_ptr, row, c_0, c_hi, k_sel)
    j_n = _index(idx_ptr, row, c_0 + 64, c_hi, k_sel)
    j_nn = _index(idx_ptr, row, c_0 + 128, c_hi, k_sel)
    page = _page(bt_ptr, j, slot, sel_ok, max_pages, PAGE)
    page_n = _page(bt_ptr, j_n, slot, sel_ok, max_pages, PAGE)
    rec, valid = _rec(j, page, n_pages, D, PAGE)
    for it in range(C_STEPS):
        b0, s0 = _fp4_chunk(comp_ptr, rec, valid, 0, D)
        b1, s1 = _fp4_chunk(comp_ptr, rec, valid, 1, D)
        page_nn = _page(bt_ptr, j_nn, slot, sel_ok, max_pages, PAGE)
        j_nnn = _index(idx_ptr, row, c_0 + (it + 3) * 64, c_hi, k_sel)
        gl.thread_barrier()  # every warp's wgmmas of the previous step are done with k_s
        _fp4_store(k_s, b0, s0, 0, D)
        b2, s2 = _fp4_chunk(comp_ptr, rec, valid, 2, D)
        _fp4_store(k_s, b1, s1, 1, D)
        b3, s3 = _fp4_chunk(comp_ptr, rec, valid, 3, D)
        _fp4_store(k_s, b2, s2, 2, D)
        _fp4_store(k_s, b3, s3, 3, D)
        m_i, l_i, acc = _attend(k_s, q_s, p_s, valid, m_i, l_i, acc, qk_scale, mma_s, mma_o)
        rec, valid = _rec(j_n, page_n, n_pages, D, PAGE)
        page_n = page_nn
        j_n = j_nn
        j_nn = j_nnn
    return m_i, l_i, acc


@gluon.jit
def _wgmma_attn_kernel(
    q_ptr, win_ptr, pos_ptr, slot_ptr, comp_ptr, bt_ptr, idx_ptr,
    ws_acc_ptr, ws_m_ptr, ws_l_ptr,
    n_heads, n_slots, ring, n_bt_slots, n_pages, max_pages, k_sel,
    qk_scale,  # softmax scale * log2(e)
    WINDOW: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr, W_STEPS: gl.constexpr,
    N_WSPLIT: gl.constexpr, C_STEPS: gl.constexpr, N_SPLIT: gl.constexpr,
    HAS_SEL: gl.constexpr,
):
    """Split ``program_id(0)`` of (row ``program_id(2)``, head block ``program_id(1)``) ->
    its partial (m, l, acc) rows of the workspace (the Triton kernel's layout: row
    ``(group * N_SPLIT + split) * 16 + head``, group = row x head blocks + head block)."""
    WG: gl.constexpr = gl.num_warps() // 4  # warpgroups: S^T split by heads, acc^T by dims
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG],
                                                    instr_shape=[16, 16 // WG, 16])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0],
                                                    warps_per_cta=[gl.num_warps(), 1],
                                                    instr_shape=[16, 16, 16])
    k_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                             rank=2)
    p_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16,
                                             rank=2)
    pid_s = gl.program_id(0)
    pid_h = gl.program_id(1)
    row = gl.program_id(2)
    pos = gl.load(pos_ptr + row)
    slot = gl.load(slot_ptr + row)
    win_ok = (slot >= 0) & (slot < n_slots)
    sel_ok = (slot >= 0) & (slot < n_bt_slots)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [64, D], k_l)
    q_s = gl.allocate_shared_memory(gl.bfloat16, [16, D], k_l)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [64, 16], p_l)
    m_i = gl.full([16], float("-inf"), gl.float32, gl.SliceLayout(0, mma_s))
    l_i = gl.zeros([64, 16], gl.float32, mma_s)
    acc = gl.zeros([D, 16], gl.float32, mma_o)
    is_win = pid_s < N_WSPLIT
    if is_win:
        _load_q(q_ptr, q_s, row, pid_h * 16, n_heads, D, False)
        w_i0 = pid_s * (W_STEPS * 64)
        w_hi = gl.minimum(w_i0 + W_STEPS * 64, WINDOW)
        m_i, l_i, acc = _window_split(win_ptr, k_s, q_s, p_s, m_i, l_i, acc,
                                      gl.where(win_ok, slot, 0), pos, win_ok, w_i0, w_hi, ring,
                                      qk_scale, WINDOW, D, W_STEPS, mma_s, mma_o)
        scale_out = 1.0
    else:
        _load_q(q_ptr, q_s, row, pid_h * 16, n_heads, D, True)
        if HAS_SEL:
            c_0 = (pid_s - N_WSPLIT) * (C_STEPS * 64)
            c_hi = gl.minimum(c_0 + C_STEPS * 64, k_sel)
            m_i, l_i, acc = _compressed_split(comp_ptr, bt_ptr, idx_ptr, k_s, q_s, p_s, m_i,
                                              l_i, acc, row, gl.where(sel_ok, slot, 0), sel_ok,
                                              c_0, c_hi, k_sel, n_pages, max_pages,
                                              qk_scale * 256.0, D, PAGE, C_STEPS, mma_s,
                                              mma_o)
        scale_out = 256.0  # the tiles held the keys x 2^-8
    group = row * gl.num_programs(1) + pid_h
    r = (group * N_SPLIT + pid_s) * 16 + gl.arange(0, 16, layout=gl.SliceLayout(0, mma_o))
    dp = gl.arange(0, D, layout=gl.SliceLayout(1, mma_o))  # the tile's column order
    if is_win:
        dim = dp
    else:  # even dims first, then odd
        dim = gl.where(dp < D // 2, 2 * dp, 2 * (dp - D // 2) + 1)
    gl.store(ws_acc_ptr + gl.expand_dims(r.to(gl.int64) * D, 0) + gl.expand_dims(dim, 1),
             acc * scale_out)
    rs = (group * N_SPLIT + pid_s) * 16 + gl.arange(0, 16, layout=gl.SliceLayout(0, mma_s))
    gl.store(ws_m_ptr + rs, m_i)
    gl.store(ws_l_ptr + rs, gl.sum(l_i, 0))
