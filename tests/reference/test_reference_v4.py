"""ReferenceModelV4 on its own (the HF cross-check is test_reference_vs_hf_v4.py): decode ==
prefill bit for bit with the V4 record (QAT) on, across CSA and HCA emissions; the V4 window
record byte layout against an independent formulation; the compressor pooling against a
per-channel loop; argument errors."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4_decode.config import ModelConfig
from dsv4_decode.reference import ReferenceModel, ReferenceModelV4
from dsv4_decode.reference.v4 import (
    decode_window_record_v4,
    encode_window_record_v4,
    pool_csa,
    pool_hca,
)
from dsv4_decode.weights import random_weights

G = torch.Generator().manual_seed(7)


def qat_cfg() -> ModelConfig:
    """tiny-v4 with head_dim 72 = 64 nope dims (one V4 record scale block) + 8 rope dims."""
    return ModelConfig.preset("tiny-v4").replace(head_dim=72, sliding_window=8)


def test_v4_decode_equals_prefill_with_qat():
    cfg = qat_cfg()
    model = ReferenceModelV4(cfg, random_weights(cfg, seed=3))
    tokens = torch.randint(0, cfg.vocab_size, (262,), generator=G)
    full = model.prefill(tokens, model.new_request())
    st = model.new_request()
    model.prefill(tokens[:250], st)
    rows, p = [], 250
    for q in (1, 1, 6, 4):  # 250 .. 261: CSA emits at 251 / 255 / 259, HCA at 255
        rows.append(model.decode(tokens[None, p:p + q], [st])[0])
        p += q
    assert torch.equal(torch.cat(rows), full[250:])
    assert st.compressed[2].shape[0] == 2 and st.compressed[1].shape[0] == 65
    # stored window / compressed values lie on the record's e4m3 grid (re-encoding is exact;
    # bf16 values with mantissa bits beyond e4m3's 3 would not survive it)
    rd = cfg.qk_rope_head_dim
    for t in (st.window[0], st.compressed[1], st.compressed[2]):
        assert torch.equal(decode_window_record_v4(encode_window_record_v4(t, rd), rd), t)


def test_window_record_v4_layout():
    d, rd = 512, 64
    kv = (torch.randn(3, d, generator=G) * torch.logspace(-3, 2, d)).bfloat16()
    rec = encode_window_record_v4(kv, rd)
    assert rec.shape == (3, 448 + 128 + 7) and rec.dtype == torch.uint8
    for r in range(3):
        for b in range(7):
            blk = kv[r, 64 * b:64 * (b + 1)].float()
            t = torch.tensor(max(blk.abs().max().item(), 1e-4), dtype=torch.float32) * \
                torch.tensor(1 / 448, dtype=torch.float32)
            m, e = math.frexp(t.item())  # t = m 2^e, m in [0.5, 1)
            exp = e - 1 if m == 0.5 else e  # ceil(log2 t)
            assert rec[r, 576 + b] == exp + 127
            codes = (blk / 2.0**exp).to(torch.float8_e4m3fn).view(torch.uint8)
            assert torch.equal(rec[r, 64 * b:64 * (b + 1)], codes)
        assert torch.equal(rec[r, 448:576].clone().view(torch.bfloat16), kv[r, 448:])
    back = decode_window_record_v4(rec, rd)
    assert torch.equal(back[:, 448:], kv[:, 448:].float())
    assert ((back[:, :448] - kv[:, :448].float()).abs() <= kv[:, :448].float().abs() / 16 +
            1e-30).all()


def test_pooling_matches_a_per_channel_loop():
    r, w = 4, 3
    c, z, prev = (torch.randn(r, 2 * w, generator=G) for _ in range(3))
    got_first, got = pool_csa(c, z, None), pool_csa(c, z, prev)
    for ch in range(w):
        vals = [prev[k, ch].item() for k in range(r)] + [c[k, w + ch].item() for k in range(r)]
        gates = [prev[k, w + ch].item() for k in range(r)] + [z[k, w + ch].item() for k in range(r)]
        e = [math.exp(g) for g in gates]
        want = sum(v * x for v, x in zip(vals, e, strict=True)) / sum(e)
        assert got[ch].item() == pytest.approx(want, rel=1e-5, abs=1e-6)
        e0 = e[r:]
        want0 = sum(v * x for v, x in zip(vals[r:], e0, strict=True)) / sum(e0)
        assert got_first[ch].item() == pytest.approx(want0, rel=1e-5, abs=1e-6)
    ch, zh = torch.randn(128, 2, generator=G), torch.randn(128, 2, generator=G)
    torch.testing.assert_close(pool_hca(ch, zh), (torch.softmax(zh, 0) * ch).sum(0))


def test_v4_model_argument_errors():
    v41 = ModelConfig.preset("tiny-v41")
    with pytest.raises(ValueError, match="model_type"):
        ReferenceModelV4(v41, {})
    cfg = ModelConfig.preset("tiny-v4")  # 24 nope dims: no 64-wide record blocks
    w = random_weights(cfg, seed=0)
    with pytest.raises(ValueError, match="qat"):
        ReferenceModelV4(cfg, w)
    model = ReferenceModelV4(cfg, w, qat=False)
    with pytest.raises(ValueError, match="token_ids"):
        model.prefill(torch.tensor([cfg.vocab_size]), model.new_request())
    assert isinstance(model, ReferenceModel)
