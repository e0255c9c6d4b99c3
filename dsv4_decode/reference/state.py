"""Per-request state of the decode step (spec §5.7), in the real record formats.

Record layouts (``formats.encode_*_record`` / ``decode_*_record``; with V4.1's d = 512 and
di = 128 they are exactly the 528-, 288- and 68-byte records; other head dims scale them):

- window record ``[d + d/32]``: e4m3 codes of dims 0..d-1, then one ue8m0 byte per 32 dims;
- compressed record ``[d/2 + d/16]``: packed e2m1 (element 2k in the low nibble), then one
  e4m3 scale byte per 16 dims;
- index-key record ``[di/2 + di/32]``: packed e2m1, then one ue8m0 byte per 32 dims.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4_decode.config import ModelConfig


@dataclass
class RequestState:
    """All the caches of one request (spec §5.7) and its length.

    position: number of tokens consumed (the next row's position).
    window: layer -> uint8 ``[sliding_window, d + d/32]`` ring, slot ``p % sliding_window``
        holds position p (slots of positions never written are zero bytes).
    compressed: KV-source layer -> uint8 ``[n_entries, d/2 + d/16]`` (entry j = group of
        positions ``j*r .. j*r+r-1``, RoPE'd at ``j*r``).
    index_keys: KV-source layer -> uint8 ``[n_entries, di/2 + di/32]``.
    pending: ratio-2 KV-source layer -> fp32 ``[2*d]`` = (c_p, z_p) of an even position whose
        group is still open, or ``None``.
    engram_history: int64 ``[max_ngram - 1]`` compressed ids of positions ``position-1,
        position-2, ...`` (most recent first), ``-1`` before the sequence start.
    """

    position: int
    window: dict[int, torch.Tensor]
    compressed: dict[int, torch.Tensor]
    index_keys: dict[int, torch.Tensor]
    pending: dict[int, torch.Tensor | None]
    engram_history: torch.Tensor

    @staticmethod
    def new(cfg: ModelConfig, device="cpu") -> RequestState:
        """An empty request (position 0) with zeroed window rings and empty caches."""
        d, di = cfg.head_dim, cfg.index_head_dim
        n = cfg.num_hidden_layers
        window = {i: torch.zeros(cfg.sliding_window, d + d // 32, dtype=torch.uint8,
                                 device=device) for i in range(n)}
        kv = [i for i in cfg.kv_source_layer_ids]
        compressed = {i: torch.zeros(0, d // 2 + d // 16, dtype=torch.uint8, device=device)
                      for i in kv}
        keys = {i: torch.zeros(0, di // 2 + di // 32, dtype=torch.uint8, device=device)
                for i in kv}
        pending = {i: None for i in kv if cfg.compress_ratios[i] == 2}
        hist = torch.full((max(cfg.engram_max_ngram_size - 1, 0),), -1, dtype=torch.int64,
                          device=device)
        return RequestState(0, window, compressed, keys, pending, hist)
