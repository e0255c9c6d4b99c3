"""Indexer (spec §5.4): scores the visible compressed entries of a KV source for each query
row, the level-1 candidate blocks (candidate source layer), the level-2 constraint (Reindex
layers) and the top-k. Ties everywhere go to the lower index (stable descending sort), the
project-wide rule (design.md "Exact where exact is possible").
"""

from __future__ import annotations

import torch

from dsv4_decode.formats import fake_quant_mxfp4_32

from .norm_rope import apply_rope, linear

# Keys scored at once (bounds the [Hi, chunk, di] product temporary).
_SCORE_CHUNK = 4096


def index_query(qr, x, wq_b, weights_proj, pos, freqs, n_heads: int):
    """Query side of the indexer for ``T`` rows.

    qr ``[T, Q]`` bf16 (the attention's normalised low-rank query), x ``[T, D]`` bf16.
    Returns ``qI [T, Hi, di]`` fp32 = QAT-MXFP4/32(RoPE(wq_b qr, pos)) per head, and the head
    weights ``w [T, Hi]`` fp32 = bf16(weights_proj x) * Hi^-1/2 * di^-1/2 (both scalings
    folded into w)."""
    t = x.shape[0]
    q = linear(qr, wq_b).to(torch.bfloat16).reshape(t, n_heads, -1)
    q = fake_quant_mxfp4_32(apply_rope(q, pos, freqs)).float()
    w = linear(x, weights_proj).to(torch.bfloat16).float()
    return q, w * (n_heads ** -0.5) * (q.shape[-1] ** -0.5)


def index_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """One row: ``q [Hi, di]``, ``w [Hi]`` fp32, ``keys [n, di]`` fp32 (dequantised index keys)
    -> ``s [n]`` fp32, ``s_j = sum_h w_h ReLU(q_h . k_j)``.

    Elementwise fp32 products summed over the fixed di axis, then over heads: the value of
    ``s_j`` does not depend on n or on how rows are batched (FP4 x FP4 products are exact)."""
    out = []
    for c in range(0, keys.shape[0], _SCORE_CHUNK):
        k = keys[c:c + _SCORE_CHUNK]
        dots = (q[:, None, :] * k[None, :, :]).sum(-1)  # [Hi, n_chunk]
        out.append((w[:, None] * dots.clamp_min(0)).sum(0))
    return torch.cat(out) if out else keys.new_zeros(0)


def candidate_mask(s: torch.Tensor, block: int, n_blocks: int) -> torch.Tensor:
    """Level-1 candidates (spec §5.4): ``s [n]`` -> bool ``[n]`` marking the entries of the
    ``min(n_blocks, ceil(n/block))`` blocks with the largest block maximum; the block holding
    the newest entry (``n-1``) is always kept."""
    n = s.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.bool, device=s.device)
    nb = -(-n // block)
    padded = s.new_full((nb * block,), float("-inf"))
    padded[:n] = s
    bmax = padded.reshape(nb, block).amax(-1)
    bmax[-1] = float("inf")  # pinned newest block
    keep = topk_indices(bmax, n_blocks)
    mask = torch.zeros(nb, dtype=torch.bool, device=s.device)
    mask[keep] = True
    return mask.repeat_interleave(block)[:n]


def topk_indices(s: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``min(k, #finite-or-+inf)`` largest ``s`` (``-inf`` = excluded), ties to
    the lower index; returned in ascending index order (int64)."""
    order = torch.sort(s, descending=True, stable=True).indices
    valid = s[order] > float("-inf")
    sel = order[valid][:k]
    return torch.sort(sel).values
