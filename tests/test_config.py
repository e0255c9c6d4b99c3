"""ModelConfig: presets, HF layouts, the derived schedule (spec §1.2-§1.3), TP shapes, errors."""

import json

import pytest

from dsv4_decode.config import ModelConfig


def test_flash_schedule_follows_spec_table():
    cfg = ModelConfig.preset("v41-flash")
    modes = {p.layer: p.mode for p in cfg.layers}
    assert [modes[i] for i in (0, 1, 2, 3, 8, 14, 20, 21, 24, 25, 28, 36, 39)] == [
        "swa", "swa", "full", "reuse", "full", "full", "full", "reuse", "reindex", "reuse",
        "reindex", "reindex", "reuse"]
    l29 = cfg.layers[29]
    assert (l29.kv_source, l29.index_source) == (20, 28)
    assert [p.layer for p in cfg.layers if p.candidate_consumer] == [24, 28, 32, 36]
    assert [p.layer for p in cfg.layers if p.candidate_publisher] == [20]
    assert [p.layer for p in cfg.layers if p.engram] == [1, 14]
    assert [p.layer for p in cfg.layers if p.draft] == [40, 41, 42]
    assert all(p.rope == ("main" if p.ratio == 0 else "compress") for p in cfg.layers)
    assert cfg.layers[13].kv_source == 8 and cfg.layers[19].index_source == 14


def test_tiny_schedule_is_derived():
    cfg = ModelConfig.preset("tiny-v41")
    assert cfg.kv_source_layer_ids == (1, 3) and cfg.index_source_layer_ids == (1, 3)
    assert cfg.candidate_source_layer_id == 3
    assert [p.mode for p in cfg.layers] == ["swa", "full", "reuse", "full", "reuse"]
    assert cfg.dspark_target_layer_ids == (0, 2, 4)


def test_rank_shapes_tp4_match_spec():
    s = ModelConfig.preset("v41-flash").rank_shapes(4)
    assert (s.heads, s.o_groups, s.wo_b_in, s.moe_inter, s.vocab, s.engram_columns) == (
        16, 2, 2048, 576, 32320, 6)
    with pytest.raises(ValueError, match="tp"):
        ModelConfig.preset("v41-flash").rank_shapes(3)
    with pytest.raises(ValueError, match="o_groups"):
        ModelConfig.preset("tiny-v41").rank_shapes(4)


def test_from_hf_nested_released_layout_and_flat(tmp_path):
    cfg = ModelConfig.preset("v41-flash")
    hf = cfg.to_hf()
    assert "text_config" in hf and hf["quantization_config"]["weight_block_size"] == [32, 32]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert ModelConfig.from_hf(tmp_path) == cfg
    flat = dict(hf["text_config"], quantization_config=hf["quantization_config"])
    assert ModelConfig.from_hf(flat) == cfg
    # released key spellings: vLLM's engram pad id, an eos list
    flat2 = dict(flat, engram_pad_token_id=7, eos_token_id=[1, 5])
    flat2.pop("engram_pad_id")
    c2 = ModelConfig.from_hf(flat2)
    assert c2.engram_pad_id == 7 and c2.eos_token_id == 1


@pytest.mark.parametrize("changes,field", [
    (dict(compress_ratios=(0, 2, 2, 1)), "compress_ratios"),  # length disagrees
    (dict(compress_ratios=(0, 2, 2, 3, 1)), "compress_ratios"),  # ratio 3 not served
    (dict(compress_ratios=(0, 2, 2, 2, 1)), "compress_ratios"),  # layer 4's source has ratio 2
    (dict(kv_source_layer_ids=(0, 3)), "kv_source_layer_ids"),  # ratio-0 layer as a source
    (dict(index_source_layer_ids=(3,)), "index_source_layer_ids"),  # KV source 1 not indexed
    (dict(candidate_source_layer_id=2), "candidate_source_layer_id"),
    (dict(o_groups=3), "o_groups"),
    (dict(engram_layer_ids=(1,)), "engram_num_embeddings"),
])
def test_invalid_configs_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig.preset("tiny-v41").replace(**changes)


def test_unknown_preset_and_model_type():
    with pytest.raises(ValueError, match="preset"):
        ModelConfig.preset("nope")
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf({"model_type": "llama"})
