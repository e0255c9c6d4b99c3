"""Keys and packed bf16 words: the element-level helpers every ``decode_topk`` kernel shares
(``_triton``'s four launches, ``_row``, ``_radix``), and the exact fallback they all end in.
Design: docs/kernels/topk.md."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import ref

# Kernels may only read module globals that are constexpr.
NEG_INF_KEY1 = tl.constexpr(ref.NEG_INF_KEY1)
PIN_KEY1 = tl.constexpr(ref.PIN_KEY1)

# The group-maxima pass works on int32 words of two bf16 logits (element 2j in the low half):
# a packed bf16 maximum (``max.NaN.bf16x2``) folds two elements an instruction and needs no
# bf16 -> fp32 convert (sm_90a: the pipelined 1M fold 130 -> 101 instructions a chunk).
NEG_WORD = tl.constexpr(-8323200)  # 0xFF80FF80: two -inf
NEG_HIGH = tl.constexpr(-8388608)  # 0xFF800000: -inf in the high half


@triton.jit
def _pdl_enter():
    """Start of a kernel launched as a programmatic dependent (``launch_pdl``): wait until the
    kernel before it has finished and its writes are visible, then let the next one launch
    (its CTAs take free slots and wait in turn: all of this grid's CTAs have started)."""
    gdc_wait()
    gdc_launch_dependents()


@triton.jit
def _key1(u):
    """int32 bf16 bit patterns (0..0xFFFF) -> 1 + order-preserving key; -0 -> +0, NaN on top."""
    u = tl.where(u == 0x8000, 0, u)
    key = tl.where(u >= 0x8000, 0xFFFF - u, u + 0x8000)
    key = tl.where((u & 0x7FFF) > 0x7F80, 0xFFFF, key)
    return key + 1


@triton.jit
def _element_keys(x_row_ptr, e, len_e):
    """key1 of columns ``e`` (int32, any shape) of one row; 0 for columns at or past the
    length."""
    # Loads are masked per 8 columns (16 B) so they vectorize; reading up to 7 columns past the
    # length stays inside the row (the API checks the row stride and the storage for it).
    u = tl.load(x_row_ptr + e, mask=(e // 8) * 8 < len_e, other=0).to(tl.int32) & 0xFFFF
    return tl.where(e < len_e, _key1(u), 0)


@triton.jit
def _row_length(lengths_ptr, row, cols, BLOCK: tl.constexpr):
    length = tl.minimum(tl.maximum(tl.load(lengths_ptr + row), 0), cols)
    return length, (length + BLOCK - 1) // BLOCK


@triton.jit
def _bmax2(a, b):
    """Lane-wise maximum of two words of two bf16 each, NaN on top (the result's NaN is
    canonical, a zero's sign either: their key1 is the same)."""
    return tl.inline_asm_elementwise("max.NaN.bf16x2 $0, $1, $2;", "=r,r,r", [a, b],
                                     dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _bits_of_key1(k):
    """The bf16 bits of a key1 (> 0): one representative of the key (+0 for both zeros, the
    canonical NaN for every NaN), so its key1 is k again."""
    k16 = k - 1
    return tl.where(k16 >= 0x8000, k16 - 0x8000, 0xFFFF - k16)


@triton.jit
def _word_of_keys(lo, hi):
    return _bits_of_key1(lo) | (_bits_of_key1(hi) << 16)


@triton.jit
def _wmax(v, axis, TWIN: tl.constexpr):
    """``_bmax2`` reduced along ``axis``. ``TWIN`` (the interpreter, which has no inline
    assembly and runs a custom reduction element by element in Python): the maxima of the
    halves' key1 by ``tl.max``, as words of the same keys."""
    if TWIN:
        r = _word_of_keys(tl.max(_key1(v & 0xFFFF), axis),
                          tl.max(_key1((v >> 16) & 0xFFFF), axis))
    else:
        r = tl.reduce(v, axis, _bmax2)
    return r


@triton.jit
def _wmax2(a, b, TWIN: tl.constexpr):
    """``_bmax2`` (``TWIN``: as ``_wmax``'s, by the halves' keys)."""
    if TWIN:
        r = _word_of_keys(tl.maximum(_key1(a & 0xFFFF), _key1(b & 0xFFFF)),
                          tl.maximum(_key1((a >> 16) & 0xFFFF), _key1((b >> 16) & 0xFFFF)))
    else:
        r = _bmax2(a, b)
    return r


@triton.jit
def _word_key1(w, TWIN: tl.constexpr):
    """key1 of the larger of a word's two bf16 halves (their packed maximum with the halves
    swapped: one key transform, not two)."""
    return _key1(_wmax2(w, (w << 16) | ((w >> 16) & 0xFFFF), TWIN) & 0xFFFF)


@triton.jit
def _mask_words(w, u, len_e):
    """Words ``u`` (word indices ``w`` of a row) with -inf in the halves at or past the
    length."""
    return tl.where(2 * w + 1 < len_e, u,
                    tl.where(2 * w < len_e, (u & 0xFFFF) | NEG_HIGH, NEG_WORD))


@triton.jit
def _exact_fallback(x_row, lengths_ptr, row, cols, o_ptr, K, SCAN: tl.constexpr):
    """Exact selection when the candidate buffer overflowed (heavy ties, adversarial rows).

    One CTA: tau = the K-th largest key1 by 17 counting scans of the row, then one scan in
    index order writes every element above tau and the first K - #{> tau} equal to it.
    """
    _, len_e = _row_length(lengths_ptr, row, cols, 1)
    tau = len_e * 0
    for b in tl.static_range(16, -1, -1):
        cand = tau | (1 << b)
        count = len_e * 0
        start = len_e * 0
        while start < len_e:  # (a while loop: the interpreter cannot range over a tensor)
            key1 = _element_keys(x_row, start + tl.arange(0, SCAN), len_e)
            count += tl.sum((key1 >= cand).to(tl.int32), axis=0)
            start += SCAN
        tau = tl.where(count >= K, cand, tau)
    above = len_e * 0
    start = len_e * 0
    while start < len_e:
        key1 = _element_keys(x_row, start + tl.arange(0, SCAN), len_e)
        above += tl.sum((key1 > tau).to(tl.int32), axis=0)
        start += SCAN
    kept = len_e * 0
    ties = len_e * 0
    start = len_e * 0
    while start < len_e:
        e = start + tl.arange(0, SCAN)
        key1 = _element_keys(x_row, e, len_e)
        eq = key1 == tau
        keep = (key1 > tau) | (eq & (ties + tl.cumsum(eq.to(tl.int32), axis=0) <= K - above))
        tl.store(o_ptr + kept + tl.cumsum(keep.to(tl.int32), axis=0) - 1, e, mask=keep)
        kept += tl.sum(keep.to(tl.int32), axis=0)
        ties += tl.sum(eq.to(tl.int32), axis=0)
        start += SCAN
