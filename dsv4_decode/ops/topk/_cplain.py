"""Plain mode's select on thread-block clusters (private; sm_90+). Design: docs/kernels/topk.md
(session 32).

One launch, one cluster of ``CTAS`` CTAs a row; CTA q holds columns ``[q CE, q CE + CE)`` of the
row (those before the length are candidates), loaded once into registers as int32 words of two
bf16 (thread t: words ``4t .. 4t + 3`` of every ``4T``, T the CTA's threads). The CTAs meet in
distributed shared memory and at cluster barriers (``utils.cluster``). Keys are 16-bit
(``_key16``: 0 = not a candidate, 127 = -inf, 65,535 = NaN).

1. T0: each thread's maximum (packed bf16 maxima over its ``4 S`` words: a group) is one key;
   T0 is the K-th largest of the row's group keys, exactly, by two rounds (a histogram of the
   high byte summed over the cluster, then of the low byte inside the bin found). At least K
   groups reach T0, so at least K elements do: the K-th largest element is >= T0.
2. The list: each word is compared with T0 as two bf16 at once (``set.gtu.bf16x2``, as the
   collect's ``_row_candidates``) and the words holding a key >= T0 are stored in the CTA's
   list in shared memory, at slots from one scan of the threads' counts (predicated stores:
   no branch). Random rows list about 1 word in 230. From here the rounds read the list, not the
   tile (``_each``); a CTA whose list overflows ``CAP`` re-reads its tile from global memory
   instead (heavy ties, constant rows: slower, exact).
3. tau: ``min(key - T0, 255)`` of the listed keys into a 256-bin histogram summed over the
   cluster: tau = T0 + L when L < 255 (random rows: always); otherwise two more rounds find it
   exactly (the high byte of the keys >= T0 + 255, then the low byte inside its bin).
4. The write: each CTA's suffix counts ``#{key >= tau}`` / ``#{key > tau}`` (its last histogram)
   give its offset and the ties at tau before it (ties go to the lower column); inside the CTA,
   bitmaps of its kept halves (``> tau`` and ``== tau``, by shared-memory ORs), one scan of
   their popcounts, and each kept column is stored at its rank in column order; rank 0 pads
   with -1. Columns come out ascending.

Shared region (words, ``region(ce)`` bytes): five cluster histograms of 256 bins at ``C1 ..
CB`` (CTA r owns the r-th slice of each, as ``_cluster``), five of this CTA's own at ``L1 ..
LB`` (shared-memory atomics), its suffix counts at ``SUF`` (word 256: its count above the last
round's range), then the list (``CAP`` entries: a word and its low
half's column), the two bitmaps and their prefix counts (``CE / 32`` words each). Barriers:
after the zeroing, after each round's adds, and after the last remote read (its wait before
the CTA exits). No global scratch, integer adds: every call and graph replay writes bitwise
the same output.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from dsv4_decode.utils import cluster

from ._radix import _largest_bin
from ._words import _bmax2, _key1, _mask_words, _pdl_enter, _row_length, _word_key1

NB = tl.constexpr(256)
C1, C2, C3, CA, CB = (tl.constexpr(256 * i) for i in range(5))  # cluster histograms
L1, L2, L3, LA, LB = (tl.constexpr(256 * i + 1280) for i in range(5))  # this CTA's own
SUF = tl.constexpr(2560)
LIST = tl.constexpr(2820)
CAP = tl.constexpr(2048)  # listed words at most (random 256K rows: about 35 a CTA)
CTAS = tl.constexpr(16)  # a row's cluster (the largest Hopper runs)
MAX_CE = 32768  # columns a CTA at most: its kept counts fit 16 bits

# The candidate halves of a word, branch-free: $1 the word, $2 both halves' threshold bits
# (``_below``), $3 its low half's column, $4 the length; $0 = 0xFFFF in each half whose key
# reaches the threshold, inside the length.
PRE = tl.constexpr(
    "{ .reg .pred %p; .reg .b32 %t, %a; set.gtu.u32.bf16x2 $0, $1, $2; sub.s32 %t, $4, $3; "
    "setp.gt.s32 %p, %t, 1; selp.b32 %a, -1, 65535, %p; setp.gt.s32 %p, %t, 0; "
    "selp.b32 %a, %a, 0, %p; and.b32 $0, $0, %a; }")
# Store the word $2 (column $3) as list entry $4 where its candidate halves $1 are not 0 and
# the slot is below $5; entries of two words from $6. Predicated, no branch: a branch skipped
# in this unrolled code costs more than the whole word's work (session 32: a shared atomic a
# word, which the compiler aggregates a warp at a time behind a branch, cost ~190 cycles a word).
APPEND = tl.constexpr(
    "{ .reg .pred %p, %q; .reg .b32 %a; setp.ne.u32 %p, $1, 0; setp.lt.u32 %q, $4, $5; "
    "and.pred %p, %p, %q; mad.lo.u32 %a, $4, 8, $6; @%p st.shared.v2.b32 [%a], {$2, $3}; "
    "mov.b32 $0, 0; }")


def tile(cols: int, warps: int) -> tuple[int, int]:
    """(CE, S): the columns a CTA holds (a power of two covering a 16th of the row, at least
    8 a thread) and its words a thread (4 S)."""
    threads = 32 * warps
    ce = max(triton.next_power_of_2(-(-cols // CTAS)), 8 * threads)
    assert ce <= MAX_CE, f"{cols} columns: more than {MAX_CE} a CTA"
    return ce, ce // (8 * threads)


def region(ce: int) -> int:
    """Bytes of a CTA's shared region (a multiple of 16)."""
    return 4 * (LIST + 2 * CAP + 4 * (ce // 32))


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
def _halves(u, col, length, ok):
    """The 16-bit keys of both halves of words ``u`` (``col``: the low half's column; 0 at or
    past ``length`` or where not ``ok``)."""
    lo = tl.where(ok & (col < length), _key1(u & 0xFFFF) - 1, 0)
    hi = tl.where(ok & (col + 1 < length), _key1((u >> 16) & 0xFFFF) - 1, 0)
    return lo, hi


@triton.jit
def _addr(smem_off, W):
    return cluster.smem_addr(smem_off + 4 * W)


@triton.jit
def _or_bit(addr, bit, mask):
    """OR ``1 << bit`` into the shared word at ``addr`` where ``mask``."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 v; setp.ne.s32 p, $3, 0; shl.b32 v, 1, $2; "
        "@p red.shared.or.b32 [$1], v; mov.u32 $0, 0; }",
        "=r,r,r,r", [addr, bit, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _store_at(ptr, v, mask):
    """Store ``v`` at ``ptr`` where ``mask``, in the operands' own layout (``tl.store`` would
    first move scattered addresses to one a thread through shared memory)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $3, 0; @p st.global.b32 [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r,r", [ptr.to(tl.int64, bitcast=True), v, mask.to(tl.int32)], dtype=tl.int32,
        is_pure=False, pack=1)


@triton.jit
def _work(lo, hi, c0, op, base, hi_key, sub, shift, tau, quota, offset, o_ptr, smem_off,
          W: tl.constexpr, NBM: tl.constexpr, OP: tl.constexpr):
    """One step on keys ``lo`` / ``hi`` of words whose low half is column ``c0`` of the CTA:
    OP 0: count the keys in [base, hi_key] into histogram ``W``, bin ``min((key - sub) >>
    shift, 255)``; OP 1: set the bits of the kept halves (> tau, == tau); OP 2: store the kept
    columns at their ranks (``op``: the row's first column of the CTA, added back)."""
    if OP == 0:
        for h in tl.static_range(2):
            k = lo if h == 0 else hi
            b = tl.minimum((k - sub) >> shift, 255)
            cluster.count_local(_addr(smem_off, W + b), (k > 0) & (k >= base) & (k <= hi_key))
    else:
        for h in tl.static_range(2):
            k = lo if h == 0 else hi
            c = c0 + h
            gt = (k > tau) & (k > 0)
            eq = (k == tau) & (k > 0)
            wd = (c >> 5) & (NBM - 1)  # (unlisted slots hold stale columns: keep in range)
            if OP == 1:
                _or_bit(_addr(smem_off, W + wd), c & 31, gt)
                _or_bit(_addr(smem_off, W + NBM + wd), c & 31, eq)
            else:
                below = (1 << (c & 31)) - 1
                bg = cluster.ld_local(_addr(smem_off, W + wd)) & below
                be = cluster.ld_local(_addr(smem_off, W + NBM + wd)) & below
                n_gt = cluster.ld_local(_addr(smem_off, W + 2 * NBM + wd)) + libdevice.popc(bg)
                n_eq = cluster.ld_local(_addr(smem_off, W + 3 * NBM + wd)) + libdevice.popc(be)
                keep = gt | (eq & (n_eq < quota))
                _store_at(o_ptr + offset + n_gt + tl.minimum(n_eq, quota), op + c, keep)


@triton.jit
def _each(x_row, q, length, cols, n_list, base, hi_key, sub, shift, tau, quota, offset, o_ptr,
          smem_off, W: tl.constexpr, OP: tl.constexpr, CE: tl.constexpr, S: tl.constexpr,
          T: tl.constexpr):
    """``_work`` on every listed word, or, when the list overflowed, on every word of the tile
    read again from global memory."""
    NBM: tl.constexpr = CE // 32
    if n_list <= CAP:
        for i0 in range(0, n_list, T):
            i = i0 + tl.arange(0, T)
            ok = i < n_list
            u = cluster.ld_local(_addr(smem_off, LIST + 2 * i))
            col = cluster.ld_local(_addr(smem_off, LIST + 2 * i + 1))
            lo, hi = _halves(u, col, length, ok)
            _work(lo, hi, col - q * CE, q * CE, base, hi_key, sub, shift, tau, quota, offset,
                  o_ptr, smem_off, W, NBM, OP)
    else:
        for s in range(S):
            w = q * (CE // 2) + s * 4 * T + tl.arange(0, 4 * T)
            u = tl.load(x_row + w, mask=2 * w < cols, other=0)
            lo, hi = _halves(u, 2 * w, length, 2 * w < cols)
            _work(lo, hi, 2 * w - q * CE, q * CE, base, hi_key, sub, shift, tau, quota, offset,
                  o_ptr, smem_off, W, NBM, OP)


@triton.jit
def _local(smem_off, W: tl.constexpr):
    tl.debug_barrier()  # every thread's atomics landed
    return cluster.ld_local(_addr(smem_off, W + tl.arange(0, NB)))


@triton.jit
def _add(h, smem_off, W: tl.constexpr):
    """Add this CTA's histogram ``h`` into the cluster histogram ``W`` (its bins' owners)."""
    b = tl.arange(0, NB)
    cluster.red_add_rank(_addr(smem_off, W + b), h, h > 0, b // (NB // CTAS))


@triton.jit
def _gather(smem_off, W: tl.constexpr):
    b = tl.arange(0, NB)
    return cluster.ld_rank(_addr(smem_off, W + b), b // (NB // CTAS))


@triton.jit
def _suffix(h, above, smem_off):
    """This CTA's suffix counts from its last histogram (``above``: its keys past the range)."""
    b = tl.arange(0, NB)
    cluster.st_local(_addr(smem_off, SUF + b), above + tl.cumsum(h, axis=0, reverse=True))
    cluster.st_local(_addr(smem_off, SUF + NB + 0 * b), above + 0 * b)


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
    NBM: tl.constexpr = CE // 32
    W_BM: tl.constexpr = LIST + 2 * CAP  # the bitmaps (> tau, == tau), then their prefixes
    w = q * (CE // 2) + tl.arange(0, NW)
    x_row = (x_ptr + tl.multiple_of(row.to(tl.int64) * stride_x, 8)).to(
        tl.pointer_type(tl.int32))
    # masked per 8 columns (16 B) so the loads vectorize; reading up to 7 columns past the
    # width stays inside the row (the API checks the row stride and the storage for it)
    u = tl.load(x_row + w, mask=(w // 4) * 8 < cols, other=0)
    b = tl.arange(0, NB)
    zeros = tl.zeros([NB], tl.int32)
    for i in tl.static_range(0, 10):  # the histograms
        cluster.st_local(_addr(smem_off, 256 * i + b), zeros)
    for i in tl.static_range(0, 2 * NBM, NB):  # the bitmaps
        cluster.st_local(_addr(smem_off, W_BM + i + b), zeros)
    cluster.arrive()  # after the zeroing
    # 1. T0: the K-th largest group key (thread t's words; 0 for a group past the length)
    m = tl.reduce(tl.reduce(tl.reshape(_mask_words(w, u, length), [S, T, 4]), 2, _bmax2), 0,
                  _bmax2)
    gk = tl.where(q * CE + 8 * tl.arange(0, T) < length, _word_key1(m, False) - 1, 0)
    tl.debug_barrier()  # the local zeros
    cluster.count_local(_addr(smem_off, L1 + (gk >> 8)), gk > 0)
    h1 = _local(smem_off, L1)
    cluster.wait()
    _add(h1, smem_off, C1)
    _sync()
    b0, above = _largest_bin(_gather(smem_off, C1), 0, K, NB)
    cluster.count_local(_addr(smem_off, L2 + (gk & 0xFF)), (gk > 0) & ((gk >> 8) == b0))
    _add(_local(smem_off, L2), smem_off, C2)
    _sync()
    t0 = b0 * 256 + _largest_bin(_gather(smem_off, C2), above, K, NB)[0]
    # 2. the list: the words holding a key >= T0
    z = u * 0
    cand = tl.inline_asm_elementwise(PRE, "=r,r,r,r,r", [u, z + _below(t0), 2 * w, z + length],
                                     dtype=tl.int32, is_pure=True, pack=1)
    # each listed word's slot: the thread's listed words before it, after those of the
    # threads before (one scan across the CTA; the tile's words in any order will do)
    f3 = tl.reshape((cand != 0).to(tl.int32), [S, T, 4])
    rs = tl.sum(f3, axis=2)
    tot = tl.sum(rs, axis=0)
    before_t = tl.cumsum(tot, axis=0) - tot
    n_list = tl.sum(tot, axis=0)
    at = tl.reshape(tl.cumsum(f3, axis=2) - f3 + (tl.cumsum(rs, axis=0) - rs)[:, :, None]
                      + before_t[None, :, None], [NW])
    tl.inline_asm_elementwise(
        APPEND, "=r,r,r,r,r,r,r", [cand, u, 2 * w, at, z + CAP, z + _addr(smem_off, LIST)],
        dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()
    o_row = out_ptr + row.to(tl.int64) * stride_o
    # 3. tau: min(key - T0, 255) of the keys >= T0
    _each(x_row, q, length, cols, n_list, t0, 65535, t0, 0, 0, 0, 0, o_row, smem_off, L3, 0,
          CE, S, T)
    h = _local(smem_off, L3)
    _add(h, smem_off, C3)
    _suffix(h, 0, smem_off)
    _sync()
    g = _gather(smem_off, C3)
    lsel, greater = _largest_bin(g, 0, K, NB)
    tau = t0 + lsel
    if lsel == NB - 1:  # the K-th lies 255 or more above T0: its byte, then the low byte
        base = t0 + 255
        _each(x_row, q, length, cols, n_list, base, 65535, 0, 8, 0, 0, 0, o_row, smem_off, LA,
              0, CE, S, T)
        ha = _local(smem_off, LA)
        _add(ha, smem_off, CA)
        _sync()
        bsel, above = _largest_bin(_gather(smem_off, CA), 0, K, NB)
        mine = tl.sum(tl.where(b > bsel, ha, 0), axis=0)
        _each(x_row, q, length, cols, n_list, tl.maximum(bsel * 256, base), bsel * 256 + 255,
              bsel * 256, 0, 0, 0, 0, o_row, smem_off, LB, 0, CE, S, T)
        h = _local(smem_off, LB)
        _add(h, smem_off, CB)
        _suffix(h, mine, smem_off)
        _sync()
        g = _gather(smem_off, CB)
        lsel, greater = _largest_bin(g, above, K, NB)
        tau = bsel * 256 + lsel
    ties = K - greater  # ties at tau to keep, lowest column first (more than exist: all)
    # 4. the CTAs before this one: their keys >= tau and > tau
    p = tl.arange(0, CTAS)
    ge = cluster.ld_rank(_addr(smem_off, SUF + lsel + 0 * p), p)
    gt = cluster.ld_rank(_addr(smem_off, SUF + lsel + 1 + 0 * p), p)
    cluster.arrive()  # no CTA reads this one's shared memory after this
    before = p < q
    n_above = tl.sum(tl.where(before, gt, 0), axis=0)
    n_ties = tl.sum(tl.where(before, ge - gt, 0), axis=0)
    quota = tl.maximum(ties - n_ties, 0)
    offset = n_above + tl.minimum(n_ties, ties)
    # the kept halves' bitmaps, their prefix counts, the stores
    _each(x_row, q, length, cols, n_list, 0, 0, 0, 0, tau, quota, offset, o_row, smem_off,
          W_BM, 1, CE, S, T)
    tl.debug_barrier()
    for part in tl.static_range(2):  # > tau, == tau
        i = tl.arange(0, NBM)
        pc = libdevice.popc(cluster.ld_local(_addr(smem_off, W_BM + part * NBM + i)))
        cluster.st_local(_addr(smem_off, W_BM + (2 + part) * NBM + i),
                         tl.cumsum(pc, axis=0) - pc)
    tl.debug_barrier()
    _each(x_row, q, length, cols, n_list, 0, 0, 0, 0, tau, quota, offset, o_row, smem_off,
          W_BM, 2, CE, S, T)
    if q == 0:
        n_eq = tl.sum(tl.where(b == lsel, g, 0), axis=0)
        slot = tl.arange(0, KP)
        tl.store(o_row + slot, -1, mask=(slot >= greater + tl.minimum(n_eq, ties)) & (slot < K))
    cluster.wait()


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
    clusters = cluster.prepare(_cplain_kernel, args, consts, CTAS, region(ce))[1]
    cluster.launch(_cplain_kernel, (1, rows), args, consts, CTAS, region(ce))
    return clusters
