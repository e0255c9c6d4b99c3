"""Plain mode's select on thread-block clusters (private; sm_90+). Design: docs/kernels/topk.md
(session 32).

One launch, one cluster of ``CTAS`` CTAs a row; CTA q holds columns ``[q CE, q CE + CE)`` of the
row (those before the length are candidates) in registers, as int32 words of two bf16 loaded
16 bytes at a time (thread t: words ``4t .. 4t + 3`` of every ``4T``, T the CTA's threads). The
CTAs meet in distributed shared memory and at cluster barriers (``utils.cluster``). Keys are
16-bit (``_key16``: 0 = not a candidate, 127 = -inf, 65,535 = NaN); only the group maxima and
the few elements near the threshold are ever turned into keys:

1. T0: each thread's maximum (packed bf16 maxima over its ``4 S`` words: a group) is one key;
   the K-th largest of the row's group keys, exactly, by two rounds (a histogram of the high
   byte summed over the cluster, then of the low byte inside the bin found). At least K groups
   reach T0, so at least K elements do, and the K-th largest element is >= T0.
2. tau: each word is compared with T0 as two bf16 at once (``set.gtu.bf16x2``, as the collect's
   ``_row_candidates``); only the words holding a candidate enter a branch (inline PTX) that
   counts ``min(key - T0, 255)`` into a 256-bin histogram. Summed over the cluster, it gives
   tau = T0 + L when L < 255 (random rows: always). Otherwise (L lumps everything 255 and more
   above T0: rows whose largest values sit in few groups) two more rounds of the same branch
   find tau exactly: the high byte of the keys >= T0 + 255, then the low byte inside its bin.
3. The write: each CTA's suffix counts ``#{key >= tau}`` and ``#{key > tau}`` (from its last
   histogram) give every CTA its offset and the ties at tau before it (ties go to the lower
   column); in the CTA, one count a word (``gt | ties << 16``, again only words with a
   candidate take the branch), a scan in column order, and a branch that stores each kept
   column; rank 0 pads with -1. Columns come out ascending.

Shared region (words): five cluster histograms of 256 bins at ``C1 .. CB`` (CTA r owns the r-th
slice of each, as ``_cluster``), five of this CTA's own at ``L1 .. LB`` (counted by shared-memory
atomics), and this CTA's suffix counts at ``SUF`` (word 256: its count above the last round's
range). Barriers: after the zeroing, after each round's adds, and after the last remote read
(its wait before the CTA exits). No global scratch, integer adds: every call and graph replay
writes bitwise the same output.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsv4_decode.utils import cluster

from ._radix import _largest_bin
from ._words import _bmax2, _mask_words, _pdl_enter, _row_length, _word_key1

NB = tl.constexpr(256)
C1, C2, C3, CA, CB = (tl.constexpr(256 * i) for i in range(5))  # cluster histograms
L1, L2, L3, LA, LB = (tl.constexpr(256 * i + 1280) for i in range(5))  # this CTA's own
SUF = tl.constexpr(2560)
REGION = 4 * 2820  # bytes, a multiple of 16
CTAS = tl.constexpr(16)  # a row's cluster (the largest Hopper runs)
MAX_CE = 32768  # columns a CTA at most: its counts fit the 16 bits the write packs them in

# The 16-bit key of the bf16 bits in %x (the low half of a register), into %k; uses %p.
_KEY = ("setp.eq.u32 %p, %x, 32768; selp.b32 %x, 0, %x, %p; "  # -0 is +0
        "setp.ge.u32 %p, %x, 32768; xor.b32 %k, %x, 65535; or.b32 %t, %x, 32768; "
        "selp.b32 %k, %k, %t, %p; and.b32 %t, %x, 32767; setp.gt.u32 %p, %t, 32640; "
        "selp.b32 %k, 65535, %k, %p; ")  # NaN on top


def _half(h: int, body: str) -> str:
    """PTX for half h of the word $1 when its bit in %c is set: %x its bits, %k its key."""
    bit, shift = (1, 0) if h == 0 else (65536, 16)
    return (f"and.b32 %t, %c, {bit}; setp.eq.u32 %p, %t, 0; @%p bra skip{h}_${{:uid}}; "
            f"shr.u32 %x, $1, {shift}; and.b32 %x, %x, 65535; " + _KEY + body +
            f"skip{h}_${{:uid}}: ")


_HEAD = ("{ .reg .pred %p; .reg .b32 %c, %x, %k, %t, %a, %b; .reg .b64 %o; "
         "set.gtu.u32.bf16x2 %c, $1, $2; sub.s32 %t, $4, $3; setp.gt.s32 %p, %t, 1; "
         "selp.b32 %a, -1, 65535, %p; setp.gt.s32 %p, %t, 0; selp.b32 %a, %a, 0, %p; "
         "and.b32 %c, %c, %a; mov.b32 $0, 0; "
         "setp.eq.u32 %p, %c, 0; @%p bra done_${:uid}; ")
_TAIL = "done_${:uid}: }"
# $5 base, $6 hi, $7 sub, $8 shift, $9 the histogram's shared address: count the key's bin
_COUNT = ("setp.lt.u32 %p, %k, $5; @%p bra skip{h}_${{:uid}}; setp.gt.u32 %p, %k, $6; "
          "@%p bra skip{h}_${{:uid}}; sub.u32 %t, %k, $7; shr.u32 %t, %t, $8; "
          "min.u32 %t, %t, 255; mad.lo.u32 %a, %t, 4, $9; red.shared.add.u32 [%a], 1; ")
ROUND = tl.constexpr(_HEAD + "".join(_half(h, _COUNT.format(h=h)) for h in (0, 1)) + _TAIL)
# $5 tau: $0 = the word's (key > tau) | (key == tau) << 16
_GT_EQ = ("setp.gt.u32 %p, %k, $5; @%p add.u32 $0, $0, 1; setp.eq.u32 %p, %k, $5; "
          "@%p add.u32 $0, $0, 65536; ")
COUNT = tl.constexpr(_HEAD + "".join(_half(h, _GT_EQ) for h in (0, 1)) + _TAIL)
# $5 tau, $6 the packed count before the word, $7 quota, $8 offset, $9 the output row: store
# each kept column ($3 + h) at offset + gt before + min(ties before, quota)
_STORE = ("setp.lt.u32 %p, %k, $5; @%p bra skip{h}_${{:uid}}; shr.u32 %t, %b, 16; "
          "setp.gt.u32 %p, %k, $5; @%p bra keep{h}_${{:uid}}; setp.ge.u32 %p, %t, $7; "
          "add.u32 %b, %b, 65536; @%p bra skip{h}_${{:uid}}; sub.u32 %b, %b, 65536; "
          "keep{h}_${{:uid}}: min.u32 %t, %t, $7; and.b32 %a, %b, 65535; add.u32 %a, %a, %t; "
          "add.u32 %a, %a, $8; add.u32 %t, $3, {h}; "
          "mul.wide.u32 %o, %a, 4; add.u64 %o, %o, $9; st.global.b32 [%o], %t; "
          "setp.gt.u32 %p, %k, $5; selp.b32 %t, 1, 65536, %p; add.u32 %b, %b, %t; ")
STORE = tl.constexpr(_HEAD + "mov.b32 %b, $6; "
                     + "".join(_half(h, _STORE.format(h=h)) for h in (0, 1)) + _TAIL)


def tile(cols: int, warps: int) -> tuple[int, int]:
    """(CE, S): the columns a CTA holds (a power of two covering a 16th of the row, at least
    8 a thread) and its words a thread (4 S)."""
    threads = 32 * warps
    ce = max(triton.next_power_of_2(-(-cols // CTAS)), 8 * threads)
    assert ce <= MAX_CE, f"{cols} columns: more than {MAX_CE} a CTA"
    return ce, ce // (8 * threads)


@triton.jit
def _below(key):
    """Both halves of a word: the bf16 bits of the largest value whose key is below ``key``,
    so that ``x > v`` (unordered: NaN passes) is ``key16(x) >= key`` (``_row_candidates``;
    key 0: v is a NaN and everything passes)."""
    k = tl.minimum(tl.maximum(key - 1, 0), 0xFF80)
    k = tl.where(k == 0x7FFF, 0x7FFE, k)
    v = tl.where(k >= 0x8000, k - 0x8000, 0xFFFF - k)
    return (v << 16) | v


@triton.jit
def _round(u, col, length, base, hi, sub, shift: tl.constexpr, smem_off, W: tl.constexpr):
    """Count the keys in [base, hi] of every word (``col``: its low half's column; halves at or
    past ``length`` are not keys) into this CTA's histogram ``W``, bin ``min((key - sub) >>
    shift, 255)``: only the words with a key >= base take the branch."""
    z = u * 0
    tl.inline_asm_elementwise(
        ROUND, "=r,r,r,r,r,r,r,r,r,r",
        [u, z + _below(base), col, z + length, z + base, z + hi, z + sub, z + shift,
         z + cluster.smem_addr(smem_off + 4 * W)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _local(smem_off, W: tl.constexpr):
    tl.debug_barrier()  # every thread's atomics landed
    return cluster.ld_local(cluster.smem_addr(smem_off + 4 * (W + tl.arange(0, NB))))


@triton.jit
def _add(h, smem_off, W: tl.constexpr):
    """Add this CTA's histogram ``h`` into the cluster histogram ``W`` (its bins' owners)."""
    b = tl.arange(0, NB)
    cluster.red_add_rank(cluster.smem_addr(smem_off + 4 * (W + b)), h, h > 0, b // (NB // CTAS))


@triton.jit
def _gather(smem_off, W: tl.constexpr):
    b = tl.arange(0, NB)
    return cluster.ld_rank(cluster.smem_addr(smem_off + 4 * (W + b)), b // (NB // CTAS))


@triton.jit
def _suffix(h, above, smem_off):
    """This CTA's suffix counts from its last histogram (``above``: its keys past the range)."""
    b = tl.arange(0, NB)
    cluster.st_local(cluster.smem_addr(smem_off + 4 * (SUF + b)),
                     above + tl.cumsum(h, axis=0, reverse=True))
    cluster.st_local(cluster.smem_addr(smem_off + 4 * (SUF + NB) + 0 * b), above + 0 * b)


@triton.jit
def _sync():
    cluster.arrive()
    cluster.wait()


@triton.jit
def _cplain_kernel(x_ptr, lengths_ptr, out_ptr, stride_x, stride_o, cols, K, smem_off,
                   CE: tl.constexpr, S: tl.constexpr, T: tl.constexpr, KP: tl.constexpr,
                   PDL: tl.constexpr):
    if PDL:  # launched as a programmatic dependent: wait for the kernel before
        _pdl_enter()
    cluster.check_cluster(CTAS)
    q = tl.program_id(0)
    row = tl.program_id(1)
    length = _row_length(lengths_ptr, row, cols, 1)[0]
    NW: tl.constexpr = S * 4 * T
    w = q * (CE // 2) + tl.arange(0, NW)
    x_row = x_ptr + tl.multiple_of(row.to(tl.int64) * stride_x, 8)
    # masked per 8 columns (16 B) so the loads vectorize; reading up to 7 columns past the
    # width stays inside the row (the API checks the row stride and the storage for it)
    u = tl.load(x_row.to(tl.pointer_type(tl.int32)) + w, mask=(w // 4) * 8 < cols, other=0)
    col = 2 * w  # each word's low half
    b = tl.arange(0, NB)
    zeros = tl.zeros([NB], tl.int32)
    for i in tl.static_range(0, 10):
        cluster.st_local(cluster.smem_addr(smem_off + 4 * (256 * i + b)), zeros)
    cluster.arrive()  # after the zeroing
    # 1. T0: the K-th largest group key (thread t's words; 0 for a group past the length)
    m = tl.reduce(tl.reduce(tl.reshape(_mask_words(w, u, length), [S, T, 4]), 2, _bmax2), 0,
                  _bmax2)
    gk = tl.where(q * CE + 8 * tl.arange(0, T) < length, _word_key1(m, False) - 1, 0)
    tl.debug_barrier()  # the local zeros
    cluster.count_local(cluster.smem_addr(smem_off + 4 * (L1 + (gk >> 8))), gk > 0)
    h1 = _local(smem_off, L1)
    cluster.wait()
    _add(h1, smem_off, C1)
    _sync()
    b0, above = _largest_bin(_gather(smem_off, C1), 0, K, NB)
    cluster.count_local(cluster.smem_addr(smem_off + 4 * (L2 + (gk & 0xFF))),
                        (gk > 0) & ((gk >> 8) == b0))
    _add(_local(smem_off, L2), smem_off, C2)
    _sync()
    t0 = b0 * 256 + _largest_bin(_gather(smem_off, C2), above, K, NB)[0]
    # 2. tau: the keys >= T0, min(key - T0, 255)
    _round(u, col, length, t0, 65535, t0, 0, smem_off, L3)
    h = _local(smem_off, L3)
    _add(h, smem_off, C3)
    _suffix(h, 0, smem_off)
    _sync()
    g = _gather(smem_off, C3)
    lsel, greater = _largest_bin(g, 0, K, NB)
    tau = t0 + lsel
    if lsel == NB - 1:  # the K-th lies 255 or more above T0: its byte, then the low byte
        base = t0 + 255
        _round(u, col, length, base, 65535, 0, 8, smem_off, LA)
        ha = _local(smem_off, LA)
        _add(ha, smem_off, CA)
        _sync()
        bsel, above = _largest_bin(_gather(smem_off, CA), 0, K, NB)
        mine = tl.sum(tl.where(b > bsel, ha, 0), axis=0)
        _round(u, col, length, tl.maximum(bsel * 256, base), bsel * 256 + 255, bsel * 256, 0,
               smem_off, LB)
        h = _local(smem_off, LB)
        _add(h, smem_off, CB)
        _suffix(h, mine, smem_off)
        _sync()
        g = _gather(smem_off, CB)
        lsel, greater = _largest_bin(g, above, K, NB)
        tau = bsel * 256 + lsel
    ties = K - greater  # ties at tau to keep, lowest column first (more than exist: all)
    # 3. the CTAs before this one: their keys >= tau and > tau
    p = tl.arange(0, CTAS)
    ge = cluster.ld_rank(cluster.smem_addr(smem_off + 4 * (SUF + lsel) + 0 * p), p)
    gt = cluster.ld_rank(cluster.smem_addr(smem_off + 4 * (SUF + lsel + 1) + 0 * p), p)
    cluster.arrive()  # no CTA reads this one's shared memory after this
    before = p < q
    n_above = tl.sum(tl.where(before, gt, 0), axis=0)
    n_ties = tl.sum(tl.where(before, ge - gt, 0), axis=0)
    o_row = out_ptr + row.to(tl.int64) * stride_o
    _write(u, col, length, tau, tl.maximum(ties - n_ties, 0),
           n_above + tl.minimum(n_ties, ties), o_row, S, T)
    if q == 0:
        n_eq = tl.sum(tl.where(b == lsel, g, 0), axis=0)
        slot = tl.arange(0, KP)
        tl.store(o_row + slot, -1, mask=(slot >= greater + tl.minimum(n_eq, ties)) & (slot < K))
    cluster.wait()


@triton.jit
def _write(u, col, length, tau, quota, offset, o_row, S: tl.constexpr, T: tl.constexpr):
    """Store the tile's keys > tau and its first ``quota`` ties at tau from ``offset``, in
    column order (words: slice-major, then thread, then the thread's 4): each word's count
    ``gt | ties << 16`` (a CTA holds at most ``MAX_CE`` columns: no field carries), scanned."""
    z = u * 0
    vv = z + _below(tau)
    c = tl.inline_asm_elementwise(COUNT, "=r,r,r,r,r,r", [u, vv, col, z + length, z + tau],
                                  dtype=tl.int32, is_pure=True, pack=1)
    c3 = tl.reshape(c, [S, T, 4])
    in_t = tl.cumsum(c3, axis=2) - c3
    r = tl.sum(c3, axis=2)
    in_s = tl.cumsum(r, axis=1) - r
    rs = tl.sum(r, axis=1)
    s_before = tl.cumsum(rs, axis=0) - rs
    bw = tl.reshape(in_t + in_s[:, :, None] + s_before[:, None, None], [S * T * 4])
    tl.inline_asm_elementwise(
        STORE, "=r,r,r,r,r,r,r,r,r,l",
        [u, vv, col, z + length, z + tau, bw, z + quota, z + offset,
         z.to(tl.int64) + o_row.to(tl.int64, bitcast=True)], dtype=tl.int32, is_pure=False,
        pack=1)


def launch(x16, lengths, out, k: int, warps: int = 8, pdl: bool = True) -> int:
    """Run the select: a cluster of ``CTAS`` CTAs of ``warps`` warps a row (sm_90+), each CTA
    holding ``tile(cols, warps)[0]`` columns in registers. ``x16``: the bf16 logits viewed as
    int16 [rows, cols]; ``pdl``: a programmatic dependent launch. Returns how many such
    clusters the GPU holds at once (the driver's occupancy; rows past it wait)."""
    rows, cols = x16.shape
    ce, s = tile(cols, warps)
    consts = dict(CE=ce, S=s, T=32 * warps, KP=triton.next_power_of_2(k), PDL=pdl,
                  num_warps=warps, **({"launch_pdl": True} if pdl else {}))
    args = (x16, lengths, out, x16.stride(0), out.stride(0), cols, k)
    clusters = cluster.prepare(_cplain_kernel, args, consts, CTAS, REGION)[1]
    cluster.launch(_cplain_kernel, (1, rows), args, consts, CTAS, REGION)
    return clusters
