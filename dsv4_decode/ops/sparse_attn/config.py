"""Launch configuration of ``sparse_attn`` and the rule that picks it from static shapes.

Work split: one CTA per (row, head block, split). A row's keys are its window (``window``
columns) and its index list (``n_sel`` columns), handled by different splits: ``n_wsplit``
window splits of ``w_steps`` steps and ``n_csplit`` compressed splits of ``c_steps`` steps, each
step ``block_n`` keys. The splits of one (row, head block) are merged by a second small kernel
(default) or by the last CTA to finish (``fused_merge``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from functools import lru_cache

MAX_SPLITS = 8  # beyond this the merge (n_split partial [heads, D] reads) costs more than it saves
# Registers decide how many CTAs share an SM: ptxas (sm_90a) gives every layout here 180-255
# registers a thread, so 8-warp CTAs run one per SM (the 64K-register file) and 4-warp CTAs two.
REGISTERS = 65536
REGS_PER_THREAD = 256  # allocation granule of a 255-register thread

# Named launch layouts (``SparseAttnConfig.pick(..., **LAYOUTS[name])``), the candidates for the
# default at head dim 512, timed side by side by ``bench sparse_attn --sweep`` (session 3; see
# docs/kernels/sparse_attn.md). ptxas, sm_90a, 16 heads: registers / spills / CTAs per SM.
LAYOUTS = {
    "default": {},  # 32 keys a step, 8 warps, 2-d products: 178 regs, 1 CTA/SM
    "block_n64": dict(block_n=64),  # 64 keys a step, 8 warps: 249 regs, 1 CTA/SM
    "dim_split8": dict(dim_split=8),  # 32 keys, 8 warps x 64-dim chunks: 254 regs, 1 CTA/SM
    # 16 keys, 4 warps x 128-dim chunks: 254 regs, 2 CTAs/SM
    "dim_split4": dict(block_n=16, num_warps=4, dim_split=4),
    # 32 heads a CTA where there are >= 32 (64 heads: 2 head blocks dequantising each key, not
    # 4), else as the default: 255 regs, 1 CTA/SM
    "block_h32": dict(block_h=32),
}


@dataclass(frozen=True)
class SparseAttnConfig:
    block_h: int  # heads per CTA (tl.dot M, >= 16), padded heads are masked
    block_n: int  # keys dequantised per step (tl.dot N)
    w_steps: int  # steps per window split
    n_wsplit: int  # window splits: ceil(ceil(window / block_n) / w_steps)
    c_steps: int  # steps per compressed split (0 without an index list)
    n_csplit: int  # compressed splits: ceil(ceil(n_sel / block_n) / c_steps)
    num_warps: int
    num_stages: int = 1  # Triton's pipeliner (the kernel prefetches one step by itself)
    # last CTA merges (one launch) vs a separate merge kernel; the kernel was faster at every
    # round-1 H200 size (by 0.2-3.9 us) and needs no arrival counters
    fused_merge: bool = False
    maxnreg: int | None = None  # register cap (e.g. 128: two 8-warp CTAs per SM, some spills)
    # > 1: both products batched over dim_split chunks of head_dim / dim_split dims, one chunk
    # per warp (give dim_split == num_warps, else Triton repeats chunks on the spare warps):
    # distinct MMA work per warp, short HMMA chains, a warp reads only its slice of q
    dim_split: int = 1
    # launch the merge kernel as a programmatic dependent (Hopper+, CUDA only): its launch
    # overlaps the attention kernel's tail, it waits for the partials on the device
    pdl: bool = False
    # launch the attention kernel itself as a programmatic dependent (Hopper+, CUDA only): its
    # launch overlaps the tail of whatever kernel precedes the call; it waits for that kernel
    # before its first load
    pdl_entry: bool = False
    # split partials' acc stored as bf16 instead of fp32 (m and l stay fp32): half the bytes
    # written by the splits and read by the merge (31 of ~35 MB at 32 x 6 rows x 16 heads);
    # each partial rounded once to bf16 (relative 2^-9, as the bf16 P of the P K product)
    partials_bf16: bool = False
    # Hopper only (sm_90): the splits run ``_gluon._wgmma_attn_kernel`` (both products on
    # warpgroup MMAs, keys in M; ~100 KB of shared memory and <= 128 registers at 8 warps, so
    # two CTAs share a SM); needs block_h 16, block_n 64, D 512, 4 or 8 warps, several splits,
    # fp32 partials and the merge kernel (``wgmma_config`` builds one)
    wgmma: bool = False
    # CTAs launched split by split over all rows, the splits with more steps first (the index
    # list's at the production shapes), not each row's splits one after the other, so the long
    # splits do not start in the last wave (``_gluon._cta_row``; the Triton kernel likewise)
    long_first: bool = False

    @property
    def n_split(self) -> int:
        return self.n_wsplit + self.n_csplit

    @property
    def ctas_per_sm(self) -> int:
        """CTAs of this config one SM holds at once, from the register file (shared memory,
        <= 82 KB a CTA for every layout of ``LAYOUTS``, never binds first). The wgmma kernel:
        two (100 KB of shared memory a CTA; registers capped at 128 at 8 warps, 255 at 4)."""
        if self.wgmma:
            return 2
        return max(REGISTERS // (32 * self.num_warps * (self.maxnreg or REGS_PER_THREAD)), 1)

    @staticmethod
    def pick(rows: int, heads: int, head_dim: int, window: int, n_sel: int,
             sm_count: int = 132, fused_merge: bool = False, *, block_n: int | None = None,
             num_warps: int | None = None, dim_split: int = 1, maxnreg: int | None = None,
             block_h: int = 16) -> SparseAttnConfig:
        """The default for these shapes: the steps per split that minimise ``waves x steps``
        (``_steps``), ties to fewer splits (each adds a partial-result round trip).
        ``block_n`` / ``num_warps`` / ``dim_split`` / ``maxnreg`` / ``block_h`` (heads per
        CTA at most, never more than the heads rounded up to a power of two) pick another
        layout (the same rule then sizes its splits, with that layout's CTAs per SM)."""
        # 16 heads x 32 keys x 512 dims at 8 warps compiles to 178 registers, 32 heads to 255,
        # without spills (ptxas, sm_90a; session 3)
        block_h = max(16, min(block_h, 1 << (heads - 1).bit_length()))
        block_n = block_n or (32 if head_dim >= 256 else 16)
        num_warps = num_warps or (8 if head_dim >= 256 else 4)
        lay = dict(num_warps=num_warps, dim_split=dim_split, maxnreg=maxnreg)
        slots = SparseAttnConfig(block_h, block_n, 1, 1, 0, 0, **lay).ctas_per_sm * sm_count
        return SparseAttnConfig.with_steps(
            block_h, block_n, _steps(rows, heads, block_h, block_n, window, n_sel, slots),
            window, n_sel, fused_merge=fused_merge, **lay)

    @staticmethod
    def with_steps(block_h: int, block_n: int, steps: int, window: int, n_sel: int, *,
                   c_steps: int | None = None, **kw) -> SparseAttnConfig:
        """A config of at most ``steps`` steps per window split and ``c_steps`` (default
        ``steps``) per index-list split (fewer where a kind has fewer)."""
        w_units, c_units = -(-window // block_n), -(-n_sel // block_n)
        w_steps, c_steps = min(steps, w_units), min(steps if c_steps is None else c_steps,
                                                    c_units)
        return SparseAttnConfig(block_h, block_n, w_steps, -(-w_units // w_steps), c_steps,
                                -(-c_units // c_steps) if c_units else 0, **kw)

    def check(self, window: int, n_sel: int) -> bool:
        """Whether this config covers exactly ``window`` + ``n_sel`` columns."""
        w_units, c_units = -(-window // self.block_n), -(-n_sel // self.block_n)
        ok_c = (self.n_csplit == 0 and c_units == 0) or (
            self.c_steps > 0 and self.n_csplit == -(-c_units // self.c_steps))
        return (self.block_h >= 16 and self.block_n >= 16 and self.w_steps > 0
                and self.n_wsplit == -(-w_units // self.w_steps) and ok_c)

    def wgmma_problem(self, head_dim: int) -> str | None:
        """Why this ``wgmma`` config cannot run at ``head_dim`` (None: it can, or not wgmma)."""
        if not self.wgmma:
            return None
        if self.num_warps not in (4, 8):
            return f"wgmma: needs 4 or 8 warps, got {self.num_warps}"
        if head_dim != 512:
            return f"wgmma: needs head dim 512, got {head_dim}"
        if (self.block_h, self.block_n, self.dim_split) != (16, 64, 1):
            return "wgmma: needs block_h 16, block_n 64 and no dim split"
        if self.n_split < 2 or self.fused_merge or self.partials_bf16:
            return "wgmma: needs several splits, the merge kernel and fp32 partials"
        if self.maxnreg:
            return "wgmma: takes no register cap"
        return None

    def fits_head_dim(self, head_dim: int) -> bool:
        """Whether ``dim_split`` works at ``head_dim``: 1, or a power of two >= 2 leaving chunks
        of >= 32 dims (one ue8m0 block of the window records, >= 16 for the MMA's K)."""
        ds = self.dim_split
        return ds == 1 or (ds >= 2 and ds & (ds - 1) == 0 and head_dim // ds >= 32)


def wgmma_config(rows: int, heads: int, window: int, n_sel: int, sm_count: int = 132,
                 num_warps: int | None = None) -> SparseAttnConfig:
    """The wgmma kernel's config (Hopper, head dim 512): 64 keys a step, the merge kernel, both
    kernels programmatic dependent launches, two CTAs a SM. ``num_warps`` 8 or 4: those warps
    throughout, split by ``_wgmma_rule``. None, the default, by the one-step splits' CTA count
    n1 (groups x splits) against the SMs; session 12's same-process comparison
    (``scripts/sparse_ab.py``, H200, all 24 benchmark cells, run 6):
    - n1 <= 3/4 of the SMs: one-step splits at 8 warps (1 x 6 x 16 7.17 us against 7.44 at 4
      warps; 1 x 1 x 16 6.63 / 6.88);
    - else the rule at 4 warps (one warpgroup a CTA: S^T reads the key tile once, not once a
      warpgroup; 255 registers; session 13: S^T from registers): 32 x 6 x 16 53.7 against
      58.7 at 8 warps, 8 x 6 x 16 17.2 / 17.6, 32 x 6 x 64 168.0 / 185.8, 4 x 6 x 16 12.3 /
      13.3.
    The two-tile kernel (one CTA a SM) was within 1 % at 2 x 6 x 16 and 32 x 1 x 16 and slower
    everywhere else (session 12), the warp-specialized one slower in 20 of 24 cells (session
    13): both removed. Dependent launches (session 12, ``scripts/pdl_ab.py``): -0.95 to -1.23
    us at 1-2 requests, -0.89 at 8 x 6 x 16, -1.74 at 32 x 6 x 16, -0.41 at 1 x 6 x 64, -1.11
    at 32 x 1 x 16; outputs bitwise equal."""
    if num_warps is not None:
        if num_warps not in (4, 8):
            raise ValueError(f"num_warps: 4, 8 or None, got {num_warps!r}")
        return replace(_wgmma_rule(rows, heads, window, n_sel, sm_count), num_warps=num_warps)
    groups = rows * -(-heads // 16)
    one = SparseAttnConfig.with_steps(16, 64, 1, window, n_sel, num_warps=8)
    if 4 * groups * one.n_split <= 3 * sm_count:
        return replace(one, wgmma=True, pdl=True, pdl_entry=True)
    return replace(_wgmma_rule(rows, heads, window, n_sel, sm_count), num_warps=4)


def _wgmma_rule(rows: int, heads: int, window: int, n_sel: int,
                sm_count: int) -> SparseAttnConfig:
    """The wgmma kernel's split rule (8 warps; the caller may change them): the window and
    index-list steps a split that ``_split_schedule`` picks for ``rows x head blocks`` groups
    on two CTAs a SM, ``long_first`` where the two kinds' splits differ in steps. Never fewer
    than two splits (there is no in-place finalisation on that path)."""
    w_steps, c_steps = _split_schedule(rows * -(-heads // 16), -(-window // 64),
                                       -(-n_sel // 64), 2 * sm_count)
    return SparseAttnConfig.with_steps(16, 64, w_steps, window, n_sel, c_steps=c_steps,
                                       num_warps=8, wgmma=True, pdl=True, pdl_entry=True,
                                       long_first=c_steps > 0 and w_steps != c_steps)


SPLIT_COST = 0.5  # a split's fixed cost in steps (``_split_schedule``)


@lru_cache(maxsize=256)
def _split_schedule(groups: int, w_units: int, c_units: int, slots: int) -> tuple[int, int]:
    """(window, index-list) steps a split for ``groups`` (row, head block) groups of
    ``w_units`` window and ``c_units`` index-list steps, on ``slots`` CTA slots: the pair whose
    schedule ends first. The model: a CTA costs its steps + ``SPLIT_COST`` (the index -> page
    -> record chain before its first step, the partial store); CTAs take the first free slot
    in launch order (all groups' longest splits first where the kinds differ in steps, else
    each group's splits together, as ``long_first`` launches them); ties to the smaller sum of
    CTA costs, then to fewer splits, then to shorter window splits. Only pairs whose last
    split of each kind is at most one step short of the others: the model prices a short
    straggler like any CTA, and picked 2/5 (splits 5 + 3) at 128 groups, measured 35.9 us
    against 29.6 for 1/4 (run 6); 1/4 and 2/3 then tie, and 1/4 was the faster (32.8 for 2/3).

    Measured on the H200 (session 14, run 5, ``scripts/sparse_ab.py --splits``, same process,
    µs), the pair it picks in bold: 48 groups (8 x 6 x 16) **2/2** 15.55, 1/4 19.3, 2/8 32.1;
    64 (16 x 1 x 64) **2/3** 18.9, 2/2 24.9, 1/4 21.8; 96 (16 x 6 x 16) **1/4** 23.7, 2/2
    (the previous rule's) 27.1, 2/4 24.6; 96 (4 x 6 x 64) **1/4** 22.9 against 25.9; 128
    (32 x 1 x 64) **1/4** 30.1, 2/3 (previous) 33.2; 192 (32 x 6 x 16) **2/8** 37.5, 1/8
    40.6, 2/4 44.7; 384 (16 x 6 x 64) **2/8** 70.3, 1/8 79.1. Run 6 (all 24 cells against
    2/2, 2/3, 1/4, 2/5, 2/8): the same best pairs, and 2/5 at 128 groups 35.9 (1/4 29.6, 2/3
    32.8). Where every split is one step and they all fit the slots, one-step splits (session
    11: 1 x 6 x 16 8.58 us against 11.85 for longer splits)."""
    best = None
    for w in range(1, w_units + 1):
        for c in range(1, c_units + 1) if c_units else (0,):
            n_w = -(-w_units // w)
            n_c = -(-c_units // c) if c else 0
            if n_w + n_c < 2:
                continue
            w_last, c_last = w_units - (n_w - 1) * w, c_units - (n_c - 1) * c if c else 0
            if w - w_last > 1 or c - c_last > 1:  # a kind's last split a short straggler
                continue
            splits = [min(w, w_units - i * w) for i in range(n_w)] + \
                     [min(c, c_units - i * c) for i in range(n_c)]
            if w != c:  # split by split over all groups, the longest first
                costs = [t + SPLIT_COST for t in sorted(splits, reverse=True)
                         for _ in range(groups)]
            else:
                costs = [t + SPLIT_COST for _ in range(groups) for t in splits]
            free = [0.0] * min(slots, len(costs))
            for t in costs:
                heapq.heapreplace(free, free[0] + t)
            key = (max(free), sum(costs), n_w + n_c, w)
            if best is None or key < best[0]:
                best = (key, (w, c))
    return best[1]


def pick_default(rows: int, heads: int, head_dim: int, window: int, n_sel: int,
                 sm_count: int = 132, wgmma: bool = False) -> SparseAttnConfig:
    """The default launch config, chosen from the H200 sweep of session 3 (16 heads, 512
    selected + full window; docs/kernels/sparse_attn.md): at head dim >= 256, the ``block_n64``
    layout with one step a split (2 window + 8 index splits of 64 keys at 512 selected) where
    all its CTAs fit in one wave (1 per SM: 1-2 requests x 6 rows, up to 13 rows; measured
    13.67 us at 1 x 6 against 18.18 for the 8-warp rule), its merge a programmatic dependent
    launch (session 7, Hopper+; ignored elsewhere); else (session 5) that layout split
    by ``pick`` where it fits one wave, above 16 head groups (rows x head blocks; 4 x 6 x 16:
    17.18 against 22.75 us); else the default layout at 4 warps (two CTAs per SM) split by
    ``pick`` (measured 31.23 / 104.51 us at 8 / 32 requests x 6 rows against 40.44 / 144.68
    at 8 warps). Other head dims: ``pick``.

    ``pdl_entry`` (the attention kernel a programmatic dependent launch) only on the one-step
    layout: session 10, same process (``scripts/pdl_ab.py``), -0.23 / -0.31 / -0.44 / -0.42 /
    -0.26 us at 1 x 1 x 16 / 1 x 1 x 64 / 2 x 1 x 16 / 1 x 6 x 16 / 2 x 6 x 16, and +0.23 to
    +0.29 us on the other layouts (8 and 32 x 6 x 16, 1 x 6 x 64, 32 x 1 x 16).

    ``wgmma`` (a Hopper GPU, ``api.pick_config``): the wgmma kernel at every shape of head dim
    512 (``wgmma_config``; session 11: -6 to -27 % against this function's Triton choice in all
    24 cells of the benchmark, same run; sessions 12-13 measured its variants)."""
    if wgmma and head_dim == 512:
        return wgmma_config(rows, heads, window, n_sel, sm_count)
    if head_dim >= 256:
        groups = rows * -(-heads // 16)
        # session 7: with the merge as a programmatic dependent launch (its position / RoPE /
        # sink loads overlap the attention kernel): 1 x 1 x 16 10.55 against 11.05 us, 1 x 1
        # x 64 10.92 against 11.62, 1 x 6 x 16 11.21 against 11.68, 2 x 1 x 16 10.68 / 11.29
        one = SparseAttnConfig.with_steps(16, 64, 1, window, n_sel, num_warps=8, pdl=True,
                                          pdl_entry=True)
        if groups * one.n_split <= one.ctas_per_sm * sm_count:
            return one
        # session 5: the block_n64 layout split by the rule, where that fits one wave, beat
        # the 4-warp rule at 24 and 32 head groups (4 x 6 x 16: 17.18 against 22.75 us, 1 x 6
        # x 64: 16.30 against 22.50, 32 x 1 x 16: 21.62 against 23.25) but not at 16 (16 x 1
        # x 16: 17.32 against 16.12, 4 x 1 x 64: 16.22 against 15.34)
        few = SparseAttnConfig.pick(rows, heads, head_dim, window, n_sel, sm_count, block_n=64)
        if groups > 16 and groups * few.n_split <= few.ctas_per_sm * sm_count:
            return few
        cfg = SparseAttnConfig.pick(rows, heads, head_dim, window, n_sel, sm_count,
                                    num_warps=4)
        # several waves: long splits first where the kinds differ in steps (session 14, run 9,
        # same process, µs: 32 x 6 x 16 86.5 -> 79.0, 8 x 6 x 64 85.0 -> 77.5, 16 x 6 x 64
        # 152.1 -> 141.1, 32 x 6 x 64 289.7 -> 278.9, 32 x 1 x 64 60.4 -> 57.7, 16 x 1 x 64
        # 33.1 -> 32.2; outputs bitwise equal)
        return replace(cfg, long_first=cfg.c_steps > 0 and cfg.c_steps != cfg.w_steps)
    return SparseAttnConfig.pick(rows, heads, head_dim, window, n_sel, sm_count)


def _steps(rows, heads, block_h, block_n, window, n_sel, slots) -> int:
    """Steps per split. Round 1 on the H200 ran at about (10 + 3.7 x waves x steps) us: a CTA's
    time is its step count (each step a serial gather -> dequantise -> 2 MMAs), CTAs beyond the
    ``slots`` (CTAs per SM x SMs) wait for a whole earlier wave. So pick the steps that minimise
    ``ceil(CTAs / slots) x steps`` over at most ``MAX_SPLITS`` splits, ties to fewer splits.

    Then, at three waves or more (and more than two splits), twice those steps: each split pays
    a fixed cost (the index -> page -> record chain before its first step, its partial store,
    its share of the merge) that the count above leaves out, and with many waves the total
    work, not the last wave, sets the time. Measured on the H200 (session 5, 4-warp layout):
    32 x 6 x 16 86.49 against 93.07 us, 8 x 6 x 64 84.74 against 91.40, 32 x 6 x 64 289.66
    against 342.18; below three waves it lost (16 x 6 x 16 52.32 against 48.74, 8 x 6 x 16
    38.41 against 27.19)."""
    w_units, c_units = -(-window // block_n), -(-n_sel // block_n)
    groups = max(rows * -(-heads // block_h), 1)
    best = None
    for steps in range(1, max(w_units, c_units) + 1):
        n_split = -(-w_units // steps) + -(-c_units // steps)
        if n_split > MAX_SPLITS:
            continue
        span = max(min(steps, w_units), min(steps, c_units))  # the longest split's steps
        key = (-(-groups * n_split // slots) * span, n_split)
        if best is None or key < best[0]:
            best = (key, steps)
    steps = best[1]
    n_split = -(-w_units // steps) + -(-c_units // steps)
    if groups * n_split >= 3 * slots and n_split > 2:
        return 2 * steps
    return steps
