"""The weight table: every tensor of a DeepSeek-V4.1 checkpoint, written once (spec §2, §9, §10.4).

``param_table(cfg)`` lists one ``Param`` per stored tensor of the backbone, in the checkpoint's
own names and storage formats (the WEIGHT DICT CONTRACT of ``dsv4_decode.weights``). Random
init, the loader's validation, TP sharding (``shard.py``) and the parameter / byte counts all
read this one table; a new tensor (or the V4 layout) is added here and nowhere else.

Storage formats (``Param.fmt``):

=============== ======================= ===================================================
fmt             dtype                   meaning
=============== ======================= ===================================================
``bf16``        bfloat16                plain tensor
``fp32``        float32                 plain tensor (mHC, attn_sink, router biases)
``fp8``         float8_e4m3fn [out,in]  FP8 linear weight; ``X.scale`` holds its block scales
``fp8_scale``   uint8 ue8m0             ``[ceil(out/b0), ceil(in/b1)]``, b = weight_block_size
``fp4``         uint8 [out, in/2]       routed expert, packed e2m1, low nibble = even input
``fp4_scale``   uint8 ue8m0             ``[out, in/expert_scale_block]``
``rows8``       float8_e4m3fn [rows,dh] engram table rows
``rows8_scale`` uint8 ue8m0 [rows,dh/32] engram row scales, one per 32 channels
``i32``         int32                   V4 ``gate.tid2eid`` (hash routing table)
=============== ======================= ===================================================

With ``cfg.quantized`` False every FP8 / FP4 weight (and the engram tables) is a ``bf16`` tensor
of the logical shape and there are no scale entries.

TP split kinds (``Param.split``; the range math is in ``shard.py``): ``None`` replicated;
``"even"`` the split dim is cut into ``tp`` equal parts; ``"vocab"`` rows cut into
``ceil(V/tp)`` (the last rank zero-padded); ``"engram"`` table rows cut at the bucket
boundaries of the rank's ``C/tp`` hash columns (spec §7.2, §10.4).
DSpark draft layers (``mtp.*``) are not in the table (spec §8.2 is unconfirmed).
A V4 config (``cfg.is_v4``) gets the V4 layout of ``names_v4.param_table_v4``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelConfig

COMPONENTS = ("embed", "attention", "mhc", "norms", "router", "routed_experts", "shared_expert",
              "compressor", "indexer", "engram_tables", "engram_wkv", "head")

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn,
          "fp8_scale": torch.uint8, "fp4": torch.uint8, "fp4_scale": torch.uint8,
          "rows8": torch.float8_e4m3fn, "rows8_scale": torch.uint8, "i32": torch.int32}
SCALE_FORMATS = ("fp8_scale", "fp4_scale", "rows8_scale")
ENGRAM_ROW_BLOCK = 32  # engram table rows: one ue8m0 scale per 32 channels (spec §9.1)


@dataclass(frozen=True)
class Param:
    """One stored tensor.

    name: checkpoint name (``layers.3.attn.wq_b.weight``). shape: whole (tp = 1) storage shape.
    fmt: storage format (module table). component: one of ``COMPONENTS``. logical: the logical
    shape of the values (``[out, in]`` of a quantized matrix and of its scales; = shape for
    plain tensors). split / split_dim: TP split kind and dim; div: logical indices per storage
    index along split_dim (2 for packed FP4 inputs, the block for scales). layer / expert /
    engram: backbone layer, routed expert id and engram-layer index (-1 when not applicable).
    """

    name: str
    shape: tuple[int, ...]
    fmt: str
    component: str
    logical: tuple[int, ...]
    split: str | None = None
    split_dim: int = 0
    div: int = 1
    layer: int = -1
    expert: int = -1
    engram: int = -1

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.fmt]

    @property
    def is_scale(self) -> bool:
        return self.fmt in SCALE_FORMATS

    @property
    def weight_name(self) -> str:
        """For a scale entry: the name of the weight it scales (``X.scale`` -> ``X.weight``)."""
        return self.name[: -len("scale")] + "weight" if self.is_scale else self.name


def stack_key(p: Param) -> str:
    """The routed experts of one layer, projection and part share a key
    (``layers.3.ffn.experts.w1.weight``): they are stored as one stacked ``[E, ...]`` tensor
    whose per-expert views carry the per-expert names. Other tensors: their own name."""
    if p.expert < 0:
        return p.name
    return p.name.replace(f".experts.{p.expert}.", ".experts.")


def engram_primes(cfg: ModelConfig) -> tuple[tuple[int, ...], ...]:
    """Bucket primes per engram layer, in column order ``c = (n-2) * engram_n_heads + h``.

    Spec §7.2: consecutive primes above ``engram_vocab_size - 1``, never reused, layer by layer
    (layer ``k`` takes primes ``24k .. 24k+23`` for V4.1). Raises ValueError when
    ``cfg.engram_num_embeddings`` disagrees with the prime sums.
    """
    c = cfg.engram_columns
    primes = _primes_above(cfg.engram_vocab_size - 1, c * len(cfg.engram_layer_ids))
    out = tuple(tuple(primes[k * c:(k + 1) * c]) for k in range(len(cfg.engram_layer_ids)))
    for k, layer in enumerate(cfg.engram_layer_ids):
        if sum(out[k]) != cfg.engram_num_embeddings[k]:
            raise ValueError(
                f"engram_num_embeddings: layer {layer} has {cfg.engram_num_embeddings[k]} rows "
                f"but its {c} prime buckets above engram_vocab_size - 1 = "
                f"{cfg.engram_vocab_size - 1} sum to {sum(out[k])} (spec §7.2)")
    return out


def engram_offsets(cfg: ModelConfig, k: int) -> list[int]:
    """Row offsets ``O_0 = 0 .. O_C = rows`` of the hash-column buckets of engram layer index
    ``k`` (column ``c`` owns table rows ``[O_c, O_{c+1})``)."""
    out = [0]
    for prime in engram_primes(cfg)[k]:
        out.append(out[-1] + prime)
    return out


def engram_rows(vocab_size: int, columns: int, n_layers: int) -> tuple[int, ...]:
    """Table rows per engram layer for a prime-search start ``vocab_size`` (to build configs)."""
    primes = _primes_above(vocab_size - 1, columns * n_layers)
    return tuple(sum(primes[k * columns:(k + 1) * columns]) for k in range(n_layers))


class TableBuilder:
    """Appends ``Param`` rows in the storage formats of ``cfg`` (shared by the V4.1 and V4
    tables): ``plain`` tensors, ``fp8`` linears (+ block scales) and ``fp4`` routed-expert
    matrices (+ scales); bf16 of the logical shape when ``cfg.quantized`` is False."""

    def __init__(self, cfg: ModelConfig):
        self.q = cfg.quantized
        self.b0, self.b1 = cfg.weight_block_size
        self.blk = cfg.expert_scale_block
        self.out: list[Param] = []

    def plain(self, name, shape, fmt, comp, split=None, dim=0, **kw):
        shape = tuple(shape)
        self.out.append(Param(name, shape, fmt, comp, shape, split, dim, 1, **kw))

    def fp8(self, name, o, i, comp, split=None, dim=0, **kw):
        """FP8 linear ``name`` [o, i] (+ its block scales), or bf16 when not quantized."""
        if not self.q:
            return self.plain(f"{name}.weight", (o, i), "bf16", comp, split, dim, **kw)
        b = (self.b0, self.b1)
        self.out.append(Param(f"{name}.weight", (o, i), "fp8", comp, (o, i), split, dim, 1, **kw))
        self.out.append(Param(f"{name}.scale", (-(-o // b[0]), -(-i // b[1])), "fp8_scale", comp,
                              (o, i), split, dim, b[dim], **kw))

    def fp4(self, name, o, i, dim, **kw):
        """Routed expert matrix [o, i], split along ``dim`` (packed FP4 + scales)."""
        if not self.q:
            return self.plain(f"{name}.weight", (o, i), "bf16", "routed_experts", "even", dim,
                              **kw)
        blk = self.blk
        self.out.append(Param(f"{name}.weight", (o, i // 2), "fp4", "routed_experts", (o, i),
                              "even", dim, 2 if dim else 1, **kw))
        self.out.append(Param(f"{name}.scale", (o, i // blk), "fp4_scale", "routed_experts",
                              (o, i), "even", dim, blk if dim else 1, **kw))


    def experts(self, f: str, E: int, I: int, D: int, layer: int, kw: dict) -> None:
        """The routed MXFP4 experts (W1, W3 [I, D], W2 [D, I]) and the FP8 shared expert of the
        FFN at prefix ``f``: the same in V4.1 and V4."""
        for e in range(E):
            x = f"{f}experts.{e}."
            self.fp4(x + "w1", I, D, 0, layer=layer, expert=e)
            self.fp4(x + "w3", I, D, 0, layer=layer, expert=e)
            self.fp4(x + "w2", D, I, 1, layer=layer, expert=e)
        self.fp8(f + "shared_experts.w1", I, D, "shared_expert", "even", 0, **kw)
        self.fp8(f + "shared_experts.w3", I, D, "shared_expert", "even", 0, **kw)
        self.fp8(f + "shared_experts.w2", D, I, "shared_expert", "even", 1, **kw)

    def layer_core(self, cfg: ModelConfig, p: str, kw: dict) -> str:
        """The tensors every V4.1 / V4 layer has (norms, mHC, the attention projections and
        sink) under prefix ``p``; returns the attention prefix."""
        D, N, H, d = cfg.hidden_size, cfg.hc_mult, cfg.num_attention_heads, cfg.head_dim
        Q, G, R = cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank
        plain, fp8 = self.plain, self.fp8
        plain(p + "attn_norm.weight", (D,), "bf16", "norms", **kw)
        plain(p + "ffn_norm.weight", (D,), "bf16", "norms", **kw)
        for site in ("attn", "ffn"):
            plain(p + f"hc_{site}_fn", ((2 + N) * N, N * D), "fp32", "mhc", **kw)
            plain(p + f"hc_{site}_base", ((2 + N) * N,), "fp32", "mhc", **kw)
            plain(p + f"hc_{site}_scale", (3,), "fp32", "mhc", **kw)
        a = p + "attn."
        fp8(a + "wq_a", Q, D, "attention", **kw)
        plain(a + "q_norm.weight", (Q,), "bf16", "attention", **kw)
        fp8(a + "wq_b", H * d, Q, "attention", "even", 0, **kw)
        fp8(a + "wkv", d, D, "attention", **kw)
        plain(a + "kv_norm.weight", (d,), "bf16", "attention", **kw)
        fp8(a + "wo_a", G * R, (H // G) * d, "attention", "even", 0, **kw)
        fp8(a + "wo_b", D, G * R, "attention", "even", 1, **kw)
        plain(a + "attn_sink", (H,), "fp32", "attention", "even", **kw)
        return a


def param_table(cfg: ModelConfig) -> list[Param]:
    """Every backbone tensor of ``cfg`` (whole, tp = 1), embed first, head last."""
    if cfg.is_v4:
        from .names_v4 import param_table_v4
        return param_table_v4(cfg)
    if cfg.engram_layer_ids:
        engram_primes(cfg)  # validates the table sizes
    q = cfg.quantized
    t = TableBuilder(cfg)
    out, plain, fp8 = t.out, t.plain, t.fp8

    D, N, d = cfg.hidden_size, cfg.hc_mult, cfg.head_dim
    Q, I = cfg.q_lora_rank, cfg.moe_intermediate_size
    E, Hi, di = cfg.n_routed_experts, cfg.index_n_heads, cfg.index_head_dim
    C, dh = cfg.engram_columns, cfg.engram_head_dim
    plain("embed.weight", (cfg.vocab_size, D), "bf16", "embed", "vocab")
    for plan in cfg.layers[: cfg.num_hidden_layers]:
        i = plan.layer
        p = f"layers.{i}."
        kw = {"layer": i}
        if plan.engram:
            k = cfg.engram_layer_ids.index(i)
            rows = cfg.engram_num_embeddings[k]
            ekw = {"layer": i, "engram": k}
            if q:
                plain(p + "engram.embed.weight", (rows, dh), "rows8", "engram_tables", "engram",
                      **ekw)
                plain(p + "engram.embed.scale", (rows, dh // ENGRAM_ROW_BLOCK), "rows8_scale",
                      "engram_tables", "engram", **ekw)
            else:
                plain(p + "engram.embed.weight", (rows, dh), "bf16", "engram_tables", "engram",
                      **ekw)
            fp8(p + "engram.wkv", (N + 1) * D, C * dh, "engram_wkv", **kw)
            plain(p + "engram.q_weight", (N, D), "bf16", "engram_wkv", **kw)
            plain(p + "engram.k_weight", (N, D), "bf16", "engram_wkv", **kw)
        a = t.layer_core(cfg, p, kw)
        if plan.mode == "full":
            plain(a + "compressor.wkv.weight", (d, D), "bf16", "compressor", **kw)
            if plan.ratio == 2:
                plain(a + "compressor.wgate.weight", (d, D), "bf16", "compressor", **kw)
            plain(a + "compressor.norm.weight", (d,), "bf16", "compressor", **kw)
            plain(a + "indexer.wk.weight", (di, d), "bf16", "indexer", **kw)
            plain(a + "indexer.k_norm.weight", (di,), "bf16", "indexer", **kw)
        if plan.mode in ("full", "reindex"):
            fp8(a + "indexer.wq_b", Hi * di, Q, "indexer", **kw)
            plain(a + "indexer.weights_proj.weight", (Hi, D), "bf16", "indexer", **kw)
        f = p + "ffn."
        plain(f + "gate.weight", (E, D), "bf16", "router", **kw)
        plain(f + "gate.bias", (E,), "fp32", "router", **kw)
        plain(f + "gate.bias_vl", (E,), "fp32", "router", **kw)
        t.experts(f, E, I, D, i, kw)
    plain("norm.weight", (D,), "bf16", "norms")
    plain("head.weight", (cfg.vocab_size, D), "bf16", "head", "vocab")
    return out


# --------------------------------------------------------------------------- primes


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24 (fixed prime bases)."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in bases:
        if n % p == 0:
            return n == p
    r, s = 0, n - 1
    while s % 2 == 0:
        r, s = r + 1, s // 2
    for a in bases:
        x = pow(a, s, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _primes_above(start: int, count: int) -> list[int]:
    """The ``count`` smallest primes strictly greater than ``start``."""
    out, n = [], start
    while len(out) < count:
        n += 1
        if _is_prime(n):
            out.append(n)
    return out

