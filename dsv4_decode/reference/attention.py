"""Attention of one layer (spec §5.1, §5.2, §5.5, §5.6): Q path, window KV, sparse attention
with a per-head sink and inverse RoPE, grouped low-rank output projection.

Shapes: ``T`` rows, ``D`` hidden, ``H`` heads of ``d`` dims (rope = the trailing ``rd``),
``Q`` q_lora_rank, ``G`` o_groups of ``R`` dims. Activations bf16, statistics and softmax fp32.
"""

from __future__ import annotations

import torch

from .norm_rope import apply_rope, linear, rms_norm


def q_path(x, wq_a, q_norm, wq_b, pos, freqs, n_heads: int, eps: float):
    """``x [T, D]`` bf16 -> (``qr [T, Q]`` bf16, ``q [T, H, d]`` bf16 with RoPE at ``pos``).

    ``qr = RMSNorm(wq_a x)`` also feeds the indexer query. No per-head q norm in V4.1."""
    qr = rms_norm(linear(x, wq_a).to(torch.bfloat16), q_norm, eps)
    q = linear(qr, wq_b).to(torch.bfloat16).reshape(x.shape[0], n_heads, -1)
    return qr, apply_rope(q, pos, freqs)


def window_kv(x, wkv, kv_norm, pos, freqs, eps: float) -> torch.Tensor:
    """``x [T, D]`` -> post-RoPE latent ``kv [T, d]`` bf16, *before* the QAT-FP8 fake-quant
    (the caller quantises it into the 528-byte window record; attention uses the record)."""
    kv = rms_norm(linear(x, wkv).to(torch.bfloat16), kv_norm, eps)
    return apply_rope(kv, pos, freqs)


def sparse_attention(q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """One row: ``q [H, d]`` bf16, ``kv [n, d]`` fp32 (dequantised K = V), ``sink [H]`` fp32
    -> ``o [H, d]`` fp32 (before the inverse RoPE).

    ``z = q.k / sqrt(d)``; softmax over the n keys with ``exp(sink_h)`` added to the
    denominator only (spec §5.5). fp32 throughout (the reference kernel's bf16 P is a
    rounding-level difference)."""
    z = (q.float() @ kv.t()) * q.shape[-1] ** -0.5  # [H, n]
    m = torch.maximum(z.amax(dim=-1), sink)  # [H]
    p = torch.exp(z - m[:, None])
    den = p.sum(dim=-1) + torch.exp(sink - m)
    return (p / den[:, None]) @ kv  # [H, d]


def output_projection(o: torch.Tensor, wo_a: torch.Tensor, wo_b: torch.Tensor,
                      n_groups: int) -> torch.Tensor:
    """Grouped low-rank output (spec §5.6). ``o [T, H, d]`` bf16 (after inverse RoPE),
    ``wo_a [G*R, (H/G)*d]``, ``wo_b [D, G*R]`` -> ``a [T, D]`` bf16.

    Group g = heads ``g*H/G .. (g+1)*H/G - 1`` concatenated head-major, projected by rows
    ``g*R .. (g+1)*R - 1`` of ``wo_a``."""
    t = o.shape[0]
    og = o.reshape(t, n_groups, -1)  # [T, G, (H/G)*d]
    r = wo_a.shape[0] // n_groups
    y = torch.cat([linear(og[:, g], wo_a[g * r:(g + 1) * r]) for g in range(n_groups)], dim=-1)
    return linear(y.to(torch.bfloat16), wo_b).to(torch.bfloat16)
