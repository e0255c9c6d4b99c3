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
    up_n: int = 32
    up_k: int = 256
    down_n: int = 64
    down_k: int = 256
    num_warps: int = 2
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
    """The rule (SM90 SASS instruction counts, docs/kernels/moe.md): one warp per 16 weight
    rows (``num_warps = BLOCK_N / 16``), so each weight value is decoded once, and mma.sync
    takes the decoded tile from registers: 32-row W1|W3 tiles and 64-row W2 tiles with 2 warps
    need 3.5-3.9 issued instructions per weight value (64/128-row wgmma tiles with 4 warps:
    4.0-4.5; 32-row tiles with 4 warps decode twice: 6.5). Small CTAs (49 KB of shared memory)
    let 4 of them share an SM. K steps of 256 (64 for I = 576). ``rows`` and ``top_k`` do not
    change the choice today. Under the interpreter, larger tiles keep the CPU tests fast."""
    if not on_gpu:
        return MoEConfig(up_n=32, up_k=128, down_n=64, down_k=64, num_warps=4)
    return MoEConfig()
