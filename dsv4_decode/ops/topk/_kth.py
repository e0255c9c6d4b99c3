"""One CTA's K-th largest over its keys, and the writer of the kept set (private): the helpers
the four launches (``_triton``) and the one-CTA-a-row path (``_row``) share. Keys are
non-negative int32 (``key1``: 0 = not a candidate); every function here is a ``@triton.jit``
helper called inside a kernel, reducing over the whole CTA unless its docstring says which
reductions stay inside a warp."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _kth_largest(v, m, n, K, HIST: tl.constexpr):
    """The K-th largest of the non-negative int32 ``v[m]`` (the largest t with #{v >= t} >= K);
    0 when fewer than K are masked in. ``n``: the count of ``m`` (the callers know it: one CTA
    reduction fewer).

    HIST: selected values usually lie within 255 keys (2 octaves of bf16) of the largest, where
    one 256-bin histogram of the distance to it answers. It costs ~110 instructions per element
    and thread-register, so it only pays on tiles of <= 16 values per thread; otherwise, or when
    the K-th lies further down, a 17-step bitwise search (one CTA reduction per step) does.
    """
    t = n * 0
    first = n * 0 + 255
    if HIST:
        top = tl.max(tl.where(m, v, 0), axis=0)
        hist = tl.histogram(tl.minimum(top - tl.where(m, v, top), 255), 256, mask=m)
        first = tl.min(tl.where(tl.cumsum(hist, axis=0) >= K, tl.arange(0, 256), 256), axis=0)
        t = tl.where(n >= K, top - first, 0)
    if (n >= K) & (first >= 255):  # bin 255 also holds everything further down
        t = _kth_bitwise(v, m, K)
    return t


@triton.jit
def _kth_bitwise(v, m, K):
    """The K-th largest of the non-negative int32 ``v[m]`` (at least K masked in) by a 17-step
    bitwise search, one CTA reduction a step: whatever the spread of the values."""
    t = tl.sum(m.to(tl.int32), axis=0) * 0  # (a tensor zero: K may be specialized to 1)
    for b in tl.static_range(16, -1, -1):
        cand = t | (1 << b)
        t = tl.where(tl.sum((m & (v >= cand)).to(tl.int32), axis=0) >= K, cand, t)
    return t


@triton.jit
def _part_bound(v3, K, W: tl.constexpr):
    """T0 from W parts: ``v3`` [A, W, C] non-negative keys (0 = not valid); part w =
    ``v3[:, w, :]``, which the callers' layouts put in one warp, so every reduction here but
    the last runs inside a warp (no CTA barrier). Measured (session 18): T0 of ``_row_kernel``
    on 2,048 keys 2,000 cycles against 4,550 with ``_kth_largest`` (``scripts/topk_stamps.py``);
    the same search in ``scripts/topk_kth_probe.py`` 2,900 against 6,250 on 4,096 keys.

    t_w = part w's top minus the smallest distance D <= 255 with q = ceil(K / W) of its keys
    within D of it (an 8-step binary search; 4-ary steps measured slower from 2,048 keys);
    T0 = min_w t_w, so at least W q >= K keys are >= T0: a lower bound, a little below the
    exact K-th (a few % more candidates). Returns 0 when a part has fewer than q valid keys
    within 255 of its top (short rows, wide value ranges): the caller then takes
    ``_kth_largest``."""
    q = (K + W - 1) // W
    ok = v3 > 0
    top = tl.max(tl.max(v3, axis=2), axis=0)  # [W]
    c = tl.sum(tl.sum((ok & (v3 >= (top - 255)[None, :, None])).to(tl.int32), axis=2), axis=0)
    found = (top > 0) & (c >= q)
    d = top * 0
    for b in tl.static_range(7, -1, -1):  # D in [d, d + 2 ** (b + 1))
        t = top - (d + (1 << b) - 1)
        c = tl.sum(tl.sum((ok & (v3 >= t[None, :, None])).to(tl.int32), axis=2), axis=0)
        d += (c < q).to(tl.int32) << b
    return tl.min(tl.where(found, tl.maximum(top - d, 1), 0), axis=0)


@triton.jit
def _kth_in_bins(v, m, t0, K, NB: tl.constexpr):
    """(found, tau, need) from one NB-bin histogram of the keys' distance to ``t0`` (all
    ``v[m]`` >= t0, at least K of them): the bin where the count from the top reaches K, and
    the count above it from the same bins; not found when that is the last bin (it lumps
    everything NB - 1 or more above t0)."""
    b = tl.arange(0, NB)
    h = tl.histogram(tl.minimum(v - t0, NB - 1), NB, mask=m)
    at_least = tl.cumsum(h, axis=0, reverse=True)  # #{v >= t0 + b}
    above = at_least - h
    # the one bin where the count reaches K (above < 2**20: at most CAP candidates)
    hit = tl.max(tl.where((at_least >= K) & (above < K), (b << 20) | above, -1), axis=0)
    return (hit >= 0) & ((hit >> 20) < NB - 1), t0 + (hit >> 20), K - (hit & 0xFFFFF)


@triton.jit
def _kth_above(v, m, n, t0, K, HIST: tl.constexpr):
    """(tau, need) of the n candidate keys ``v[m]``, all >= ``t0`` (T0): tau = their K-th
    largest (0 when n < K) and need = K - #{v > tau}, the ties at tau to keep (K - n when
    n < K).

    HIST: a histogram of v - t0. The K-th usually lies a few keys above T0, and the count
    above tau is read from the same bins: no CTA maximum and no count afterwards, two CTA
    reductions fewer than ``_kth_largest`` (whose histogram sits below the maximum). Tiles of
    at most 2,048 keys (k <= 512's) try 64 bins first: a ``tl.histogram`` costs per key a
    ballot per bit of the bin and a mask and popcount per bin a lane owns, so 64 bins cost
    about a quarter of 256 (random rows put the 512th candidate 6-34 keys above T0; 1,500
    candidates of an 8K-valid row, 85-97). Then 256 bins, and with the K-th 255 or more keys
    above t0 (top values lumped in few groups), or no HIST: ``_kth_largest`` and a count."""
    tau = n * 0
    need = K - n
    found = n < K
    if HIST:
        if v.shape[0] <= 2048:
            f, t, d = _kth_in_bins(v, m, t0, K, 64)
            if (n >= K) & f:
                found = found | f
                tau = t
                need = d
        if not found:
            f, t, d = _kth_in_bins(v, m, t0, K, 256)
            found = found | f
            tau = tl.where(n < K, 0, t)
            need = tl.where(n < K, K - n, d)
    if not found:
        tau = _kth_largest(v, m, n, K, HIST)
        need = K - tl.sum((m & (v > tau)).to(tl.int32), axis=0)
    return tau, need


@triton.jit
def _write_kept(gt, tie, need, col, n, o_ptr, K):
    """The selection's output from entries in column order (n live; tau the K-th largest, or
    0 with fewer than K): ``_store_kept``, ``before`` from one prefix sum of the packed counts
    (entries < 2**16)."""
    w = gt.to(tl.int32) + (tie.to(tl.int32) << 16)
    _store_kept(gt, tie, need, tl.cumsum(w, axis=0) - w, col, n, o_ptr, K)


@triton.jit
def _store_kept(gt, tie, need, before, col, n, o_ptr, K):
    """Store ``col`` of every ``gt`` entry and of the ties (``tie``) with fewer than ``need``
    ties ahead, each at its place in column order, then -1 from the kept count (K, or n when
    n < K) up to K. ``before``: the gt and tie entries ahead of each in column order, packed
    ``gt | ties << 16`` (``_write_kept``: a prefix sum; ``_place_onchip``: gathered)."""
    b_tie = before >> 16
    keep = gt | (tie & (b_tie < need))
    tl.store(o_ptr + (before & 0xFFFF) + tl.minimum(b_tie, need), col, mask=keep)
    i = tl.arange(0, gt.shape[0])
    tl.store(o_ptr + i, -1, mask=(i >= tl.minimum(n, K)) & (i < K))
