"""PyTorch twin of ``sparse_attn``: the same signature, fp32 math on the dequantised records.

Shapes: ``T`` rows, ``H`` heads, ``D`` head dim, ``R`` rope dims (``cos.shape[1] == R/2``),
``W`` window, ``K`` index-list width, ``N = W + K`` key columns per row.
It gathers every row's keys, masks what is not visible, and runs the softmax with the sink in
the denominator (spec §5.5). ``torch.compile`` of this function is the benchmark baseline.
"""

from __future__ import annotations

import torch

from dsv4_decode import formats


def rope_tables(freqs: torch.Tensor, n_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin`` fp32 ``[n_positions, R/2]`` of angles ``pos * freqs[i]`` (fp32 math, as the
    reference RoPE computes them), for the kernels that take per-position tables."""
    pos = torch.arange(n_positions, dtype=torch.float32, device=freqs.device)
    ang = pos[:, None] * freqs.float()[None, :]
    return ang.cos(), ang.sin()


def window_keys(window_cache, positions, row_slots, window: int):
    """Dequantised window keys ``fp32 [T, W, D]`` and their visibility ``bool [T, W]``.

    Key ``i`` of a row at position ``p`` is position ``p - W + 1 + i`` (visible when >= 0),
    read from ring record ``pos % ring`` of the row's slot."""
    n_slots, ring, rb = window_cache.shape
    d = rb * 32 // 33
    p = positions.long()
    s = row_slots.long()
    kpos = p[:, None] - window + 1 + torch.arange(window, device=p.device)[None, :]  # [T, W]
    valid = (kpos >= 0) & ((s >= 0) & (s < n_slots))[:, None]
    rec = window_cache[s.clamp(0, n_slots - 1)[:, None], kpos.clamp_min(0) % ring]  # [T, W, rb]
    k = formats.dequant_fp8_32(rec[..., :d], rec[..., d:])
    return torch.where(valid[..., None], k, 0.0), valid


def compressed_keys(compressed, block_table, indices, row_slots):
    """Dequantised selected keys ``fp32 [T, K, D]`` and their validity ``bool [T, K]``.

    Entry ``j = indices[t, c]`` of the row's slot is record ``j % page`` of page
    ``block_table[slot, j // page]``; ``j < 0``, ``j >= max_pages * page``, a page id of -1 (or
    outside the pool) and a slot outside the block table are masked."""
    n_pages, page, rb = compressed.shape
    n_bt, max_pages = block_table.shape
    d = rb * 16 // 9
    s = row_slots.long()
    j = indices.long()
    valid = (j >= 0) & (j < max_pages * page) & ((s >= 0) & (s < n_bt))[:, None]
    jc = torch.where(valid, j, 0)
    pg = block_table[s.clamp(0, n_bt - 1)[:, None], jc // page].long()  # [T, K]
    valid = valid & (pg >= 0) & (pg < n_pages)
    rec = compressed[pg.clamp(0, n_pages - 1), jc % page]  # [T, K, rb]
    k = formats.dequant_nvfp4_16(rec[..., : d // 2], rec[..., d // 2:])
    return torch.where(valid[..., None], k, 0.0), valid


def sparse_attn_ref(q: torch.Tensor, window_cache: torch.Tensor, positions: torch.Tensor,
                    row_slots: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                    window: int, sinks: torch.Tensor | None = None,
                    compressed: torch.Tensor | None = None,
                    block_table: torch.Tensor | None = None,
                    indices: torch.Tensor | None = None, softmax_scale: float | None = None,
                    compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reference of ``dsv4_decode.ops.sparse_attn`` (same arguments, contract in ``api.py``).

    ``compute_dtype=torch.bfloat16`` runs the same math with bf16 tensors (PyTorch's own bf16
    version, used to earn test tolerances); the default is fp32. Returns bf16 ``[T, H, D]``.
    """
    t, h, d = q.shape
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    kv, valid = window_keys(window_cache, positions, row_slots, window)  # [T, W, D], [T, W]
    if indices is not None and indices.shape[1] > 0:
        kc, vc = compressed_keys(compressed, block_table, indices, row_slots)
        kv, valid = torch.cat((kv, kc), dim=1), torch.cat((valid, vc), dim=1)
    kv = kv.to(compute_dtype)
    z = torch.einsum("thd,tnd->thn", q.to(compute_dtype), kv) * scale  # [T, H, N]
    z = z.float().masked_fill(~valid[:, None, :], float("-inf"))
    m = z.amax(dim=-1)  # [T, H]
    if sinks is not None:
        m = torch.maximum(m, sinks.float()[None, :])
    m = torch.where(torch.isfinite(m), m, 0.0)  # a row with no key and no sink
    p = torch.exp(z - m[..., None])
    den = p.sum(dim=-1)
    if sinks is not None:
        den = den + torch.exp(sinks.float()[None, :] - m)
    o = torch.einsum("thn,tnd->thd", p.to(compute_dtype), kv).float()
    o = torch.where(den[..., None] > 0, o / den[..., None], 0.0)  # [T, H, D] fp32
    return _inverse_rope(o, positions, cos, sin).to(torch.bfloat16)


def _inverse_rope(o: torch.Tensor, positions, cos, sin) -> torch.Tensor:
    """Rotate the trailing ``R`` dims of ``o [T, H, D]`` (interleaved pairs) by ``-pos * f``.
    Positions outside ``[0, cos.shape[0])`` are left unrotated (the kernel masks the same way)."""
    r2 = cos.shape[1]
    p = positions.long()
    ok = (p >= 0) & (p < cos.shape[0])
    pc = p.clamp(0, cos.shape[0] - 1)
    c = torch.where(ok[:, None], cos[pc].float(), 1.0)[:, None, :]  # [T, 1, R/2]
    s = torch.where(ok[:, None], sin[pc].float(), 0.0)[:, None, :]
    a, b = o[..., -2 * r2::2], o[..., -2 * r2 + 1::2]
    rot = torch.stack((a * c + b * s, b * c - a * s), dim=-1).flatten(-2)
    return torch.cat((o[..., : -2 * r2], rot), dim=-1)
