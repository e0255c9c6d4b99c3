"""PyTorch twin of the MoE op (spec §6): router front, routed FP4 experts, FP8 shared expert.

Plain fp32 math on dequantised weights; the oracle of ``api.route`` / ``api.moe_experts``.
Dimension names: ``T`` rows, ``D`` hidden, ``E`` routed experts, ``I`` expert intermediate
(per TP rank), ``k`` experts per row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4_decode.formats import dequant_fp8_weight, dequant_mxfp4

SWIGLU_LIMIT = 10.0


def route_ref(x: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor,
              top_k: int = 6, route_scale: float = 1.5, valid_rows: torch.Tensor | None = None):
    """Router front (spec §6.1). ``x [T, D]`` bf16, ``gate_weight [E, D]`` bf16,
    ``gate_bias [E]`` fp32 -> (``ids int32 [T, k]``, ``weights fp32 [T, k]``).

    ``sigma = sqrt(softplus(W x))`` in fp32; the ``k`` experts of largest ``sigma + bias``
    (descending, ties to the lower expert id); ``weights = sigma_sel / (sum sigma_sel + 1e-20)
    * route_scale``. Rows ``>= valid_rows[0]`` (if given) get ids -1 and weights 0.
    """
    logits = x.float() @ gate_weight.float().t()  # [T, E]
    sigma = torch.sqrt(F.softplus(logits))
    score = sigma + gate_bias.float()[None, :]
    # Stable descending sort keeps the lower id first among equal scores.
    ids = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = sigma.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * route_scale
    ids = ids.to(torch.int32)
    if valid_rows is not None:
        pad = torch.arange(x.shape[0], device=x.device)[:, None] >= valid_rows.to(x.device)[0]
        ids = torch.where(pad, torch.full_like(ids, -1), ids)
        w = torch.where(pad, torch.zeros_like(w), w)
    return ids, w


def clamped_swiglu(g: torch.Tensor, u: torch.Tensor, limit: float = SWIGLU_LIMIT):
    """Spec §6.2: ``silu(min(g, limit)) * clamp(u, -limit, limit)`` in fp32."""
    return F.silu(g.float().clamp(max=limit)) * u.float().clamp(-limit, limit)


def dequant_routed(w13, w13_scales, w2, w2_scales, e: int):
    """Routed expert ``e`` -> fp32 (``W13 [2I, D]``, ``W2 [D, I]``); the scale block is
    ``D / w13_scales.shape[-1]`` (32 or 16)."""
    d = w13.shape[-1] * 2
    i = w2.shape[-1] * 2
    w13_f = dequant_mxfp4(w13[e], w13_scales[e], block=d // w13_scales.shape[-1])
    w2_f = dequant_mxfp4(w2[e], w2_scales[e], block=i // w2_scales.shape[-1])
    return w13_f, w2_f


def expert_ref(x: torch.Tensor, w13_f: torch.Tensor, w2_f: torch.Tensor) -> torch.Tensor:
    """One clamped-SwiGLU expert in fp32: ``x [t, D]``, ``w13_f [2I, D]`` (W1 rows then W3
    rows), ``w2_f [D, I]`` -> ``[t, D]`` fp32."""
    i = w2_f.shape[1]
    gu = x.float() @ w13_f.t()  # [t, 2I]
    return clamped_swiglu(gu[:, :i], gu[:, i:]) @ w2_f.t()


def moe_experts_ref(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    w13: torch.Tensor, w13_scales: torch.Tensor,
                    w2: torch.Tensor, w2_scales: torch.Tensor, shared=None) -> torch.Tensor:
    """``sum_i weights[:, i] * E_{ids[:, i]}(x) + Shared(x)`` (spec §6.2-§6.3), fp32 math,
    bf16 out ``[T, D]``.

    ``x [T, D]`` bf16; ``ids int32 [T, k]`` (-1 = no expert); ``weights fp32 [T, k]``;
    ``w13 uint8 [E, 2I, D/2]`` + ``w13_scales uint8 [E, 2I, D/b]``; ``w2 uint8 [E, D, I/2]`` +
    ``w2_scales uint8 [E, D, I/b]`` (MXFP4, spec §9); ``shared`` = ``(w13 e4m3 [2I, D],
    scale [2I/32, D/32], w2 e4m3 [D, I], scale [D/32, I/32])`` or None.
    """
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in torch.unique(ids[ids >= 0]).tolist():
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        w13_f, w2_f = dequant_routed(w13, w13_scales, w2, w2_scales, e)
        y = expert_ref(x[rows], w13_f, w2_f)
        out.index_add_(0, rows, weights[rows, slots].float()[:, None] * y)
    if shared is not None:
        s13, s13_scale, s2, s2_scale = shared
        out += expert_ref(x, dequant_fp8_weight(s13, s13_scale), dequant_fp8_weight(s2, s2_scale))
    return out.to(torch.bfloat16)
