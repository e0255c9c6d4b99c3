"""The sparse_attn sweep's variant set, built without a GPU (the device queries patched to an
H200's answers): every config is consistent with the benchmark's shapes and runnable by its
kernel's rules."""

from __future__ import annotations

import pytest

from dsv4_decode.bench import sparse_attn as B
from dsv4_decode.ops.sparse_attn.config import pick_default


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(B, "is_hopper", lambda device: True)
    monkeypatch.setattr(B, "sm_count", lambda device: 132)
    monkeypatch.setattr(B, "pick_config", lambda rows, heads, d, window, n_sel: pick_default(
        rows, heads, d, window, n_sel, 132, wgmma=True))


@pytest.mark.parametrize("rows,heads", [(6, 16), (48, 16), (192, 16), (6, 64), (32, 16)])
def test_sweep_variants(hopper, rows, heads):
    variants = B.sweep_variants(rows, heads)
    ours = variants["ours"]
    # the wgmma kernel is the default beyond the one-step layout, else beside it
    assert ("ours_triton" in variants) == ours.wgmma
    assert ("wgmma" in variants) == (not ours.wgmma)
    for name, cfg in variants.items():
        assert cfg.check(B.WINDOW, B.SELECTED), (name, cfg)
        assert cfg.wgmma_problem(B.D) is None, (name, cfg)
        assert cfg.fits_head_dim(B.D), (name, cfg)
