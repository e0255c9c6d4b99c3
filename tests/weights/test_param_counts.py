"""param_counts / param_bytes against the spec's own numbers (§1.1 totals, §11.1-§11.3 bytes
per TP=4 rank), and the engram prime buckets (§7.2)."""

import pytest
import torch
from weights_cases import tiny_engram

from dsv4_decode.config import ModelConfig
from dsv4_decode.weights import (
    engram_primes,
    engram_rows,
    param_bytes,
    param_counts,
    param_table,
    random_weights,
)


@pytest.fixture(scope="module")
def flash():
    return ModelConfig.preset("v41-flash")


def test_flash_bytes_per_rank(flash):
    b = param_bytes(flash, tp=4)
    assert b["attention"] == 40 * 38_576_448  # §11.1 attention total per layer per rank
    assert b["routed_experts"] == 40 * 384 * 4_700_160  # §11.2 per expert per rank
    assert b["head"] == 330_956_800  # §11.3 LM head per rank
    bias_vl = 384 * 4  # stored, but not read for text rows: §11 leaves it out
    assert b["mhc"] == 40 * 3_932_376 and b["router"] == 40 * (3_933_696 + bias_vl)
    assert b["shared_expert"] == 40 * 8_856_000 and b["norms"] == 40 * 20_480 + 10_240
    assert b["compressor"] == 3 * 10_486_784 + 5_243_904
    assert b["indexer"] == 8 * 5_575_680 + 4 * 131_328
    assert b["engram_wkv"] == 2 * 157_521_920
    static = sum(v for k, v in b.items() if k not in ("routed_experts", "embed", "engram_tables"))
    assert static == 2_940_605_888 + 40 * bias_vl  # §11.3 total static
    # tables: rank 0 holds the buckets of 6 of the 24 columns of each layer (fp8 + 8 scales)
    primes = engram_primes(flash)
    assert b["engram_tables"] == sum(sum(p[:6]) for p in primes) * (256 + 8)
    assert 74e9 < sum(b.values()) - b["engram_tables"] < 76e9  # "about 75 GB" per rank


def test_flash_param_counts(flash):
    c = param_counts(flash)
    assert c["routed_experts"] == 40 * 384 * 3 * 2304 * 5120  # §1.1: ~543.6 B
    assert c["engram_tables"] == (384_006_168 + 384_016_682) * 256  # ~196.6 B
    assert c["embed"] == c["head"] == 129_280 * 5120
    assert c["attention"] == 40 * (1280 * 5120 + 1280 + 32768 * 1280 + 512 * 5120 + 512
                                   + 8192 * 4096 + 5120 * 8192 + 64)
    tp4 = param_counts(flash, tp=4)
    assert tp4["routed_experts"] * 4 == c["routed_experts"]
    assert tp4["mhc"] == c["mhc"]  # replicated


def test_engram_primes_of_the_release(flash):
    primes = engram_primes(flash)
    assert [sum(p) for p in primes] == [384_006_168, 384_016_682]  # §1.1 / §7.2
    assert primes[0][0] == 16_000_057 and min(primes[1]) > max(primes[0])
    assert engram_rows(16_000_000, 24, 2) == (384_006_168, 384_016_682)
    with pytest.raises(ValueError, match="engram_num_embeddings"):
        param_table(flash.replace(engram_num_embeddings=(1, 2)))


def test_counts_match_generated_tensors():
    cfg = tiny_engram()
    for tp in (1, 2):
        b = param_bytes(cfg, tp)
        w = random_weights(cfg, tp=tp, rank=0)
        assert sum(t.numel() * t.dtype.itemsize for t in w.values()) == sum(b.values())
        n = sum(t.numel() * (2 if t.dtype == torch.uint8 else 1)
                for k, t in w.items() if not k.endswith(".scale"))
        assert n == sum(param_counts(cfg, tp).values())
