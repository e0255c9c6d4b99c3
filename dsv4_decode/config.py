"""ModelConfig: the DeepSeek-V4.1 (and V4) text model's hyper-parameters, its derived layer
schedule and its per-tensor-parallel-rank shapes (spec §1, §10.4, §12).

``ModelConfig.from_hf(path_or_dict)`` reads a Hugging Face ``config.json`` in the released V4.1
layout (``text_config`` nested, ``quantization_config`` at the top level), a flat V4.1 text
config, or a flat V4 config (``model_type: deepseek_v4``); ``ModelConfig.preset(name)`` gives
``v41-flash``, ``tiny-v41``, ``v4-flash`` or ``tiny-v4``. Every config is validated on
construction: a field that disagrees with another raises ``ValueError`` naming it.

V4 (spec §12) reuses the same fields: ``compress_ratios`` holds 0 (sliding window), 4 (CSA:
own overlapping compressor and own indexer) or 128 (HCA: own compressor, no indexer);
``kv_source_layer_ids`` = every compressed layer, ``index_source_layer_ids`` = the CSA layers,
no candidate source, no engram; the first ``num_hash_layers`` layers route by ``tid2eid``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLASH_RATIOS = [0, 0] + [2] * 18 + [1] * 20
FLASH_KV_SOURCES = [2, 8, 14, 20]
FLASH_INDEX_SOURCES = [2, 8, 14, 20, 24, 28, 32, 36]
V4 = "deepseek_v4"
V4_FLASH_RATIOS = [0, 0] + [4, 128] * 20 + [4]  # 43 layers (the MTP layer adds a 0)
V4_RATIOS = (0, 4, 128)  # sliding window, CSA, HCA


@dataclass(frozen=True)
class LayerPlan:
    """What one layer does in the decode step (spec §1.2), derived from the config.

    mode: ``"swa"`` window only (ratio 0); ``"full"`` owns a compressor (KV source) and an
    indexer; ``"reindex"`` runs its own indexer over a KV source's index keys; ``"reuse"``
    reuses the latest KV source's compressed KV and the latest index source's top-k.
    V4 only: ``"csa"`` (ratio 4) owns an overlapping compressor and an indexer with its own
    compressor; ``"hca"`` (ratio 128) owns a compressor and attends to every visible entry.
    kv_source / index_source: layer ids (-1 for SWA layers). candidate_publisher: this layer
    publishes the level-1 candidate blocks. candidate_consumer: its top-k is restricted to the
    candidate blocks published by ``candidate_source`` for the same token. rope: ``"main"`` or
    ``"compress"``. engram: an engram module runs at the start of the layer. draft: a DSpark
    draft layer (after the backbone). hash_moe: V4's experts are chosen by ``tid2eid[token]``.
    """

    layer: int
    ratio: int
    mode: str
    kv_source: int
    index_source: int
    candidate_publisher: bool
    candidate_consumer: bool
    rope: str
    engram: bool
    draft: bool
    hash_moe: bool = False


@dataclass(frozen=True)
class RankShapes:
    """Per-TP-rank shapes (spec §10.4: heads, o-groups, expert intermediate and vocab split;
    everything else replicated)."""

    tp: int
    heads: int  # local attention heads (wq_b rows / head_dim, attn_sink)
    o_groups: int  # local output groups (wo_a)
    wo_b_in: int  # wo_b input columns per rank = o_groups * o_lora_rank
    moe_inter: int  # routed and shared expert intermediate per rank
    vocab: int  # embed / head rows per rank (vocab-parallel)
    engram_columns: int  # hash columns looked up per rank (24 / tp)


@dataclass(frozen=True)
class ModelConfig:
    """DeepSeek-V4.1 text-model hyper-parameters (spec §1.1; names as in the HF config).
    ``model_type = "deepseek_v4"`` describes a V4 model with the same fields (module doc)."""

    model_type: str = "deepseek_v41"  # or "deepseek_v4"
    vocab_size: int = 129280  # token ids; 0, 1, 2 special; eos = 1
    hidden_size: int = 5120  # D: width of each residual stream
    num_hidden_layers: int = 40  # backbone layers (DSpark draft layers come after)
    num_attention_heads: int = 64  # H query heads
    num_key_value_heads: int = 1  # one shared latent, K = V
    head_dim: int = 512  # d = nope + rope dims (rope = the last qk_rope_head_dim)
    qk_rope_head_dim: int = 64  # rotated trailing dims, interleaved pairs
    q_lora_rank: int = 1280  # wq_a output / wq_b input
    o_groups: int = 8  # grouped low-rank output projection groups
    o_lora_rank: int = 1024  # per-group wo_a output
    rope_theta: float = 10000.0  # "main" table (ratio-0 layers)
    compress_rope_theta: float = 160000.0  # "compress" table (ratio > 0 layers)
    rope_scaling: dict | None = None  # YaRN of the compress table (no mscale)
    max_position_embeddings: int = 1048576
    sliding_window: int = 128  # window includes the current token
    compress_ratios: tuple[int, ...] = tuple(FLASH_RATIOS + [0, 0, 0])  # per layer (+ drafts: 0)
    kv_source_layer_ids: tuple[int, ...] = tuple(FLASH_KV_SOURCES)  # own a compressor
    index_source_layer_ids: tuple[int, ...] = tuple(FLASH_INDEX_SOURCES)  # run an indexer
    candidate_source_layer_id: int = 20  # publishes level-1 candidate blocks (-1: off)
    candidate_topk_blocks: int = 2048
    candidate_block_size: int = 8  # compressed positions per candidate block
    index_n_heads: int = 32
    index_head_dim: int = 128  # last qk_rope_head_dim dims rotated
    index_topk: int = 512
    n_routed_experts: int = 384
    num_experts_per_tok: int = 6
    moe_intermediate_size: int = 2304  # routed and shared experts
    n_shared_experts: int = 1
    scoring_func: str = "sqrtsoftplus"
    topk_method: str = "noaux_tc"  # selection bias only
    norm_topk_prob: bool = True  # renormalise the selected weights (+1e-20 floor)
    routed_scaling_factor: float = 1.5  # route scale
    gate_temp: float = 1.0
    swiglu_limit: float = 10.0
    hidden_act: str = "silu"
    hc_mult: int = 4  # N residual streams
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-20
    engram_layer_ids: tuple[int, ...] = (1, 14)
    engram_num_embeddings: tuple[int, ...] = (384006168, 384016682)  # table rows per layer
    engram_max_ngram_size: int = 4  # hashes 2..N-grams
    engram_n_heads: int = 8  # per n-gram size
    engram_head_dim: int = 256  # table row width
    engram_vocab_size: int = 16000000  # prime search start
    engram_pad_id: int = 2
    engram_compressed_vocab_size: int = 99092
    num_nextn_predict_layers: int = 3  # DSpark draft layers
    dspark_block_size: int = 5
    dspark_noise_token_id: int = 128799
    dspark_target_layer_ids: tuple[int, ...] = (37, 38, 39)
    dspark_markov_rank: int = 256
    dspark_n_routed_experts: int = 128
    dspark_num_experts_per_tok: int = 3
    tie_word_embeddings: bool = False
    eos_token_id: int = 1
    weight_block_size: tuple[int, int] = (32, 32)  # FP8 weight scale blocks
    expert_scale_block: int = 32  # MXFP4 expert scale block along the input dim
    quantized: bool = True  # FP8/FP4 weights (False: bf16 everywhere, e.g. HF tiny tests)
    num_hash_layers: int = 0  # V4: the first layers route by tid2eid (V4.1: none)
    layers: tuple[LayerPlan, ...] = field(default=(), compare=False, repr=False)

    # ------------------------------------------------------------------ construction

    def __post_init__(self):
        for name in ("compress_ratios", "kv_source_layer_ids", "index_source_layer_ids",
                     "engram_layer_ids", "engram_num_embeddings", "dspark_target_layer_ids",
                     "weight_block_size"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        self._validate()
        derive = self._derive_schedule_v4 if self.is_v4 else self._derive_schedule
        object.__setattr__(self, "layers", tuple(derive()))

    def replace(self, **changes) -> ModelConfig:
        """A copy with ``changes`` applied (re-validated, schedule re-derived)."""
        changes.setdefault("layers", ())
        return dataclasses.replace(self, **changes)

    @property
    def is_v4(self) -> bool:
        """A DeepSeek-V4 model (spec §12) rather than V4.1."""
        return self.model_type == V4

    @staticmethod
    def preset(name: str) -> ModelConfig:
        """``v41-flash`` (the released model, spec §1.1), ``tiny-v41`` (spec §1.3),
        ``v4-flash`` (spec §1.4) or ``tiny-v4`` (the HF cross-check model)."""
        if name == "v41-flash":
            return ModelConfig(rope_scaling=dict(_FLASH_YARN))
        if name == "tiny-v41":
            return _tiny_v41()
        if name == "v4-flash":
            return _v4_flash()
        if name == "tiny-v4":
            return _tiny_v4()
        raise ValueError(f"preset: unknown preset {name!r}; choose from {PRESETS}")

    @staticmethod
    def from_hf(src: str | Path | dict) -> ModelConfig:
        """From a HF ``config.json`` (a folder, a file path, or the parsed dict).

        Accepts the released V4.1 layout (``text_config`` nested, ``quantization_config`` at the
        top) and flat V4.1 text configs. Missing schedule fields are derived as HF does: the
        released schedule for 40 layers, else KV sources = first layer of each same-ratio run,
        index sources = KV sources, candidate source = last KV source.
        """
        if not isinstance(src, dict):
            p = Path(src)
            p = p / "config.json" if p.is_dir() else p
            src = json.loads(p.read_text())
        top = dict(src)
        text = dict(top.get("text_config") or top)
        quant = top.get("quantization_config") or text.get("quantization_config")
        model_type = text.get("model_type", top.get("model_type", "deepseek_v41"))
        if model_type == V4:
            return _from_hf_v4(text, quant)
        if model_type not in ("deepseek_v41", "deepseek_v41_text"):
            raise ValueError(f"model_type: {model_type!r} is not a DeepSeek-V4.1 or V4 config")
        known = {f.name for f in dataclasses.fields(ModelConfig)} - {"layers", "model_type"}
        kw: dict[str, Any] = {k: v for k, v in text.items() if k in known and v is not None}
        if "engram_pad_token_id" in text:  # vLLM's name for the same field
            kw["engram_pad_id"] = text["engram_pad_token_id"]
        if isinstance(kw.get("eos_token_id"), list):
            kw["eos_token_id"] = kw["eos_token_id"][0]
        n = kw.get("num_hidden_layers", 40)
        n_draft = kw.get("num_nextn_predict_layers", 3)
        ratios = list(kw.get("compress_ratios") or _default_ratios(n))
        kw["compress_ratios"] = ratios[: n + n_draft] + [0] * max(0, n + n_draft - len(ratios))
        if len(ratios) < n:
            raise ValueError(f"compress_ratios: {len(ratios)} entries, need at least "
                             f"num_hidden_layers = {n}")
        if len(ratios) > n + n_draft:
            raise ValueError(f"compress_ratios: {len(ratios)} entries, but num_hidden_layers + "
                             f"num_nextn_predict_layers = {n + n_draft}")
        back = kw["compress_ratios"][:n]
        if "kv_source_layer_ids" not in kw:
            kw["kv_source_layer_ids"] = (
                FLASH_KV_SOURCES if back == FLASH_RATIOS[:n] and n == 40
                else [i for i in range(n) if back[i] > 0 and (i == 0 or back[i - 1] != back[i])]
            )
        if "index_source_layer_ids" not in kw:
            kw["index_source_layer_ids"] = (
                FLASH_INDEX_SOURCES if list(kw["kv_source_layer_ids"]) == FLASH_KV_SOURCES
                else list(kw["kv_source_layer_ids"])
            )
        if "candidate_source_layer_id" not in kw:
            kv = list(kw["kv_source_layer_ids"])
            kw["candidate_source_layer_id"] = kv[-1] if kv else -1
        if "dspark_target_layer_ids" not in kw:
            kv = set(kw["kv_source_layer_ids"])
            kw["dspark_target_layer_ids"] = sorted([i for i in range(n) if i not in kv][-3:])
        if "engram_layer_ids" in kw and "engram_num_embeddings" not in kw:
            kw["engram_num_embeddings"] = [0] * len(kw["engram_layer_ids"])
        if "engram_layer_ids" not in kw:
            kw["engram_layer_ids"], kw["engram_num_embeddings"] = [], []
        if quant:
            kw["weight_block_size"] = tuple(quant.get("weight_block_size", (32, 32)))
            kw["quantized"] = True
        else:
            kw["quantized"] = False
        return ModelConfig(**kw)

    def to_hf(self) -> dict:
        """The released V4.1 ``config.json`` layout for this config (inverse of ``from_hf``);
        for V4 the flat layout ``transformers.DeepseekV4Config(**d)`` accepts."""
        if self.is_v4:
            return _to_hf_v4(self)
        text = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("layers", "weight_block_size", "expert_scale_block",
                                  "quantized", "model_type")}
        text = {k: list(v) if isinstance(v, tuple) else v for k, v in text.items()}
        text["model_type"] = "deepseek_v41_text"
        out = {"model_type": "deepseek_v41", "architectures": ["DeepseekV41ForCausalLM"],
               "text_config": text}
        if self.quantized:
            out["quantization_config"] = _quantization_config(self)
        return out

    # ------------------------------------------------------------------ validation

    def _validate(self):
        if self.is_v4:
            return self._validate_v4()
        if self.model_type != "deepseek_v41":
            raise ValueError(f"model_type: {self.model_type!r}; need 'deepseek_v41' or '{V4}'")
        if self.num_hash_layers:
            raise ValueError(f"num_hash_layers: V4.1 has no hash-routed layers, got "
                             f"{self.num_hash_layers}")
        n = self.num_hidden_layers
        self._validate_shared("V4.1", (0, 1, 2))
        back = self.compress_ratios[:n]
        kv, idx = list(self.kv_source_layer_ids), list(self.index_source_layer_ids)
        if kv != sorted(set(kv)) or idx != sorted(set(idx)):
            raise ValueError("kv_source_layer_ids / index_source_layer_ids: must be increasing")
        for name, ids in (("kv_source_layer_ids", kv), ("index_source_layer_ids", idx)):
            bad = [i for i in ids if not 0 <= i < n or back[i] == 0]
            if bad:
                raise ValueError(f"{name}: layers {bad} are out of range or have ratio 0")
        if not set(kv) <= set(idx):
            raise ValueError(f"index_source_layer_ids: must include every KV source {kv}")
        for layer in range(n):
            if back[layer] == 0:
                continue
            ks = [s for s in kv if s <= layer]
            if not ks:
                raise ValueError(f"compress_ratios: layer {layer} has ratio {back[layer]} but no "
                                 f"kv_source_layer_ids entry at or before it")
            if back[ks[-1]] != back[layer]:
                raise ValueError(
                    f"compress_ratios: layer {layer} has ratio {back[layer]} but its KV source "
                    f"{ks[-1]} compresses with ratio {back[ks[-1]]}")
            src = [s for s in idx if s <= layer][-1]
            if [s for s in kv if s <= src][-1] != ks[-1]:
                raise ValueError(f"index_source_layer_ids: layer {layer} would reuse the top-k of "
                                 f"{src}, which indexes another KV source")
        cand = self.candidate_source_layer_id
        if cand >= 0 and cand not in kv:
            raise ValueError(f"candidate_source_layer_id: {cand} must be a KV source {kv}")
        if len(self.engram_num_embeddings) != len(self.engram_layer_ids):
            raise ValueError("engram_num_embeddings: one entry per engram_layer_ids entry")
        if any(not 0 <= i < n for i in self.engram_layer_ids):
            raise ValueError(f"engram_layer_ids: {list(self.engram_layer_ids)} out of range")
        if self.num_nextn_predict_layers and any(
                not 0 <= i < n for i in self.dspark_target_layer_ids):
            raise ValueError(f"dspark_target_layer_ids: {list(self.dspark_target_layer_ids)} out "
                             f"of range")

    def _validate_shared(self, name: str, ratios: tuple[int, ...]):
        """Checks V4.1 and V4 share: lengths, allowed ratios, heads, experts, alignment."""
        n, nd = self.num_hidden_layers, self.num_nextn_predict_layers
        if n <= 0:
            raise ValueError(f"num_hidden_layers: must be positive, got {n}")
        if len(self.compress_ratios) != n + nd:
            raise ValueError(
                f"compress_ratios: {len(self.compress_ratios)} entries, but num_hidden_layers + "
                f"num_nextn_predict_layers = {n + nd}")
        if any(r not in ratios for r in self.compress_ratios):
            raise ValueError(f"compress_ratios: {name} layers have ratios {list(ratios)}, got "
                             f"{sorted(set(self.compress_ratios))}")
        if any(r != 0 for r in self.compress_ratios[n:]):
            raise ValueError("compress_ratios: draft (MTP / DSpark) layers must have ratio 0")
        if self.qk_rope_head_dim % 2 or self.qk_rope_head_dim > self.head_dim:
            raise ValueError(f"qk_rope_head_dim: {self.qk_rope_head_dim} must be even and at most "
                             f"head_dim {self.head_dim}")
        if self.qk_rope_head_dim > self.index_head_dim:
            raise ValueError(f"index_head_dim: {self.index_head_dim} is smaller than the rope "
                             f"slice {self.qk_rope_head_dim}")
        if self.num_attention_heads % self.o_groups:
            raise ValueError(f"o_groups: {self.o_groups} does not divide num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.num_key_value_heads != 1:
            raise ValueError(f"num_key_value_heads: {name} has one shared latent, got "
                             f"{self.num_key_value_heads}")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ValueError("num_experts_per_tok: more than n_routed_experts")
        if self.scoring_func != "sqrtsoftplus":
            raise ValueError(f"scoring_func: only sqrtsoftplus is served, got "
                             f"{self.scoring_func!r}")
        if self.hidden_size % 32 or self.moe_intermediate_size % 32:
            raise ValueError("hidden_size / moe_intermediate_size: must be multiples of 32")

    def _validate_v4(self):
        """V4 (spec §12): ratios 0 / 4 / 128, every compressed layer its own KV source, every
        CSA layer its own index source, no candidate blocks, no engram."""
        n = self.num_hidden_layers
        self._validate_shared("V4", V4_RATIOS)
        back = self.compress_ratios[:n]
        kv = tuple(i for i in range(n) if back[i])
        idx = tuple(i for i in range(n) if back[i] == 4)
        if self.kv_source_layer_ids != kv or self.index_source_layer_ids != idx:
            raise ValueError(f"kv_source_layer_ids / index_source_layer_ids: V4 layers own their "
                             f"compressor / indexer; need {kv} / {idx}, got "
                             f"{self.kv_source_layer_ids} / {self.index_source_layer_ids}")
        if self.candidate_source_layer_id != -1:
            raise ValueError(f"candidate_source_layer_id: V4 has none (-1), got "
                             f"{self.candidate_source_layer_id}")
        if self.engram_layer_ids:
            raise ValueError(f"engram_layer_ids: V4 has no engram, got "
                             f"{list(self.engram_layer_ids)}")
        if not 0 <= self.num_hash_layers <= n:
            raise ValueError(f"num_hash_layers: {self.num_hash_layers} not in [0, {n}]")

    def _derive_schedule_v4(self) -> list[LayerPlan]:
        n = self.num_hidden_layers
        plans = []
        for layer, r in enumerate(self.compress_ratios):
            mode = {0: "swa", 4: "csa", 128: "hca"}[r]
            plans.append(LayerPlan(
                layer, r, mode, layer if r else -1, layer if r == 4 else -1, False, False,
                "compress" if r else "main", False, layer >= n,
                layer < min(self.num_hash_layers, n)))
        return plans

    def _derive_schedule(self) -> list[LayerPlan]:
        n = self.num_hidden_layers
        kv, idx = self.kv_source_layer_ids, self.index_source_layer_ids
        cand = self.candidate_source_layer_id
        plans = []
        for layer, r in enumerate(self.compress_ratios):
            draft = layer >= n
            if r == 0:
                plans.append(LayerPlan(layer, 0, "swa", -1, -1, False, False, "main",
                                       layer in self.engram_layer_ids and not draft, draft))
                continue
            ks = max(s for s in kv if s <= layer)
            isrc = max(s for s in idx if s <= layer)
            mode = "full" if layer in kv else "reindex" if layer in idx else "reuse"
            consumer = mode == "reindex" and cand >= 0 and cand < layer and ks == cand
            plans.append(LayerPlan(layer, r, mode, ks, isrc, layer == cand, consumer,
                                   "compress", layer in self.engram_layer_ids, False))
        return plans

    # ------------------------------------------------------------------ derived shapes

    @property
    def nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def n_draft_layers(self) -> int:
        return self.num_nextn_predict_layers

    @property
    def engram_columns(self) -> int:
        """Hash columns per engram layer: (max n-gram - 1) sizes x heads (24 for V4.1)."""
        return (self.engram_max_ngram_size - 1) * self.engram_n_heads

    def rank_shapes(self, tp: int) -> RankShapes:
        """Per-rank shapes for ``tp`` in {1, 2, 4, 8} (spec §10.4)."""
        if tp not in (1, 2, 4, 8):
            raise ValueError(f"tp: must be 1, 2, 4 or 8, got {tp}")
        for name, value in (("num_attention_heads", self.num_attention_heads),
                            ("o_groups", self.o_groups),
                            ("moe_intermediate_size", self.moe_intermediate_size)):
            if value % tp:
                raise ValueError(f"{name}: {value} is not divisible by tp = {tp}")
        if (self.moe_intermediate_size // tp) % 32:
            raise ValueError(f"moe_intermediate_size: {self.moe_intermediate_size} / tp = {tp} "
                             f"is not a multiple of the 32-wide scale blocks")
        if self.engram_layer_ids and self.engram_columns % tp:
            raise ValueError(f"engram_n_heads: {self.engram_columns} hash columns not divisible "
                             f"by tp = {tp}")
        return RankShapes(
            tp=tp,
            heads=self.num_attention_heads // tp,
            o_groups=self.o_groups // tp,
            wo_b_in=self.o_groups // tp * self.o_lora_rank,
            moe_inter=self.moe_intermediate_size // tp,
            vocab=math.ceil(self.vocab_size / tp),
            engram_columns=self.engram_columns // tp if self.engram_layer_ids else 0,
        )

    def describe(self) -> str:
        """A human-readable summary: the main fields and the layer schedule."""
        lines = [f"{self.model_type}: D={self.hidden_size} layers={self.num_hidden_layers}"
                 f"(+{self.num_nextn_predict_layers} draft) heads={self.num_attention_heads}x"
                 f"{self.head_dim} q_lora={self.q_lora_rank} o={self.o_groups}x{self.o_lora_rank}"
                 f" experts={self.n_routed_experts}/top{self.num_experts_per_tok}x"
                 f"{self.moe_intermediate_size} vocab={self.vocab_size} hc={self.hc_mult}"
                 f" window={self.sliding_window} index={self.index_n_heads}x"
                 f"{self.index_head_dim}/top{self.index_topk}",
                 "layer ratio mode     kv  idx  cand rope     engram"]
        for p in self.layers:
            cand = "pub" if p.candidate_publisher else "use" if p.candidate_consumer else "-"
            lines.append(f"{p.layer:5d} {p.ratio:5d} {p.mode + ('*' if p.draft else ''):8s} "
                         f"{p.kv_source:3d} {p.index_source:4d} {cand:>4s} {p.rope:8s} "
                         f"{'yes' if p.engram else ''}")
        return "\n".join(lines)


_FLASH_YARN = {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
               "original_max_position_embeddings": 65536}


def _default_ratios(n: int) -> list[int]:
    """HF's default schedule: the released one at 40 layers, else the same pattern scaled."""
    if n == len(FLASH_RATIOS):
        return list(FLASH_RATIOS)
    n_slide = min(2, n)
    n_enc = max(0, (n - n_slide + 1) // 2)
    return [0] * n_slide + [2] * n_enc + [1] * max(0, n - n_slide - n_enc)


def _from_hf_v4(text: dict, quant: dict | None) -> ModelConfig:
    """A flat V4 config (released ``config.json`` keys, or HF ``DeepseekV4Config`` keys:
    ``layer_types`` / ``compress_rates``, ``mlp_layer_types``, ``partial_rotary_factor``,
    ``rope_parameters``)."""
    known = {f.name for f in dataclasses.fields(ModelConfig)} - {"layers", "model_type"}
    kw: dict[str, Any] = {k: v for k, v in text.items() if k in known and v is not None}
    if isinstance(kw.get("eos_token_id"), list):
        kw["eos_token_id"] = kw["eos_token_id"][0]
    n = kw.get("num_hidden_layers", 43)
    n_mtp = kw.get("num_nextn_predict_layers", 1)
    ratios = list(kw.get("compress_ratios") or [])
    if not ratios and text.get("layer_types"):
        rates = {"sliding_attention": 0, "compressed_sparse_attention": 4,
                 "heavily_compressed_attention": 128, **(text.get("compress_rates") or {})}
        ratios = [rates[t] for t in text["layer_types"]]
    ratios = ratios or V4_FLASH_RATIOS[:n]
    if len(ratios) < n:
        raise ValueError(f"compress_ratios: {len(ratios)} entries, need at least "
                         f"num_hidden_layers = {n}")
    kw["compress_ratios"] = ratios[:n] + [0] * n_mtp
    if "mlp_layer_types" in text and text["mlp_layer_types"] is not None:
        kw["num_hash_layers"] = sum(t == "hash_moe" for t in text["mlp_layer_types"])
    kw.setdefault("num_hash_layers", 3)
    if "qk_rope_head_dim" not in kw and text.get("partial_rotary_factor"):
        kw["qk_rope_head_dim"] = int(kw.get("head_dim", 512) * text["partial_rotary_factor"])
    rp = text.get("rope_parameters") or {}
    comp = rp.get("compress", rp) if isinstance(rp, dict) else {}
    if "rope_scaling" not in kw and comp.get("rope_type", comp.get("type")) == "yarn":
        kw["rope_scaling"] = {k: comp[k] for k in ("rope_type", "factor", "beta_fast",
                                                    "beta_slow",
                                                    "original_max_position_embeddings")
                              if k in comp}
    kw["kv_source_layer_ids"] = [i for i in range(n) if ratios[i]]
    kw["index_source_layer_ids"] = [i for i in range(n) if ratios[i] == 4]
    kw.update(candidate_source_layer_id=-1, engram_layer_ids=[], engram_num_embeddings=[],
              dspark_target_layer_ids=[])
    kw.setdefault("rms_norm_eps", 1e-6)
    if quant:
        kw["weight_block_size"] = tuple(quant.get("weight_block_size", (128, 128)))
        kw["quantized"] = True
    else:
        kw["quantized"] = False
    return ModelConfig(model_type=V4, **kw)


def _to_hf_v4(cfg: ModelConfig) -> dict:
    """Flat V4 config: the released keys that ``transformers.DeepseekV4Config`` folds in."""
    n = cfg.num_hidden_layers
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_groups",
            "o_lora_rank", "rope_theta", "compress_rope_theta", "max_position_embeddings",
            "sliding_window", "index_n_heads", "index_head_dim", "index_topk",
            "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
            "n_shared_experts", "scoring_func", "norm_topk_prob", "routed_scaling_factor",
            "swiglu_limit", "hidden_act", "hc_mult", "hc_sinkhorn_iters", "hc_eps",
            "rms_norm_eps", "num_nextn_predict_layers", "num_hash_layers", "tie_word_embeddings",
            "eos_token_id")
    out = {k: getattr(cfg, k) for k in keys}
    out.update(model_type=V4, architectures=["DeepseekV4ForCausalLM"],
               compress_ratios=list(cfg.compress_ratios[:n]) + [0] * cfg.num_nextn_predict_layers)
    if cfg.rope_scaling:
        out["rope_scaling"] = dict(cfg.rope_scaling)
    if cfg.quantized:
        out["quantization_config"] = _quantization_config(cfg)
    return out


def _quantization_config(cfg: ModelConfig) -> dict:
    """The released checkpoints' top-level ``quantization_config`` (spec §9.1)."""
    return {"quant_method": "fp8", "activation_scheme": "dynamic",
            "weight_block_size": list(cfg.weight_block_size), "scale_fmt": "ue8m0",
            "expert_dtype": "fp4"}


def _v4_flash() -> ModelConfig:
    """DeepSeek-V4-Flash (spec §1.4): 43 layers [0, 0, (4, 128) x 20, 4], 3 hash layers."""
    return _from_hf_v4({
        "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
        "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024,
        "o_groups": 8, "o_lora_rank": 1024, "n_routed_experts": 256, "num_experts_per_tok": 6,
        "moe_intermediate_size": 2048, "index_n_heads": 64, "index_head_dim": 128,
        "index_topk": 512, "num_hash_layers": 3, "num_nextn_predict_layers": 1,
        "compress_ratios": V4_FLASH_RATIOS + [0], "rope_scaling": dict(_FLASH_YARN),
        "rms_norm_eps": 1e-6}, {"weight_block_size": [128, 128]})


def _tiny_v4() -> ModelConfig:
    """The HF cross-check model: 4 layers [0, 4, 128, 4] (SWA, CSA, HCA, CSA), the first two
    hash-routed, window 16, index_topk 8 over 8 heads, 8 experts top-2, FP8 weights in
    128x128 blocks and MXFP4 experts as released, tiny widths (D 64, 4 heads x 72 = 64 nope
    dims, one V4-record scale block, + 8 rope dims). Prompts over 128 tokens make HCA emit,
    over 35 make the indexer's top-k cut."""
    return _from_hf_v4({
        "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "head_dim": 72, "qk_rope_head_dim": 8, "q_lora_rank": 32, "o_groups": 2,
        "o_lora_rank": 16, "compress_ratios": [0, 4, 128, 4], "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 64, "max_position_embeddings": 512,
        "sliding_window": 16, "hc_mult": 4, "hc_sinkhorn_iters": 20, "index_n_heads": 8,
        "index_head_dim": 32, "index_topk": 8, "num_hash_layers": 2,
        "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-6}, {"weight_block_size": [128, 128]})


def _tiny_v41() -> ModelConfig:
    """The HF test config (spec §1.3): 5 layers [0, 2, 2, 1, 1], no DSpark, no engram."""
    return ModelConfig.from_hf({
        "model_type": "deepseek_v41_text", "vocab_size": 128, "hidden_size": 64,
        "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 32, "o_groups": 2,
        "o_lora_rank": 16, "compress_ratios": [0, 2, 2, 1, 1], "n_routed_experts": 4,
        "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 64,
        "max_position_embeddings": 128, "sliding_window": 8, "hc_mult": 2,
        "hc_sinkhorn_iters": 3, "hc_eps": 1e-6, "index_n_heads": 2, "index_head_dim": 32,
        "index_topk": 2, "candidate_topk_blocks": 4, "candidate_block_size": 4,
        "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-20,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 32]},
    })


PRESETS = ("v41-flash", "tiny-v41", "v4-flash", "tiny-v4")
