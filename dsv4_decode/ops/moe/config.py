"""Launch configuration of the MoE expert kernels and the rule that picks it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoEConfig:
    """Tile sizes of ``_moe_up_kernel`` / ``_moe_down_kernel`` (all powers of two).

    block_m: entries per tile (rows of one expert, padded; the tensor-core minimum is 16).
    up_n / down_n: output channels per CTA (of I for W1|W3, of D for W2); up_k / down_k: the
    K step (halved where it does not divide K). num_warps / num_stages: as in Triton.
    """

    block_m: int = 16
    up_n: int = 64
    up_k: int = 256
    down_n: int = 128
    down_k: int = 256
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


def pick_config(rows: int, top_k: int, on_gpu: bool) -> MoEConfig:
    """The rule (SM90 instruction counts and the H200 sweep in docs/kernels/moe.md): W1|W3 tiles
    of 64 channels (fewest instructions per weight value, 2 CTAs per SM), except with few
    routed entries (``rows * top_k <= 8``, e.g. 1 row) where 32-channel tiles keep ~130 CTAs
    busy; W2 tiles of 128. K steps of 256 (64 for I = 576, the largest power of two dividing
    it). Under the interpreter, small tiles keep the CPU tests fast."""
    if not on_gpu:
        return MoEConfig(up_n=32, up_k=128, down_n=64, down_k=64)
    return MoEConfig(up_n=32 if rows * top_k <= 8 else 64)
