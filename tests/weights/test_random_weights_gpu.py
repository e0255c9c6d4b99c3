"""random_weights on the GPU: one TP=4 rank of v41-flash (~75 GB) in seconds, and the same
contract guarantees as on the CPU (reproducible, TP slices, no NaN codes)."""

import time

import pytest
import torch
from weights_cases import assert_same_weights, tiny_engram

from dsv4_decode import formats
from dsv4_decode.config import ModelConfig
from dsv4_decode.weights import (
    expert_stack,
    param_bytes,
    param_table,
    random_weights,
    shard,
)
from dsv4_decode.weights import random as wrandom
from dsv4_decode.weights.random import init_stats


@pytest.mark.gpu
@pytest.mark.parametrize("units", ["whole", "split"])
def test_tiny_on_gpu_contract(units, monkeypatch):
    if units == "split":  # every split tensor drawn in 8 units / per engram bucket
        monkeypatch.setattr(wrandom, "_WHOLE_BYTES", 0)
    cfg = tiny_engram()
    full = random_weights(cfg, seed=4, device="cuda")
    assert all(t.is_cuda for t in full.values())
    assert_same_weights(full, random_weights(cfg, seed=4, device="cuda"))
    table = {p.name: p for p in param_table(cfg)}
    for rank in range(2):
        part = random_weights(cfg, seed=4, device="cuda", tp=2, rank=rank)
        assert_same_weights(part, {k: shard(table[k], full[k], cfg, 2, rank) for k in full})


@pytest.mark.gpu
def test_flash_rank_in_seconds():
    """The full v41-flash weights of TP=4 rank 1, without the engram tables."""
    cfg = ModelConfig.preset("v41-flash")
    torch.cuda.empty_cache()  # 75 GB: give back what earlier tests cached
    random_weights(ModelConfig.preset("tiny-v41"), device="cuda")  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    w = random_weights(cfg, seed=0, device="cuda", tp=4, rank=1, engram_tables=False)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    nbytes = sum(t.numel() * t.dtype.itemsize for t in w.values())
    want = param_bytes(cfg, 4)
    print(f"v41-flash TP=4 rank 1: {nbytes / 1e9:.2f} GB in {dt:.2f} s")
    assert nbytes == sum(want.values()) - want["engram_tables"]
    assert dt < 60, f"{dt:.1f} s for {nbytes / 1e9:.1f} GB"
    # spot checks on the real shapes: no NaN codes, dequantized RMS near the target
    table = {p.name: p for p in param_table(cfg)}
    for name in ("layers.5.attn.wq_b.weight", "layers.20.ffn.shared_experts.w2.weight"):
        q = w[name]
        assert not ((q.view(torch.uint8) & 0x7F) == 0x7F).any()
        v = formats.dequant_fp8_weight(q, w[name[:-6] + "scale"], 32)
        rms, target = v.pow(2).mean().sqrt().item(), init_stats(table[name], cfg)[1]
        assert 0.85 < rms / target < 1.15, (name, rms, target)
    stack = expert_stack(w, cfg, 7, "w1")  # the MoE kernels' [E, I/tp, D/2] operand, no copy
    assert stack.shape == (384, 576, 2560) and stack.data_ptr() == w[
        "layers.7.ffn.experts.0.w1.weight"].data_ptr()
    name = "layers.39.ffn.experts.383.w2.weight"
    assert w[name].shape == (5120, 288) and w[name[:-6] + "scale"].shape == (5120, 18)
    v = formats.dequant_mxfp4(w[name], w[name[:-6] + "scale"])
    assert 0.9 < v.pow(2).mean().sqrt().item() / init_stats(table[name], cfg)[1] < 1.1
    del w, v, stack
    torch.cuda.empty_cache()
