"""mHC: manifold-constrained hyper-connections (spec §4).

The residual state of a token is ``S [N, D]`` (N streams, stored bf16). Each layer has two
sites (attn, ffn); a site's ``Mix`` gives ``pre [N]``, ``post [N]`` and a doubly-stochastic
``C [N, N]`` (Sinkhorn), all fp32. The ``pre`` a site computes is used by the *next* site's
collapse ("one site ahead", §4.3); the schedule itself lives in ``model.py``.
"""

from __future__ import annotations

import torch

from .norm_rope import linear, rms_norm


def hc_mix(s: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
           iters: int, hc_eps: float, rms_eps: float):
    """Mix coefficients of one site (spec §4.1).

    s: ``[T, N, D]`` bf16 state; fn ``[(2+N)*N, N*D]``, base ``[(2+N)*N]``, scale ``[3]`` fp32.
    Returns ``pre [T, N]``, ``post [T, N]``, ``C [T, N, N]`` (fp32; ``C[j, k]``: row j = source
    stream, column k = destination stream).
    """
    t, n, _ = s.shape
    flat = rms_norm(s.reshape(t, -1), None, rms_eps)  # [T, N*D] fp32, one statistic per token
    m = linear(flat, fn)  # [T, (2+N)*N]
    pre = torch.sigmoid(m[:, :n] * scale[0] + base[:n]) + hc_eps
    post = 2 * torch.sigmoid(m[:, n:2 * n] * scale[1] + base[n:2 * n])
    logits = (m[:, 2 * n:] * scale[2] + base[2 * n:]).reshape(t, n, n)
    c = torch.softmax(logits, dim=-1) + hc_eps
    c = c / (c.sum(dim=-2, keepdim=True) + hc_eps)  # column normalisation first
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + hc_eps)  # rows
        c = c / (c.sum(dim=-2, keepdim=True) + hc_eps)  # columns
    return pre, post, c


def hc_collapse(s: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x = sum_k w_k S_k``: ``s [T, N, D]`` bf16, ``w [T, N]`` fp32 -> bf16 ``[T, D]``."""
    return (w[:, :, None] * s.float()).sum(dim=1).to(torch.bfloat16)


def hc_expand(s: torch.Tensor, y: torch.Tensor, post: torch.Tensor, c: torch.Tensor):
    """``S'_k = post_k y + sum_j C[j, k] S_j`` (fp32, cast to bf16).

    s ``[T, N, D]`` bf16, y ``[T, D]`` bf16 sublayer output, post ``[T, N]``, c ``[T, N, N]``.
    """
    mixed = (c[:, :, :, None] * s.float()[:, :, None, :]).sum(dim=1)  # [T, N(k), D]
    return (post[:, :, None] * y.float()[:, None, :] + mixed).to(torch.bfloat16)
