"""The DeepSeek-V4 weight table (spec §12): checkpoint names, shapes and storage formats.

Same contract and ``Param`` rows as ``names.param_table`` (which dispatches here when
``cfg.is_v4``); only the layout differs from V4.1:

- every compressed layer owns ``attn.compressor.{wkv, wgate}`` (bf16 ``[c*d, D]``, c = 2 for
  CSA's two overlapping series, 1 for HCA), ``attn.compressor.ape`` (fp32 ``[r, c*d]``, the
  learned position bias added to the gate logits) and ``attn.compressor.norm.weight`` ``[d]``;
- every CSA layer owns an indexer: ``attn.indexer.wq_b`` (FP8), ``attn.indexer.weights_proj``
  (bf16 ``[Hi, D]``) and its own overlapping compressor ``attn.indexer.compressor.{wkv, wgate}``
  (bf16 ``[2*di, D]``), ``.ape`` (fp32 ``[4, 2*di]``), ``.norm.weight`` ``[di]``;
- hash-routed layers (the first ``num_hash_layers``) store ``ffn.gate.tid2eid`` (int32
  ``[vocab, top_k]``, distinct expert ids per token) instead of ``ffn.gate.bias``;
- no ``gate.bias_vl``, no engram; top level adds ``hc_head_fn`` (fp32 ``[N, N*D]``),
  ``hc_head_base`` ``[N]``, ``hc_head_scale`` ``[1]`` (the learned final collapse);
- FP8 scale blocks are ``cfg.weight_block_size`` (128 x 128 in the released V4).

The names are the released checkpoint's (HF's ``conversion_mapping`` for ``deepseek_v4`` maps
exactly these); ``weights.hf_v4`` converts a dict of them into HF module names.
"""

from __future__ import annotations

from ..config import ModelConfig
from .names import Param, TableBuilder


def param_table_v4(cfg: ModelConfig) -> list[Param]:
    """Every backbone tensor of the V4 ``cfg`` (whole, tp = 1), embed first, head last."""
    t = TableBuilder(cfg)
    out, plain, fp8 = t.out, t.plain, t.fp8

    def compressor(prefix, ratio, width, dim, comp, kw):
        c = 2 if ratio == 4 else 1  # CSA: two series (Ca | Cb); HCA: one
        plain(prefix + "wkv.weight", (c * width, dim), "bf16", comp, **kw)
        plain(prefix + "wgate.weight", (c * width, dim), "bf16", comp, **kw)
        plain(prefix + "ape", (ratio, c * width), "fp32", comp, **kw)
        plain(prefix + "norm.weight", (width,), "bf16", comp, **kw)

    D, N, d = cfg.hidden_size, cfg.hc_mult, cfg.head_dim
    Q, I = cfg.q_lora_rank, cfg.moe_intermediate_size
    E, Hi, di = cfg.n_routed_experts, cfg.index_n_heads, cfg.index_head_dim
    plain("embed.weight", (cfg.vocab_size, D), "bf16", "embed", "vocab")
    for plan in cfg.layers[: cfg.num_hidden_layers]:
        i = plan.layer
        p = f"layers.{i}."
        kw = {"layer": i}
        a = t.layer_core(cfg, p, kw)
        if plan.ratio:
            compressor(a + "compressor.", plan.ratio, d, D, "compressor", kw)
        if plan.mode == "csa":
            fp8(a + "indexer.wq_b", Hi * di, Q, "indexer", **kw)
            plain(a + "indexer.weights_proj.weight", (Hi, D), "bf16", "indexer", **kw)
            compressor(a + "indexer.compressor.", plan.ratio, di, D, "indexer", kw)
        f = p + "ffn."
        plain(f + "gate.weight", (E, D), "bf16", "router", **kw)
        if plan.hash_moe:
            plain(f + "gate.tid2eid", (cfg.vocab_size, cfg.num_experts_per_tok), "i32",
                  "router", **kw)
        else:
            plain(f + "gate.bias", (E,), "fp32", "router", **kw)
        t.experts(f, E, I, D, i, kw)
    plain("hc_head_fn", (N, N * D), "fp32", "mhc")
    plain("hc_head_base", (N,), "fp32", "mhc")
    plain("hc_head_scale", (1,), "fp32", "mhc")
    plain("norm.weight", (D,), "bf16", "norms")
    plain("head.weight", (cfg.vocab_size, D), "bf16", "head", "vocab")
    return out
