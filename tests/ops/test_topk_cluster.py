"""decode_topk's select on a thread-block cluster a row (``_cplain``; sm_90+, GPU only: the
interpreter has no inline PTX) against the twin, bitwise (same set, same ascending order).
Split from test_topk.py, whose input patterns it shares."""

from __future__ import annotations

import pytest
import torch
from test_topk import make_lengths, make_logits

from dsv4_decode.ops.topk import decode_topk_ref

PATTERNS = ["random", "crowded", "constant", "rising", "falling", "special", "hidden", "tied",
            "lumped", "neg_inf"]


def _run(x, lens, k, warps):
    from dsv4_decode.ops.topk import _cplain

    out = torch.full((x.shape[0], k), -7, dtype=torch.int32, device="cuda")
    _cplain.launch(x.view(torch.int16), lens, out, k, warps=warps)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("kind", PATTERNS)
@pytest.mark.parametrize("lens_spec", ["edges", "eighth", "full"])
@pytest.mark.parametrize("rows,cols,k,warps", [
    (7, 262144, 512, 8), (6, 262144, 2048, 8), (7, 100000, 512, 8), (5, 131072, 2048, 8),
    (3, 40000, 16, 8), (2, 524288, 512, 8)])
def test_gpu_cplain_matches_twin(kind, lens_spec, rows, cols, k, warps):
    """Every pattern and length (0, 1, k - 1, k, k + 1, full, random; 1/8; full): rows whose
    K-th largest lies above the thread maxima's bin (rising rows, ties: the second round),
    fewer candidates than k (-1 fill), NaN and +/-inf and both zeros; clusters of 16 CTAs of
    16K (256K columns), 32K (512K: shared memory past 48 KB, opted in) and 8K columns; odd
    widths; 4 and 8 warps."""
    gen = torch.Generator().manual_seed(rows * cols + k)
    x = make_logits(kind, rows, cols, gen).cuda()
    lens = make_lengths(lens_spec, rows, cols, k, gen).cuda()
    assert torch.equal(_run(x, lens, k, warps), decode_topk_ref(x, lens, k))


@pytest.mark.gpu
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("k", [512, 2048])
def test_gpu_cplain_second_round(tied, k):
    """3,000 large values in consecutive columns (a few hundred groups of the tile) above random
    ones: at least k keys lie above the bin of the k-th largest group maximum, so the select
    finds the bin again from the keys themselves; ``tied``: all of them equal (ties at tau
    in that round, lowest columns kept)."""
    gen = torch.Generator().manual_seed(k + tied)
    x = torch.randn(4, 262144, generator=gen)
    big = torch.full((4, 3000), 1000.0) if tied else 1000.0 + torch.rand(4, 3000, generator=gen)
    for r, start in enumerate((5, 70000, 130001, 259000)):
        x[r, start:start + 3000] = big[r]
    x = x.to(torch.bfloat16).cuda()
    lens = torch.tensor([262144, 262144, 200000, 262144], dtype=torch.int32, device="cuda")
    assert torch.equal(_run(x, lens, k, 8), decode_topk_ref(x, lens, k))


@pytest.mark.gpu
def test_gpu_cplain_empty_rows():
    """Rows of length 0: all -1."""
    x = torch.randn(3, 262144, device="cuda").to(torch.bfloat16)
    lens = torch.zeros(3, dtype=torch.int32, device="cuda")
    assert (_run(x, lens, 512, 8) == -1).all()
