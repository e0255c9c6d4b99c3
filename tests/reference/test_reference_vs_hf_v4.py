"""The reference's primitives against an implementation nobody here wrote: the HF
``transformers`` DeepSeek-V4 modules that V4.1 shares unchanged (spec §12): mHC mix and
collapse, interleaved RoPE on the trailing slice, attention with a per-head sink, the
sqrtsoftplus noaux_tc router and the clamped SwiGLU. Skipped when ``transformers`` (with
``deepseek_v4``) is not installed. Inputs are fresh random tensors in fp32, so the expected
differences are fp32 rounding (different op order): rtol 1e-5 unless a comment says why."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

hf = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
from transformers import DeepseekV4Config  # noqa: E402

from dsv4_decode.reference import (  # noqa: E402
    apply_rope,
    hc_collapse,
    hc_mix,
    route,
    sparse_attention,
    swiglu_expert,
)

G = torch.Generator().manual_seed(99)


def randn(*shape):
    return torch.randn(*shape, generator=G)


def _cfg(**kw):
    base = dict(hidden_size=64, hc_mult=4, hc_sinkhorn_iters=20, num_local_experts=8,
                num_experts_per_tok=3, scoring_func="sqrtsoftplus", rms_norm_eps=1e-20)
    return DeepseekV4Config(**{**base, **kw})


def test_hc_mix_and_collapse_match_hf():
    cfg = _cfg()
    n, d, t = cfg.hc_mult, cfg.hidden_size, 5
    mod = hf.DeepseekV4HyperConnection(cfg)
    with torch.no_grad():
        mod.fn.copy_(randn(*mod.fn.shape) * 0.1)
        mod.base.copy_(randn(*mod.base.shape) * 0.5)
        mod.scale.copy_(1 + 0.1 * randn(3))
    s = randn(t, n, d).bfloat16()
    with torch.no_grad():
        post_h, comb_h, coll_h = mod(s[None])
    pre, post, c = hc_mix(s, mod.fn.detach(), mod.base.detach(), mod.scale.detach(),
                          cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)
    torch.testing.assert_close(post, post_h[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c, comb_h[0], rtol=1e-5, atol=1e-6)
    # bf16 outputs: identical up to one bf16 ulp of a differently-ordered fp32 sum
    torch.testing.assert_close(hc_collapse(s, pre), coll_h[0], rtol=2**-7, atol=1e-6)


def test_rope_matches_hf():
    rd, t = 16, 6
    freqs = 1.0 / (10000.0 ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    pos = torch.tensor([0, 1, 5, 63, 200, 4095])
    x = randn(t, 3, 48)
    ang = pos[:, None].float() * freqs
    ref = hf.apply_rotary_pos_emb(x[None].transpose(1, 2), ang.cos()[None], ang.sin()[None])
    torch.testing.assert_close(apply_rope(x, pos, freqs), ref.transpose(1, 2)[0],
                               rtol=1e-5, atol=1e-5)


def test_sink_attention_matches_hf():
    h, n, d = 4, 13, 64
    q, kv, sink = randn(h, d).bfloat16(), randn(n, d), randn(h)
    module = SimpleNamespace(sinks=sink, num_key_value_groups=h, training=False)
    out, _ = hf.eager_attention_forward(module, q.float()[None, :, None, :], kv[None, None],
                                        kv[None, None], None, scaling=1 / math.sqrt(d))
    torch.testing.assert_close(sparse_attention(q, kv, sink), out[0, 0], rtol=1e-5, atol=1e-6)


def test_router_matches_hf():
    cfg = _cfg()
    mod = hf.DeepseekV4TopKRouter(cfg)
    with torch.no_grad():
        mod.weight.copy_(randn(*mod.weight.shape) / 8)
        mod.e_score_correction_bias.copy_(randn(cfg.num_local_experts) * 0.3)
    x = randn(7, cfg.hidden_size).bfloat16()
    with torch.no_grad():
        _, w_h, idx_h = mod(x.float())
    experts, w = route(x, mod.weight.detach(), mod.e_score_correction_bias,
                       cfg.num_experts_per_tok, cfg.routed_scaling_factor)
    order_h = idx_h.sort(-1)
    order = experts.sort(-1)
    assert torch.equal(order.values, order_h.values)
    torch.testing.assert_close(w.gather(1, order.indices), w_h.gather(1, order_h.indices),
                               rtol=1e-5, atol=1e-6)


def test_clamped_swiglu_matches_hf():
    cfg = _cfg(intermediate_size=32)
    mod = hf.DeepseekV4Experts(cfg)
    d, i = cfg.hidden_size, cfg.intermediate_size
    w1, w3, w2 = randn(i, d) / 2, randn(i, d) / 2, randn(d, i) / 4  # large: clamps engage
    x = randn(3, d).bfloat16()
    gate_up = x.float() @ torch.cat((w1, w3)).t()
    ref = mod._apply_gate(gate_up) @ w2.t()
    assert (gate_up.abs() > cfg.swiglu_limit).any()
    torch.testing.assert_close(swiglu_expert(x, w1, w3, w2, cfg.swiglu_limit), ref,
                               rtol=1e-5, atol=1e-4)
