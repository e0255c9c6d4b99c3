"""Plain mode's select on thread-block clusters (private; sm_90+). Design: docs/kernels/topk.md
(session 32).

One launch, one cluster of ``CTAS`` CTAs a row. CTA q holds columns ``[q CE, q CE + CE)`` of
the row (those before the length are candidates) in registers, as int32 words of two bf16:
a ``[S, T, 4]`` tile, thread t holding words ``4t .. 4t + 3`` of every ``4T`` (T = the CTA's
threads, 16-byte loads). An exact radix select on ``key1`` (``_words._key1``: 0 = not a
candidate, NaN on top, 17 bits) in three cluster rounds, the CTAs meeting in distributed
shared memory (``utils.cluster``), as block mode's ``_cluster``:

1. Every thread's own maximum (packed bf16 maxima over its ``4 S`` words) gives one key a
   thread; the histogram of those keys' high byte (``key1 >> 8``) summed over the cluster
   gives B0, the largest bin with at least K thread maxima at or above it. So at least K
   elements lie in bin B0 or above, and the K-th largest does too. One key a thread is
   counted, not one an element: random logits fill a handful of high-byte bins, and 64 keys a
   thread would queue on those few shared-memory words.
2. The low-byte histogram of the elements in bin B0, and the count of elements above it,
   summed over the cluster. When fewer than K lie above B0 (always, on random rows) the K-th
   largest is in B0 and these counts give tau = B0 256 + L. Otherwise (the row's largest
   elements crowd a few threads: rising rows, heavy ties) one more round takes the histogram
   of the high byte of the elements above B0 (exact bin B), and the low-byte round runs again
   in B on separate words. Every CTA reads the same sums, so all take the same branch.
3. Each CTA stores its suffix counts ``#{key1 >= 256 B + l}`` (as ``_cluster``), reads those of
   the CTAs before it for its output offset and the ties at tau ahead of it (ties go to the
   lower column), and writes its keys > tau and its share of the ties in column order (a scan
   over its tile); rank 0 pads with -1.

Shared region (words, ``REGION`` bytes): ``[0, 512)`` the thread maxima's high-byte histogram
and ``[512, 768)`` the low-byte one, each spread over the cluster's CTAs (CTA r owns the r-th
slice of the bins, as ``_cluster``); ``[768, 1025)`` this CTA's suffix counts (word 1024: its
count above the bin); word 1025, rank 0's: the cluster's count above B0; ``[1028, 1540)`` and
``[1540, 1796)`` this CTA's own two histograms, counted by shared-memory atomics; ``[1796,
2308)`` and ``[2308, 2564)`` the second round's two cluster histograms (spread). Barriers as
``_cluster``: B0 after the zeroing, B1 after the high-byte adds, B2 after the low-byte adds, B3
after the last remote read (its wait before the CTA exits). No global scratch, integer adds:
every call and graph replay writes bitwise the same output, columns ascending.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsv4_decode.utils import cluster

from ._radix import _largest_bin
from ._words import NEG_WORD, _bmax2, _key1, _mask_words, _pdl_enter, _row_length, _word_key1

NB = tl.constexpr(256)  # bins of either byte of a 16-bit key
# region words (module docstring)
W_C2, W_SUF, W_NGT = tl.constexpr(256), tl.constexpr(512), tl.constexpr(769)
W_L1, W_L2, W_F1, W_F2 = (tl.constexpr(w) for w in (772, 1028, 1284, 1540))
W_K = tl.constexpr(1796)  # the CTA's keys, two a word (CE / 2 words)
CTAS = tl.constexpr(16)  # a row's cluster (the largest Hopper runs)
MAX_CE = 32768  # columns a CTA at most: a CTA's counts fit the 16 bits _write_tile packs them in


def tile(cols: int, warps: int) -> tuple[int, int]:
    """(CE, S): the columns a CTA holds (a power of two covering a 16th of the row, at least
    8 a thread) and its words a thread (4 S)."""
    threads = 32 * warps
    ce = max(triton.next_power_of_2(-(-cols // CTAS)), 8 * threads)
    assert ce <= MAX_CE, f"{cols} columns: more than {MAX_CE} a CTA"
    return ce, ce // (8 * threads)


def region(ce: int) -> int:
    """Bytes of the shared region of a CTA holding ``ce`` columns (a multiple of 16)."""
    return 4 * (W_K + ce // 2)


@triton.jit
def _key16(u, valid):
    """The 16-bit order-preserving key of bf16 bits ``u`` (``_key1`` - 1: 127 for -inf, 65,535
    for NaN), 0 where not ``valid``: real values never get 0 (keys 0-126 would be negative
    NaNs, which rank as NaN)."""
    return tl.where(valid, _key1(u) - 1, 0)


@triton.jit
def _count(bins, mask, smem_off, W: tl.constexpr):
    """Add 1 to the CTA's shared words ``W + bins`` where ``mask`` (atomics, one a key)."""
    cluster.count_local(cluster.smem_addr(smem_off + 4 * (W + bins)), mask)


@triton.jit
def _read_local(smem_off, W: tl.constexpr):
    tl.debug_barrier()  # every thread's atomics landed
    return cluster.ld_local(cluster.smem_addr(smem_off + 4 * (W + tl.arange(0, NB))))


@triton.jit
def _owners(smem_off, W: tl.constexpr):
    """Addresses of the cluster histogram ``W``'s bins, and the CTA owning each."""
    b = tl.arange(0, NB)
    return cluster.smem_addr(smem_off + 4 * (W + b)), b // (NB // CTAS)


@triton.jit
def _slot(g, r, S: tl.constexpr, SW: tl.constexpr):
    """Shared word (from ``W_K``) of the tile's word g S + r (group g's r-th): slice r of the
    tile is words ``[r SW, r SW + SW)``, group g at ``g ^ (r 32 / S)``, so that a warp's 32
    lanes meet 32 banks both when they copy 32 consecutive words and when they read one slice
    (S <= 32)."""
    return r * SW + (g ^ ((r * (32 // S)) & 31))


@triton.jit
def _keys(smem_off, r, S: tl.constexpr, SW: tl.constexpr):
    """Slice r of the CTA's keys (the r-th word of every group), two a word: (low halves, high
    halves, the words' indices in the tile)."""
    g = tl.arange(0, SW)
    kw = cluster.ld_local(cluster.smem_addr(smem_off + 4 * (W_K + _slot(g, r, S, SW))))
    return kw & 0xFFFF, (kw >> 16) & 0xFFFF, g * S + r


@triton.jit
def _low_round(b, smem_off, W_LOC: tl.constexpr, W_OWN: tl.constexpr, S: tl.constexpr,
               SW: tl.constexpr):
    """The low-byte histogram of the CTA's keys in high-byte bin ``b``, added into the owners
    of the cluster histogram ``W_OWN``; the CTA's suffix counts stored. Returns the CTA's count
    of keys above bin b. The keys stream from shared memory a slice at a time (registers held
    them all: 255 registers a thread at 256K columns)."""
    above = tl.zeros([SW], tl.int32)
    for r in range(S):
        lo, hi, _ = _keys(smem_off, r, S, SW)
        _count(lo & 0xFF, (lo > 0) & ((lo >> 8) == b), smem_off, W_LOC)
        _count(hi & 0xFF, (hi > 0) & ((hi >> 8) == b), smem_off, W_LOC)
        above += ((lo >> 8) > b).to(tl.int32) + ((hi >> 8) > b).to(tl.int32)
    h2 = _read_local(smem_off, W_LOC)
    n_gt = tl.sum(above, axis=0)
    a, own = _owners(smem_off, W_OWN)
    cluster.red_add_rank(a, h2, h2 > 0, own)
    w2 = tl.arange(0, NB)
    cluster.st_local(cluster.smem_addr(smem_off + 4 * (W_SUF + w2)),
                     n_gt + tl.cumsum(h2, axis=0, reverse=True))
    cluster.st_local(cluster.smem_addr(smem_off + 4 * (W_SUF + NB)), n_gt)
    return n_gt


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
    # the CTA's words, copied into its shared region (cp.async: no register holds them, the
    # loops below read them a slice at a time); reading up to 7 columns past the width stays
    # inside the row (the API checks the row stride and the storage for it)
    NW: tl.constexpr = S * 4 * T
    SW: tl.constexpr = 4 * T  # groups of S words: a slice of the loops over the tile
    w = tl.arange(0, NW)
    x_row = (x_ptr + row.to(tl.int64) * stride_x).to(tl.pointer_type(tl.int32))
    cluster.copy_async(cluster.smem_addr(smem_off + 4 * (W_K + _slot(w // S, w % S, S, SW))),
                       x_row + q * (CE // 2) + w, 2 * (q * (CE // 2) + w) < cols)
    cluster.copy_wait()
    tl.debug_barrier()
    # 1. the keys, two a word, in place; and one key a group (2 S consecutive columns): its
    # maximum (past the length -inf; a group with no candidate: 0)
    g = tl.arange(0, SW)
    m = tl.full([SW], NEG_WORD, tl.int32)
    for r in range(S):
        a_k = cluster.smem_addr(smem_off + 4 * (W_K + _slot(g, r, S, SW)))
        u = cluster.ld_local(a_k)
        wi = q * (CE // 2) + g * S + r
        m = _bmax2(m, _mask_words(wi, u, length))
        cluster.st_local(a_k, _key16(u & 0xFFFF, 2 * wi < length)
                         | (_key16((u >> 16) & 0xFFFF, 2 * wi + 1 < length) << 16))
    gk = tl.where(q * CE + 2 * S * g < length, _word_key1(m, False) - 1, 0)
    b_ = tl.arange(0, NB)
    zeros = tl.zeros([NB], tl.int32)
    for wz in tl.static_range(0, 6):  # every histogram of the region (this CTA's words)
        cluster.st_local(cluster.smem_addr(
            smem_off + 4 * (b_ + (NB * wz if wz < 2 else W_L1 + NB * (wz - 2)))), zeros)
    cluster.st_local(cluster.smem_addr(smem_off + 4 * W_NGT + 0 * b_), zeros)
    cluster.arrive()  # B0
    tl.debug_barrier()  # the local zeros
    _count(gk >> 8, gk > 0, smem_off, W_L1)
    h1 = _read_local(smem_off, W_L1)
    a1, own1 = _owners(smem_off, 0)
    cluster.wait()
    cluster.red_add_rank(a1, h1, h1 > 0, own1)
    cluster.arrive()  # B1
    cluster.wait()
    b0 = _largest_bin(cluster.ld_rank(a1, own1), 0, K, NB)[0]
    # 2. the low byte in B0, and the count above it (into rank 0's word)
    n_gt = _low_round(b0, smem_off, W_L2, W_C2, S, SW)
    a_ngt = cluster.smem_addr(smem_off + 4 * W_NGT + 0 * b_)
    cluster.red_add_rank(a_ngt, n_gt + 0 * b_, b_ == 0, 0 * b_)
    cluster.arrive()  # B2
    cluster.wait()
    above = tl.max(cluster.ld_rank(a_ngt, 0 * b_), axis=0)
    bsel = b0
    a2, own2 = _owners(smem_off, W_C2)
    g2 = cluster.ld_rank(a2, own2)
    if above >= K:  # the K-th largest lies above B0: its bin from the keys above B0
        tl.debug_barrier()  # every thread read its local histograms back
        cluster.st_local(cluster.smem_addr(smem_off + 4 * (W_L1 + b_)), zeros)
        cluster.st_local(cluster.smem_addr(smem_off + 4 * (W_L2 + b_)), zeros)
        tl.debug_barrier()
        for r in range(S):
            f_lo, f_hi, f_i = _keys(smem_off, r, S, SW)
            _count(f_lo >> 8, (f_lo >> 8) > b0, smem_off, W_L1)
            _count(f_hi >> 8, (f_hi >> 8) > b0, smem_off, W_L1)
        f1 = _read_local(smem_off, W_L1)
        af, ownf = _owners(smem_off, W_F1)
        cluster.red_add_rank(af, f1, f1 > 0, ownf)
        cluster.arrive()
        cluster.wait()
        bsel, above = _largest_bin(cluster.ld_rank(af, ownf), 0, K, NB)
        _low_round(bsel, smem_off, W_L2, W_F2, S, SW)
        cluster.arrive()
        cluster.wait()
        af2, ownf2 = _owners(smem_off, W_F2)
        g2 = cluster.ld_rank(af2, ownf2)
    lsel, greater = _largest_bin(g2, above, K, NB)
    tau = bsel * 256 + lsel
    ties = K - greater  # ties at tau to keep, lowest column first (more than exist: all)
    # 3. the CTAs before this one: their keys >= tau and > tau (word l + 1; l = 255: above B)
    p = tl.arange(0, CTAS)
    ge = cluster.ld_rank(cluster.smem_addr(smem_off + 4 * (W_SUF + lsel) + 0 * p), p)
    gt = cluster.ld_rank(cluster.smem_addr(smem_off + 4 * (W_SUF + lsel + 1) + 0 * p), p)
    cluster.arrive()  # B3: no CTA reads this one's shared memory after this
    before = p < q
    n_above = tl.sum(tl.where(before, gt, 0), axis=0)
    n_ties = tl.sum(tl.where(before, ge - gt, 0), axis=0)
    o_row = out_ptr + row.to(tl.int64) * stride_o
    _write_tile(smem_off, q * CE, tau, tl.maximum(ties - n_ties, 0),
                n_above + tl.minimum(n_ties, ties), o_row, S, SW)
    if q == 0:
        n_eq = tl.sum(tl.where(b_ == lsel, g2, 0), axis=0)
        slot = tl.arange(0, KP)
        tl.store(o_row + slot, -1, mask=(slot >= greater + tl.minimum(n_eq, ties)) & (slot < K))
    cluster.wait()  # B3


@triton.jit
def _counts(lo, hi, tau):
    """Each half's ``gt | tie << 16`` against tau."""
    gl = (lo > tau).to(tl.int32) | (((lo == tau) & (lo > 0)).to(tl.int32) << 16)
    gh = (hi > tau).to(tl.int32) | (((hi == tau) & (hi > 0)).to(tl.int32) << 16)
    return gl, gh


@triton.jit
def _write_tile(smem_off, col0, tau, quota, offset, o_row, S: tl.constexpr, SW: tl.constexpr):
    """Write the tile's keys > tau and its first ``quota`` ties at tau from ``offset``, in
    column order, from counts packed ``gt | ties << 16`` (a CTA holds at most ``MAX_CE``
    columns, so neither field carries): each group's total (a pass over the slices), one scan
    over the groups, then a second pass places each kept key."""
    tot = tl.zeros([SW], tl.int32)
    for r in range(S):
        lo, hi, _ = _keys(smem_off, r, S, SW)
        gl, gh = _counts(lo, hi, tau)
        tot += gl + gh
    before = tl.cumsum(tot, axis=0) - tot
    for r in range(S):
        lo, hi, i = _keys(smem_off, r, S, SW)
        gl, gh = _counts(lo, hi, tau)
        _store_kept(gl, before, col0 + 2 * i, quota, offset, o_row)
        _store_kept(gh, before + gl, col0 + 2 * i + 1, quota, offset, o_row)
        before += gl + gh


@triton.jit
def _store_kept(g, before, col, quota, offset, o_row):
    keep = ((g & 1) == 1) | ((g > 1) & ((before >> 16) < quota))
    a = (o_row + offset + (before & 0xFFFF) + tl.minimum(before >> 16, quota)).to(tl.int64,
                                                                                  bitcast=True)
    # a predicated store in the tile's own layout (tl.store would first move the addresses
    # to one element a thread through shared memory: they are not contiguous)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $3, 0; @p st.global.b32 [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r,r", [a, col, keep.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


def launch(x16, lengths, out, k: int, warps: int = 8, pdl: bool = True) -> int:
    """Run the select: a cluster of ``CTAS`` CTAs of ``warps`` warps a row (sm_90+), each CTA
    holding ``tile(cols, warps)[0]`` columns in its shared memory. ``x16``: the bf16 logits
    viewed as int16 [rows, cols]; ``pdl``: a programmatic dependent launch. Returns how many
    such clusters the GPU holds at once (the driver's occupancy; rows past it wait)."""
    rows, cols = x16.shape
    ce, s = tile(cols, warps)
    consts = dict(CE=ce, S=s, T=32 * warps, KP=triton.next_power_of_2(k), PDL=pdl,
                  num_warps=warps, **({"launch_pdl": True} if pdl else {}))
    args = (x16, lengths, out, x16.stride(0), out.stride(0), cols, k)
    clusters = cluster.prepare(_cplain_kernel, args, consts, CTAS, region(ce))[1]
    cluster.launch(_cplain_kernel, (1, rows), args, consts, CTAS, region(ce))
    return clusters
