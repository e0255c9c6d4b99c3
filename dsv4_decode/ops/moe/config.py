"""Launch configuration of the MoE expert kernels and the rule that picks it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoEConfig:
    """Tile sizes of ``_moe_up_kernel`` / ``_moe_down_kernel`` (all powers of two).

    block_m: entries per tile (rows of one expert, padded; the tensor-core minimum is 16).
    up_n / down_n: output channels per CTA (of I for W1|W3, of D for W2); up_k / down_k: the
    K step (halved where it does not divide K). up_split: W1|W3 split-K factor (1..16; > 1
    writes fp32 partials that one more launch sums in order, so few-row grids fill the GPU).
    num_warps / num_stages: as in Triton.
    """

    block_m: int = 16
    up_n: int = 32
    up_k: int = 256
    down_n: int = 64
    down_k: int = 256
    num_warps: int = 2
    num_stages: int = 3
    up_split: int = 1

    def __post_init__(self):
        for name in ("block_m", "up_n", "up_k", "down_n", "down_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"MoEConfig.{name}: got {v}, needs a power of two >= 16")
        for name in ("up_k", "down_k"):
            if getattr(self, name) < 32:
                raise ValueError(f"MoEConfig.{name}: got {getattr(self, name)}, needs >= 32")
        if not 1 <= self.up_split <= 16:
            raise ValueError(f"MoEConfig.up_split: got {self.up_split}, needs 1..16")


# 132 SMs x 4 resident CTAs (49 KB shared memory, 2 warps each) x 8 waves: enough W1|W3 CTAs
# that the last wave's tail is short and every SM streams from the start.
_TARGET_UP_CTAS = 4224


def pick_config(rows: int, top_k: int, on_gpu: bool, inter: int = 576) -> MoEConfig:
    """The rule (SM90 SASS instruction counts, docs/kernels/moe.md): one warp per 16 weight
    rows (``num_warps = BLOCK_N / 16``), so each weight value is decoded once, and mma.sync
    takes the decoded tile from registers: 32-row W1|W3 tiles and 64-row W2 tiles with 2 warps
    need 3.5-3.9 issued instructions per weight value (64/128-row wgmma tiles with 4 warps:
    4.0-4.5; 32-row tiles with 4 warps decode twice: 6.5). Small CTAs (49 KB of shared memory)
    let 4 of them share an SM. K steps of 256 (64 for I = 576). ``rows`` and ``top_k`` do not
    change the tiles. W1|W3 split K: the largest power of two <= 8 keeping the W1|W3 grid
    (about ``rows*top_k + rows/16`` tiles x ``inter/32``) within ``_TARGET_UP_CTAS``: 8 at 1
    row (126 CTAs of 164-327 KB each at TP=4 would leave one long serial CTA per SM), 4 at
    6 rows, 2 at 12, 1 from 48 rows (TP=4). Under the interpreter, larger tiles keep the CPU
    tests fast (split 1; the tests force other splits)."""
    if not on_gpu:
        return MoEConfig(up_n=32, up_k=128, down_n=64, down_k=64, num_warps=4)
    ctas = (rows * top_k + -(-rows // 16)) * -(-inter // 32)
    split = 1
    while split < 8 and 2 * split * ctas <= _TARGET_UP_CTAS:
        split *= 2
    return MoEConfig(up_split=split)
