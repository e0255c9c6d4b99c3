"""Probe: can a weight-streaming kernel on Hopper feed mma.sync from registers, with no
shared-memory round trip between the global load and the MMA? The MoE's Triton kernels cannot
choose the register layout of a load, so every decoded weight tile goes through shared memory
(STS, barrier, LDSM). Gluon (``triton.experimental.gluon``, Triton 3.6) takes explicit layouts.

Two kernels, compiled for sm_90a (no GPU needed):

- ``_bf16_pairs``: a [16, 64] x [64, 64] product a 64-deep K step whose B operand is read as
  32-bit words, two bf16 of consecutive k a word (the pair each thread's m16n8k16 fragment
  holds), in an explicit linear layout (the B-operand layout without its pair bit), split in
  registers and handed to ``mma_v2`` through ``convert_layout(..., assert_trivial=True)``,
  which compiles only if the conversion moves no data.
- ``_mxfp4_gemm``: the MoE's orientation (weights in the MMA's M, up to 16 token rows in N) on
  MXFP4 weights: 64 weight rows a CTA, ue8m0 scales per 32 inputs, the e2m1 decode of
  ``ops/moe/_triton._mx4_dot`` (``api.REPACK_BITS``). Each 32-bit word holds the 8 values at
  k = base + {0, 1, 8, 9, 16, 17, 24, 25} of a 64-input step (``fragment_repack``), three of
  the A fragment's k bits; the word's index carries k + 2, + 4, + 32.

Offline it prints each kernel's registers, shared memory and SASS counts (``cuobjdump``).
Session 10 got 0 bytes and no LDS / STS / LDSM / BAR for every Gluon kernel. ``_mxfp4_gemm``
at 64 rows and 64-deep steps took 48 registers, and its K loop is 142 instructions a thread a
step (1,024 weights a warp): 8 HMMA, 4 LDG of words and 4 of scale bytes, 16 LDG of the
activation operand (loaded straight from global memory in its fragment layout, 4 bytes at a
time), 18 HMUL2, ~60 integer ops of the decode, 20 register moves (IMAD.MOV, PRMT): 1,136 a
warp per 8,192 weights. Larger tiles share the activation loads and the loop overhead: 64
rows x 128-deep 69 registers, 1,048; 128 x 64 88 registers, 1,020; 128 x 128 124 registers,
966. The
same product through the MoE's Triton step (``_triton_stream``: ``_mx4_dot`` at W1|W3's
ROUND1 tile, 32 rows, 256-deep, 2 warps, 3 stages) compiles to 94 registers, 25 KB of shared
memory and a 494-instruction loop a 256-deep step: 988 per 8,192 weights, with 21 LDS, 4
LDSM, 13 LDGSTS and 2 barriers a step. It also checks ``fragment_repack`` on the CPU:
decoding its words the way the kernel does (``emulate``) gives the reference dequantisation
bit for bit.

``_mxfp4_vec`` (session 11) is the same product with vector loads: the words in
``vector_repack``'s order (a thread's words of a row adjacent), x pre-permuted into fragment
order (``x_fragments``), x one step ahead and the words one or two (``DEPTH``).

With a GPU (``--gpu``) it checks every kernel against torch and times them, alternated,
streaming ~141 MB of weights at 16 token rows. Session 11 on the H200: the Triton step 2.48-2.51
TB/s; ``_mxfp4_gemm`` 0.62-0.92; ``_mxfp4_vec`` 0.66-1.65 (128 rows x 64-deep, two steps
ahead, best). The registers-only feeding does not pay (docs/kernels/moe.md, Session 11).

    PYTHONPATH=. python3 scripts/gluon_fragment_probe.py [--gpu]
"""

import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from dsv4_decode.ops.moe._triton import _mx4_dot
from dsv4_decode.ops.moe.api import repack_mxfp4
from dsv4_decode.utils.sm90 import sass

# word o of a 64-input step's 8 -> k offset from the word's base (the A fragment's k + 1, + 8,
# + 16 bits); the decode yields them in the order l0 h0 l2 h2 l1 h1 l3 h3 (_mx4_dot)
OFFSET = (0, 1, 8, 9, 16, 17, 24, 25)


def base(j: int) -> int:
    """k of word j (0..7) of a 64-input step: its bits are the fragment's k + 2, + 4, + 32."""
    return 2 * (j & 1) + 4 * ((j >> 1) & 1) + 32 * ((j >> 2) & 1)


def fragment_repack(packed: torch.Tensor) -> torch.Tensor:
    """Checkpoint MXFP4 rows ``uint8 [N, K/2]`` (low nibble = even k) -> int32 ``[N, K/8]``:
    word ``8c + j`` holds k = 64c + base(j) + OFFSET[o] at in-word slot o, with the bits of
    ``api.REPACK_BITS`` (so the kernel's decode is ``_mx4_dot``'s)."""
    n, half = packed.shape
    k = 2 * half
    codes = torch.stack((packed & 15, packed >> 4), -1).reshape(n, k)
    src = torch.tensor([64 * c + base(j) + OFFSET[o] for c in range(k // 64) for j in range(8)
                        for o in range(8)])
    perm = codes[:, src]  # slot 8j + o of step c = the code of k above
    return repack_mxfp4((perm[:, 0::2] | (perm[:, 1::2] << 4)).to(torch.uint8))


def emulate(words: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The kernel's decode on the CPU: int32 ``[N, K/8]`` words + ue8m0 ``[N, K/32]`` ->
    fp32 ``[N, K]`` weights (the same bit operations, then the same placement)."""
    q = words.to(torch.int64) & 0xFFFFFFFF
    m2 = 0x81C081C0
    pairs = [q & m2, (q << 3) & m2, (q << 6) & m2,
             ((q >> 4) & 0x00C000C0) | ((q >> 5) & 0x01000100) | ((q << 1) & 0x80008000)]
    halves = []
    for p in pairs:
        for h in (p & 0xFFFF, (p >> 16) & 0xFFFF):
            halves.append(torch.where(h >= 2**15, h - 2**16, h).to(torch.int16)
                          .view(torch.bfloat16).float())
    l0, h0, l1, h1, l2, h2, l3, h3 = halves
    slots = (l0, h0, l2, h2, l1, h1, l3, h3)  # slot o
    n, nw = words.shape
    out = torch.empty(n, nw * 8)
    for wi in range(nw):
        c, j = divmod(wi, 8)
        for o in range(8):
            out[:, 64 * c + base(j) + OFFSET[o]] = slots[o][:, wi]
    s = torch.repeat_interleave(scales.to(torch.int32) - 64, 32, dim=1).float()
    return out * torch.exp2(s) * 2.0**63


@gluon.jit
def _bf16_pairs(x_ptr, w_ptr, o_ptr, K: gl.constexpr, N: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4],
                                                  instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # B's layout for [64, 64] (printed by a failing assert_trivial): registers k+1, k+8, k+16,
    # k+32, n+32; lanes k+2, k+4, n+1, n+2, n+4; warps n+8, n+16. The words [32, 64] drop the
    # first register bit (the pair) and halve k.
    w_l: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[4, 0], [8, 0], [16, 0], [0, 32]],
        lane_bases=[[1, 0], [2, 0], [0, 1], [0, 2], [0, 4]],
        warp_bases=[[0, 8], [0, 16]], block_bases=[], shape=[32, 64])
    acc = gl.zeros([16, N], gl.float32, layout=mma)
    offs_m = gl.arange(0, 16, layout=gl.SliceLayout(1, a_l))
    offs_n = gl.arange(0, N, layout=gl.SliceLayout(0, w_l))
    for kk in range(0, K, 64):
        offs_ka = kk + gl.arange(0, 64, layout=gl.SliceLayout(0, a_l))
        a = gl.load(x_ptr + offs_m[:, None] * K + offs_ka[None, :])
        offs_kw = kk // 2 + gl.arange(0, 32, layout=gl.SliceLayout(1, w_l))
        w = gl.load(w_ptr + offs_n[None, :] * (K // 2) + offs_kw[:, None])  # W [N, K] as words
        lo = (w & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True)
        hi = (w >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True)
        b = gl.join(lo, hi).permute(0, 2, 1).reshape([64, N])
        acc = mma_v2(a, gl.convert_layout(b, b_l, assert_trivial=True), acc)
    om = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    on = gl.arange(0, N, layout=gl.SliceLayout(0, mma))
    gl.store(o_ptr + om[:, None] * N + on[None, :], acc)


@gluon.jit
def _bf16_halves(p, sc):
    """A pair word (two bf16 bit patterns) -> its two values times the scale ``sc`` (bf16)."""
    lo = (p & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True)
    hi = (p >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True)
    return lo * sc, hi * sc


@gluon.jit
def _decode_words(q, s):
    """``fragment_repack`` words and their ue8m0 bytes -> the 8 bf16 values of each word,
    ``[..., 2, 2, 2]``: slots l0 h0 | l2 h2 | l1 h1 | l3 h3 = k + 0, 1 | 8, 9 | 16, 17 | 24, 25;
    each join adds the next-fastest register bit (k + 1, then k + 8, then k + 16)."""
    sc = ((s.to(gl.int32) + 63) << 7).to(gl.int16).to(gl.bfloat16, bitcast=True)
    l0, h0 = _bf16_halves(q & -2118090304, sc)  # 0x81C081C0
    l1, h1 = _bf16_halves((q << 3) & -2118090304, sc)
    l2, h2 = _bf16_halves((q << 6) & -2118090304, sc)
    l3, h3 = _bf16_halves(((q >> 4) & 0x00C000C0) | ((q >> 5) & 0x01000100)
                          | ((q << 1) & -2147450880), sc)  # 0x80008000
    return gl.join(gl.join(gl.join(l0, h0), gl.join(l2, h2)),
                   gl.join(gl.join(l1, h1), gl.join(l3, h3)))


@gluon.constexpr_function
def _word_layout(rows, bk):
    """The words ``[rows, bk / 8]`` of one K step: registers m+8 and word bit 2 (k+32), then
    word bit 3 (k+64) at 128-deep steps and m+64 at 128 rows; lanes word bits 0, 1 (k+2, k+4)
    and m+1, m+2, m+4; warps m+16, m+32 (A's layout without its k+1, k+8, k+16 bits)."""
    regs = [[8, 0], [0, 4]] + ([[0, 8]] if bk == 128 else []) + ([[64, 0]] if rows == 128 else [])
    return gl.DistributedLinearLayout(
        reg_bases=regs, lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[rows, bk // 8])


@gluon.jit
def _mxfp4_gemm(x_ptr, w_ptr, s_ptr, o_ptr, N, K: gl.constexpr, ROWS: gl.constexpr,
                BK: gl.constexpr):
    """``out[r, n] = sum_k x[r, k] * W[n, k]`` for 16 rows of x (bf16 ``[16, K]``) and the
    ROWS (64 or 128) weight rows of this CTA (``fragment_repack`` words ``[N, K/8]``, ue8m0
    ``[N, K/32]``), fp32 ``[16, N]``; K steps of BK (64 or 128)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # A's layout for [64, 64]: registers k+1, m+8, k+8, k+16, k+32; lanes k+2, k+4, m+1, m+2,
    # m+4; warps m+16, m+32 (then k+64 and m+64 registers for larger tiles)
    w_l: gl.constexpr = _word_layout(ROWS, BK)
    WPS: gl.constexpr = BK // 8  # words a row a step
    n0 = gl.program_id(0) * ROWS
    offs_m = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, w_l))
    offs_j = gl.arange(0, WPS, layout=gl.SliceLayout(0, w_l))
    offs_r = gl.arange(0, 16, layout=gl.SliceLayout(0, b_l))
    acc = gl.zeros([ROWS, 16], gl.float32, layout=mma)
    w_rows = w_ptr + offs_m.to(gl.int64)[:, None] * (K // 8) + offs_j[None, :]
    s_rows = s_ptr + offs_m.to(gl.int64)[:, None] * (K // 32) + (offs_j // 4)[None, :]
    q = gl.load(w_rows)
    s = gl.load(s_rows)
    for kk in range(0, K, BK):
        # the next step's words and scales first: their round trip overlaps this step
        nxt = gl.full([ROWS, WPS], kk + BK < K, gl.int1, w_l)
        q_next = gl.load(w_rows + (kk + BK) // 8, mask=nxt, other=0)
        s_next = gl.load(s_rows + (kk + BK) // 32, mask=nxt, other=127)
        v = _decode_words(q, s)  # [ROWS, WPS, 2, 2, 2]
        if BK == 64:  # m, word bits (k+32, k+4, k+2), k+1, k+8, k+16
            v = v.reshape([ROWS, 2, 2, 2, 2, 2, 2])
            a = v.permute(0, 1, 6, 5, 2, 3, 4).reshape([ROWS, BK])
        else:  # m, word bits (k+64, k+32, k+4, k+2), k+1, k+8, k+16
            v = v.reshape([ROWS, 2, 2, 2, 2, 2, 2, 2])
            a = v.permute(0, 1, 2, 7, 6, 3, 4, 5).reshape([ROWS, BK])
        offs_k = kk + gl.arange(0, BK, layout=gl.SliceLayout(1, b_l))
        xt = gl.load(x_ptr + offs_r[None, :] * K + offs_k[:, None])
        acc = mma_v2(gl.convert_layout(a, a_l, assert_trivial=True), xt, acc)
        q = q_next
        s = s_next
    om = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma))
    orr = gl.arange(0, 16, layout=gl.SliceLayout(0, mma))
    gl.store(o_ptr + orr[None, :] * N + om[:, None], acc * 9.223372036854775808e18)  # 2**63


def vector_repack(words: torch.Tensor, bk: int) -> torch.Tensor:
    """``fragment_repack`` words -> the memory order of ``_mxfp4_vec`` at ``bk``-deep steps:
    inside a step, word bits k+32 (and k+64) lowest, then k+2, k+4, so that each thread's
    words of a row are adjacent (one 8- or 16-byte load)."""
    n, nw = words.shape
    if bk == 64:  # old (j2, j1, j0) -> new (j1, j0, j2)
        return words.reshape(n, nw // 8, 2, 2, 2).permute(0, 1, 3, 4, 2).reshape(n, nw)
    # old (j3, j2, j1, j0), j3 = which 64-input half -> new (j1, j0, j3, j2)
    return words.reshape(n, nw // 16, 2, 2, 2, 2).permute(0, 1, 4, 5, 2, 3).reshape(n, nw)


def x_fragments(x: torch.Tensor, bk: int) -> torch.Tensor:
    """bf16 ``[16, K]`` -> each ``bk``-deep step's B fragments in lane order: ``[K/bk, 32,
    bk/2]``, lane bits k+2, k+4, n+1, n+2, n+4 and register bits k+1, k+8, k+16, k+32
    (k+64), n+8 (``mma_v2``'s B layout, printed by ``gl.to_linear_layout``)."""
    k = x.shape[1]
    if bk == 64:  # dims n8 n4 n2 n1 S k32 k16 k8 k4 k2 k1
        v = x.reshape(2, 2, 2, 2, k // 64, 2, 2, 2, 2, 2, 2).permute(
            4, 1, 2, 3, 8, 9, 0, 5, 6, 7, 10)
    else:  # dims n8 n4 n2 n1 S k64 k32 k16 k8 k4 k2 k1
        v = x.reshape(2, 2, 2, 2, k // 128, 2, 2, 2, 2, 2, 2, 2).permute(
            4, 1, 2, 3, 9, 10, 0, 5, 6, 7, 8, 11)
    return v.contiguous().reshape(k // bk, 32, bk // 2)


@gluon.constexpr_function
def _vec_word_layout(rows, bk):
    """``_word_layout`` in ``vector_repack``'s order: the k+32 (k+64) word bits first."""
    wb = [[0, 1]] + ([[0, 2]] if bk == 128 else [])
    lane = [[0, 2 * len(wb)], [0, 4 * len(wb)], [1, 0], [2, 0], [4, 0]]
    regs = wb + [[8, 0]] + ([[64, 0]] if rows == 128 else [])
    return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=lane,
                                      warp_bases=[[16, 0], [32, 0]], block_bases=[],
                                      shape=[rows, bk // 8])


@gluon.constexpr_function
def _x_frag_layout(bk):
    """One step's ``x_fragments`` ``[32, bk/2]``: a lane's values contiguous, every warp the
    same (the B operand is replicated over the warps, which split M)."""
    regs = [[0, 1 << i] for i in range((bk // 2).bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=regs,
                                      lane_bases=[[1, 0], [2, 0], [4, 0], [8, 0], [16, 0]],
                                      warp_bases=[[0, 0], [0, 0]], block_bases=[],
                                      shape=[32, bk // 2])


@gluon.jit
def _mxfp4_vec(x_ptr, w_ptr, s_ptr, o_ptr, N, K: gl.constexpr, ROWS: gl.constexpr,
               BK: gl.constexpr, DEPTH: gl.constexpr):
    """``_mxfp4_gemm`` with vector loads: the weight words in ``vector_repack``'s order (a
    thread's words of a row in one 8- / 16-byte load, its two scale bytes in one) and x as
    ``x_fragments`` (``[K/BK, 32, BK/2]`` bf16: 64-128 contiguous bytes a lane a step,
    16-byte loads, instead of 16-32 scattered 4-byte loads), x one step ahead and the
    weights ``DEPTH`` (1 or 2) steps ahead."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    w_l: gl.constexpr = _vec_word_layout(ROWS, BK)
    x_l: gl.constexpr = _x_frag_layout(BK)
    WPS: gl.constexpr = BK // 8
    n0 = gl.program_id(0) * ROWS
    offs_m = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, w_l))
    offs_p = gl.arange(0, WPS, layout=gl.SliceLayout(0, w_l))
    acc = gl.zeros([ROWS, 16], gl.float32, layout=mma)
    w_rows = w_ptr + offs_m.to(gl.int64)[:, None] * (K // 8) + offs_p[None, :]
    s_rows = s_ptr + offs_m.to(gl.int64)[:, None] * (K // 32) + (offs_p % (BK // 32))[None, :]
    x_offs = (gl.arange(0, 32, layout=gl.SliceLayout(1, x_l))[:, None] * (BK // 2)
              + gl.arange(0, BK // 2, layout=gl.SliceLayout(0, x_l))[None, :])
    q = gl.load(w_rows)
    s = gl.load(s_rows)
    xr = gl.load(x_ptr + x_offs)  # [32 lanes, BK/2]
    if DEPTH == 2:
        q1 = gl.load(w_rows + BK // 8)
        s1 = gl.load(s_rows + BK // 32)
    for kk in range(0, K, BK):
        ahead = kk + DEPTH * BK
        nxt = gl.full([ROWS, WPS], ahead < K, gl.int1, w_l)
        q_next = gl.load(w_rows + ahead // 8, mask=nxt, other=0)
        s_next = gl.load(s_rows + ahead // 32, mask=nxt, other=127)
        x_next = gl.load(x_ptr + ((kk + BK) % K // BK) * (16 * BK) + x_offs)
        v = _decode_words(q, s)  # [ROWS, WPS, k1, k8, k16]
        if BK == 64:  # m, word bits (k+4, k+2, k+32), k+1, k+8, k+16
            v = v.reshape([ROWS, 2, 2, 2, 2, 2, 2])
            a = v.permute(0, 3, 6, 5, 1, 2, 4).reshape([ROWS, BK])
        else:  # m, word bits (k+4, k+2, k+64, k+32), k+1, k+8, k+16
            v = v.reshape([ROWS, 2, 2, 2, 2, 2, 2, 2])
            a = v.permute(0, 3, 4, 7, 6, 1, 2, 5).reshape([ROWS, BK])
        if BK == 64:  # lanes n4 n2 n1 k4 k2, registers n8 k32 k16 k8 k1
            xt = xr.reshape([2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
            xt = xt.permute(6, 7, 8, 3, 4, 9, 5, 0, 1, 2).reshape([BK, 16])
        else:  # registers n8 k64 k32 k16 k8 k1
            xt = xr.reshape([2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
            xt = xt.permute(6, 7, 8, 9, 3, 4, 10, 5, 0, 1, 2).reshape([BK, 16])
        acc = mma_v2(gl.convert_layout(a, a_l, assert_trivial=True),
                     gl.convert_layout(xt, b_l, assert_trivial=True), acc)
        xr = x_next
        if DEPTH == 2:
            q = q1
            s = s1
            q1 = q_next
            s1 = s_next
        else:
            q = q_next
            s = s_next
    om = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma))
    orr = gl.arange(0, 16, layout=gl.SliceLayout(0, mma))
    gl.store(o_ptr + orr[None, :] * N + om[:, None], acc * 9.223372036854775808e18)  # 2**63


@triton.jit
def _triton_stream(x_ptr, w_ptr, s_ptr, o_ptr, N, K: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr):
    """The same product through the MoE's Triton step (``_mx4_dot``, ``repack_mxfp4`` words),
    BN weight rows a CTA: the comparison at equal bytes."""
    wrows = tl.program_id(0) * BN + tl.arange(0, BN)
    rows = tl.arange(0, 16)
    acc = tl.zeros((BN, 16), dtype=tl.float32)
    for it in range(K // BK):
        acc = _mx4_dot(acc, x_ptr, rows, rows < 16, K, it, K, w_ptr, s_ptr, wrows, wrows < N,
                       32, BK, 0, False)
    tl.store(o_ptr + rows[None, :] * N + wrows[:, None], acc * 9.223372036854775808e18)


# W1|W3's ROUND1 step (config.ROUND1: 32 rows, 256-deep, 2 warps, 3 stages)
TRITON = dict(BN=32, BK=256, num_warps=2, num_stages=3)
GLUON = [(64, 64), (64, 128), (128, 64), (128, 128)]  # (weight rows a CTA, K step)


def report(name, fn, sig, const, gluon_fn=True, num_warps=4, num_stages=1) -> None:
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*")}
    source = (GluonASTSource if gluon_fn else ASTSource)(fn, sig, const, attrs)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})
    tools = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
    text = sass(kernel)
    with tempfile.TemporaryDirectory() as d:
        ptx = os.path.join(d, "k.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        info = subprocess.run([os.path.join(tools, "ptxas"), "-arch=sm_90a", "-v", ptx, "-o",
                               os.devnull], capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", info)
    ops = Counter(re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text))
    print(f"{name}: {regs[0] if regs else '?'} registers, shared memory "
          f"{kernel.metadata.shared} bytes; SASS: "
          + ", ".join(f"{op} {ops.get(op, 0)}" for op in ("HMMA", "HGMMA", "LDG", "LDGSTS",
                                                          "LDS", "STS", "LDSM", "BAR"))
          + f"; {sum(ops.values())} instructions", flush=True)


def random_mxfp4(n: int, k: int, gen: torch.Generator):
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    scales = torch.randint(118, 131, (n, k // 32), dtype=torch.uint8, generator=gen)
    return packed, scales


def reference(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Dequantised fp32 weights from the checkpoint layout (e2m1 magnitudes, sign bit 3)."""
    codes = torch.stack((packed & 15, packed >> 4), -1).reshape(packed.shape[0], -1).long()
    mag = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])[codes & 7]
    val = torch.where(codes >= 8, -mag, mag)
    return val * torch.exp2(torch.repeat_interleave(scales.float() - 127, 32, dim=1))


def check_cpu() -> None:
    gen = torch.Generator().manual_seed(0)
    packed, scales = random_mxfp4(64, 256, gen)
    got = emulate(fragment_repack(packed), scales)
    want = reference(packed, scales)
    print(f"CPU emulation of the kernel's decode equals the reference: "
          f"{torch.equal(got, want)}", flush=True)
    assert torch.equal(got, want)


K_IN = 5120  # the MoE's hidden size: W1|W3's K
STREAM_ROWS = 48 * 1152  # 48 experts of W1|W3 at TP = 4: ~141 MB of words, past the L2


def check_inputs():
    """A 256 x K_IN MXFP4 matrix, x with 6 of 16 rows set, and torch's product (on the CPU)."""
    gen = torch.Generator().manual_seed(1)
    packed, scales = random_mxfp4(256, K_IN, gen)
    x = torch.zeros(16, K_IN, dtype=torch.bfloat16)
    x[:6] = torch.randn(6, K_IN, generator=gen).to(torch.bfloat16)
    return packed, scales, x, x.float() @ reference(packed, scales).T


def stream_inputs():
    """Random words and scales of STREAM_ROWS weight rows, the output, the bytes streamed."""
    words = torch.randint(-2**31, 2**31 - 1, (STREAM_ROWS, K_IN // 8), dtype=torch.int32,
                          device="cuda")
    sc = torch.randint(118, 131, (STREAM_ROWS, K_IN // 32), dtype=torch.uint8, device="cuda")
    return words, sc, torch.empty(16, STREAM_ROWS, device="cuda"), words.numel() * 4 + sc.numel()


def time_alternated(runs: dict, nbytes: int) -> None:
    """Each run twice, alternated (one GPU, one process): µs a call and TB/s."""
    from dsv4_decode.bench.timing import graph_time_us

    for name in list(runs) * 2:
        us = graph_time_us(runs[name], calls=20)
        print(f"{name} stream: {STREAM_ROWS} x {K_IN} MXFP4, 16 rows: {us:.2f} us, "
              f"{nbytes / us / 1e6:.2f} TB/s", flush=True)


def run_gpu() -> None:
    k = K_IN
    packed, scales, x, want = check_inputs()
    xs, scs, out = x.cuda(), scales.cuda(), torch.empty(16, 256, device="cuda")
    for rows, bk in GLUON:
        out.fill_(float("nan"))
        _mxfp4_gemm[(256 // rows,)](xs, fragment_repack(packed).cuda(), scs, out, 256, K=k,
                                    ROWS=rows, BK=bk, num_warps=4)
        err = (out.cpu() - want).abs().max().item() / want.abs().max().item()
        print(f"Gluon {rows} rows {bk}-deep against torch (6 rows of 16, 256 x {k}): max "
              f"relative error {err:.2e}", flush=True)
    for rows, bk in GLUON:
        for depth in (1, 2):
            out.fill_(float("nan"))
            _mxfp4_vec[(256 // rows,)](x_fragments(x, bk).cuda(),
                                       vector_repack(fragment_repack(packed), bk).cuda(), scs,
                                       out, 256, K=k, ROWS=rows, BK=bk, DEPTH=depth,
                                       num_warps=4)
            err = (out.cpu() - want).abs().max().item() / want.abs().max().item()
            print(f"Gluon vector loads {rows} rows {bk}-deep {depth} ahead against torch: max "
                  f"relative error {err:.2e}", flush=True)
    _triton_stream[(256 // TRITON["BN"],)](xs, repack_mxfp4(packed).cuda(), scs, out, 256, K=k,
                                           **TRITON)
    err = (out.cpu() - want).abs().max().item() / want.abs().max().item()
    print(f"Triton against torch: max relative error {err:.2e}")
    n = STREAM_ROWS
    words, sc, out, nbytes = stream_inputs()
    runs = {f"gluon {rows}x{bk}": (lambda rows=rows, bk=bk: _mxfp4_gemm[(n // rows,)](
        xs, words, sc, out, n, K=k, ROWS=rows, BK=bk, num_warps=4)) for rows, bk in GLUON}
    xf = {bk: x_fragments(x, bk).cuda() for bk in (64, 128)}
    for rows, bk in GLUON:
        for depth in (1, 2):
            runs[f"vec {rows}x{bk} d{depth}"] = (
                lambda rows=rows, bk=bk, depth=depth: _mxfp4_vec[(n // rows,)](
                    xf[bk], words, sc, out, n, K=k, ROWS=rows, BK=bk, DEPTH=depth,
                    num_warps=4))
    runs["triton"] = lambda: _triton_stream[(n // TRITON["BN"],)](xs, words, sc, out, n, K=k,
                                                                 **TRITON)
    time_alternated(runs, nbytes)


if __name__ == "__main__":
    check_cpu()
    report("bf16 pairs", _bf16_pairs, {"x_ptr": "*bf16", "w_ptr": "*i32", "o_ptr": "*fp32",
                                       "K": "constexpr", "N": "constexpr"},
           {"K": 1024, "N": 64})
    sig = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "o_ptr": "*fp32", "N": "i32",
           "K": "constexpr"}
    for rows, bk in GLUON:
        report(f"mxfp4 (Gluon, {rows} rows, {bk}-deep)", _mxfp4_gemm,
               dict(sig, ROWS="constexpr", BK="constexpr"), {"K": 5120, "ROWS": rows, "BK": bk})
        for depth in (1, 2):
            report(f"mxfp4 vector loads (Gluon, {rows} rows, {bk}-deep, {depth} ahead)",
                   _mxfp4_vec, dict(sig, ROWS="constexpr", BK="constexpr", DEPTH="constexpr"),
                   {"K": 5120, "ROWS": rows, "BK": bk, "DEPTH": depth})
    report("mxfp4 (Triton, _mx4_dot)", _triton_stream,
           dict(sig, BN="constexpr", BK="constexpr"),
           {"K": 5120, "BN": TRITON["BN"], "BK": TRITON["BK"]}, gluon_fn=False,
           num_warps=TRITON["num_warps"], num_stages=TRITON["num_stages"])
    if "--gpu" in sys.argv:
        run_gpu()
