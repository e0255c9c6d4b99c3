"""Launch configuration of ``sparse_attn`` and the rule that picks it from static shapes.

Work split: one CTA per (row, head block, split). A row's keys are its window (``window``
columns) and its index list (``n_sel`` columns), handled by different splits: ``n_wsplit``
window splits of ``w_steps`` steps and ``n_csplit`` compressed splits of ``c_steps`` steps, each
step ``block_n`` keys. The splits of one (row, head block) are merged by a second small kernel
(default) or by the last CTA to finish (``fused_merge``).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_SPLITS = 8  # beyond this the merge (n_split partial [heads, D] reads) costs more than it saves
# 16 heads x 32 keys x 512 dims at 8 warps takes 255 registers/thread: the 256 threads fill the
# 64K-register file, so one CTA per SM (ptxas -v, sm_90a).
CTAS_PER_SM = 1


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

    @property
    def n_split(self) -> int:
        return self.n_wsplit + self.n_csplit

    @staticmethod
    def pick(rows: int, heads: int, head_dim: int, window: int, n_sel: int,
             sm_count: int = 132, fused_merge: bool = False) -> SparseAttnConfig:
        """The default for these shapes: the steps per split that minimise ``waves x steps``
        (``_steps``), ties to fewer splits (each adds a partial-result round trip)."""
        # 16 heads x 32 keys x 512 dims at 8 warps compiles to 255 registers without spills;
        # 32 heads spill (about 1.2 KB/thread), so more heads take more head blocks.
        block_h = 16
        block_n = 32 if head_dim >= 256 else 16
        return SparseAttnConfig.with_steps(
            block_h, block_n, _steps(rows, heads, block_h, block_n, window, n_sel, sm_count),
            window, n_sel, num_warps=8 if head_dim >= 256 else 4, fused_merge=fused_merge)

    @staticmethod
    def with_steps(block_h: int, block_n: int, steps: int, window: int, n_sel: int,
                   **kw) -> SparseAttnConfig:
        """A config of at most ``steps`` steps per split (fewer where a kind has fewer)."""
        w_units, c_units = -(-window // block_n), -(-n_sel // block_n)
        w_steps, c_steps = min(steps, w_units), min(steps, c_units)
        return SparseAttnConfig(block_h, block_n, w_steps, -(-w_units // w_steps), c_steps,
                                -(-c_units // c_steps) if c_units else 0, **kw)

    def check(self, window: int, n_sel: int) -> bool:
        """Whether this config covers exactly ``window`` + ``n_sel`` columns."""
        w_units, c_units = -(-window // self.block_n), -(-n_sel // self.block_n)
        ok_c = (self.n_csplit == 0 and c_units == 0) or (
            self.c_steps > 0 and self.n_csplit == -(-c_units // self.c_steps))
        return (self.block_h >= 16 and self.block_n >= 16 and self.w_steps > 0
                and self.n_wsplit == -(-w_units // self.w_steps) and ok_c)


def _steps(rows, heads, block_h, block_n, window, n_sel, sm_count) -> int:
    """Steps per split. Round 1 on the H200 ran at about (10 + 3.7 x waves x steps) us: a CTA's
    time is its step count (each step a serial gather -> dequantise -> 2 MMAs), CTAs beyond
    ``CTAS_PER_SM x sm_count`` wait for a whole earlier wave. So pick the steps that minimise
    ``ceil(CTAs / slots) x steps`` over at most ``MAX_SPLITS`` splits, ties to fewer splits."""
    w_units, c_units = -(-window // block_n), -(-n_sel // block_n)
    groups = max(rows * -(-heads // block_h), 1)
    slots = CTAS_PER_SM * sm_count
    best = None
    for steps in range(1, max(w_units, c_units) + 1):
        n_split = -(-w_units // steps) + -(-c_units // steps)
        if n_split > MAX_SPLITS:
            continue
        span = max(min(steps, w_units), min(steps, c_units))  # the longest split's steps
        key = (-(-groups * n_split // slots) * span, n_split)
        if best is None or key < best[0]:
            best = (key, steps)
    return best[1]
