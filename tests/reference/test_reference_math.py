"""Unit tests of the reference's math modules against independent formulations of the spec
(spec §3-§7). Inputs are fresh random tensors; fp32 comparisons use tolerances at fp32
rounding level (1e-5 relative) unless a comment says otherwise."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4_decode import formats
from dsv4_decode.config import ModelConfig
from dsv4_decode.reference import (
    EngramLayout,
    apply_rope,
    candidate_mask,
    dequant_expert,
    engram_forward,
    hash_ids,
    hc_collapse,
    hc_expand,
    hc_mix,
    index_scores,
    pool_groups,
    rms_norm,
    rope_freqs,
    route,
    sparse_attention,
    swiglu_expert,
    topk_indices,
)

G = torch.Generator().manual_seed(1234)


def randn(*shape):
    return torch.randn(*shape, generator=G)


def test_sparse_attention_sink_is_an_extra_logit_with_zero_value():
    """softmax over [z_1..z_n, sink] with the sink's value row = 0 (spec §5.5)."""
    h, n, d = 4, 11, 64
    q, kv, sink = randn(h, d).bfloat16(), randn(n, d), randn(h) * 2
    o = sparse_attention(q, kv, sink)
    z = (q.float() @ kv.t()) / math.sqrt(d)
    p = torch.softmax(torch.cat((z, sink[:, None]), dim=1), dim=1)[:, :n]
    torch.testing.assert_close(o, p @ kv, rtol=1e-5, atol=1e-6)
    # a very negative sink leaves plain softmax attention
    o2 = sparse_attention(q, kv, torch.full((h,), -1e4))
    torch.testing.assert_close(o2, torch.softmax(z, 1) @ kv, rtol=1e-5, atol=1e-6)


def test_rope_matches_complex_rotation_and_inverts():
    cfg = ModelConfig.preset("tiny-v41")
    f = rope_freqs(cfg, "compress")
    x, pos = randn(5, 3, 32), torch.tensor([0, 1, 7, 100, 127])
    y = apply_rope(x, pos, f)
    rd = 2 * f.shape[0]
    assert torch.equal(y[..., :-rd], x[..., :-rd])  # leading dims untouched
    c = torch.view_as_complex(x[..., -rd:].reshape(5, 3, rd // 2, 2).contiguous())
    rot = c * torch.polar(torch.ones(5, 1, rd // 2), pos[:, None, None] * f)
    torch.testing.assert_close(y[..., -rd:], torch.view_as_real(rot).flatten(-2))
    torch.testing.assert_close(apply_rope(y, pos, f, inverse=True), x, rtol=1e-5, atol=1e-5)


def test_rope_tables_flash():
    """Main table 10000^(-2i/64); compress = YaRN over 160000: pairs 0..15 unscaled, 25..31
    divided by 16, linear ramp between (spec §3.2: lo = 15, hi = 25)."""
    cfg = ModelConfig.preset("v41-flash")
    i = torch.arange(32, dtype=torch.float64)
    torch.testing.assert_close(rope_freqs(cfg, "main").double(), 10000.0 ** (-2 * i / 64))
    g = 160000.0 ** (-2 * i / 64)
    ramp = ((i - 15) / 10).clamp(0, 1)
    torch.testing.assert_close(rope_freqs(cfg, "compress").double(), g * (1 - ramp) + g / 16 * ramp)


def test_rms_norm():
    x, w = randn(3, 64).bfloat16(), randn(64).bfloat16()
    ref = x.double() * w.double() / x.double().pow(2).mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(rms_norm(x, w, 1e-20).double(), ref, rtol=8e-3, atol=1e-6)


def test_hc_mix_flatten_order_and_sinkhorn():
    """With identical streams, phi s = (sum of phi's N column blocks) e and rho = 1/rms(e)
    (spec §4.3 note) — checks the stream-major flattening; C is doubly stochastic after 20
    Sinkhorn iterations; pre in (0, 1 + 1e-6], post in (0, 2)."""
    n, d = 4, 32
    e = randn(3, d).bfloat16()
    s = e[:, None, :].expand(3, n, d).contiguous()
    fn, base, scale = randn((2 + n) * n, n * d) * 0.1, randn((2 + n) * n) * 0.1, randn(3)
    pre, post, c = hc_mix(s, fn, base, scale, 20, 1e-6, 1e-20)
    ef = e.float()
    m = (ef / ef.pow(2).mean(-1, keepdim=True).sqrt()) @ fn.reshape(-1, n, d).sum(1).t()
    torch.testing.assert_close(pre, torch.sigmoid(m[:, :n] * scale[0] + base[:n]) + 1e-6,
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(post, 2 * torch.sigmoid(m[:, n:2 * n] * scale[1] + base[n:2 * n]),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c.sum(-1), torch.ones(3, n), atol=1e-3, rtol=0)
    torch.testing.assert_close(c.sum(-2), torch.ones(3, n), atol=1e-4, rtol=0)


def test_hc_collapse_expand():
    s, y = randn(2, 3, 16).bfloat16(), randn(2, 16).bfloat16()
    w, post, c = randn(2, 3), randn(2, 3), randn(2, 3, 3)
    x = hc_collapse(s, w)
    torch.testing.assert_close(x, torch.einsum("tk,tkd->td", w, s.float()).bfloat16())
    out = hc_expand(s, y, post, c)
    ref = post[:, :, None] * y.float()[:, None] + torch.einsum("tjk,tjd->tkd", c, s.float())
    torch.testing.assert_close(out, ref.bfloat16())


def test_route_bias_selects_weights_unbiased():
    d, e = 32, 8
    x, gw = randn(4, d).bfloat16(), randn(e, d).bfloat16()
    bias = torch.zeros(e)
    bias[7] = 100.0  # always selected, weight still from the unbiased score
    experts, w = route(x, gw, bias, 3, 1.5)
    sigma = torch.sqrt(torch.nn.functional.softplus(x.float() @ gw.float().t()))
    assert (experts[:, 0] == 7).all()
    top2 = sigma[:, :7].topk(2).indices
    assert torch.equal(experts[:, 1:].sort(-1).values, top2.sort(-1).values)
    sel = sigma.gather(1, experts)
    torch.testing.assert_close(w, sel / sel.sum(-1, keepdim=True) * 1.5)
    # ties go to the lower expert id
    ex, _ = route(torch.zeros(1, d).bfloat16(), gw, torch.zeros(e), 3, 1.5)
    assert ex.tolist() == [[0, 1, 2]]


def test_swiglu_expert_clamps():
    d, i = 32, 16
    x = randn(2, d).bfloat16() * 20
    w1, w3, w2 = randn(i, d), randn(i, d), randn(d, i)
    g = (x.float() @ w1.t()).clamp(max=10.0)
    u = (x.float() @ w3.t()).clamp(-10, 10)
    ref = (torch.nn.functional.silu(g) * u * 0.5) @ w2.t()
    out = swiglu_expert(x, w1, w3, w2, 10.0, torch.full((2,), 0.5))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3)


def test_index_scores_and_topk():
    hi, di, n = 2, 32, 40
    q = formats.fake_quant_mxfp4_32(randn(hi, di))
    k = formats.fake_quant_mxfp4_32(randn(n, di))
    w = randn(hi)
    s = index_scores(q, w, k)
    ref = sum(w[h] * torch.relu(k @ q[h]) for h in range(hi))
    torch.testing.assert_close(s, ref, rtol=1e-5, atol=1e-6)
    # ties (ReLU zeros) go to the lower index; -inf is never selected
    t = torch.tensor([0.0, 3.0, 0.0, float("-inf"), 0.0, 3.0])
    assert topk_indices(t, 3).tolist() == [0, 1, 5]
    assert topk_indices(t, 10).tolist() == [0, 1, 2, 4, 5]


def test_candidate_mask_pins_newest_block():
    s = torch.tensor([5.0, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 0, 0])  # blocks of 4: max 5, 9, 1, 0
    m = candidate_mask(s, 4, 2)  # newest block (entries 12, 13) pinned + best other (block 1)
    assert m.tolist() == [False] * 4 + [True] * 4 + [False] * 4 + [True] * 2
    assert candidate_mask(s, 4, 8).all()
    assert candidate_mask(s[:0], 4, 2).numel() == 0


def test_pool_groups_ratio2_and_ratio1():
    d = 8
    c, z = randn(5, d), randn(5, d)
    pend = torch.cat((randn(d), randn(d)))  # the open group of position 9
    emitted, pending = pool_groups(c, z, [10, 11, 12, 13, 14], 2, None)
    assert [j for j, _ in emitted] == [5, 6] and torch.equal(pending, torch.cat((c[4], z[4])))
    a = torch.softmax(torch.stack((z[0], z[1])), 0)
    torch.testing.assert_close(emitted[0][1], a[0] * c[0] + a[1] * c[1])
    emitted, pending = pool_groups(c[:1], z[:1], [10], 2, None)
    assert emitted == [] and pending is not None
    emitted, _ = pool_groups(c[1:2], z[1:2], [10], 2, pend)  # even: replaces nothing emitted
    assert emitted == []
    with pytest.raises(ValueError, match="pending"):
        pool_groups(c[:1], z[:1], [11], 2, None)
    emitted, pending = pool_groups(c[:2], None, [3, 4], 1, None)
    assert [j for j, _ in emitted] == [3, 4] and pending is None


def test_engram_layout_flash_primes():
    """V4.1-Flash: the 24 primes of layer 1 and the next 24 of layer 14 sum to the released
    table sizes (spec §7.2); multipliers are odd and < 2^63 / compressed vocab."""
    layout = EngramLayout.from_config(ModelConfig.preset("v41-flash"))
    assert layout.rows == (384006168, 384016682)
    assert layout.primes.min() > 15999999
    assert (layout.multipliers % 2 == 1).all()
    assert (layout.multipliers < (2**63 - 1) // 99092).all()
    assert torch.equal(layout.offsets[:, 0], torch.zeros(2, dtype=torch.int64))


def test_hash_ids_match_python_ints():
    cfg = ModelConfig.preset("v41-flash")
    layout = EngramLayout.from_config(cfg)
    hist = torch.tensor([[17, 99091, 5, 0], [3, 8, -1, -1]])  # row 2 at position 1
    ids = hash_ids(hist, 2, layout, 1)
    for r in range(2):
        v, blocked = [], False
        for x in hist[r].tolist():
            blocked = blocked or x < 0
            v.append(2 if blocked else x)
        m = layout.multipliers[1].tolist()
        acc, want = v[0] * m[0], []
        for n in range(1, 4):
            acc ^= v[n] * m[n]
            for h in range(8):
                c = (n - 1) * 8 + h
                want.append(acc % int(layout.primes[1, c]) + int(layout.offsets[1, c]))
        assert ids[r].tolist() == want


def test_engram_forward_gate():
    n, d, cdh = 2, 32, 64
    s, rows = randn(3, n, d).bfloat16(), randn(3, cdh).bfloat16()
    wkv, qw, kw = randn((n + 1) * d, cdh) * 0.1, randn(n, d).bfloat16(), randn(n, d).bfloat16()
    out = engram_forward(s, rows, wkv, qw, kw, 1e-20)
    kv = (rows.float() @ wkv.t()).bfloat16().float()
    for t in range(3):
        for k in range(n):
            key, hs = kv[t, k * d:(k + 1) * d], s[t, k].float()
            dot = (hs * qw[k].float() * kw[k].float() * key).sum()
            dot = dot / hs.pow(2).mean().sqrt() / key.pow(2).mean().sqrt() / math.sqrt(d)
            gate = torch.sigmoid(torch.sign(dot) * dot.abs().clamp_min(1e-6).sqrt())
            ref = (hs + gate * kv[t, n * d:]).bfloat16()
            torch.testing.assert_close(out[t, k], ref, rtol=8e-3, atol=1e-2)


def test_dequant_expert_matches_formats():
    w = randn(64, 96)
    packed, scale = formats.quant_mxfp4_weight(w, 32)
    assert torch.equal(dequant_expert(packed, scale, 32), formats.dequant_mxfp4(packed, scale, 32))
