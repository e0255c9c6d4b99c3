"""V4 weights (spec §12): the table's layout and size, random init, the HF name mapping."""

import pytest
import torch

from dsv4_decode import formats
from dsv4_decode.config import ModelConfig
from dsv4_decode.weights import param_counts, param_table, random_weights
from dsv4_decode.weights.hf_v4 import hf_name, to_hf_state_dict


def test_v4_flash_table_size_and_layout():
    cfg = ModelConfig.preset("v4-flash")
    counts = param_counts(cfg)
    assert 284.0e9 < sum(counts.values()) < 284.5e9  # "284B total parameters"
    table = {p.name: p for p in param_table(cfg)}
    assert table["layers.0.ffn.gate.tid2eid"].shape == (129280, 6)
    assert "layers.3.ffn.gate.bias" in table and "layers.2.ffn.gate.bias" not in table
    assert table["layers.2.attn.compressor.wkv.weight"].shape == (1024, 4096)  # CSA: 2 series
    assert table["layers.3.attn.compressor.ape"].shape == (128, 512)  # HCA
    assert table["layers.2.attn.indexer.compressor.ape"].shape == (4, 256)
    assert "layers.3.attn.indexer.wq_b.weight" not in table  # HCA: no indexer
    assert table["layers.0.attn.wq_b.scale"].shape == (256, 8)  # 128x128 blocks
    assert table["hc_head_fn"].shape == (4, 4 * 4096)
    assert not any("engram" in n or "bias_vl" in n for n in table)


def test_v4_random_weights_and_hf_mapping():
    cfg = ModelConfig.preset("tiny-v4")
    w = random_weights(cfg, seed=1)
    table = param_table(cfg)
    assert sorted(w) == sorted(p.name for p in table)
    assert all(w[p.name].dtype == p.dtype and tuple(w[p.name].shape) == p.shape for p in table)
    t2e = w["layers.0.ffn.gate.tid2eid"]
    assert t2e.min() >= 0 and t2e.max() < cfg.n_routed_experts
    assert all(len(set(row)) == cfg.num_experts_per_tok for row in t2e.tolist())
    assert hf_name("layers.3.attn.indexer.compressor.norm.weight") == \
        "model.layers.3.self_attn.compressor.indexer.kv_norm.weight"
    assert hf_name("layers.2.attn.compressor.ape") == \
        "model.layers.2.self_attn.compressor.position_bias"
    sd = to_hf_state_dict(cfg, w)
    q = formats.dequant_fp8_weight(w["layers.1.attn.wq_a.weight"], w["layers.1.attn.wq_a.scale"],
                                   128)
    assert torch.equal(sd["model.layers.1.self_attn.q_a_proj.weight"], q)
    up = sd["model.layers.2.mlp.experts.gate_up_proj"]
    assert up.shape == (cfg.n_routed_experts, 2 * cfg.moe_intermediate_size, cfg.hidden_size)
    w3 = formats.dequant_mxfp4(w["layers.2.ffn.experts.5.w3.weight"],
                               w["layers.2.ffn.experts.5.w3.scale"])
    assert torch.equal(up[5, cfg.moe_intermediate_size:], w3)
    tf = pytest.importorskip("transformers")
    hcfg = tf.DeepseekV4Config(**cfg.to_hf())
    tf.DeepseekV4ForCausalLM(hcfg).load_state_dict(sd, strict=True)  # every name, every shape
