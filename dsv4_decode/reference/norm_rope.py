"""RMSNorm, the two RoPE tables (main; compress with optional YaRN) and row-wise linears
(spec §3.1, §3.2).

Batch invariance: every function here treats rows independently, and ``linear`` computes each
row with its own ``[1, in] @ [in, out]`` product, so a row's result never depends on how many
rows were processed together. That is what lets decode (1 or 6 rows) equal prefill (L rows)
bit for bit in the reference tests.
"""

from __future__ import annotations

import math

import torch

from dsv4_decode.config import ModelConfig

# Output rows of a weight upcast to fp32 at once (bounds the temporary for the LM head).
_LINEAR_CHUNK = 16384


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``y = W x`` per row in fp32. ``x [T, in]`` (any float dtype), ``w [out, in]`` (bf16/fp32)
    -> fp32 ``[T, out]``. Each row is its own GEMV (batch-invariant, see module doc)."""
    xf = x.float()
    out = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    for o in range(0, w.shape[0], _LINEAR_CHUNK):
        wt = w[o:o + _LINEAR_CHUNK].float().t()  # [in, chunk]
        for t in range(x.shape[0]):
            out[t, o:o + wt.shape[1]] = (xf[t:t + 1] @ wt)[0]
    return out


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``w * x / sqrt(mean(x^2) + eps)`` over the last dim, fp32 until the final cast to bf16.

    (vLLM's order; HF rounds to bf16 before multiplying by ``w``: a bf16-ulp difference.)
    ``w=None`` gives the unweighted variant (fp32 result, caller casts).
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if w is None:
        return y
    return (y * w.float()).to(torch.bfloat16)


def rope_freqs(cfg: ModelConfig, table: str, device="cpu") -> torch.Tensor:
    """Per-pair frequencies ``f_i`` (fp32 ``[rope_dim / 2]``) of the ``"main"`` or
    ``"compress"`` table (spec §3.2). The compress table applies YaRN when
    ``cfg.rope_scaling`` is a yarn dict (no mscale); tiny configs have none (plain RoPE)."""
    rd = cfg.qk_rope_head_dim
    base = cfg.rope_theta if table == "main" else cfg.compress_rope_theta
    exps = torch.arange(0, rd, 2, dtype=torch.float32) / rd
    g = 1.0 / (base ** exps)  # 1 / powf(base, positive exponent), fp32
    rs = cfg.rope_scaling
    if table == "compress" and rs and rs.get("rope_type", rs.get("type")) == "yarn":
        s, orig = float(rs["factor"]), float(rs["original_max_position_embeddings"])

        def corr(rho: float) -> float:  # pair index whose wavelength is orig / rho
            return rd * math.log(orig / (rho * 2 * math.pi)) / (2 * math.log(base))

        lo = max(math.floor(corr(rs.get("beta_fast", 32))), 0)
        hi = min(math.ceil(corr(rs.get("beta_slow", 1))), rd - 1)
        hi = hi + 0.001 if hi == lo else hi
        ramp = ((torch.arange(rd // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
        g = g * (1 - ramp) + (g / s) * ramp
    return g.to(device)


def apply_rope(x: torch.Tensor, pos: torch.Tensor, freqs: torch.Tensor,
               inverse: bool = False) -> torch.Tensor:
    """Rotate the trailing ``2 * len(freqs)`` dims of ``x [T, ..., L]`` in interleaved pairs
    ``(x[2i], x[2i+1])`` by ``pos[T] * f_i`` (fp32 math, cast back to ``x.dtype``).
    ``inverse`` rotates by the negated angle (attention output, spec §5.5)."""
    rd = 2 * freqs.shape[0]
    ang = pos.to(torch.float32)[:, None] * freqs[None, :]  # [T, rd/2]
    cos, sin = ang.cos(), ang.sin()
    if inverse:
        sin = -sin
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (rd // 2,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    r = x[..., -rd:].float()
    a, b = r[..., 0::2], r[..., 1::2]
    rot = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rd], rot.to(x.dtype)), dim=-1)
