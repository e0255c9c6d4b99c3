"""DeepSeek-V4 primitives that differ from V4.1 (spec §12); everything else is shared with the
V4.1 modules (``norm_rope``, ``attention``, ``indexer``, ``mhc``, ``moe``).

- ``q_path_v4``: V4.1's Q path plus the per-head *unweighted* RMSNorm after ``wq_b``;
- ``pool_hca`` / ``pool_csa``: one compressed entry from one complete window of ``r`` rows
  (HCA: softmax over the window's ``r`` slots; CSA: over ``2r`` slots, the previous window's
  ``Ca`` series and this window's ``Cb`` series), gate logits already carrying the learned
  position bias ``ape``;
- ``index_query_v4``: V4.1's index query, QAT through ``rotate_fp4`` (Hadamard rotation, then
  MXFP4/32) instead of plain MXFP4/32;
- ``hash_route``: experts from ``tid2eid[token]``, weights from the router's scores;
- ``hc_head_pre``: the learned final collapse weights (``hc_head``);
- the V4 window record: e4m3 nope dims with one ue8m0 scale per 64, bf16 rope dims.

Sources for the QAT points (HF's V4 has none, see docs/reference-notes.md): spec §12 (vLLM's
584-byte record) and third-party ports of the official V4 reference that quote it
(``act_quant(kv[..., :-rd], 64)`` on window and compressed KV; ``rotate_activation`` then
``fp4_act_quant(x, 32)`` on the indexer's keys and queries).

Shapes: ``T`` rows, ``r`` compress ratio, ``w`` latent width (``d`` for the KV compressor,
``di`` for the indexer's), ``N`` residual streams. fp32 math, bf16 activations as in V4.1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4_decode import formats

from .norm_rope import apply_rope, linear, rms_norm

V4_QAT_BLOCK = 64  # FP8 scale block of the V4 window / compressed record (nope dims only)


def q_path_v4(x, wq_a, q_norm, wq_b, pos, freqs, n_heads: int, eps: float):
    """``x [T, D]`` bf16 -> (``qr [T, Q]`` bf16, ``q [T, H, d]`` bf16): V4.1's ``q_path`` with
    each head RMS-normalised *without a weight* after ``wq_b`` (fp32 statistic, bf16 result),
    before RoPE at ``pos``."""
    qr = rms_norm(linear(x, wq_a).to(torch.bfloat16), q_norm, eps)
    q = linear(qr, wq_b).to(torch.bfloat16).reshape(x.shape[0], n_heads, -1)
    q = rms_norm(q, None, eps).to(torch.bfloat16)
    return qr, apply_rope(q, pos, freqs)


def pool_hca(c: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """HCA entry of one complete window: ``c, z [r, w]`` fp32 (values, gate logits + ape)
    -> ``u [w]`` fp32 = sum over the r slots of ``softmax_slots(z) * c``, per channel."""
    return (torch.softmax(z, dim=0) * c).sum(dim=0)


def pool_csa(c: torch.Tensor, z: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
    """CSA entry of one complete window (overlapping windows of width 2r, stride r).

    ``c, z [r, 2w]`` fp32: this window's two series, ``Ca = [..., :w]`` and ``Cb = [..., w:]``
    (gate logits + ape). ``prev [r, 2w]`` = the previous window's ``(Ca | za)`` or ``None`` for
    window 0. Returns ``u [w]`` = softmax over the 2r slots (previous Ca, then this Cb) of the
    gates, times the values, summed per channel."""
    w = c.shape[-1] // 2
    vals, gates = c[:, w:], z[:, w:]
    if prev is not None:
        vals = torch.cat((prev[:, :w], vals))
        gates = torch.cat((prev[:, w:], gates))
    return (torch.softmax(gates, dim=0) * vals).sum(dim=0)


def index_query_v4(qr, x, wq_b, weights_proj, pos, freqs, n_heads: int, qat: bool):
    """V4 indexer query: ``qI [T, Hi, di]`` fp32 = RoPE(bf16(wq_b qr), pos) per head (no
    per-head norm), through ``rotate_fp4`` when ``qat``; ``w [T, Hi]`` fp32 =
    bf16(weights_proj x) * Hi^-1/2 * di^-1/2. (The keys get the same rotation, so without
    quantisation the scores equal the unrotated ones.)"""
    t = x.shape[0]
    q = linear(qr, wq_b).to(torch.bfloat16).reshape(t, n_heads, -1)
    q = apply_rope(q, pos, freqs)
    q = rotate_fp4(q) if qat else q.float()
    w = linear(x, weights_proj).to(torch.bfloat16).float()
    return q, w * (n_heads ** -0.5) * (q.shape[-1] ** -0.5)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """``x [..., n]`` (n a power of two) -> fp32 ``x @ H_n / sqrt(n)``, ``H_n`` the Sylvester
    Hadamard matrix (``H[i, j] = (-1)^popcount(i & j)``, symmetric, orthogonal once scaled):
    the official ``rotate_activation``."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"x: Hadamard rotation needs a power-of-two last dim, got {n}")
    h = torch.ones(1, 1, device=x.device)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)))
    return (x.float() @ h) * n ** -0.5


def rotate_fp4(x: torch.Tensor) -> torch.Tensor:
    """Indexer QAT of V4: bf16 ``x [..., di]`` -> Hadamard rotation (rounded to bf16, as the
    reference rotates bf16 activations) -> MXFP4/32 fake-quant (spec §3.4) -> fp32."""
    return formats.fake_quant_mxfp4_32(hadamard(x).to(torch.bfloat16)).float()


def hash_route(x: torch.Tensor, gate_w: torch.Tensor, experts: torch.Tensor,
               route_scale: float) -> torch.Tensor:
    """Hash-routed layer: ``experts [T, k]`` = ``tid2eid[token]`` (given); returns their
    weights ``[T, k]`` fp32 = ``sigma_sel / (sum sigma_sel + 1e-20) * route_scale`` with
    ``sigma = sqrt(softplus(W x))`` (always renormalised, as HF's hash router)."""
    sigma = torch.sqrt(F.softplus(linear(x, gate_w)))
    w = sigma.gather(1, experts)
    return w / (w.sum(-1, keepdim=True) + 1e-20) * route_scale


def hc_head_pre(s: torch.Tensor, fn, base, scale, hc_eps: float, eps: float) -> torch.Tensor:
    """Final collapse weights ``pre [T, N]`` fp32 = ``sigmoid(scale * (rho * fn s) + base) +
    hc_eps`` (``rho`` the unweighted RMS statistic of the flattened ``s [T, N, D]``)."""
    flat = rms_norm(s.reshape(s.shape[0], -1), None, eps)
    return torch.sigmoid(linear(flat, fn) * scale[0] + base) + hc_eps


# --------------------------------------------------------------------------- window record


def encode_window_record_v4(kv: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """V4 window / compressed-KV record of post-RoPE ``kv [..., d]`` -> uint8
    ``[..., n + 2*rope_dim + n/64]``, ``n = d - rope_dim``: e4m3 codes of the nope dims (one
    ue8m0 scale per 64, amax floor 1e-4, exactly as ``formats.quant_fp8_32`` but 64-wide),
    then the rope dims as bf16 (little-endian), then the n/64 scale bytes (d = 512: 448 + 128
    + 7 = 583 bytes; engines pad it to 584)."""
    n = kv.shape[-1] - rope_dim
    if n % V4_QAT_BLOCK:
        raise ValueError(f"kv: nope dims {n} are not a multiple of {V4_QAT_BLOCK}")
    xb = kv[..., :n].float().reshape(*kv.shape[:-1], n // V4_QAT_BLOCK, V4_QAT_BLOCK)
    amax = xb.abs().amax(-1).clamp_min(1e-4)
    e = formats.ceil_log2(amax * torch.tensor(1.0 / formats.E4M3_MAX, dtype=torch.float32))
    codes = formats.e4m3_encode(xb / torch.ldexp(torch.ones_like(amax), e)[..., None])
    rope = kv[..., n:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat((codes.reshape(*kv.shape[:-1], n), rope, formats.ue8m0_encode(e)), -1)


def decode_window_record_v4(rec: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """Inverse of ``encode_window_record_v4``: fp32 ``[..., d]``."""
    n = (rec.shape[-1] - 2 * rope_dim) * V4_QAT_BLOCK // (V4_QAT_BLOCK + 1)
    v = formats.e4m3_decode(rec[..., :n]).reshape(*rec.shape[:-1], -1, V4_QAT_BLOCK)
    s = formats.ue8m0_decode(rec[..., n + 2 * rope_dim:])
    rope = rec[..., n:n + 2 * rope_dim].clone(memory_format=torch.contiguous_format)
    rope = rope.view(torch.bfloat16).float()
    return torch.cat(((v * s[..., None]).reshape(*rec.shape[:-1], n), rope), -1)
