"""Random weights keep activations finite and O(1) through the reference model (spec §4-§8),
at the real V4.1-Flash widths with a reduced depth and fewer experts (CPU), and through a
deeper slice of the real schedule on the GPU."""

import pytest
import torch

from dsv4_decode.config import FLASH_RATIOS, ModelConfig
from dsv4_decode.reference import ReferenceModel
from dsv4_decode.weights import engram_rows, random_weights


def _flash_slice(layers, ratios, kv, idx, cand, engram, experts, vocab):
    """v41-flash widths, a custom short schedule, small engram tables, fewer experts."""
    return ModelConfig.preset("v41-flash").replace(
        num_hidden_layers=layers, num_nextn_predict_layers=0, compress_ratios=tuple(ratios),
        kv_source_layer_ids=kv, index_source_layer_ids=idx, candidate_source_layer_id=cand,
        dspark_target_layer_ids=(), n_routed_experts=experts, vocab_size=vocab,
        engram_layer_ids=engram, engram_vocab_size=100,
        engram_num_embeddings=engram_rows(100, 24, len(engram)))


def _run(cfg, device, n_tokens, seed=0):
    """Prefill ``n_tokens`` tokens; returns (logits, {tap: RMS [layers, T, ...]}) with taps
    ``stream`` (streams leaving each layer, [layers, T, N]), ``attn`` / ``moe`` (sublayer
    outputs, [layers, T]) and ``engram_delta`` (what engram adds, [engram layers, T, N])."""
    w = random_weights(cfg, seed=seed, device=device)
    model = ReferenceModel(cfg, w, device=device)
    rec = {k: {} for k in ("stream", "attn", "moe", "engram_delta")}

    def rms(x):
        return x.float().pow(2).mean(-1).sqrt()

    def tap(key, fn, f):
        def wrapped(i, *a):  # every sublayer method takes the layer id first
            out = fn(i, *a)
            rec[key].setdefault(i, []).append(f(out, *a).cpu())
            return out
        return wrapped

    # Per-layer taps on the reference's sublayer methods (instance attributes only; the
    # reference itself is untouched; a renamed method fails here loudly). Records are keyed
    # by layer, so they do not depend on whether the reference runs rows together or one by
    # one.
    model._layer = tap("stream", model._layer, lambda o, *a: rms(o[0]))
    model._attention = tap("attn", model._attention, lambda o, *a: rms(o))
    model._moe = tap("moe", model._moe, lambda o, *a: rms(o))
    model._engram = tap("engram_delta", model._engram,
                        lambda o, s, *a: rms(o.float() - s.float()))
    tokens = (torch.arange(n_tokens) * 7919 + 11) % cfg.vocab_size
    logits = model.prefill(tokens, model.new_request())
    return logits, {k: torch.stack([torch.cat(v[i]) for i in sorted(v)]) if v else None
                    for k, v in rec.items()}


def _check(logits, rec, cfg):
    assert torch.isfinite(logits).all()
    assert 0.3 < logits.std().item() < 3.0, logits.std()
    stream = rec["stream"]  # [layers, T, N]
    assert stream.shape[0] == cfg.num_hidden_layers and torch.isfinite(stream).all()
    # streams start at RMS ~1 (embed) and stay O(1): no layer blows them up or kills them
    assert stream.min() > 0.5 and stream.max() < 3.0, stream.amin((1, 2))
    growth = stream[1:].mean((1, 2)) / stream[:-1].mean((1, 2))
    assert growth.max() < 1.3, growth
    # every sublayer adds a contribution that is visible but small next to the stream
    for key in ("attn", "moe", "engram_delta"):
        if rec[key] is not None:
            v = rec[key]
            assert torch.isfinite(v).all() and v.min() > 0.01 and v.max() < 1.0, (key, v)


def test_activations_o1_flash_widths():
    """3 layers at D = 5120 (SWA; ratio-2 KV source with engram; ratio-1 candidate source),
    6 experts of the real size (top-6: all routed), 2 tokens."""
    cfg = _flash_slice(3, (0, 2, 1), (1, 2), (1, 2), 2, (1,), experts=6, vocab=1024)
    logits, rec = _run(cfg, "cpu", n_tokens=2)
    _check(logits, rec, cfg)


def _deep(experts, vocab):
    """26 layers of the released schedule: KV sources 2, 8, 14, 20, index sources + 24 (a
    candidate consumer of 20), engram 1 and 14."""
    n = 26
    return _flash_slice(n, FLASH_RATIOS[:n], (2, 8, 14, 20), (2, 8, 14, 20, 24), 20, (1, 14),
                        experts=experts, vocab=vocab)


def test_activations_o1_deep_schedule_narrow():
    """The deep schedule at reduced widths (D = 512): the stream's growth over many layers."""
    cfg = _deep(experts=8, vocab=1024).replace(
        hidden_size=512, q_lora_rank=256, num_attention_heads=8, head_dim=128, o_groups=2,
        o_lora_rank=128, moe_intermediate_size=256, index_n_heads=4)
    logits, rec = _run(cfg, "cpu", n_tokens=4)
    _check(logits, rec, cfg)


@pytest.mark.gpu
def test_activations_o1_flash_deep_gpu():
    """The deep schedule at the real widths, 32 experts of the real size, the real vocabulary,
    16 tokens."""
    cfg = _deep(experts=32, vocab=129280)
    logits, rec = _run(cfg, "cuda", n_tokens=16)
    _check(logits, rec, cfg)
