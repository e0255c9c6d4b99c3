"""Launch configuration of ``sparse_attn`` and the rule that picks it from static shapes.

Work split: one CTA per (row, head block, column split). A row's key columns are the window
(padded to a multiple of ``block_n``) followed by the index list; a split covers ``split_cols``
consecutive columns, iterated ``block_n`` keys at a time. Splits of one (row, head block) are
merged by the last CTA to finish (``fused_merge``) or by a second small kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_SPLITS = 8  # beyond this the merge (n_split partial [heads, D] reads) costs more than it saves
TARGET_WAVES = 2  # aim for about this many CTAs per SM when splitting


@dataclass(frozen=True)
class SparseAttnConfig:
    block_h: int  # heads per CTA (tl.dot M): 16 or 32, padded heads are masked
    block_n: int  # keys dequantised per inner step (tl.dot N)
    split_cols: int  # key columns per CTA, a multiple of block_n
    n_split: int  # CTAs per (row, head block)
    num_warps: int
    num_stages: int = 1  # software pipelining of the key loads (1 = none)
    fused_merge: bool = True  # last CTA merges (one launch) vs a separate merge kernel

    @staticmethod
    def pick(rows: int, heads: int, head_dim: int, window: int, n_sel: int,
             sm_count: int = 132, fused_merge: bool = True) -> SparseAttnConfig:
        """The default for these shapes: fill about ``TARGET_WAVES`` CTAs per SM with as few
        splits as possible (each split adds a partial-result round trip to the merge)."""
        block_h = 16 if heads <= 16 else 32
        # [block_n, D] dequantised keys live in registers: 32 x 512 keeps it at 64 fp32/thread.
        block_n = 32 if head_dim >= 256 else 16
        n_cols = padded_window(window, block_n) + n_sel
        units = -(-n_cols // block_n)
        ctas = max(rows * -(-heads // block_h), 1)
        want = -(-TARGET_WAVES * sm_count // ctas)
        n_split = max(1, min(want, units, MAX_SPLITS))
        split_cols = -(-units // n_split) * block_n
        n_split = -(-n_cols // split_cols)
        return SparseAttnConfig(block_h, block_n, split_cols, n_split,
                                num_warps=8 if head_dim >= 256 else 4, fused_merge=fused_merge)


def padded_window(window: int, block_n: int) -> int:
    """Window columns rounded up to whole ``block_n`` steps (a step never mixes key kinds)."""
    return -(-window // block_n) * block_n
