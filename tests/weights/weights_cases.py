"""Small configs and helpers for the weight tests (imported by name: unique module name)."""

import torch

from dsv4_decode.config import ModelConfig
from dsv4_decode.weights import engram_rows


def tiny_engram(**changes) -> ModelConfig:
    """tiny-v41 with one engram layer (1) and tiny tables (prime search from 100, 4 columns)
    and widths that split 2 ways on 32-wide scale blocks (o_lora_rank 32)."""
    kw = dict(engram_layer_ids=(1,), engram_vocab_size=100, engram_max_ngram_size=3,
              engram_n_heads=2, engram_head_dim=32, o_lora_rank=32)
    kw.update(changes)
    kw["engram_num_embeddings"] = engram_rows(
        kw["engram_vocab_size"], (kw["engram_max_ngram_size"] - 1) * kw["engram_n_heads"],
        len(kw["engram_layer_ids"]))
    return ModelConfig.preset("tiny-v41").replace(**kw)



def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor comparable with ``torch.equal`` bit for bit (fp8 viewed as bytes, NaN-safe)."""
    if t.dtype.itemsize == 1:
        return t.contiguous().view(torch.uint8)
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.dtype.itemsize])


def assert_same_weights(a: dict, b: dict):
    """Same names, shapes, dtypes and bits."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:10]
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(bits(a[k]), bits(b[k])), k
