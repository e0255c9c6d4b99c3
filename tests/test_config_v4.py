"""ModelConfig for DeepSeek-V4 (spec §1.4, §12): presets, the derived schedule, the flat V4
config layouts (released keys and HF ``DeepseekV4Config`` keys), validation errors."""

import json

import pytest

from dsv4_decode.config import ModelConfig


def test_v4_flash_schedule():
    cfg = ModelConfig.preset("v4-flash")
    assert cfg.is_v4 and not ModelConfig.preset("v41-flash").is_v4
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.n_routed_experts) == (4096, 43, 256)
    assert cfg.rms_norm_eps == 1e-6 and cfg.weight_block_size == (128, 128)
    assert cfg.compress_ratios == (0, 0) + (4, 128) * 20 + (4, 0)  # + the MTP layer
    modes = [p.mode for p in cfg.layers[:43]]
    assert modes[:5] == ["swa", "swa", "csa", "hca", "csa"] and modes[42] == "csa"
    assert [p.layer for p in cfg.layers if p.hash_moe] == [0, 1, 2]
    assert [p.layer for p in cfg.layers if p.draft] == [43]
    for p in cfg.layers[:43]:
        assert p.kv_source == (p.layer if p.ratio else -1)
        assert p.index_source == (p.layer if p.ratio == 4 else -1)
        assert p.rope == ("main" if p.ratio == 0 else "compress")
        assert not (p.engram or p.candidate_publisher or p.candidate_consumer)


def test_v4_round_trips_and_hf_layouts(tmp_path):
    for name in ("v4-flash", "tiny-v4"):
        cfg = ModelConfig.preset(name)
        (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf()))
        assert ModelConfig.from_hf(tmp_path) == cfg
    # HF DeepseekV4Config spellings: layer_types / mlp_layer_types / partial_rotary_factor /
    # nested rope_parameters
    cfg = ModelConfig.preset("v4-flash")
    hf = {k: v for k, v in cfg.to_hf().items()
          if k not in ("compress_ratios", "num_hash_layers", "qk_rope_head_dim", "rope_scaling")}
    names = {0: "sliding_attention", 4: "compressed_sparse_attention",
             128: "heavily_compressed_attention"}
    hf["layer_types"] = [names[r] for r in cfg.compress_ratios[:43]]
    hf["mlp_layer_types"] = ["hash_moe"] * 3 + ["moe"] * 40
    hf["partial_rotary_factor"] = 0.125
    hf["rope_parameters"] = {"main": {"rope_type": "default", "rope_theta": 10000.0},
                             "compress": dict(cfg.rope_scaling, rope_theta=160000.0)}
    assert ModelConfig.from_hf(hf) == cfg


def test_v4_config_accepted_by_transformers():
    tf = pytest.importorskip("transformers")
    cfg = ModelConfig.preset("v4-flash")
    hcfg = tf.DeepseekV4Config(**cfg.to_hf())
    kinds = {"sliding_attention": 0, "compressed_sparse_attention": 4,
             "heavily_compressed_attention": 128}
    assert tuple(kinds[t] for t in hcfg.layer_types) == cfg.compress_ratios[:43]
    assert hcfg.mlp_layer_types == ["hash_moe"] * 3 + ["moe"] * 40
    assert hcfg.qk_rope_head_dim == 64
    comp = hcfg.rope_parameters["compress"]
    assert comp["rope_type"] == "yarn" and comp["factor"] == 16 and comp["attention_factor"] == 1


@pytest.mark.parametrize("changes,field", [
    (dict(compress_ratios=(0, 2, 128, 4)), "compress_ratios"),
    (dict(kv_source_layer_ids=(1,)), "kv_source_layer_ids"),
    (dict(candidate_source_layer_id=1), "candidate_source_layer_id"),
    (dict(engram_layer_ids=(1,), engram_num_embeddings=(10,)), "engram_layer_ids"),
    (dict(num_hash_layers=5), "num_hash_layers"),
    (dict(model_type="deepseek_v5"), "model_type"),
])
def test_v4_validation_errors(changes, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig.preset("tiny-v4").replace(**changes)


def test_v41_rejects_hash_layers():
    with pytest.raises(ValueError, match="num_hash_layers"):
        ModelConfig.preset("tiny-v41").replace(num_hash_layers=1)
