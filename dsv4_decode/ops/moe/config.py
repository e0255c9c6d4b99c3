"""Launch configuration of the MoE expert kernels and the rule that picks it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoEConfig:
    """Tile sizes of ``_moe_up_kernel`` / ``_moe_down_kernel`` (all powers of two).

    block_m: entries per tile (rows of one expert, padded; the tensor-core minimum is 16).
    up_n / down_n: output channels per CTA (of I for W1|W3, of D for W2); up_k / down_k: the
    K step (halved where it does not divide K). mx_native: use Triton's ``dot_scaled`` for
    the MXFP4 weights (block 32 only) instead of the explicit dequant + ``dot``.
    num_warps / num_stages: as in Triton.
    """

    block_m: int = 16
    up_n: int = 32
    up_k: int = 256
    down_n: int = 64
    down_k: int = 128
    mx_native: bool = True
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_m", "up_n", "up_k", "down_n", "down_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"MoEConfig.{name}: got {v}, needs a power of two >= 16")
        for name in ("up_k", "down_k"):
            if getattr(self, name) < 32:
                raise ValueError(f"MoEConfig.{name}: got {getattr(self, name)}, needs >= 32")


def pick_config(rows: int, scale_block: int, on_gpu: bool) -> MoEConfig:
    """The rule: ``dot_scaled`` where the format allows it (block 32) on a GPU (the interpreter
    lacks it); small N tiles so that even 1 row (6 experts) spreads over >= 2 CTAs per SM of an
    H200 (TP=4: 18 W1|W3 tiles and 80 W2 tiles per expert). Under the interpreter, few large
    tiles keep the CPU tests fast."""
    if not on_gpu:
        return MoEConfig(up_n=32, up_k=128, down_n=64, down_k=64, mx_native=False)
    return MoEConfig(mx_native=scale_block == 32)
