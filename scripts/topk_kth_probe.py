"""Probe: cycles of one CTA's K-th-largest step, variant by variant (one Hopper GPU).

    PYTHONPATH=. python3 scripts/topk_kth_probe.py

Every single-CTA phase of plain-mode top-k (T0 over group maxima, tau over candidates) is
``_kth._kth_largest``; Session 18's stamps (``scripts/topk_stamps.py``) put 4,500 cycles
on it over 2,048 group maxima and 3,100 over a 1,024-slot candidate tile, half of a one-tile
row's 16,000. One CTA of 8 warps runs each variant on int32 keys like the kernels' (random
bf16 key1 maxima), with ``%clock64`` after a barrier before and after it (median of 20
launches). Variants:

- ``hist``: ``_kth_largest`` with the valid count summed first (as before session 18);
- ``hist-n``: the same with the count passed in (the kernels know it);
- ``coarse64`` / ``coarse128``: a lower bound: a 64- / 128-bin histogram of
  ``(top - v) >> 2`` / ``>> 1``; at least K are >= the value (enough for T0);
- ``search4``: exact: four 4-ary steps on the distance to the top (a [4] count vector a
  step, one CTA reduction);
- ``parts``: ``_kth._part_bound``, the kernels' T0 since session 18: a lower bound, each
  warp's own K/8-th largest (an 8-step binary search on the distance to its own top, every
  reduction inside the warp), then the CTA minimum of the 8. (Runs 2 / 3 of session 18 timed
  this search as a probe-local ``warp`` variant and ``parts`` as a 4-ary form, since replaced.)
- ``max``, ``sum``: one CTA reduction alone (calibration).

Prints cycles and the value (the exact ones must agree; the bounds must be <= them, with the
count of keys >= the value).
"""

import statistics
import sys

import torch
import triton
import triton.language as tl

from dsv4_decode.ops.topk._kth import _kth_largest, _part_bound

VARIANTS = ["hist", "hist-n", "coarse64", "coarse128", "search4", "parts", "max", "sum"]


@triton.jit
def _clk():
    tl.debug_barrier()
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [tl.program_id(0)],
                                     dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _coarse(v, m, n, K, SHIFT: tl.constexpr):
    """A lower bound: the histogram of (top - v) >> SHIFT over 256 >> SHIFT bins; the lowest
    value of the bin where the count reaches K (at least K are >= it); 1 past the last bin."""
    BINS: tl.constexpr = 256 >> SHIFT
    top = tl.max(tl.where(m, v, 0), axis=0)
    hist = tl.histogram(tl.minimum((top - tl.where(m, v, top)) >> SHIFT, BINS - 1), BINS, mask=m)
    first = tl.min(tl.where(tl.cumsum(hist, axis=0) >= K, tl.arange(0, BINS), BINS), axis=0)
    return tl.where((n >= K) & (first < BINS - 1), top - ((first + 1) << SHIFT) + 1, 1)


@triton.jit
def _search4(v, m, n, K):
    """Exact: the smallest distance D <= 255 below the top with #{v >= top - D} >= K by four
    4-ary steps (three thresholds a step, one CTA reduction of a [4] count vector each); the
    first step also counts at D = 255 (beyond: the bitwise search). 0 when n < K."""
    top = tl.max(tl.where(m, v, 0), axis=0)
    j = tl.arange(0, 4)
    d = top * 0
    far = top * 0
    for s in tl.static_range(3, -1, -1):
        dj = tl.where(j == 0, 255, d + j * (1 << (2 * s)) - 1)
        c = tl.sum(((v[:, None] >= (top - dj)[None, :]) & m[:, None]).to(tl.int32), axis=0)
        if s == 3:
            far = tl.sum(tl.where(j == 0, c, 0), axis=0) < K
        d += (1 << (2 * s)) * tl.sum(((c < K) & (j > 0)).to(tl.int32), axis=0)
    t = tl.where(n >= K, top - d, 0)
    if (n >= K) & far:
        t = n * 0
        for b in tl.static_range(16, -1, -1):
            cand = t | (1 << b)
            t = tl.where(tl.sum((m & (v >= cand)).to(tl.int32), axis=0) >= K, cand, t)
    return t


@triton.jit
def _probe_kernel(v_ptr, out_ptr, n, K, SIZE: tl.constexpr, VAR: tl.constexpr):
    i = tl.arange(0, SIZE)
    v = tl.load(v_ptr + i)
    m = i < n
    t0 = _clk()
    if VAR == 0:
        x = _kth_largest(v, m, tl.sum(m.to(tl.int32), axis=0), K, True)
    elif VAR == 1:
        x = _kth_largest(v, m, n, K, True)
    elif VAR == 2:
        x = _coarse(v, m, n, K, 2)
    elif VAR == 3:
        x = _coarse(v, m, n, K, 1)
    elif VAR == 4:
        x = _search4(v, m, n, K)
    elif VAR == 5:
        x = _part_bound(tl.reshape(v, [SIZE // 1024, 8, 128]), K, 8)
    elif VAR == 6:
        x = tl.max(v, axis=0)
    else:
        x = tl.sum(v, axis=0)
    t1 = _clk()
    tl.store(out_ptr, x)
    tl.store(out_ptr + 1, (t1 - t0).to(tl.int32))


def inputs(size: int, seed: int) -> torch.Tensor:
    """key1 of the maxima of 4 random normal bf16 values (the T0 step's input)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 4, generator=g).to(torch.bfloat16).amax(1)
    u = x.view(torch.int16).to(torch.int32) & 0xFFFF
    key = torch.where(u >= 0x8000, 0xFFFF - u, u + 0x8000)
    return (key + 1).to(torch.int32)


def main(argv) -> None:
    k = 512
    print(torch.cuda.get_device_name())
    out = torch.zeros(2, dtype=torch.int32, device="cuda")
    for size in (1024, 2048, 4096):
        v = inputs(size, size)
        vd = v.cuda()
        line = []
        for var, name in enumerate(VARIANTS):
            cyc = []
            for _ in range(20):
                _probe_kernel[(1,)](vd, out, size, k, SIZE=size, VAR=var, num_warps=8)
                torch.cuda.synchronize()
                cyc.append(out[1].item())
            x = out[0].item()
            line.append(f"{name} {statistics.median(cyc):.0f} (t {x}, {(v >= x).sum().item()} >=)")
        print(f"size {size} k {k}: " + ", ".join(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
