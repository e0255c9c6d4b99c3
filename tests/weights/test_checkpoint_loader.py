"""load / save_checkpoint: bit-identical round trips through sharded safetensors + index,
TP slices, dequantisation, the released spellings, and every error naming tensor and file."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from weights_cases import assert_same_weights, tiny_engram

from dsv4_decode import formats
from dsv4_decode.config import ModelConfig
from dsv4_decode.weights import load, param_table, random_weights, save_checkpoint, shard
from dsv4_decode.weights.loader import INDEX_FILE


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """tiny-engram checkpoint in 3 shards: (dir, cfg, whole weights)."""
    cfg = tiny_engram()
    w = random_weights(cfg, seed=7)
    d = save_checkpoint(tmp_path_factory.mktemp("ckpt"), cfg, w, shards=3)
    return d, cfg, w


def _rewrite(src, dst, edit):
    """Copy checkpoint ``src`` to ``dst`` with ``edit(tensors: dict) -> dict`` per shard."""
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    index = json.loads((src / INDEX_FILE).read_text())
    new_map = {}
    for file in sorted(set(index["weight_map"].values())):
        with safe_open(src / file, framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        tensors = edit(tensors)
        save_file(tensors, str(dst / file))
        new_map.update({k: file for k in tensors})
    index["weight_map"] = new_map
    (dst / INDEX_FILE).write_text(json.dumps(index))
    return dst


def test_layout_on_disk(ckpt):
    d, cfg, w = ckpt
    index = json.loads((d / INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert set(index["weight_map"]) == set(w)
    conf = json.loads((d / "config.json").read_text())
    assert conf["text_config"]["hidden_size"] == 64
    assert conf["quantization_config"]["weight_block_size"] == [32, 32]


def test_round_trip_bit_identical(ckpt):
    d, cfg, w = ckpt
    cfg2, w2 = load(d, progress=False)
    assert cfg2 == cfg
    assert_same_weights(w2, w)
    assert w2["layers.0.attn.wq_a.weight"].dtype == torch.float8_e4m3fn
    assert w2["layers.0.ffn.experts.1.w2.scale"].dtype == torch.uint8


def test_tp_shards(ckpt):
    d, cfg, w = ckpt
    table = {p.name: p for p in param_table(cfg)}
    parts = [load(d, tp=2, rank=r, progress=False)[1] for r in range(2)]
    for r, part in enumerate(parts):
        assert_same_weights(part, {k: shard(table[k], w[k], cfg, 2, r) for k in w})
        assert_same_weights(part, random_weights(cfg, seed=7, tp=2, rank=r))
    for k, p in table.items():  # the shards concatenate back to the whole tensors
        if p.split is None:
            assert torch.equal(parts[0][k].view(torch.uint8), parts[1][k].view(torch.uint8))
        else:
            cat = torch.cat([parts[0][k], parts[1][k]], dim=p.split_dim)
            assert torch.equal(cat.view(torch.uint8), w[k].contiguous().view(torch.uint8)), k


def test_dequantize(ckpt):
    d, cfg, w = ckpt
    cfg2, wd = load(d, dequantize=True, progress=False)
    assert not cfg2.quantized and not any(k.endswith(".scale") for k in wd)
    assert {p.name: (p.shape, p.dtype) for p in param_table(cfg2)} == {
        k: (tuple(t.shape), t.dtype) for k, t in wd.items()}
    n = "layers.2.attn.wq_b"
    ref = formats.dequant_fp8_weight(w[n + ".weight"], w[n + ".scale"], 32)
    assert torch.equal(wd[n + ".weight"].float(), ref)  # exact in bf16
    n = "layers.0.ffn.experts.2.w2"
    assert torch.equal(wd[n + ".weight"].float(), formats.dequant_mxfp4(w[n + ".weight"],
                                                                        w[n + ".scale"]))
    n = "layers.1.engram.embed"
    assert torch.equal(wd[n + ".weight"].float(), formats.dequant_fp8_32(
        w[n + ".weight"].view(torch.uint8), w[n + ".scale"]))
    assert torch.equal(wd["head.weight"], w["head.weight"])


def test_released_spellings(ckpt, tmp_path):
    """.weight_scale_inv names, F8_E8M0 / F32 scales, I8 / F4 packed experts, mtp.* skipped."""
    d, cfg, w = ckpt

    def edit(t):
        out = {}
        for k, v in t.items():
            if k.endswith(".scale") and "experts.0." in k:
                v = formats.ue8m0_decode(v)  # F32 powers of two
            elif k.endswith(".scale") and "attn." in k:
                k, v = k[:-len("scale")] + "weight_scale_inv", v.view(torch.float8_e8m0fnu)
            elif k.endswith(".scale"):
                v = v.view(torch.float8_e8m0fnu)
            elif "experts.1." in k and k.endswith(".weight"):
                v = v.view(torch.int8)
            elif "experts.2." in k and k.endswith(".weight"):
                v = v.view(torch.float4_e2m1fn_x2)
            out[k] = v
        return out

    alt = _rewrite(d, tmp_path / "alt", edit)
    with safe_open(alt / "model-00001-of-00003.safetensors", framework="pt") as f:
        stored = list(f.keys())
    assert any(k.endswith("weight_scale_inv") for k in stored)
    # plus a DSpark tensor the loader must skip
    save_file({"mtp.0.attn_norm.weight": torch.ones(64, dtype=torch.bfloat16)},
              str(alt / "mtp.safetensors"))
    index = json.loads((alt / INDEX_FILE).read_text())
    index["weight_map"]["mtp.0.attn_norm.weight"] = "mtp.safetensors"
    (alt / INDEX_FILE).write_text(json.dumps(index))
    for tp, rank in ((1, 0), (2, 1)):
        _, got = load(alt, tp=tp, rank=rank, progress=False)
        table = {p.name: p for p in param_table(cfg)}
        assert_same_weights(got, {k: shard(table[k], w[k], cfg, tp, rank) for k in w})


def test_single_file_without_index(tmp_path):
    cfg = ModelConfig.preset("tiny-v41").replace(quantized=False)
    w = random_weights(cfg, seed=1)
    save_checkpoint(tmp_path, cfg, w)
    (tmp_path / INDEX_FILE).unlink()
    cfg2, w2 = load(tmp_path, progress=False)
    assert not cfg2.quantized
    assert_same_weights(w2, w)


def test_engram_tables_skipped(ckpt):
    d, cfg, w = ckpt
    _, got = load(d, engram_tables=False, progress=False)
    assert set(w) - set(got) == {"layers.1.engram.embed.weight", "layers.1.engram.embed.scale"}


def _corrupt(d, tmp_path, edit):
    return _rewrite(d, tmp_path / "bad", edit)


@pytest.mark.parametrize("case,match", [
    ("missing", r"missing tensor 'layers\.2\.attn\.wkv\.scale'"),
    ("unknown", r"unknown tensor 'layers\.2\.attn\.wkv\.bias' in model-0000\d-of-00003"),
    ("shape", r"'layers\.2\.attn\.wkv\.weight' in model-0000\d-of-00003\.safetensors has shape"),
    ("dtype", r"'layers\.2\.attn\.wkv\.weight' in model-0000\d-of-00003\.safetensors is BF16"),
    ("duplicate", r"'layers\.2\.attn\.wkv\.scale' appears twice"),
    ("scale", r"scale 'layers\.2\.attn\.wkv\.scale' in .* not all powers of two"),
])
def test_errors_name_tensor_and_file(ckpt, tmp_path, case, match):
    d, cfg, w = ckpt
    n = "layers.2.attn.wkv."

    def edit(t):
        if n + "weight" not in t:
            return t
        if case == "missing":
            del t[n + "scale"]
        elif case == "unknown":
            t[n + "bias"] = torch.zeros(3)
        elif case == "shape":
            t[n + "weight"] = t[n + "weight"][:-1].clone()
        elif case == "dtype":
            t[n + "weight"] = t[n + "weight"].to(torch.bfloat16)
        elif case == "duplicate":
            t[n + "weight_scale_inv"] = t[n + "scale"].clone()
        elif case == "scale":
            t[n + "scale"] = formats.ue8m0_decode(t[n + "scale"]) * 1.5
        return t

    bad = _corrupt(d, tmp_path, edit)
    with pytest.raises(ValueError, match=match):
        load(bad, progress=False)


def test_missing_file(ckpt, tmp_path):
    d, cfg, w = ckpt
    bad = _rewrite(d, tmp_path / "bad", lambda t: t)
    (bad / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(ValueError, match=r"mapped to model-00002-of-00003.safetensors, which"):
        load(bad, progress=False)


def test_save_checkpoint_validates(tmp_path):
    cfg = ModelConfig.preset("tiny-v41")
    w = random_weights(cfg)
    with pytest.raises(ValueError, match="missing"):
        save_checkpoint(tmp_path, cfg, {k: v for k, v in w.items() if k != "norm.weight"})
    w["norm.weight"] = w["norm.weight"].float()
    with pytest.raises(ValueError, match="norm.weight"):
        save_checkpoint(tmp_path, cfg, w)


@pytest.mark.gpu
def test_load_to_gpu(ckpt):
    d, cfg, w = ckpt
    _, got = load(d, device="cuda", tp=2, rank=0, progress=False)
    assert all(t.is_cuda for t in got.values())
    want = random_weights(cfg, seed=7, tp=2, rank=0)
    assert_same_weights({k: v.cpu() for k, v in got.items()}, want)


def test_load_tokenizer(tmp_path):
    from dsv4_decode.weights import load_tokenizer

    assert load_tokenizer(tmp_path) is None
    tk = pytest.importorskip("tokenizers")
    Tokenizer, models, pre_tokenizers = tk.Tokenizer, tk.models, tk.pre_tokenizers
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path).encode("a b c").ids == [0, 1, 2]


def test_expert_stacks_are_zero_copy(ckpt):
    from dsv4_decode.weights import expert_stack

    d, cfg, w = ckpt
    _, got = load(d, tp=2, rank=1, progress=False)
    _, deq = load(d, dequantize=True, progress=False)
    for weights in (w, got):  # random_weights and load: views of one stacked tensor
        for proj in ("w1", "w2", "w3"):
            for part in ("weight", "scale"):
                s = expert_stack(weights, cfg, 2, proj, part)
                first = weights[f"layers.2.ffn.experts.0.{proj}.{part}"]
                assert s.data_ptr() == first.data_ptr() and s.shape[0] == cfg.n_routed_experts
                assert torch.equal(s, torch.stack([weights[f"layers.2.ffn.experts.{e}.{proj}."
                                                            f"{part}"] for e in range(4)]))
    s = expert_stack(deq, cfg, 0, "w2")  # dequantized: separate tensors, stacked by copy
    assert s.dtype == torch.bfloat16 and s.shape == (4, 64, 64)
    with pytest.raises(ValueError, match="missing"):
        expert_stack(deq, cfg, 0, "w2", "scale")


def test_v4_layout_round_trip(tmp_path):
    """The V4 layout (128x128 FP8 blocks, MXFP4 experts, hash-routing ``tid2eid``, CSA/HCA
    compressors, the learned ``hc_head``): sharded save + load is bit-identical, including a
    ``tid2eid`` stored as I64 (converted exactly to the contract's int32)."""
    cfg = ModelConfig.preset("tiny-v4")
    w = random_weights(cfg, seed=11)
    assert any(n.endswith("gate.tid2eid") for n in w) and any(n.startswith("hc_head") for n in w)
    d = save_checkpoint(tmp_path / "v4", cfg, w, shards=3)
    cfg2, got = load(d, progress=False)
    assert cfg2 == cfg
    assert_same_weights(got, w)

    def widen(tensors):
        return {k: v.long() if k.endswith("tid2eid") else v for k, v in tensors.items()}

    _rewrite(d, tmp_path / "v4_i64", widen)
    _, got64 = load(tmp_path / "v4_i64", progress=False)
    assert_same_weights(got64, w)
