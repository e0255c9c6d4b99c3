"""Hopper (sm_90) kernel of ``sparse_attn`` on wgmma (private; the contract is in ``api.py``).

``_wgmma_attn_kernel`` computes the same split partials as ``_triton._sparse_attn_kernel``
(one CTA a split of a (row, head block), 16 heads a CTA, partials ``(m, l, acc)`` in the
workspace, merged by ``_triton._merge_kernel``), with both products on warpgroup MMAs and the
keys in the MMA's M, 64 keys a step, at 8 warps (one-step splits) or 4 (one warpgroup), two
CTAs a SM (about 100 KB of shared memory; at most 128 registers at 8 warps):

- ``S^T [64 keys, 16 heads] = K Q^T``: B = the row's queries ``q_s`` (``[16, 512]``, stored
  once); A = the step's key tile in shared memory (bf16, 128-byte swizzle), or at 4 warps
  the NVFP4 keys straight from registers (below); at 8 warps each warpgroup computes 8 of
  the heads.
- ``acc^T [512, 16] += K^T P^T``: A = the tile through a transposed descriptor (wgmma reads
  16-bit operands in either major order), B = ``P^T`` (``p_s``, bf16 ``[64, 16]``); at 8
  warps each warpgroup accumulates 256 of the dims.

So each key is dequantised once and read by the tensor cores only, with M = 64 keys instead
of 16 heads (wgmma's M is 64 a warpgroup; with heads in M, 16 of 64 rows would be real).

The tile is four 128-dim chunk buffers (separate allocations: Triton's shared-memory hazard
pass puts a CTA barrier between any two stores to one allocation) and acc^T four parts of
``[128, 16]``. A step: the records land (window: loaded straight into registers; index list:
copied by ``cp.async`` into one staging stage during the previous step, the index -> block
table chain running ahead), each chunk is decoded into its buffer, S^T, the online softmax
(log2 domain; ``l`` kept per key and summed after the last step, so the only cross-warp
reduction a step is the max), then PV. The loops rebuild the buffers' and q's views every
step from ``_loop_zero`` (else all the wgmma descriptors are hoisted and spilled) and load
the step's validity in the scores' layout (no conversion barriers).

Decodes are exact and in PTX: NVFP4 (``_FP4_ASM``, 17 instructions for 8 values) and FP8
(``_E4M3_ASM``, 4 a pair) give the keys x 2^-8, folded back into the score scale and acc;
at 8 warps the NVFP4 tile's columns are each 128-dim span's even dims, then its odd dims (q
stored in the same order, the partial rows put back in dim order). At 4 warps both kinds of
chunk are decoded straight into wgmma's register A layout (``_fp4_dequant_rs``,
``_window_rs_chunk``): S^T is issued from registers, chunk by chunk, and the same registers
are stored (``stmatrix``) into the tile for PV only, in the A operand's k order (no S^T read
of the tile: a quarter of a step's shared-memory traffic; acc^T's rows put back at the end);
the NVFP4 staging is swizzled (``_staging_rows``) so its reads are conflict-free. Sessions
11-15 of docs/kernels/sparse_attn.md measure each of these; the two-tile and warp-specialized
variants they replaced were removed after measuring slower.

Written in Gluon (``triton.experimental.gluon``: Triton with explicit layouts), because
Triton's own pass picks ``mma.sync`` or spills for these shapes (docs/kernels/sparse_attn.md,
"Tried offline" and "Session 11"). Gluon has no interpreter, so the CPU suite only compiles
this kernel for sm_90a (``tests/ops/test_sparse_attn.py``); the comparisons with the twin are
GPU tests. Blackwell (sm_100) has no wgmma: there the Triton kernels run. ``PDL`` / ``WAIT``:
the programmatic dependent launches, as the Triton kernel's (``config.pdl`` / ``pdl_entry``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@gluon.jit
def _load_q(q_ptr, q_s, row, h0, n_heads, D: gl.constexpr, FP4: gl.constexpr,
            RS: gl.constexpr):
    """The row's 16 queries of this head block (0 past n_heads) into ``q_s``, in dim order (the
    window tile's); FP4: in the NVFP4 tile's column order (``_FP4_ASM``): each 128-dim chunk as
    its even dims, then its odd ones, and within a 16-dim scale group dim 16g + 8w + 4v + 2u +
    p (p: odd) at column 64p + 8g + 4w + 2u + v (``_pairs_order`` inverts it); RS: in the
    register A operand's k order of ``_fp4_dequant_rs`` (FP4) or ``_window_dequant_rs``."""
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
    h = h0 + gl.arange(0, 16, layout=gl.SliceLayout(1, blk))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, blk))
    offs = gl.expand_dims((row.to(gl.int64) * n_heads + h) * D, 1) + gl.expand_dims(d, 0)
    q = gl.load(q_ptr + offs, mask=gl.expand_dims(h < n_heads, 1), other=0.0)
    if RS and FP4:  # chunk dim 32t + 8q + 4v + 2u + p -> k = 32q + 16p + 8u + 2t + v
        q = q.reshape([16, D // 128, 4, 4, 2, 2, 2]).permute(0, 1, 3, 6, 5, 2, 4)
        q = q.reshape([16, D])
    elif RS:  # the window's: chunk dim 32t + 4j + 2u + v -> k = 16j + 8u + 2t + v
        q = q.reshape([16, D // 128, 4, 8, 2, 2]).permute(0, 1, 3, 4, 2, 5).reshape([16, D])
    elif FP4:
        q = q.reshape([16, D // 128, 8, 2, 2, 2, 2]).permute(0, 1, 6, 2, 3, 5, 4)
        q = q.reshape([16, D])
    q_s.store(q)


@gluon.jit
def _pairs_order(acc):
    """A 128-dim part of acc^T, rows in the NVFP4 tile's column order (``_load_q``'s FP4) ->
    dim order."""
    return acc.reshape([2, 8, 2, 2, 2, 16]).permute(1, 2, 4, 3, 0, 5).reshape([128, 16])


@gluon.jit
def _win_rs_order(acc):
    """``_rs_order`` of the window tile (``_window_dequant_rs``: row k = 16j + 8u + 2t + v
    holds chunk dim 32t + 4j + 2u + v) -> dim order."""
    return acc.reshape([8, 2, 4, 2, 16]).permute(2, 0, 1, 3, 4).reshape([128, 16])


@gluon.jit
def _rs_order(acc):
    """A 128-dim part of acc^T, rows in the register A operand's k order (``_load_q``'s RS:
    row k = 32q + 16p + 8u + 2t + v holds chunk dim 32t + 8q + 4v + 2u + p) -> dim order."""
    return acc.reshape([4, 2, 2, 4, 2, 16]).permute(3, 0, 4, 2, 1, 5).reshape([128, 16])


@gluon.jit
def _online_softmax(s, p_s, valid, m_i, l_i, qk_scale, mma_o: gl.constexpr):
    """The online softmax of the step's scores ``s`` (S^T): P stored into ``p_s`` and a CTA
    barrier passed (the PV wgmma may follow) -> (m, l, the acc rescale ``[1, 16]`` in
    ``mma_o``)."""
    mma_s: gl.constexpr = s.type.layout
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
    return m_new, l_i, gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(0, mma_o)), 0)


@gluon.jit
def _softmax_pv(s, ks, p_s, valid, m_i, l_i, accs, qk_scale, mma_o: gl.constexpr):
    """``_online_softmax``, then ``acc^T += K^T P^T`` over the four 128-dim chunk buffers ``ks``
    into the four acc^T parts ``accs`` ([128, 16] each), four wgmmas in flight at once."""
    m_i, l_i, alpha = _online_softmax(s, p_s, valid, m_i, l_i, qk_scale, mma_o)
    a0 = warpgroup_mma(ks[0].permute((1, 0)), p_s, accs[0] * alpha, is_async=True)
    a1 = warpgroup_mma(ks[1].permute((1, 0)), p_s, accs[1] * alpha, is_async=True)
    a2 = warpgroup_mma(ks[2].permute((1, 0)), p_s, accs[2] * alpha, is_async=True)
    a3 = warpgroup_mma(ks[3].permute((1, 0)), p_s, accs[3] * alpha, is_async=True)
    return m_i, l_i, warpgroup_mma_wait(0, deps=[a0, a1, a2, a3])


@gluon.jit
def _chunk_views(kb, z):
    """This step's views of the tile's four chunk buffers (``_loop_zero`` index)."""
    return (kb[0].index(z), kb[1].index(z), kb[2].index(z), kb[3].index(z))


@gluon.jit
def _scores_chunks(ks, q_s, mma_s: gl.constexpr):
    """S^T = K Q^T over the tile's four chunk buffers (four chained wgmmas)."""
    s = gl.zeros([64, 16], gl.float32, mma_s)
    for c in gl.static_range(4):
        s = warpgroup_mma(ks[c], q_s.slice(c * 128, 128, dim=1).permute((1, 0)), s,
                          use_acc=c > 0, is_async=True)
    return warpgroup_mma_wait(0, deps=[s])


@gluon.jit
def _loop_zero(it):
    """0, computed from the loop counter ``it`` in PTX the compiler cannot see through: a
    shared-memory view indexed by it is rebuilt every step (the loops' key tile and q
    would otherwise have all 64 of their wgmma descriptors hoisted out of the loop, and
    spilled under the 128-register cap)."""
    return gl.inline_asm_elementwise("mov.b32 $0, 0;", "=r,r", [it], dtype=gl.int32,
                                     is_pure=True, pack=1)


# ----------------------------------------------------------------------------- staging
# The NVFP4 records of step i + 1 are copied (cp.async, zero-filled where masked) into the
# staging stage once step i is decoded, and fly during its products: no registers held for
# them. The decoding reads are 16 (4 warps) / 8 contiguous bytes a thread.
@gluon.constexpr_function
def _copy_layout(vec, rows_a_warp, warps):
    """Copies of ``[64, cols]`` bytes, ``vec`` contiguous bytes a thread."""
    return gl.BlockedLayout([1, vec], [rows_a_warp, 32 // rows_a_warp], [warps, 1], [1, 0])


@gluon.constexpr_function
def _staging_rows():
    """The NVFP4 staging: odd rows' 64-byte chunks swapped in pairs (chunk c at
    c ^ 1), so that the register-A decode's 16-byte reads of two adjacent keys (one phase of a
    warp's 128-bit load) fall on disjoint banks (the same banks, plain)."""
    return gl.SwizzledSharedLayout(64, 1, 2, [1, 0])


@gluon.constexpr_function
def _staging():
    """Plain row-major shared memory (the NVFP4 records' scales)."""
    return gl.SwizzledSharedLayout(1, 1, 1, [1, 0])


# ----------------------------------------------------------------------------- window (FP8)
@gluon.constexpr_function
def _win_layout(warps):
    """A window chunk ``[64 keys, 4 scale blocks, 32 codes]`` (128 dims) loaded from global
    memory: 16 contiguous bytes a thread."""
    return gl.BlockedLayout([1, 1, 16], [4, 4, 2], [warps, 1, 1], [2, 1, 0])


@gluon.jit
def _window_keys(slot, pos, win_ok, i0, i_hi, ring, WINDOW: gl.constexpr, D: gl.constexpr,
                 rows_l: gl.constexpr):
    """Window keys ``i0 .. i0+64`` (key i = position pos - WINDOW + 1 + i; i >= i_hi masked)
    -> (int64 record offsets, valid) [64] in ``rows_l``."""
    i = i0 + gl.arange(0, 64, layout=rows_l)
    kpos = pos - WINDOW + 1 + i
    valid = (i < i_hi) & (kpos >= 0) & win_ok
    rec = (slot.to(gl.int64) * ring + gl.where(valid, kpos % ring, 0)) * (D + D // 32)
    return rec, valid


@gluon.jit
def _window_chunk_load(win_ptr, rec, valid, c: gl.constexpr, D: gl.constexpr,
                       L3: gl.constexpr):
    """Dims ``c*128 .. +128`` of 64 window records straight from global memory, in ``L3``
    (``_win_layout``: 16 contiguous bytes a thread; ``_win_rs_layout``: the register A
    operand's): codes ``[64, 4, 32]`` and their 4 scales (0 where masked)."""
    blk = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    e = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    offs = gl.expand_dims(gl.expand_dims(rec + c * 128, 1) + gl.expand_dims(blk * 32, 0), 2) \
        + gl.expand_dims(gl.expand_dims(e, 0), 1)
    codes = gl.load(win_ptr + offs, mask=gl.expand_dims(gl.expand_dims(valid, 1), 2), other=0)
    sc = gl.load(win_ptr + gl.expand_dims(rec + D + c * 4, 1) + gl.expand_dims(blk, 0),
                 mask=gl.expand_dims(valid, 1), other=0)
    return codes, sc


# Four e4m3 codes -> two bf16 pairs (dim order), times the scale pairs: PRMT puts each code in
# the low byte of its half and its sign, replicated, in the high byte; shifted left by 4 and
# masked, the half is bit 15 = sign, bits 10..4 = the code's exponent and mantissa: the e4m3
# value x 2^-120 (subnormals too); the bf16 multiply by 2^(ue8m0 - 15) gives the key x 2^-8,
# exactly. 4 instructions a pair (6 by fp32: unpack, two converts, two multiplies, pack).
# Differs from the fp32 decode only on e4m3 NaN codes (0x7F / 0xFF: finite here; never
# written by the cache) and on ue8m0 > 142 (blocks above 448 x 2^15: inf, see
# ``_window_scale``).
_E4M3_ASM = gl.constexpr(
    "{ .reg .b32 x; prmt.b32 x, $2, 0, 0x9180; shl.b32 x, x, 4; and.b32 x, x, 0x87F087F0; "
    "mul.rn.bf16x2 $0, x, $3; prmt.b32 x, $2, 0, 0xB3A2; shl.b32 x, x, 4; "
    "and.b32 x, x, 0x87F087F0; mul.rn.bf16x2 $1, x, $4; }")


@gluon.jit
def _window_scale(sc):
    """ue8m0 exponents -> the bf16 factors 2^(ue8m0 - 15) of ``_E4M3_ASM`` (bf16 exponent
    field ue8m0 + 112: normal for every ue8m0 <= 142, inf above)."""
    return (gl.minimum(sc.to(gl.int32) + 112, 255) << 7).to(gl.int16).to(gl.bfloat16,
                                                                         bitcast=True)


@gluon.jit
def _window_chunk_store(k_c, codes, sc):
    """e4m3 codes x 2^(ue8m0 - 127) x 2^-8 -> the exact bf16 keys x 2^-8 of one 128-dim chunk
    into its buffer ``k_c`` (``_E4M3_ASM``; the window splits scale scores and acc
    back)."""
    k = gl.inline_asm_elementwise(
        _E4M3_ASM, "=r,=r,r,r,r", [codes, gl.expand_dims(_window_scale(sc), 2)],
        dtype=gl.bfloat16, is_pure=True, pack=4)
    k_c.store(k.reshape([64, 128]))


@gluon.constexpr_function
def _win_rs_layout():
    """A window chunk ``[64 keys, 4, 32 codes]`` (128 dims) loaded as wgmma's register A
    operand wants it (one warpgroup): warp w holds keys 16w .. 16w+15, lane 4g + t keys
    16w + g and 16w + g + 8 (the last register bit) and the 32 contiguous codes of scale
    block t of each (two 16-byte loads a key)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 0, 16], [8, 0, 0]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 4, 32])


@gluon.jit
def _window_rs_chunk(k_c, codes, sc, q_c, s, c: gl.constexpr, mma_s: gl.constexpr):
    """One window chunk at 4 warps: decoded (``_E4M3_ASM``) straight into wgmma's register A
    layout, its S^T product issued from those registers and the same registers stored
    (``stmatrix``) into the tile for PV, in the A operand's k order: chunk dim
    32t + 4j + 2u + v at column / k = 16j + 8u + 2t + v (``_load_q``'s window RS order;
    ``_win_rs_order`` puts acc^T's rows back) -> S^T with the chunk's product in flight."""
    dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_s, k_width=2)
    k = gl.inline_asm_elementwise(
        _E4M3_ASM, "=r,=r,r,r,r", [codes, gl.expand_dims(_window_scale(sc), 2)],
        dtype=gl.bfloat16, is_pure=True, pack=4)
    a = k.reshape([64, 4, 8, 2, 2]).permute(0, 2, 3, 1, 4).reshape([64, 128])
    a = gl.convert_layout(a, dot, assert_trivial=True)
    k_c.store(a)
    s = warpgroup_mma(a, q_c.permute((1, 0)), s, use_acc=c > 0, is_async=True)
    s, a = warpgroup_mma_wait(1, deps=[s, a])  # the previous chunk's done: one in flight
    return s


@gluon.jit
def _window_split(q_ptr, win_ptr, kb, q_1, p_s, m_i, l_i, accs, row, h0, n_heads, slot, pos,
                  win_ok, w_i0, w_hi, ring, qk_scale, WINDOW: gl.constexpr, D: gl.constexpr,
                  W_STEPS: gl.constexpr, mma_s: gl.constexpr, mma_o: gl.constexpr):
    """Window keys ``w_i0 .. w_hi`` of one row -> (m, l, acc^T parts): the key tile as four
    chunk buffers ``kb`` (each [1, 64, 128]), q in ``q_1`` ([1, 16, D]), acc^T in four parts
    ``accs``; the records loaded into registers, all four chunks' loads issued before the
    barrier that frees the tile; D = 512."""
    RS: gl.constexpr = gl.num_warps() == 4  # S^T from registers (one warpgroup)
    if RS:
        rows_l: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, _win_rs_layout()))
    else:
        rows_l: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, _win_layout(gl.num_warps())))
    _load_q(q_ptr, q_1.index(0), row, h0, n_heads, D, False, RS)
    if RS:  # q is read by the first S^T before any tile store's fence
        fence_async_shared()
    for it in range(W_STEPS):
        z = _loop_zero(it)
        ks = _chunk_views(kb, z)
        q_s = q_1.index(z)
        rec, valid = _window_keys(slot, pos, win_ok, w_i0 + it * 64, w_hi, ring, WINDOW, D,
                                  rows_l)
        if RS:
            L3: gl.constexpr = _win_rs_layout()
            c0, s0 = _window_chunk_load(win_ptr, rec, valid, 0, D, L3)
            c1, s1 = _window_chunk_load(win_ptr, rec, valid, 1, D, L3)
            c2, s2 = _window_chunk_load(win_ptr, rec, valid, 2, D, L3)
            c3, s3 = _window_chunk_load(win_ptr, rec, valid, 3, D, L3)
            gl.thread_barrier()  # every warp's wgmmas of the previous step are done
            s = gl.zeros([64, 16], gl.float32, mma_s)
            s = _window_rs_chunk(ks[0], c0, s0, q_s.slice(0, 128, dim=1), s, 0, mma_s)
            s = _window_rs_chunk(ks[1], c1, s1, q_s.slice(128, 128, dim=1), s, 1, mma_s)
            s = _window_rs_chunk(ks[2], c2, s2, q_s.slice(256, 128, dim=1), s, 2, mma_s)
            s = _window_rs_chunk(ks[3], c3, s3, q_s.slice(384, 128, dim=1), s, 3, mma_s)
            s = warpgroup_mma_wait(0, deps=[s])
            # no fence here: the softmax's fence and barrier (before PV) cover the tile
        else:
            L3: gl.constexpr = _win_layout(gl.num_warps())
            c0, s0 = _window_chunk_load(win_ptr, rec, valid, 0, D, L3)
            c1, s1 = _window_chunk_load(win_ptr, rec, valid, 1, D, L3)
            c2, s2 = _window_chunk_load(win_ptr, rec, valid, 2, D, L3)
            c3, s3 = _window_chunk_load(win_ptr, rec, valid, 3, D, L3)
            gl.thread_barrier()  # every warp's wgmmas of the previous step are done
            _window_chunk_store(ks[0], c0, s0)
            _window_chunk_store(ks[1], c1, s1)
            _window_chunk_store(ks[2], c2, s2)
            _window_chunk_store(ks[3], c3, s3)
            fence_async_shared()
            gl.thread_barrier()
            s = _scores_chunks(ks, q_s, mma_s)
        _, valid = _window_keys(slot, pos, win_ok, w_i0 + it * 64, w_hi, ring, WINDOW, D,
                                gl.SliceLayout(1, mma_s))
        m_i, l_i, accs = _softmax_pv(s, ks, p_s, valid, m_i, l_i, accs, qk_scale, mma_o)
    return m_i, l_i, accs


# ----------------------------------------------------------------------------- index list (NVFP4)
@gluon.constexpr_function
def _fp4_layout(warps):
    """An NVFP4 chunk ``[64 keys, 8 scale groups, 8 bytes]`` (64 packed bytes = 128 dims) read
    from staging: 8 contiguous bytes a thread."""
    return gl.BlockedLayout([1, 1, 8], [4, 8, 1], [warps, 1, 1], [2, 1, 0])


@gluon.jit
def _index(idx_ptr, row, c0, c_hi, k_sel):
    """Index-list columns ``c0 .. c0+64`` of ``row`` (>= c_hi read as -1), in the copies'
    row layout."""
    return _index_in(idx_ptr, row, c0, c_hi, k_sel,
                     gl.SliceLayout(1, _copy_layout(16, 4, gl.num_warps())))


@gluon.jit
def _index_in(idx_ptr, row, c0, c_hi, k_sel, rows_l: gl.constexpr):
    """``_index`` in the row layout ``rows_l``."""
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
def _fp4_copy(comp_ptr, packed_s, sc_s, rec, valid, D: gl.constexpr):
    """Issue the copies of 64 NVFP4 records into one stage (one commit group)."""
    cl: gl.constexpr = _copy_layout(16, 4, gl.num_warps())
    sl: gl.constexpr = _copy_layout(4, 4, gl.num_warps())  # the same rows a thread as cl
    cols = gl.arange(0, D // 2, layout=gl.SliceLayout(0, cl))
    async_copy.async_copy_global_to_shared(
        packed_s, comp_ptr + gl.expand_dims(rec, 1) + gl.expand_dims(cols, 0),
        mask=gl.expand_dims(valid, 1))
    rec_s = gl.convert_layout(rec, gl.SliceLayout(1, sl), assert_trivial=True)
    valid_s = gl.convert_layout(valid, gl.SliceLayout(1, sl), assert_trivial=True)
    cols = gl.arange(0, D // 16, layout=gl.SliceLayout(0, sl))
    async_copy.async_copy_global_to_shared(
        sc_s, comp_ptr + gl.expand_dims(rec_s + D // 2, 1) + gl.expand_dims(cols, 0),
        mask=gl.expand_dims(valid_s, 1))
    async_copy.commit_group()


# Four packed bytes (8 e2m1 codes, nibble k = dim k of the word) -> four bf16 pairs, times the
# scale: a pair is nibbles k and k + 4 (16 bits apart), masked, then one integer multiply puts
# each nibble ``s e1 e0 m`` twice, at bits 9..6 and 15..12 of its half (no overlap, no carry);
# the mask keeps bits 15 and 8..6: the e2m1 value x 2^-126 (e = 0: the subnormal m x 2^-127).
# The bf16 multiply by scale x 2^118 (exact: at most 6 significant bits, >= 2^-18) gives value
# x scale x 2^-8, as ``_triton._compressed_dequant_pairs`` (fp32 there). 17 instructions for 8
# values (session 13; 22 with the PRMT spread before, 5.4 a value in fp32).
def _fp4_pair_ptx(dst: str, src: str, mask: int, mul: int) -> str:
    """PTX for one bf16 pair: the nibbles of ``src`` under ``mask`` (bits 3..0 / 7..4 of each
    half) times ``mul`` (2^6 + 2^12 / 2^2 + 2^8), kept at bits 15 and 8..6, times the scale."""
    return (f"and.b32 t, {src}, {mask:#010x}; mul.lo.u32 t, t, {mul}; "
            f"and.b32 t, t, 0x81C081C0; mul.rn.bf16x2 {dst}, t, $5;")


# $0, $1: the even dims (0, 4 | 2, 6), $2, $3: the odd dims (1, 5 | 3, 7); $4: the four packed
# bytes; $5, $6: the scale pairs (one scale group: the same value)
_FP4_ASM = gl.constexpr(
    "{ .reg .b32 w, t; shr.b32 w, $4, 8; "
    + _fp4_pair_ptx("$0", "$4", 0x000F000F, 4160) + _fp4_pair_ptx("$1", "w", 0x000F000F, 4160)
    + _fp4_pair_ptx("$2", "$4", 0x00F000F0, 260) + _fp4_pair_ptx("$3", "w", 0x00F000F0, 260)
    + " }")


@gluon.jit
def _fp4_chunk(packed_s, sc_s, c: gl.constexpr, RS: gl.constexpr = False):
    """Chunk c (64 bytes, 128 dims) of one stage's records -> the exact bf16 keys x 2^-8
    (``_triton.FP4_TILE_SCALE``) of its even dims (low nibbles) and its odd dims (high
    nibbles), each ``[64, 8 groups, 8]``; element j = 4w + 2u + v of a group is dim
    8w + 2(2v + u) (+ 1: odd) of it (``_FP4_ASM``). RS: read in ``_rs_chunk_layouts``."""
    if RS:
        L2: gl.constexpr = _rs_chunk_layouts()[0]
        L3: gl.constexpr = _rs_chunk_layouts()[1]
    else:
        L2: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        L3: gl.constexpr = _fp4_layout(gl.num_warps())  # L2 reshaped to [64, 8, 8]
    packed = gl.convert_layout(packed_s.slice(c * 64, 64, dim=1).load(L2).reshape([64, 8, 8]),
                               L3, assert_trivial=True)
    sc = sc_s.slice(c * 8, 8, dim=1).load(gl.SliceLayout(2, L3))
    scale = (sc.to(gl.float8e4nv, bitcast=True).to(gl.float32) * 2.0 ** 118).to(gl.bfloat16)
    return gl.inline_asm_elementwise(
        _FP4_ASM, "=r,=r,=r,=r,r,r,r", [packed, gl.expand_dims(scale, 2)],
        dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)


@gluon.constexpr_function
def _rs_chunk_layouts():
    """(bytes ``[64, 64]``, the same as ``[64, 8 groups, 8]``) of an NVFP4 chunk read as
    wgmma's register A operand wants it (one warpgroup): warp w holds keys 16w .. 16w+15, lane
    4g + t keys 16w + g and 16w + g + 8 (a register bit), and 16 contiguous bytes (scale
    groups 2t, 2t + 1) of each."""
    return (gl.DistributedLinearLayout(
                reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [8, 0]],
                lane_bases=[[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]],
                warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 64]),
            gl.DistributedLinearLayout(
                reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 1, 0], [8, 0, 0]],
                lane_bases=[[0, 2, 0], [0, 4, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
                warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 8, 8]))


@gluon.jit
def _fp4_dequant_rs(ks, packed_s, sc_s, q_s, mma_s: gl.constexpr, D: gl.constexpr):
    """The 4-warp step: each chunk decoded once into registers laid out as wgmma's A
    operand (``_rs_chunk_layouts``), its S^T product issued from them (no read of the tile:
    a quarter of a step's shared-memory traffic) and the same registers stored into the tile
    for the PV product, in the same order: chunk dim 32t + 8q + 4v + 2u + p at column / k =
    32q + 16p + 8u + 2t + v (``_load_q``'s RS order; acc^T's rows come out in it and
    ``_rs_order`` puts them back). A quad of the A operand holds two keys, so that store is
    ``stmatrix`` (no register moves; session 15: 1,421 -> 1,297 instructions a step) -> S^T."""
    dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_s, k_width=2)
    s = gl.zeros([64, 16], gl.float32, mma_s)
    for c in gl.static_range(D // 128):
        k_e, k_o = _fp4_chunk(packed_s, sc_s, c, True)
        kj = gl.join(k_e, k_o)  # [64, 8 groups (2t + q1), 8 (4q0 + 2u + v), 2 (p)]
        a = kj.reshape([64, 4, 2, 2, 2, 2, 2]).permute(0, 2, 3, 6, 4, 1, 5).reshape([64, 128])
        a = gl.convert_layout(a, dot, assert_trivial=True)
        ks[c].store(a)
        s = warpgroup_mma(a, q_s.slice(c * 128, 128, dim=1).permute((1, 0)), s, use_acc=c > 0,
                          is_async=True)
        s, a = warpgroup_mma_wait(1, deps=[s, a])  # the previous chunk's done: one in flight
    return warpgroup_mma_wait(0, deps=[s])


@gluon.jit
def _fp4_dequant_spans(ks, packed_s, sc_s, D: gl.constexpr):
    """``_fp4_dequant`` in spans of 128 dims: each chunk's even dims then its odd dims, one
    store a chunk (each store to the tile after another costs a CTA barrier: Triton's
    shared-memory hazard pass sees one buffer, not the columns)."""
    for c in gl.static_range(D // 128):
        k_e, k_o = _fp4_chunk(packed_s, sc_s, c)
        ks[c].store(gl.join(k_e, k_o).permute(0, 3, 1, 2).reshape([64, 128]))


@gluon.jit
def _compressed_split(q_ptr, comp_ptr, bt_ptr, idx_ptr, kb, q_1, p_s, raw_s, rsc_s, m_i, l_i,
                      accs, row, h0, n_heads, slot, sel_ok, c_0, c_hi, k_sel, n_pages, max_pages,
                      qk_scale, D: gl.constexpr, PAGE: gl.constexpr, C_STEPS: gl.constexpr,
                      mma_s: gl.constexpr, mma_o: gl.constexpr):
    """Index-list columns ``c_0 .. c_hi`` of one row -> (m, l, acc^T parts), with
    ``_window_split``'s ``kb``, ``q_1``, ``accs`` and one staging stage (``raw_s`` /
    ``rsc_s``): step i + 1's copies are issued once step i is dequantised, and fly during its
    products; its index is loaded two steps ahead, its block-table entry at the top of step i
    (a short chain: fewer registers held across steps under the 128-register cap)."""
    j0 = _index(idx_ptr, row, c_0, c_hi, k_sel)
    j1 = _index(idx_ptr, row, c_0 + 64, c_hi, k_sel)
    RS: gl.constexpr = gl.num_warps() == 4  # S^T from registers (one warpgroup)
    _load_q(q_ptr, q_1.index(0), row, h0, n_heads, D, True, RS)  # during the chain's trips
    rec, v0 = _rec(j0, _page(bt_ptr, j0, slot, sel_ok, max_pages, PAGE), n_pages, D, PAGE)
    _fp4_copy(comp_ptr, raw_s, rsc_s, rec, v0, D)
    for it in range(C_STEPS):
        z = _loop_zero(it)
        ks = _chunk_views(kb, z)
        q_s = q_1.index(z)
        j2 = _index(idx_ptr, row, c_0 + (it + 2) * 64, c_hi, k_sel)
        page1 = _page(bt_ptr, j1, slot, sel_ok, max_pages, PAGE)
        # this step's validity loaded again in the scores' row layout (L1 / L2 hits, used
        # after the dequantisation): converting the copies' would cost two CTA barriers
        jm = _index_in(idx_ptr, row, c_0 + it * 64, c_hi, k_sel, gl.SliceLayout(1, mma_s))
        _, vm = _rec(jm, _page(bt_ptr, jm, slot, sel_ok, max_pages, PAGE), n_pages, D, PAGE)
        async_copy.wait_group(0)  # this thread's copies of step it have landed
        gl.thread_barrier()  # everyone's; every warp's wgmmas of step it - 1 are done
        if RS:
            s = _fp4_dequant_rs(ks, raw_s, rsc_s, q_s, mma_s, D)
        else:
            _fp4_dequant_spans(ks, raw_s, rsc_s, D)
        fence_async_shared()
        gl.thread_barrier()  # the tile is written, the stage read
        rec, v1 = _rec(j1, page1, n_pages, D, PAGE)
        _fp4_copy(comp_ptr, raw_s, rsc_s, rec, v1, D)
        if not RS:
            s = _scores_chunks(ks, q_s, mma_s)
        m_i, l_i, accs = _softmax_pv(s, ks, p_s, vm, m_i, l_i, accs, qk_scale, mma_o)
        j1 = j2
    async_copy.wait_group(0)
    return m_i, l_i, accs


@gluon.constexpr_function
def _tile_layout():
    """The key tile and q in shared memory: bf16, 128-byte swizzle (wgmma operands)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


@gluon.constexpr_function
def _p_layout():
    """P^T ``[64, 16]`` bf16 in shared memory (the PV wgmma's B)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)


@gluon.jit
def _cta_row(pos_ptr, slot_ptr, n_slots, n_bt_slots, W_STEPS: gl.constexpr,
             N_WSPLIT: gl.constexpr, C_STEPS: gl.constexpr, N_SPLIT: gl.constexpr,
             LONG_FIRST: gl.constexpr):
    """This CTA's split, head block and row, the number of head blocks, the row's position and
    slot, and whether the slot has a window ring / a block-table row. LONG_FIRST: the grid is
    ``(head blocks, rows, splits)``, so CTAs start split by split over all rows, the kind with
    more steps a split first (index-list splits where ``C_STEPS >= W_STEPS``); else
    ``(splits, head blocks, rows)``: each row's splits one after the other."""
    if LONG_FIRST:
        pid_h = gl.program_id(0)
        row = gl.program_id(1)
        pid_s = gl.program_id(2)
        if C_STEPS >= W_STEPS:
            pid_s = (pid_s + N_WSPLIT) % N_SPLIT
        n_hb = gl.num_programs(0)
    else:
        pid_s = gl.program_id(0)
        pid_h = gl.program_id(1)
        row = gl.program_id(2)
        n_hb = gl.num_programs(1)
    slot = gl.load(slot_ptr + row)
    return (pid_s, pid_h, row, n_hb, gl.load(pos_ptr + row), slot,
            (slot >= 0) & (slot < n_slots), (slot >= 0) & (slot < n_bt_slots))


@gluon.jit
def _store_partials(ws_acc_ptr, ws_m_ptr, ws_l_ptr, m_i, l_i, accs, base, is_win,
                    D: gl.constexpr):
    """A split's (m, l, acc^T in four 128-dim parts) into workspace rows ``base .. base + 16``
    in dim order (both kinds' tiles were x 2^-8, the index-list ones in ``_load_q``'s FP4
    order at 8 warps, its RS orders at 4). acc^T goes through shared memory into 4 consecutive
    dims of one head a thread: 16-byte stores, a warp writing 512 contiguous bytes."""
    st_l: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, gl.num_warps()], [0, 1])
    r = base + gl.arange(0, 16, layout=gl.SliceLayout(0, st_l))
    d = gl.arange(0, 128, layout=gl.SliceLayout(1, st_l))
    for c in gl.static_range(D // 128):
        offs = gl.expand_dims(r.to(gl.int64) * D, 0) + gl.expand_dims(c * 128 + d, 1)
        if is_win:
            if gl.num_warps() == 4:  # the window tile in its register A operand's k order
                gl.store(ws_acc_ptr + offs,
                         gl.convert_layout(_win_rs_order(accs[c]) * 256.0, st_l))
            else:
                gl.store(ws_acc_ptr + offs, gl.convert_layout(accs[c] * 256.0, st_l))
        elif gl.num_warps() == 4:  # the tile in the register A operand's k order
            gl.store(ws_acc_ptr + offs, gl.convert_layout(_rs_order(accs[c]) * 256.0, st_l))
        else:
            gl.store(ws_acc_ptr + offs,
                     gl.convert_layout(_pairs_order(accs[c]) * 256.0, st_l))
    rs = base + gl.arange(0, 16, layout=m_i.type.layout)
    gl.store(ws_m_ptr + rs, m_i)
    gl.store(ws_l_ptr + rs, gl.sum(l_i, 0))


@gluon.jit
def _wgmma_attn_kernel(
    q_ptr, win_ptr, pos_ptr, slot_ptr, comp_ptr, bt_ptr, idx_ptr,
    ws_acc_ptr, ws_m_ptr, ws_l_ptr,
    n_heads, n_slots, ring, n_bt_slots, n_pages, max_pages, k_sel,
    qk_scale,  # softmax scale * log2(e)
    WINDOW: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr, W_STEPS: gl.constexpr,
    N_WSPLIT: gl.constexpr, C_STEPS: gl.constexpr, N_SPLIT: gl.constexpr,
    HAS_SEL: gl.constexpr, PDL: gl.constexpr, WAIT: gl.constexpr, LONG_FIRST: gl.constexpr,
):
    """One split of one (row, head block) (``_cta_row``: which, from the program ids) -> its
    partial (m, l, acc) rows of the workspace (the Triton kernel's layout: row
    ``(group * N_SPLIT + split) * 16 + head``, group = row x head blocks + head block).
    LONG_FIRST: the launch order of ``config.long_first``.
    WAIT: launched as a programmatic dependent (``config.pdl_entry``), it waits for the kernel
    before it first; PDL or WAIT: the merge kernel may launch once every CTA here has started
    (``config.pdl``: the merge is a dependent launch)."""
    if WAIT:  # every input is the kernels' before us
        gdc_wait()
    if PDL or WAIT:
        gdc_launch_dependents()
    WG: gl.constexpr = gl.num_warps() // 4  # warpgroups: S^T split by heads, acc^T by dims
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG],
                                                    instr_shape=[16, 16 // WG, 16])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0],
                                                    warps_per_cta=[gl.num_warps(), 1],
                                                    instr_shape=[16, 16, 16])
    k_l: gl.constexpr = _tile_layout()
    p_l: gl.constexpr = _p_layout()
    pid_s, pid_h, row, n_hb, pos, slot, win_ok, sel_ok = _cta_row(
        pos_ptr, slot_ptr, n_slots, n_bt_slots, W_STEPS, N_WSPLIT, C_STEPS, N_SPLIT, LONG_FIRST)
    # the key tile as four 128-dim chunk buffers (separate allocations: Triton's hazard pass
    # puts a CTA barrier between two stores to one allocation, not to two), acc^T in four
    # parts, one staging stage of NVFP4 records and their scales (window records go straight
    # to registers)
    q_1 = gl.allocate_shared_memory(gl.bfloat16, [1, 16, D], k_l)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [64, 16], p_l)
    raw_s = gl.allocate_shared_memory(gl.uint8, [1, 64, D // 2], _staging_rows())
    rsc_s = gl.allocate_shared_memory(gl.uint8, [1, 64, D // 16], _staging())
    m_i = gl.full([16], float("-inf"), gl.float32, gl.SliceLayout(0, mma_s))
    l_i = gl.zeros([64, 16], gl.float32, mma_s)
    is_win = pid_s < N_WSPLIT
    slot_w = gl.where(win_ok, slot, 0)
    slot_c = gl.where(sel_ok, slot, 0)
    group = row * n_hb + pid_h
    base = (group * N_SPLIT + pid_s) * 16
    kb = (gl.allocate_shared_memory(gl.bfloat16, [1, 64, 128], k_l),
          gl.allocate_shared_memory(gl.bfloat16, [1, 64, 128], k_l),
          gl.allocate_shared_memory(gl.bfloat16, [1, 64, 128], k_l),
          gl.allocate_shared_memory(gl.bfloat16, [1, 64, 128], k_l))
    z = gl.zeros([128, 16], gl.float32, mma_o)
    accs = (z, z, z, z)
    if is_win:  # the tiles hold the keys x 2^-8: scores and acc scaled back by 2^8
        w_i0 = pid_s * (W_STEPS * 64)
        w_hi = gl.minimum(w_i0 + W_STEPS * 64, WINDOW)
        m_i, l_i, accs = _window_split(
            q_ptr, win_ptr, kb, q_1, p_s, m_i, l_i, accs, row, pid_h * 16,
            n_heads, slot_w, pos, win_ok, w_i0, w_hi, ring, qk_scale * 256.0, WINDOW, D,
            W_STEPS, mma_s, mma_o)
    else:
        if HAS_SEL:
            c_0 = (pid_s - N_WSPLIT) * (C_STEPS * 64)
            c_hi = gl.minimum(c_0 + C_STEPS * 64, k_sel)
            m_i, l_i, accs = _compressed_split(
                q_ptr, comp_ptr, bt_ptr, idx_ptr, kb, q_1, p_s, raw_s.index(0),
                rsc_s.index(0), m_i, l_i, accs, row, pid_h * 16, n_heads, slot_c, sel_ok,
                c_0, c_hi, k_sel, n_pages, max_pages, qk_scale * 256.0, D, PAGE, C_STEPS,
                mma_s, mma_o)
    _store_partials(ws_acc_ptr, ws_m_ptr, ws_l_ptr, m_i, l_i, accs, base, is_win, D)
