"""Tensor-parallel sharding of the weight table (spec §10.4).

Per ``Param.split`` (``names.py``): ``wq_b`` and ``attn_sink`` by heads, ``wo_a`` by o-groups,
``wo_b`` by input columns, the routed and shared experts' intermediate dim (w1/w3 rows, w2
columns), ``embed`` / ``head`` by vocab rows (``ceil(V/tp)`` per rank, the last rank's missing
rows zero-filled), engram tables by the bucket rows of the rank's ``C/tp`` hash columns; all
else replicated. A scale tensor is cut at the same logical indices as its weight, which must
fall on scale-block boundaries: otherwise the shard would need a scale block it shares with
another rank, and ``ValueError`` names the tensor (e.g. ``wo_a`` of ``tiny-v41`` at tp = 2,
16 rows per rank against 32-row blocks).
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from .names import Param, engram_offsets


def check_tp(cfg: ModelConfig, tp: int, rank: int):
    """ValueError unless ``tp`` is a valid split of ``cfg`` and ``0 <= rank < tp``."""
    cfg.rank_shapes(tp)
    if not isinstance(rank, int) or not 0 <= rank < tp:
        raise ValueError(f"rank: must be an int in [0, {tp}), got {rank!r}")


def logical_range(p: Param, cfg: ModelConfig, tp: int, rank: int) -> tuple[int, int]:
    """[start, stop) of this rank along ``p.split_dim`` in logical indices (stop may pass the
    end for the zero-padded vocab split)."""
    n = p.logical[p.split_dim]
    if p.split is None or tp == 1:
        return 0, n
    if p.split == "even":
        if n % tp:
            raise ValueError(f"tp: {p.name} has {n} entries along dim {p.split_dim}, not "
                             f"divisible by tp = {tp}")
        return rank * n // tp, (rank + 1) * n // tp
    if p.split == "vocab":
        per = -(-n // tp)
        return rank * per, (rank + 1) * per
    if p.split == "engram":
        offsets = engram_offsets(cfg, p.engram)
        c = (len(offsets) - 1) // tp
        return offsets[rank * c], offsets[(rank + 1) * c]
    raise ValueError(f"split: unknown split kind {p.split!r} of {p.name}")


def storage_range(p: Param, cfg: ModelConfig, tp: int, rank: int) -> tuple[int, int, int]:
    """(start, stop, local_len) along ``p.split_dim`` in storage indices: rows
    ``[start, stop)`` of the stored tensor, then ``local_len - (stop - start)`` zero rows."""
    lo, hi = logical_range(p, cfg, tp, rank)
    n, full, div = p.logical[p.split_dim], p.shape[p.split_dim], p.div
    if lo % div or (hi < n and hi % div):
        raise ValueError(
            f"tp: {p.name} rank {rank} of {tp} covers logical indices [{lo}, {hi}) along dim "
            f"{p.split_dim}, which cut its {div}-wide storage blocks; this config cannot be "
            f"split {tp} ways with block-scaled weights")
    start, stop = lo // div, min(-(-min(hi, n) // div), full)
    return start, stop, (stop - start) + max(0, hi - n)


def local_shape(p: Param, cfg: ModelConfig, tp: int, rank: int) -> tuple[int, ...]:
    """The storage shape of this rank's shard of ``p``."""
    if p.split is None or tp == 1:
        return p.shape
    shape = list(p.shape)
    shape[p.split_dim] = storage_range(p, cfg, tp, rank)[2]
    return tuple(shape)


def shard(p: Param, full: torch.Tensor, cfg: ModelConfig, tp: int, rank: int) -> torch.Tensor:
    """This rank's shard of the whole tensor ``full`` of ``p`` (a copy; padding rows zero)."""
    if tuple(full.shape) != p.shape:
        raise ValueError(f"full: {p.name} has shape {tuple(full.shape)}, expected {p.shape}")
    if p.split is None or tp == 1:
        return full.clone()
    start, stop, n = storage_range(p, cfg, tp, rank)
    part = full.narrow(p.split_dim, start, stop - start)
    return pad_to(part, p.split_dim, n)


def pad_to(t: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """``t`` extended with zero entries along ``dim`` to length ``n`` (a contiguous copy)."""
    if t.shape[dim] == n:
        return t.clone(memory_format=torch.contiguous_format)
    shape = list(t.shape)
    shape[dim] = n
    out = torch.zeros(shape, dtype=t.dtype, device=t.device)
    out.narrow(dim, 0, t.shape[dim]).copy_(t)
    return out
