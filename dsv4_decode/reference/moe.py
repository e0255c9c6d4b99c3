"""MoE (spec §6): sqrtsoftplus router with a selection-only bias (noaux_tc), top-k,
renormalisation and route scale; clamped-SwiGLU experts; shared expert.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4_decode import formats

from .norm_rope import linear


def dequant_expert(packed: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    """MXFP4 expert weight -> fp32 ``[out, in]``: packed e2m1 ``uint8 [out, in/2]`` (element
    2k in the low nibble), ue8m0 ``uint8 [out, in/block]``. Same values as
    ``formats.dequant_mxfp4``, through a 256-entry byte -> (low, high) table (one gather
    instead of per-nibble arithmetic: experts are dequantised on every call)."""
    codes = torch.arange(256, device=packed.device)
    lut = formats.e2m1_decode(torch.stack((codes & 15, codes >> 4), dim=-1))  # [256, 2]
    out_f = packed.shape[0]
    v = F.embedding(packed.int(), lut).reshape(out_f, scale.shape[1], block)
    v.mul_(formats.ue8m0_decode(scale)[..., None])
    return v.reshape(out_f, -1)


def route(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor, top_k: int,
          route_scale: float, temp: float = 1.0, renorm: bool = True):
    """Router (spec §6.1). ``x [T, D]`` bf16, ``gate_w [E, D]``, ``bias [E]`` fp32.

    Returns ``experts [T, k]`` int64 (chosen by ``sigma + bias``, ties to the lower expert id)
    and ``weights [T, k]`` fp32 from the *unbiased* ``sigma = sqrt(softplus(W x / temp))``:
    ``sigma_sel / (sum sigma_sel + 1e-20) * route_scale``."""
    sigma = torch.sqrt(F.softplus(linear(x, gate_w) / temp))  # [T, E]
    order = torch.sort(sigma + bias, dim=-1, descending=True, stable=True).indices
    experts = order[:, :top_k]
    w = sigma.gather(1, experts)
    if renorm and top_k > 1:  # HF skips the renormalisation for a single expert
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return experts, w * route_scale


def swiglu_expert(x: torch.Tensor, w1, w3, w2, limit: float, weight=None) -> torch.Tensor:
    """Clamped SwiGLU (spec §6.2): ``x [T, D]`` -> fp32 ``[T, D]``.

    ``g = min(W1 x, limit)``, ``u = clamp(W3 x, -limit, limit)``, ``h = silu(g) * u`` (fp32);
    the routing ``weight [T]`` (if given) multiplies ``h`` before ``W2`` as HF does."""
    g = linear(x, w1).clamp(max=limit)
    u = linear(x, w3).clamp(-limit, limit)
    h = F.silu(g) * u
    if weight is not None:
        h = h * weight[:, None]
    return linear(h, w2)
