"""Engram (spec §7): n-gram hash lookup injected into the residual streams at the start of
the engram layers.

Token map: the real map (spec §7.1) is built from the tokenizer; without it we use the
explicit **identity-style map** ``cmp(t) = t mod engram_compressed_vocab_size`` (the identity
when that size is at least ``vocab_size``, as in the test configs). Image-span (DEAD) tokens
do not exist in this text-only reference; look-back stops only at the sequence start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dsv4_decode.config import ModelConfig

from .norm_rope import linear


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


@dataclass(frozen=True)
class EngramLayout:
    """Static hashing data (spec §7.2, §7.3), one row per engram layer (config order).

    primes / offsets ``[L, C]`` int64 (column ``c = (n-2)*heads + h``; offset = sum of the
    layer's earlier primes); multipliers ``[L, max_ngram]`` int64 (odd); rows ``[L]`` = table
    rows = sum of the layer's primes."""

    primes: torch.Tensor
    offsets: torch.Tensor
    multipliers: torch.Tensor
    rows: tuple[int, ...]

    @staticmethod
    def from_config(cfg: ModelConfig) -> EngramLayout:
        primes, seen = [], set()
        for _ in cfg.engram_layer_ids:
            row = []
            for _ in range(cfg.engram_max_ngram_size - 1):
                cur = cfg.engram_vocab_size - 1  # the scan restarts per n-gram size
                for _ in range(cfg.engram_n_heads):
                    cur += 1
                    while not _is_prime(cur) or cur in seen:
                        cur += 1
                    seen.add(cur)
                    row.append(cur)
            primes.append(row)
        p = torch.tensor(primes, dtype=torch.int64).reshape(len(primes), -1)
        offsets = torch.cumsum(p, dim=1) - p
        bound = max(1, (np.iinfo(np.int64).max // cfg.engram_compressed_vocab_size) // 2)
        mult = [np.random.default_rng(10007 * layer).integers(
            0, bound, size=(cfg.engram_max_ngram_size,), dtype=np.int64) * 2 + 1
            for layer in cfg.engram_layer_ids]
        mult_t = torch.tensor(np.array(mult, dtype=np.int64)).reshape(len(primes), -1)
        return EngramLayout(p, offsets, mult_t, tuple(int(r) for r in p.sum(1)))


def compress_tokens(tokens: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """The identity-style token map (module doc): int64 ids -> compressed ids."""
    return tokens.long() % cfg.engram_compressed_vocab_size


def hash_ids(cmp_hist: torch.Tensor, pad: int, layout: EngramLayout, k: int) -> torch.Tensor:
    """Row ids into engram table ``k`` (spec §7.4).

    cmp_hist ``[T, max_ngram]`` int64: compressed ids of positions ``p, p-1, p-2, ...`` of
    each row, ``-1`` where the position is before the sequence start. Returns ``[T, C]``
    int64: ``(R_n mod P_c) + O_c`` with ``R_n`` the XOR of ``v_s * M_s`` for s < n."""
    blocked = torch.cumsum((cmp_hist < 0).long(), dim=1) > 0  # once blocked, stays blocked
    v = torch.where(blocked, torch.full_like(cmp_hist, pad), cmp_hist)
    prod = v * layout.multipliers[k].to(v.device)  # [T, max_ngram]
    heads = layout.primes.shape[1] // (prod.shape[1] - 1)
    primes = layout.primes[k].to(v.device).reshape(-1, heads)  # [n-1, heads]
    rolling, out = prod[:, 0], []
    for i in range(1, prod.shape[1]):
        rolling = torch.bitwise_xor(rolling, prod[:, i])
        out.append(rolling[:, None] % primes[i - 1])
    return torch.cat(out, dim=1) + layout.offsets[k].to(v.device)


def engram_forward(s: torch.Tensor, rows: torch.Tensor, wkv: torch.Tensor, q_weight, k_weight,
                   eps: float) -> torch.Tensor:
    """Engram module (spec §7.5). ``s [T, N, D]`` bf16 streams; ``rows [T, C*dh]`` bf16 (the
    dequantised table rows of the row's hash ids, concatenated by column); ``wkv
    [(N+1)*D, C*dh]``; ``q_weight``, ``k_weight [N, D]``. Returns the new ``s`` bf16:
    ``S_k + sig(signed_sqrt(dot_k)) * V`` with ``dot_k`` the normalised weighted
    stream-key product (per stream, not across streams)."""
    t, n, d = s.shape
    kv = linear(rows, wkv).to(torch.bfloat16)  # [T, (N+1)*D]
    key = kv[:, :n * d].float().reshape(t, n, d)
    val = kv[:, n * d:].float()  # [T, D]
    h = s.float()
    w = q_weight.float() * k_weight.float()  # only the product is used
    rstd = torch.rsqrt(h.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps)
    dot = (h * w * key).sum(-1) * rstd * d ** -0.5  # [T, N]
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
    return (h + gate[:, :, None] * val[:, None, :]).to(torch.bfloat16)
