"""Weights of DeepSeek-V4.1: random init at any config, the Hugging Face checkpoint loader, TP
sharding, parameter counts.

WEIGHT DICT CONTRACT (shared by ``dsv4_decode.weights``, which creates / loads it, and
``dsv4_decode.reference``, which consumes it): a flat ``dict[str, torch.Tensor]`` keyed by the
released checkpoint's own names (spec §2), in the checkpoint's storage formats; the table of
every name, shape, dtype and TP split is ``names.param_table(cfg)``.

- FP8 linear ``X`` (when ``cfg.quantized``): ``X.weight`` float8_e4m3fn [out, in] and
  ``X.scale`` uint8 ue8m0 [ceil(out/b), ceil(in/b)], b = ``cfg.weight_block_size``;
  dequantise with ``formats.dequant_fp8_weight``. Not quantized: ``X.weight`` bf16, no scale.
- Routed expert ``ffn.experts.{e}.w1`` / ``w3``: ``.weight`` uint8 packed [I, D/2] (low nibble
  = even input index) + ``.scale`` uint8 ue8m0 [I, D/cfg.expert_scale_block]; ``w2``: [D, I/2]
  + [D, I/block]; dequantise with ``formats.dequant_mxfp4``. Not quantized: bf16 [out, in].
- Engram tables ``engram.embed.weight`` float8_e4m3fn [rows, dh] + ``engram.embed.scale``
  uint8 ue8m0 [rows, dh/32].
- fp32: exactly ``hc_*_fn/base/scale``, ``attn.attn_sink``, ``ffn.gate.bias``,
  ``ffn.gate.bias_vl``; everything else bf16.
- With ``tp > 1`` the same names hold rank-local shards (spec §10.4, ``shard.py``): wq_b and
  attn_sink by heads, wo_a by o-groups, wo_b by input columns, routed / shared experts by the
  intermediate dim, embed / head by vocab rows, engram tables by hash-column buckets (rank r
  holds global rows ``[O[r*C/tp], O[(r+1)*C/tp])``, ``O = engram_offsets(cfg, k)``);
  everything else replicated.
- ``engram_tables=False`` (random_weights, load) leaves the engram tables out altogether.
- DSpark draft layers (``mtp.*``) are not included.
- A V4 config (``cfg.is_v4``, spec §12) has the V4 layout of ``names_v4``: FP8 blocks of
  ``cfg.weight_block_size`` (128 x 128), per-layer compressors with an fp32 position bias
  ``ape``, the CSA indexers' own compressors, int32 ``ffn.gate.tid2eid`` on hash-routed
  layers, fp32 ``hc_head_fn/base/scale``; ``hf_v4.to_hf_state_dict`` maps it to HF names.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from ..config import ModelConfig
from .loader import load, load_tokenizer, save_checkpoint
from .names import COMPONENTS, Param, engram_offsets, engram_primes, engram_rows, param_table
from .random import random_weights
from .shard import check_tp, local_shape, shard

__all__ = ["COMPONENTS", "Param", "engram_offsets", "engram_primes", "engram_rows",
           "expert_stack", "load", "load_tokenizer", "local_shape", "param_bytes",
           "param_counts", "param_table", "random_weights", "save_checkpoint", "shard"]


def expert_stack(weights: dict[str, torch.Tensor], cfg: ModelConfig, layer: int, proj: str,
                 part: str = "weight") -> torch.Tensor:
    """``[E, ...]`` stack of ``layers.{layer}.ffn.experts.{e}.{proj}.{part}`` for e < E.

    Zero-copy when the per-expert tensors are the consecutive slices of one contiguous stacked
    tensor (``random_weights`` and ``load`` store them so); otherwise a stacked copy (e.g.
    after ``dequantize=True``). proj: ``w1``, ``w2`` or ``w3``; part: ``weight`` or ``scale``.
    """
    names = [f"layers.{layer}.ffn.experts.{e}.{proj}.{part}" for e in range(cfg.n_routed_experts)]
    missing = [n for n in names if n not in weights]
    if missing:
        raise ValueError(f"weights: missing {missing[0]!r} (and {len(missing) - 1} more)")
    ts = [weights[n] for n in names]
    base = ts[0]._base
    if (base is not None and base.is_contiguous() and base.shape[0] == len(ts)
            and all(t._base is base and t.data_ptr() == base[e].data_ptr()
                    and t.shape == base.shape[1:] for e, t in enumerate(ts))):
        return base
    return torch.stack(ts)


def param_counts(cfg: ModelConfig, tp: int = 1) -> dict[str, int]:
    """Logical parameters per component (``names.COMPONENTS``) held by TP rank 0 of ``tp``
    (scales are not parameters; a packed FP4 byte holds two)."""
    check_tp(cfg, tp, 0)
    counts = Counter({c: 0 for c in COMPONENTS})
    for p in param_table(cfg):
        if p.is_scale:
            continue
        n = math.prod(local_shape(p, cfg, tp, 0))
        counts[p.component] += 2 * n if p.fmt == "fp4" else n
    return dict(counts)


def param_bytes(cfg: ModelConfig, tp: int = 1) -> dict[str, int]:
    """Storage bytes per component held by TP rank 0 of ``tp`` (FP8 1 B + 1 B per block,
    MXFP4 0.5 B + 1 B per scale block, bf16 2 B, fp32 4 B; spec §11 conventions)."""
    check_tp(cfg, tp, 0)
    out = Counter({c: 0 for c in COMPONENTS})
    for p in param_table(cfg):
        out[p.component] += math.prod(local_shape(p, cfg, tp, 0)) * p.dtype.itemsize
    return dict(out)

