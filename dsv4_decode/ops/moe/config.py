"""Launch configuration of the MoE expert kernels and the rule that picks it."""

from __future__ import annotations

from dataclasses import dataclass

# Entries a routing-record tile, the expert kernels' MMA N side (mma.sync's n8): most experts
# get 1-3 entries even at 192 rows, so 16 left half of every MMA, x tile and accumulator idle
# (session 16, H200, same process, outputs bitwise equal: -9.4 % a layer at 48 rows, -10.3 %
# at 12, -3.7 % at 192, where a few experts take two tiles).
BLOCK_M = 8


@dataclass(frozen=True)
class MoEConfig:
    """Tile sizes of ``_moe_up_kernel`` / ``_moe_down_kernel`` (all powers of two).

    block_m: entries per tile (rows of one expert, padded; mma.sync's N side: 8 or more), the
    routing record's tile (``Routing.block_m``).
    up_n / down_n: output channels per CTA (of I for W1|W3, of D for W2); up_k / down_k: the
    K step (halved where it does not divide K, or the K chunk). up_split: W1|W3 split-K factor
    (1..16; > 1 writes fp32 partials that one more launch sums in order, so few-row grids fill
    the GPU). num_warps: both kernels; up_stages / num_stages: pipeline depth of W1|W3 / W2.
    up_maxnreg: register cap of W1|W3 (0: the compiler's choice; 128 lets 8 two-warp CTAs
    share an SM instead of 5).
    """

    block_m: int = BLOCK_M
    up_n: int = 32
    up_k: int = 128
    down_n: int = 64
    down_k: int = 128
    num_warps: int = 2
    num_stages: int = 4
    up_stages: int = 4
    up_maxnreg: int = 128
    up_split: int = 1

    def __post_init__(self):
        if self.block_m < 8 or self.block_m & (self.block_m - 1):
            raise ValueError(f"MoEConfig.block_m: got {self.block_m}, needs a power of two >= 8")
        for name in ("up_n", "up_k", "down_n", "down_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"MoEConfig.{name}: got {v}, needs a power of two >= 16")
        for name in ("up_k", "down_k"):
            if getattr(self, name) < 32:
                raise ValueError(f"MoEConfig.{name}: got {getattr(self, name)}, needs >= 32")
        if not 1 <= self.up_split <= 16:
            raise ValueError(f"MoEConfig.up_split: got {self.up_split}, needs 1..16")
        if self.up_maxnreg and not 64 <= self.up_maxnreg <= 255:
            raise ValueError(f"MoEConfig.up_maxnreg: got {self.up_maxnreg}, needs 0 or 64..255")


# Round 1's launch plan: the measured best from 12 rows up (docs/kernels/moe.md).
ROUND1 = MoEConfig(up_k=256, down_k=256, num_stages=3, up_stages=3, up_maxnreg=0)

# 132 SMs x 8 resident W1|W3 CTAs x 4 waves: enough CTAs that the last wave's tail is short
# and every SM streams from the start.
_TARGET_UP_CTAS = 4224


def pick_config(rows: int, top_k: int, on_gpu: bool, inter: int = 576,
                hidden: int = 5120) -> MoEConfig:
    """The rule (SM90 SASS counts and ptxas reports, docs/kernels/moe.md): one warp per 16
    weight rows (``num_warps = BLOCK_N / 16``), so each weight value is decoded once and
    mma.sync takes the decoded tile from registers: 32-row W1|W3 tiles and 64-row W2 tiles
    with 2 warps. K steps of 128 (64 for I = 576): W1|W3 capped at 128 registers with 4 stages
    (25.6 KB shared memory) holds 8 CTAs = 16 warps per SM with no spills (round 1: 192
    registers, 5 CTAs); W2 with 4 stages (3 K steps in flight per CTA: at 1 row its ~4 CTAs
    per SM need them to cover the HBM latency): I = 576, 96 registers, 18.5 KB -> 10 CTAs per
    SM; I = 2304 with 128-steps 37 KB -> 6 (round 1: 49 KB, 4).
    W1|W3 split K: 8 if ``8 x`` the W1|W3 grid (about ``rows*top_k + rows/16`` tiles x
    ``inter/32``) stays within ``2 x _TARGET_UP_CTAS`` (1-6 rows at TP=4). Split configs
    use 2 stages (each CTA runs only 5 K steps; measured on the H200 in session 8, run 6,
    against 3: 34.93 / 94.90 against 36.65 / 97.31 µs a layer at 1 / 6 rows; 4 would spill
    under the cap), except 3 at 1 row since the 8-entry MMA width (``BLOCK_M``) freed
    registers and shared memory (session 16, run 7: 32.15 / 31.76 against 32.89 / 32.82 µs;
    at 2 and 6 rows 3 stages lost: 45.16 against 43.67, 84.2 against 80.1); a split needs
    ``hidden % (128 * split) == 0`` (whole K
    steps of 128 per chunk). Under the interpreter, larger tiles keep the CPU tests fast
    (split 1; the tests force other splits).
    Measured on the H200 (run of bec0572, docs/kernels/moe.md): split 8 wins wherever it fits
    (1 and 6 rows at TP=4, 1 row at TP=1, draft 1 and 6 rows: 45.6 against 75.5 µs at 1 row
    TP=4); everywhere else ``ROUND1`` (K steps of 256, compiler's registers) beat both the
    split-4 and the unsplit 128-step configs by 5-12 % (12 rows TP=4: 147.6 against 155.2 µs;
    48 rows: 347.9 against 400.6), so it is the default there.
    W2 at 1 row: 32-column tiles (``down_n=32``: 1120 CTAs of 32 x I instead of 560 of 64 x I,
    ~8 a SM instead of ~4, so more HBM requests in flight in the one wave). Measured on the
    H200 at 0e9b594 (bench ``ours-d32``, 1 row TP=4): 37.93 against 39.53 µs a layer; at 6
    rows (~3000 CTAs of 64 columns already) it lost, 110.92 against 107.00, so 64 there.
    Applied to every 1-row split config (TP=1 and the draft layer were not measured). There
    W2 pipelines 3 stages, not 4 (its ~8 CTAs a SM cover the latency with 2 steps in flight):
    -0.29 to -0.72 µs a layer in four session-8 runs (`moe_sweep.py 1 stages`), +0.3-0.5 at
    6 rows, so only at 1 row. Above 1 row, W1|W3 is capped at 96 registers (10 CTAs a SM
    instead of 8; one register spilled outside the K loop): -0.5 to -1.2 µs a layer at 6
    rows in three session-9 sweeps (`moe_sweep.py ... stages`), +0.37 at 1 row in both that
    timed it, so not at 1 row (2-5 rows, the draft layer and TP=1 at 2 rows: not measured)."""
    if not on_gpu:
        return MoEConfig(up_n=32, up_k=128, down_n=64, down_k=64, num_warps=4, up_maxnreg=0)
    ctas = (rows * top_k + -(-rows // 16)) * -(-inter // 32)
    if 8 * ctas <= 2 * _TARGET_UP_CTAS and hidden % (128 * 8) == 0:
        one = rows == 1
        return MoEConfig(up_split=8, up_stages=3 if one else 2, down_n=32 if one else 64,
                         num_stages=3 if one else 4, up_maxnreg=128 if one else 96)
    return ROUND1
