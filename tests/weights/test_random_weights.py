"""random_weights: the contract (names, shapes, dtypes from the table), reproducibility, TP
shards that are slices of the tp = 1 tensors, no NaN codes, realistic magnitudes."""

import math

import pytest
import torch
from weights_cases import assert_same_weights, bits, tiny_engram

from dsv4_decode import formats
from dsv4_decode.config import ModelConfig
from dsv4_decode.weights import param_table, random_weights, shard
from dsv4_decode.weights import random as wrandom
from dsv4_decode.weights.random import init_stats
from dsv4_decode.weights.shard import local_shape


def _configs():
    tiny = ModelConfig.preset("tiny-v41")
    return {"tiny-v41": tiny, "tiny-engram": tiny_engram(),
            "tiny-bf16": tiny.replace(quantized=False),
            "tiny-engram-bf16": tiny_engram(quantized=False)}


@pytest.mark.parametrize("name", list(_configs()))
def test_contract_matches_table(name):
    cfg = _configs()[name]
    w = random_weights(cfg, seed=3)
    table = param_table(cfg)
    assert list(w) == [p.name for p in table] or set(w) == {p.name for p in table}
    for p in table:
        t = w[p.name]
        assert t.dtype == p.dtype and tuple(t.shape) == p.shape, p.name
        if t.dtype.is_floating_point:
            assert torch.isfinite(t.float()).all(), p.name
    if cfg.quantized:
        assert w["layers.0.attn.wq_a.weight"].dtype == torch.float8_e4m3fn
        assert w["layers.0.attn.wq_a.scale"].shape == (1, 2)
        assert w["layers.0.ffn.experts.3.w2.weight"].shape == (64, 32)  # [D, I/2]
    else:
        assert not any(k.endswith(".scale") for k in w)
    plan = cfg.layers
    for i in range(cfg.num_hidden_layers):
        has = f"layers.{i}.attn.compressor.wkv.weight" in w
        assert has == (plan[i].mode == "full"), i
        assert (f"layers.{i}.attn.compressor.wgate.weight" in w) == (has and plan[i].ratio == 2)
        assert (f"layers.{i}.engram.wkv.weight" in w) == plan[i].engram


def test_tiny_schedule_names():
    w = random_weights(ModelConfig.preset("tiny-v41"))
    # kv sources [1, 3] own a compressor and indexer keys; nothing else does
    assert sorted(k for k in w if k.endswith("indexer.wk.weight")) == [
        "layers.1.attn.indexer.wk.weight", "layers.3.attn.indexer.wk.weight"]
    assert "layers.0.attn.indexer.wq_b.weight" not in w
    assert w["layers.1.ffn.gate.bias"].dtype == torch.float32
    assert w["layers.1.hc_ffn_fn"].shape == (8, 128)


def test_seeded_and_reproducible():
    cfg = tiny_engram()
    a, b, c = random_weights(cfg, seed=5), random_weights(cfg, seed=5), random_weights(cfg, 6)
    assert_same_weights(a, b)
    for k in ("layers.0.attn.wq_b.weight", "layers.1.engram.embed.weight", "embed.weight",
              "layers.2.ffn.experts.0.w1.weight"):
        assert not torch.equal(bits(a[k]), bits(c[k])), k
    # experts of one layer differ from each other
    assert not torch.equal(a["layers.0.ffn.experts.0.w1.weight"],
                           a["layers.0.ffn.experts.1.w1.weight"])


@pytest.mark.parametrize("quantized", [True, False])
@pytest.mark.parametrize("units", ["whole", "split"])
def test_tp_shards_are_slices_of_the_whole(quantized, units, monkeypatch):
    if units == "split":  # every split tensor drawn in 8 units / per engram bucket
        monkeypatch.setattr(wrandom, "_WHOLE_BYTES", 0)
    cfg = tiny_engram(quantized=quantized)
    full = random_weights(cfg, seed=2)
    table = {p.name: p for p in param_table(cfg)}
    for rank in range(2):
        part = random_weights(cfg, seed=2, tp=2, rank=rank)
        assert part.keys() == full.keys()
        want = {k: shard(table[k], full[k], cfg, 2, rank) for k in full}
        assert_same_weights(part, want)
        for k, p in table.items():
            assert tuple(part[k].shape) == local_shape(p, cfg, 2, rank)
    # heads / groups / intermediate / vocab / engram buckets really are split
    r0 = random_weights(cfg, seed=2, tp=2, rank=0)
    assert r0["layers.0.attn.attn_sink"].shape == (2,)
    assert r0["head.weight"].shape == (64, 64)
    assert r0["layers.0.ffn.shared_experts.w2.weight"].shape == (64, 32)
    assert r0["layers.1.engram.embed.weight"].shape[0] == 101 + 103  # first 2 of 4 buckets
    assert r0["layers.1.engram.wkv.weight"].shape == full["layers.1.engram.wkv.weight"].shape


def test_unaligned_split_is_an_error():
    with pytest.raises(ValueError, match="wo_a"):
        random_weights(ModelConfig.preset("tiny-v41"), tp=2)  # 16 rows per rank vs 32 blocks
    with pytest.raises(ValueError, match="rank"):
        random_weights(tiny_engram(), tp=2, rank=2)
    with pytest.raises(ValueError, match="tp"):
        random_weights(tiny_engram(), tp=3)


def test_engram_tables_optional():
    cfg = tiny_engram()
    w = random_weights(cfg, engram_tables=False)
    assert not any(k.startswith("layers.1.engram.embed") for k in w)
    assert "layers.1.engram.wkv.weight" in w


def test_codes_and_magnitudes():
    """No NaN e4m3 codes; block scales vary; dequantized RMS close to the documented target."""
    cfg = tiny_engram(hidden_size=1024, moe_intermediate_size=512, q_lora_rank=512)
    w = random_weights(cfg, seed=11)
    table = {p.name: p for p in param_table(cfg)}
    b = cfg.weight_block_size[0]
    for name, p in table.items():
        t = w[name]
        if p.fmt in ("fp8", "rows8"):
            assert not ((t.view(torch.uint8) & 0x7F) == 0x7F).any(), name
        if p.fmt == "fp8" and t.numel() >= 256 * 1024:  # >= 256 blocks: a stable RMS
            v = formats.dequant_fp8_weight(t, w[name[:-6] + "scale"], b)
        elif p.fmt == "fp4" and p.expert == 0:
            v = formats.dequant_mxfp4(t, w[name[:-6] + "scale"], cfg.expert_scale_block)
        elif p.fmt == "rows8":
            v = formats.dequant_fp8_32(t.view(torch.uint8), w[name[:-6] + "scale"])
        else:
            continue
        rms, want = v.pow(2).mean().sqrt().item(), init_stats(p, cfg)[1]
        assert abs(math.log(rms / want)) < math.log(1.2), (name, rms, want)
        assert len(w[name[:-6] + "scale"].unique()) >= 2, name
    norm = w["layers.0.attn_norm.weight"].float()
    assert abs(norm.mean().item() - 1) < 0.05
    base = w["layers.0.hc_attn_base"].view(-1)[2 * cfg.hc_mult:].view(cfg.hc_mult, cfg.hc_mult)
    assert (base.diagonal() > 1.5).all() and (base - torch.diag(base.diagonal())).abs().max() < 1
