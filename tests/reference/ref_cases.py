"""Test helpers of the reference tests: small configs and a seeded random weight dict that
follows the project's weight contract (checkpoint names and storage formats). Weight scales
keep the activations O(1): linears ~ N(0, 1/in), norms ~ 1, mHC biases ~ N(0, 0.25).
"""

from __future__ import annotations

import torch

from dsv4_decode import formats
from dsv4_decode.config import ModelConfig
from dsv4_decode.reference import EngramLayout


def tiny() -> ModelConfig:
    """The HF tiny config (spec §1.3): 5 layers [0, 2, 2, 1, 1], window 8, no engram."""
    return ModelConfig.preset("tiny-v41")


def tiny_indexer_engram() -> ModelConfig:
    """7 layers [0, 2, 2, 1, 1, 1, 1]: KV sources 1 (r=2) and 3 (r=1, candidate source),
    index sources 1, 3, 5 (5 = Reindex consuming 3's candidate blocks, 6 = Reuse of 5);
    index_topk 2 and 2 candidate blocks of 4 entries, so from 9 visible entries on the
    candidate blocks cut and from 3 on the top-k cuts. Engram layers 1 and 4 (tables of the
    24 smallest primes above 99 each, identity token map)."""
    cfg = tiny().replace(
        num_hidden_layers=7, compress_ratios=(0, 2, 2, 1, 1, 1, 1),
        kv_source_layer_ids=(1, 3), index_source_layer_ids=(1, 3, 5),
        candidate_source_layer_id=3, candidate_topk_blocks=2, candidate_block_size=4,
        index_topk=2, max_position_embeddings=256,
        engram_layer_ids=(1, 4), engram_num_embeddings=(0, 0), engram_vocab_size=100,
        engram_compressed_vocab_size=128, engram_head_dim=32)
    return cfg.replace(engram_num_embeddings=EngramLayout.from_config(cfg).rows)


def record_dims() -> ModelConfig:
    """V4.1 record dims (head_dim 512 with 64 rope dims, index_head_dim 128), tiny otherwise:
    4 layers [0, 2, 1, 1] so both compressor ratios write records (528 / 288 / 68 bytes)."""
    return tiny().replace(
        num_hidden_layers=4, compress_ratios=(0, 2, 1, 1), kv_source_layer_ids=(1, 2),
        index_source_layer_ids=(1, 2), candidate_source_layer_id=2, head_dim=512,
        qk_rope_head_dim=64, index_head_dim=128, num_attention_heads=2, o_groups=1,
        dspark_target_layer_ids=(0,))


def make_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w: dict[str, torch.Tensor] = {}
    b = cfg.weight_block_size[0]

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    def lin(name, out_f, in_f, fmt):
        x = randn(out_f, in_f, std=in_f ** -0.5)
        if fmt == "fp8" and cfg.quantized:
            w[name + ".weight"], w[name + ".scale"] = formats.quant_fp8_weight(x, b)
        elif fmt == "fp4" and cfg.quantized:
            w[name + ".weight"], w[name + ".scale"] = formats.quant_mxfp4_weight(
                x, cfg.expert_scale_block)
        else:
            w[name + ".weight"] = x.to(torch.bfloat16)

    def norm(name, n):
        w[name + ".weight"] = (1 + randn(n, std=0.1)).to(torch.bfloat16)

    d_, n_, h_, hd = cfg.hidden_size, cfg.hc_mult, cfg.num_attention_heads, cfg.head_dim
    q_, gq, r_ = cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank
    e_, i_ = cfg.n_routed_experts, cfg.moe_intermediate_size
    hi, di = cfg.index_n_heads, cfg.index_head_dim
    w["embed.weight"] = randn(cfg.vocab_size, d_).to(torch.bfloat16)
    norm("norm", d_)
    w["head.weight"] = randn(cfg.vocab_size, d_, std=d_ ** -0.5).to(torch.bfloat16)
    layout = EngramLayout.from_config(cfg) if cfg.engram_layer_ids else None
    for i in range(cfg.num_hidden_layers):
        p, plan = f"layers.{i}.", cfg.layers[i]
        norm(p + "attn_norm", d_)
        norm(p + "ffn_norm", d_)
        for site in ("attn", "ffn"):
            w[p + f"hc_{site}_fn"] = randn((2 + n_) * n_, n_ * d_, std=(n_ * d_) ** -0.5)
            w[p + f"hc_{site}_base"] = randn((2 + n_) * n_, std=0.5)
            w[p + f"hc_{site}_scale"] = 1 + randn(3, std=0.1)
        lin(p + "attn.wq_a", q_, d_, "fp8")
        norm(p + "attn.q_norm", q_)
        lin(p + "attn.wq_b", h_ * hd, q_, "fp8")
        lin(p + "attn.wkv", hd, d_, "fp8")
        norm(p + "attn.kv_norm", hd)
        lin(p + "attn.wo_a", gq * r_, h_ // gq * hd, "fp8")
        lin(p + "attn.wo_b", d_, gq * r_, "fp8")
        w[p + "attn.attn_sink"] = randn(h_)
        if plan.mode == "full":
            lin(p + "attn.compressor.wkv", hd, d_, "bf16")
            if plan.ratio == 2:
                lin(p + "attn.compressor.wgate", hd, d_, "bf16")
            norm(p + "attn.compressor.norm", hd)
            lin(p + "attn.indexer.wk", di, hd, "bf16")
            norm(p + "attn.indexer.k_norm", di)
        if plan.mode in ("full", "reindex"):
            lin(p + "attn.indexer.wq_b", hi * di, q_, "fp8")
            lin(p + "attn.indexer.weights_proj", hi, d_, "bf16")
        lin(p + "ffn.gate", e_, d_, "bf16")
        w[p + "ffn.gate.bias"] = randn(e_, std=0.1)
        w[p + "ffn.gate.bias_vl"] = randn(e_, std=0.1)
        for e in range(e_):
            lin(p + f"ffn.experts.{e}.w1", i_, d_, "fp4")
            lin(p + f"ffn.experts.{e}.w3", i_, d_, "fp4")
            lin(p + f"ffn.experts.{e}.w2", d_, i_, "fp4")
        lin(p + "ffn.shared_experts.w1", i_, d_, "fp8")
        lin(p + "ffn.shared_experts.w3", i_, d_, "fp8")
        lin(p + "ffn.shared_experts.w2", d_, i_, "fp8")
        if plan.engram:
            k = cfg.engram_layer_ids.index(i)
            rows, dh, c = layout.rows[k], cfg.engram_head_dim, cfg.engram_columns
            codes, scales = formats.quant_fp8_32(randn(rows, dh))
            w[p + "engram.embed.weight"] = codes.view(torch.float8_e4m3fn)
            w[p + "engram.embed.scale"] = scales
            lin(p + "engram.wkv", (n_ + 1) * d_, c * dh, "fp8")
            w[p + "engram.q_weight"] = (1 + randn(n_, d_, std=0.1)).to(torch.bfloat16)
            w[p + "engram.k_weight"] = (1 + randn(n_, d_, std=0.1)).to(torch.bfloat16)
    return w
