"""KV-source compressor (spec §5.3): pools ``r`` consecutive tokens (r = 1 or 2,
non-overlapping groups) into one latent, and derives from each emitted latent the index key
(QAT-MXFP4/32, 128 dims for V4.1) and the compressed KV entry (QAT-NVFP4/16).
"""

from __future__ import annotations

import torch

from .norm_rope import apply_rope, linear, rms_norm


def compressor_proj(x: torch.Tensor, wkv: torch.Tensor, wgate: torch.Tensor | None):
    """``x [T, D]`` bf16 -> ``c [T, d]`` fp32 and (ratio 2) gate logits ``z [T, d]`` fp32
    (bf16 weights, fp32 GEMV), else ``None``."""
    return linear(x, wkv), (linear(x, wgate) if wgate is not None else None)


def pool_groups(c: torch.Tensor, z: torch.Tensor | None, pos: list[int], ratio: int,
                pending: torch.Tensor | None):
    """Group bookkeeping for one request's rows (consecutive positions ``pos``).

    c, z ``[T, d]`` fp32; ``pending``: fp32 ``[2*d]`` = (c, z) of an even position whose
    group is still open (ratio 2), or ``None``. Returns ``(emitted, pending')`` where
    ``emitted`` is a list of ``(j, u)``: compressed entry index ``j`` (group of positions
    ``j*r .. j*r+r-1``) and its pooled pre-norm latent ``u [d]`` fp32:
    ratio 1: ``u = c_p``; ratio 2 (at odd p): ``u = a_{p-1} c_{p-1} + a_p c_p`` with
    ``a = softmax over the pair of z`` per channel.
    """
    if ratio == 1:
        return [(p, c[i]) for i, p in enumerate(pos)], None
    d = c.shape[-1]
    emitted = []
    for i, p in enumerate(pos):
        if p % 2 == 0:
            pending = torch.cat((c[i], z[i]))
            continue
        if pending is None:
            raise ValueError(f"state: position {p} closes a ratio-2 group but no pending row "
                             f"of position {p - 1} is held")
        cs = torch.stack((pending[:d], c[i]))  # [2, d]
        a = torch.softmax(torch.stack((pending[d:], z[i])), dim=0)
        emitted.append(((p - 1) // 2, (a * cs).sum(dim=0)))
        pending = None
    return emitted, pending


def latent_outputs(u: torch.Tensor, j: int, ratio: int, norm_w, wk, k_norm, freqs, eps: float):
    """From a pooled latent ``u [d]`` fp32 of entry ``j`` (position ``j*ratio``) to the two
    pre-quantisation cache values (spec §5.3):

    - ``latent = RMSNorm_norm(u)`` bf16 (pre-RoPE; normalised in fp32, cast after);
    - index key ``RoPE(RMSNorm_k_norm(wk latent), j*r)`` bf16 ``[di]`` (from the pre-RoPE latent);
    - compressed entry ``RoPE(latent, j*r)`` bf16 ``[d]``.
    Returns (index_key, compressed); the caller quantises them into 68 / 288-byte records.
    """
    latent = rms_norm(u[None], norm_w, eps)  # [1, d] bf16
    p = torch.tensor([j * ratio], device=u.device)
    k = rms_norm(linear(latent, wk).to(torch.bfloat16), k_norm, eps)  # [1, di]
    return apply_rope(k, p, freqs)[0], apply_rope(latent, p, freqs)[0]
