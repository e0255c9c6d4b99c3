"""decode_topk / decode_topk_blocks: the twin against torch.topk and the contract, the kernels
against the twin (bitwise: same set and same order), at small shapes under the interpreter and,
gpu-marked, at production shapes plus CUDA-graph replay."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from dsv4_decode.bench.timing import capture
from dsv4_decode.ops.topk import (
    config,
    decode_topk,
    decode_topk_blocks,
    decode_topk_blocks_ref,
    decode_topk_ref,
    make_topk_workspace,
)
from dsv4_decode.ops.topk._kth import _part_bound
from dsv4_decode.ops.topk.config import TopkConfig
from dsv4_decode.ops.topk.ref import rank_keys

BF16 = torch.bfloat16


# ---------------------------------------------------------------- inputs

def make_logits(kind: str, rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """bf16 [rows, cols] logits of a named pattern (on the CPU)."""
    r = torch.randn(rows, cols, generator=gen)
    if kind == "random":
        x = r
    elif kind == "crowded":  # few distinct values: thousands equal to the threshold
        x = torch.randint(0, 6, (rows, cols), generator=gen).float()
    elif kind == "constant":
        x = torch.full((rows, cols), 0.25)
    elif kind == "rising":
        x = torch.linspace(-4, 4, cols).expand(rows, cols).clone()
    elif kind == "falling":
        x = torch.linspace(4, -4, cols).expand(rows, cols).clone()
    elif kind == "special":  # NaN, +/-inf, -0.0 anywhere
        x = r
        pick = torch.rand(rows, cols, generator=gen)
        x[pick < 0.01] = float("nan")
        x[(pick >= 0.01) & (pick < 0.02)] = float("inf")
        x[(pick >= 0.02) & (pick < 0.05)] = float("-inf")
        x[(pick >= 0.05) & (pick < 0.08)] = -0.0
        x[(pick >= 0.08) & (pick < 0.11)] = 0.0
    elif kind == "hidden":  # every top value packed in one stretch near the end of the row
        x = r - 10.0
        lo = max(0, cols - cols // 7 - 64)
        x[:, lo:lo + 64] = 10.0 + torch.rand(rows, min(64, cols - lo), generator=gen)
    elif kind == "tied":  # a few values above, then many equal at the k-th place, spread out
        x = r - 10.0
        perm = torch.randperm(cols, generator=gen)
        x[:, perm[:cols // 150]] = 15.0
        x[:, perm[cols // 150:cols // 150 + cols // 600]] = 20.0
    elif kind == "lumped":  # the top values share few strided groups: far above T0 (rising,
        x = r  # so keeping the first k of them in column order would be wrong)
        x[:, 100:100 + 16 * 20:16] = 1000.0 + 8.0 * torch.arange(20)
    elif kind == "distinct":  # all different up to 16,128 columns: exactly k >= the k-th
        bits = torch.stack([torch.randperm(cols, generator=gen) for _ in range(rows)])
        x = (bits % 0x3F00 + 0x0080).to(torch.int16).view(BF16)  # positive finite patterns
    elif kind == "neg_inf":
        x = torch.full((rows, cols), float("-inf"))
    else:
        raise ValueError(kind)
    # the contract wants a row stride that is a multiple of 8: pad the storage, keep cols
    buf = torch.full((rows, -(-cols // 8) * 8), 99.0, dtype=BF16)
    buf[:, :cols] = x.to(BF16)
    return buf[:, :cols]


def make_lengths(spec, rows: int, cols: int, k: int, gen: torch.Generator) -> torch.Tensor:
    if spec == "full":
        lens = [cols] * rows
    elif spec == "edges":  # 0, 1, k-1, k, k+1, full, random
        pool = [0, 1, k - 1, k, k + 1, cols]
        lens = [pool[i % len(pool)] if i < len(pool) else
                int(torch.randint(0, cols + 1, (1,), generator=gen)) for i in range(rows)]
    elif spec == "eighth":
        lens = [max(1, cols // 8)] * rows
    elif spec == "empty":
        lens = [0] * rows
    else:
        raise ValueError(spec)
    return torch.tensor([min(max(v, 0), cols) for v in lens], dtype=torch.int32)


def make_padded(x: torch.Tensor) -> torch.Tensor:
    """A copy of x whose row stride is a multiple of 8 elements."""
    rows, cols = x.shape
    buf = torch.zeros(rows, -(-cols // 8) * 8, dtype=x.dtype, device=x.device)
    buf[:, :cols] = x
    return buf[:, :cols]


# ---------------------------------------------------------------- contract check (independent)

def check_contract(x: torch.Tensor, lens: torch.Tensor, k: int, idx: torch.Tensor) -> None:
    """idx must be the k largest of x[r, :len] by torch.topk's values, lowest columns on ties."""
    x, lens, idx = x.float().cpu(), lens.cpu(), idx.cpu()
    rows, cols = x.shape
    assert idx.shape == (rows, k) and idx.dtype == torch.int32
    for r in range(rows):
        n = min(max(int(lens[r]), 0), cols)
        m = min(k, n)
        assert (idx[r, m:] == -1).all(), f"row {r}: tail not -1"
        sel = idx[r, :m].long()
        assert ((sel >= 0) & (sel < n)).all(), f"row {r}: index out of range"
        assert sel.unique().numel() == m, f"row {r}: duplicate index"
        if m == 0:
            continue
        v = x[r, :n]
        want = torch.topk(v, m).values  # NaN ranks above +inf in torch.topk
        got = v[sel]
        assert int(got.isnan().sum()) == int(want.isnan().sum()), f"row {r}: NaN count"
        a = got[~got.isnan()].sort().values
        b = want[~want.isnan()].sort().values
        assert torch.equal(a, b), f"row {r}: selected values differ from torch.topk"
        t = want.min() if not want.isnan().all() else want[0]
        eq = v.isnan() if t.isnan() else (v == t)
        eq_cols = eq.nonzero().flatten()
        chosen = sel[eq[sel]].sort().values
        assert torch.equal(chosen, eq_cols[:chosen.numel()]), f"row {r}: tie rule"


# ---------------------------------------------------------------- twin

@pytest.mark.parametrize("kind", ["random", "crowded", "constant", "special", "neg_inf"])
def test_ref_matches_torch_topk(kind):
    gen = torch.Generator().manual_seed(1)
    x = make_logits(kind, 6, 700, gen)
    for k in (1, 37, 512):
        lens = make_lengths("edges", 6, 700, k, gen)
        check_contract(x, lens, k, decode_topk_ref(x, lens, k))


def test_ref_tie_rule_crafted():
    x = torch.zeros(2, 10, dtype=BF16)
    x[0, [3, 7]] = 1.0  # two above, then ties at 0.0 (and -0.0 equals +0.0)
    x[0, 1] = -0.0
    x[1] = float("nan")
    lens = torch.tensor([10, 6], dtype=torch.int32)
    out = decode_topk_ref(x, lens, 4)
    assert out[0].tolist() == [0, 1, 3, 7]
    assert out[1].tolist() == [0, 1, 2, 3]


def test_block_ref_rules():
    x = torch.full((3, 40), float("-inf"), dtype=BF16)
    x[0, 9] = 2.0  # block 1
    x[0, 30] = float("nan")  # block 3 (NaN above everything but the pinned block)
    x[1, :] = 1.0
    lens = torch.tensor([36, 40, 0], dtype=torch.int32)
    out = decode_topk_blocks_ref(x, lens, 4, 8)
    assert out[0].tolist() == [1, 3, 4, -1]  # pinned block 4 (col 35), NaN, then 2.0
    assert out[1].tolist() == [0, 1, 2, 4]
    assert out[2].tolist() == [-1, -1, -1, -1]


# ---------------------------------------------------------------- kernels vs twin (interpreter)

PATHS = ["row", "chunks"]  # plain mode: one CTA a row (_row) / the four launches (_triton)


def force_path(monkeypatch, path: str) -> None:
    monkeypatch.setattr(config, "one_cta_per_row", lambda rows, cols, k: path == "row")


CPU_CASES = [  # rows, cols, k, lengths, kind
    (1, 1, 1, "full", "random"),
    (3, 7, 4, "edges", "random"),
    (7, 5000, 16, "edges", "random"),
    (2, 9000, 64, "full", "random"),
    (2, 4500, 512, "edges", "random"),
    (2, 3000, 16, "full", "crowded"),
    (2, 3000, 16, "full", "constant"),
    (2, 3000, 16, "full", "rising"),
    (2, 3000, 16, "full", "falling"),
    (3, 3000, 16, "full", "special"),
    (2, 6000, 16, "full", "hidden"),
    (2, 700, 16, "full", "neg_inf"),
    (7, 6000, 16, "edges", "tied"),
    (2, 6000, 16, "full", "lumped"),
    (7, 5000, 64, "edges", "distinct"),
    (2, 9000, 1100, "edges", "random"),  # k > 512: the bitwise threshold search
    (1, 30000, 1100, "full", "crowded"),  # ~5,000 candidates: the 8,192 tile
    (2, 16384, 8, "full", "random"),
    (3, 5000, 16, "empty", "random"),  # every row empty: all -1
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows,cols,k,lens_spec,kind", CPU_CASES,
                         ids=[f"{c[0]}x{c[1]}-k{c[2]}-{c[3]}-{c[4]}" for c in CPU_CASES])
def test_decode_topk_matches_twin(rows, cols, k, lens_spec, kind, path, device, monkeypatch):
    force_path(monkeypatch, path)
    gen = torch.Generator().manual_seed(rows * 1000 + cols + k)
    x = make_logits(kind, rows, cols, gen)
    lens = make_lengths(lens_spec, rows, cols, k, gen)
    # poison, and a guard row after the output: a stray write past a row's k slots lands in
    # the next row (which may overwrite it) or, from the last row, past the output
    guard = torch.full((rows + 1, k), -7, dtype=torch.int32, device=device)
    out = guard[:rows]
    got = decode_topk(make_padded(x.to(device)), lens.to(device), k, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got.cpu(), decode_topk_ref(x, lens, k))
    assert (guard[rows] == -7).all(), "written past the output"
    check_contract(x, lens, k, got)


@pytest.mark.parametrize("path", PATHS)
def test_fallback_path_is_exercised(path, device, monkeypatch):
    """Constant rows give more candidates than ``cap``: the exact single-CTA path answers."""
    force_path(monkeypatch, path)
    k = 16
    cfg = TopkConfig.pick(k)
    cols = cfg.cap + 700
    x = torch.full((1, cols), 3.0, dtype=BF16)
    x[0, cols - 5] = 4.0
    lens = torch.tensor([cols], dtype=torch.int32)
    ws = make_topk_workspace(1, k, device)
    got = decode_topk(make_padded(x.to(device)), lens.to(device), k, workspace=ws)
    assert int(ws.cnt[0]) > cfg.cap
    assert got.cpu()[0].tolist() == list(range(k - 1)) + [cols - 5]


def test_select_tile_sizes(device, monkeypatch):
    """The select takes the smallest tile that holds a row's candidates: ``small``, twice that
    (on-chip placing where it is below ``cap``) or ``cap``. Rows of one repeated value (every
    valid element ties at T0, so the candidates are the row's length) put a row in each, with
    a few larger values at random places ahead of the ties."""
    force_path(monkeypatch, "chunks")
    k = 16
    cfg = TopkConfig.pick(k)
    lens = torch.tensor([cfg.small - 3, cfg.small + 5, 2 * cfg.small, 2 * cfg.small + 1,
                         cfg.cap], dtype=torch.int32)
    cols = cfg.cap + 64
    gen = torch.Generator().manual_seed(23)
    x = torch.full((lens.numel(), cols), -2.5, dtype=BF16)
    for r, n in enumerate(lens.tolist()):
        x[r, torch.randperm(n, generator=gen)[:5]] = 7.0
    ws = make_topk_workspace(lens.numel(), k, device)
    got = decode_topk(make_padded(x.to(device)), lens.to(device), k, workspace=ws)
    assert torch.equal(ws.cnt[: lens.numel()].cpu(), lens), "every valid element a candidate"
    assert torch.equal(got.cpu(), decode_topk_ref(x, lens, k))


def _part_bound_ref(v: torch.Tensor, k: int) -> int:
    """``_kth._part_bound``'s definition on the [SIZE] keys v (0 = not valid), parts of
    ``[SIZE / 1024, 8, 128]``: each part's ceil(k / 8)-th largest key, the least of the eight,
    or 0 when a part has fewer valid keys or its one lies more than 255 below the part's top."""
    q = -(-k // 8)
    t = []
    for part in v.view(-1, 8, 128).transpose(0, 1).reshape(8, -1):
        keys = part[part > 0].sort(descending=True).values
        if keys.numel() < q or int(keys[0] - keys[q - 1]) > 255:
            return 0
        t.append(max(int(keys[q - 1]), 1))
    return min(t)


@triton.jit
def _part_bound_kernel(v_ptr, out_ptr, K, SIZE: tl.constexpr):
    v = tl.load(v_ptr + tl.arange(0, SIZE))
    tl.store(out_ptr, _part_bound(tl.reshape(v, [SIZE // 1024, 8, 128]), K, 8))


def test_part_bound_matches_definition(device):
    """T0 by parts (each warp's own K/8-th largest, ``_part_bound``) on crafted keys: random
    maxima, invalid slots, a part with too few keys, a part spread past 255 keys."""
    gen = torch.Generator().manual_seed(18)
    for size, k in ((1024, 512), (2048, 512), (2048, 64), (1024, 8)):
        x = torch.randn(size, 4, generator=gen).to(BF16).amax(1)
        u = x.view(torch.int16).to(torch.int32) & 0xFFFF
        key1 = (torch.where(u >= 0x8000, 0xFFFF - u, u + 0x8000) + 1).to(torch.int32)
        sparse = key1.clone()
        sparse[torch.randperm(size, generator=gen)[: size // 4]] = 0  # invalid slots
        short = key1.clone()
        short.view(-1, 8, 128)[:, 3] = 0  # part 3 empty
        wide = key1.clone()
        wide.view(-1, 8, 128)[:, 5, ::2] = 1  # part 5: half its keys far below its top
        for v in (key1, sparse, short, wide):
            out = torch.zeros(1, dtype=torch.int32, device=device)
            _part_bound_kernel[(1,)](v.to(device), out, k, SIZE=size, num_warps=8)
            want = _part_bound_ref(v, k)
            assert int(out[0]) == want, (size, k)
            assert want == 0 or int((v >= want).sum()) >= k
        assert _part_bound_ref(short, k) == 0 and (k > 8 or _part_bound_ref(wide, k) > 0)


@pytest.mark.parametrize("folded", [False, True, "strided"])
def test_collect_takes_exactly_the_elements_at_or_above_t0(folded, device, monkeypatch):
    """The collect appends exactly the valid elements whose key1 reaches the row's T0 (a bf16
    compare against T0's value, ``_triton._at_least_t0``): the row's candidate count equals
    that number. A superset would still give the right answer, through the select or the exact
    fallback, so the answer alone cannot show it. Rows: random; special values; NaN in more
    than k places (T0 at NaN's key: only NaN passes, not +inf); -inf only; T0 at +0 with -0
    beside it (both pass, the largest negative does not); lengths 0, 1, k and full; the small
    grid and a folded one with listed rows (its chunks folded in spans or strided)."""
    from dsv4_decode.ops.topk import _triton

    force_path(monkeypatch, "chunks")
    if folded:  # as test_folded_spans: 2 collect programs a row, regions of 32 segments
        monkeypatch.setattr(_triton, "strided_fold", lambda rows, n, k: folded == "strided")
        monkeypatch.setattr(_triton, "span_log2", lambda rows, n_chunks: 1)
        monkeypatch.setattr(_triton, "listed", lambda rows, n_chunks: True)
        monkeypatch.setattr(_triton, "LIST_REGION", 2 * _triton.NSEG)
        monkeypatch.setattr(_triton, "list_programs", lambda rows, k: 2)
    gen = torch.Generator().manual_seed(21)
    k, cols = 16, 9000
    x = torch.cat([make_logits("random", 2, cols, gen), make_logits("special", 2, cols, gen),
                   make_logits("neg_inf", 1, cols, gen), make_logits("random", 3, cols, gen)])
    x[5, ::3] = float("nan")  # NaN in every group maximum (T0 at NaN's key), +inf beside
    x[5, 7::500] = float("inf")
    x[6] = -x[6].abs() - 1e-38  # negative (some subnormal), +0 and -0 in every group maximum
    x[6, ::50] = 0.0
    x[6, 25::50] = -0.0
    x[6, 10::97] = -1e-40
    # the -inf row (all of it ties at T0) no longer than the candidate tile: no overflow
    lens = torch.tensor([cols, 1, 4000, k, 300, cols, cols, 0], dtype=torch.int32)
    ws = make_topk_workspace(x.shape[0], k, device)
    got = decode_topk(make_padded(x.to(device)), lens.to(device), k, workspace=ws)
    assert torch.equal(got.cpu(), decode_topk_ref(x, lens, k))
    key1 = rank_keys(x) + 1
    valid = torch.arange(cols)[None, :] < lens[:, None]
    t0 = ws.thr[: x.shape[0]].cpu()
    want = ((key1 >= t0[:, None]) & valid).sum(1).to(torch.int32)
    assert int(t0[5]) == 0xFFFF + 1, "row 5's threshold should sit at NaN's key"
    assert int(t0[6]) == 0x8000 + 1, "row 6's threshold should sit at +0's key"
    assert torch.equal(ws.cnt[: x.shape[0]].cpu(), want), (ws.cnt[: x.shape[0]].cpu(), want)


def test_listed_rows_at_large_k_use_finer_segments(device, monkeypatch):
    """At k > 512 a listed grid stores, lists and collects segments of ``cfg.chunk / cfg.nseg``
    = 64 columns (twice ``NSEG``; session 34), the regions covering the same chunks: the
    stored segment maxima are those of 64-column segments (0 past the length) and the answer
    is exact (spans of 32 listed segments cross the regions of 2 chunks)."""
    from dsv4_decode.ops.topk import _triton
    from dsv4_decode.ops.topk.config import NSEG

    k, cols = 600, 16384
    cfg = TopkConfig.pick(k)
    assert cfg.nseg == 2 * NSEG and TopkConfig.pick(512).nseg == NSEG
    force_path(monkeypatch, "chunks")
    monkeypatch.setattr(_triton, "span_log2", lambda rows, n_chunks: 1)
    monkeypatch.setattr(_triton, "listed", lambda rows, n_chunks: True)
    monkeypatch.setattr(_triton, "LIST_REGION", 2 * NSEG)
    monkeypatch.setattr(_triton, "list_programs", lambda rows, k: 2)
    gen = torch.Generator().manual_seed(34)
    x = make_logits("random", 3, cols, gen)
    lens = torch.tensor([cols, 9000, 4100], dtype=torch.int32)
    ws = make_topk_workspace(3, k, device)
    got = decode_topk(x.to(device), lens.to(device), k, workspace=ws)
    assert torch.equal(got.cpu(), decode_topk_ref(x, lens, k))
    seg = cfg.chunk // cfg.nseg
    key1 = torch.where(torch.arange(cols)[None, :] < lens[:, None], rank_keys(x) + 1, 0)
    want = key1.view(3, cols // seg, seg).amax(2).to(torch.int32)
    for r, n in enumerate(lens.tolist()):  # the segments the row's programs store
        n_seg = -(-n // seg)
        assert torch.equal(ws.smax[r, :n_seg].cpu(), want[r, :n_seg]), r


@pytest.mark.parametrize("layout", ["row", "chunks", "folded", "strided", "blocks"])
def test_nothing_past_the_length_reaches_a_maximum(layout, device, monkeypatch):
    """Columns at or past a row's length hold NaN (above everything) and the lengths end at
    every offset inside a 16-byte vector and a bf16 pair (the maxima fold two columns a
    word): at k = 1, T0 is the largest group maximum, so one leaked NaN would make it NaN's key
    and the row would select nothing. Every layout of the group maxima: one CTA a row, chunks
    unfolded, folded in spans, folded strided; and block mode's block maxima (a block past the
    length that leaked would rank above every other)."""
    from dsv4_decode.ops.topk import _triton

    force_path(monkeypatch, "row" if layout == "row" else "chunks")
    if layout in ("folded", "strided"):
        monkeypatch.setattr(_triton, "span_log2", lambda rows, n_chunks: 1)
        monkeypatch.setattr(_triton, "listed", lambda rows, n_chunks: True)
        monkeypatch.setattr(_triton, "strided_fold", lambda rows, n, k: layout == "strided")
        monkeypatch.setattr(_triton, "LIST_REGION", 2 * _triton.NSEG)
        monkeypatch.setattr(_triton, "list_programs", lambda rows, k: 2)
    gen = torch.Generator().manual_seed(24)
    cols = 9000
    lens = torch.tensor([1, 2, 3, 2045, 2046, 2047, 2049, 4100, 6143, 8999], dtype=torch.int32)
    x = make_logits("random", lens.numel(), cols, gen)
    x[torch.arange(cols)[None, :] >= lens[:, None]] = float("nan")
    for k in (1, 4):
        if layout == "blocks":
            got = decode_topk_blocks(make_padded(x.to(device)), lens.to(device), 4 * k, 8)
            assert torch.equal(got.cpu(), decode_topk_blocks_ref(x, lens, 4 * k, 8)), k
            continue
        got = decode_topk(make_padded(x.to(device)), lens.to(device), k)
        assert torch.equal(got.cpu(), decode_topk_ref(x, lens, k)), k


@pytest.mark.parametrize("strided, stages", [(False, 1), (True, 1), (False, 3)])
@pytest.mark.parametrize("log_r, lists", [(1, True), (2, True), (1, False), (2, False)])
def test_folded_spans(log_r, lists, strided, stages, device, monkeypatch):
    """Many-row grids fold R chunks per group-maxima program and collect a row of more than
    ``list_programs`` chunks from the threshold's lists of active segments (one per region of
    LIST_REGION segments, spans strided over those programs a row), a shorter one a
    chunk a program; force all of it at a small shape (9,000 and 16,384 columns: odd and even
    chunk counts; regions of 32 segments, so a span crosses regions; 2 programs a row, so the
    strided loop runs and rows of 1-2 chunks are collected by chunk; at R = 4, 1 program a
    row: rows of 1 chunk by chunk, the rest listed, looping). ``strided``: the group maxima
    fold chunks p, p + n_p, ... (``config.strided_fold``), the threshold's group counts
    follow. ``stages`` 3: the spans fold software-pipelined (``config.fold_stages``: 1M-column
    rows, 256K-512K ones from 64 rows at k <= 512); from R = 4 either fold loads each chunk
    as two tiles of its segments' halves.
    ``lists`` False: the grids of ``config.FOLD2_PROGRAMS`` to ``CHUNK_PROGRAMS`` programs,
    collected a chunk a program, every row (no lists); folded by 2 (the rule) or 4 (what
    ``scripts/topk_span_sweep.py`` times on them)."""
    from dsv4_decode.ops.topk import _triton

    force_path(monkeypatch, "chunks")
    monkeypatch.setattr(_triton, "span_log2", lambda rows, n_chunks: log_r)
    monkeypatch.setattr(_triton, "listed", lambda rows, n_chunks: lists)
    monkeypatch.setattr(_triton, "strided_fold", lambda rows, n_chunks, k: strided)
    monkeypatch.setattr(_triton, "fold_stages", lambda rows, n_chunks, lg, k: stages)
    monkeypatch.setattr(_triton, "LIST_REGION", 2 * _triton.NSEG)
    monkeypatch.setattr(_triton, "list_programs", lambda rows, k: 2 if log_r == 1 else 1)
    gen = torch.Generator().manual_seed(log_r)
    for k, cols in ((4, 9000), (64, 16384)):
        x = make_logits("random", 7, cols, gen)
        lens = make_lengths("edges", 7, cols, k, gen)
        got = decode_topk(make_padded(x.to(device)), lens.to(device), k)
        assert torch.equal(got.cpu(), decode_topk_ref(x, lens, k))
    # rows long enough to fold, with as many chunks as the programs a row (2 at R = 4, 4 at
    # R = 2), fewer, or more
    x = make_logits("random", 7, 16384, gen)
    lens = torch.tensor([2049, 3000, 4096, 6000, 8192, 8193, 16384], dtype=torch.int32)
    got = decode_topk(x.to(device), lens.to(device), 16)
    assert torch.equal(got.cpu(), decode_topk_ref(x, lens, 16))
    x = make_logits("special", 3, 16384, gen)  # block mode: 8 chunks of 256 blocks of 8
    lens = make_lengths("edges", 3, 16384, 16 * 8, gen)
    got = decode_topk_blocks(x.to(device), lens.to(device), 16, 8)
    assert torch.equal(got.cpu(), decode_topk_blocks_ref(x, lens, 16, 8))


def test_fused_threshold_matches_unfused(device):
    """The threshold computed by the last group-maxima program (ticket) equals the separate
    threshold kernel's, the ticket is re-armed to 0, and both paths give the twin's answer
    (a stale threshold would not show in the answer alone: the exact fallback hides it)."""
    from dsv4_decode.ops.topk import _triton

    gen = torch.Generator().manual_seed(9)
    x = make_logits("random", 5, 12000, gen)
    lens = make_lengths("edges", 5, 12000, 64, gen)
    xd, nd = make_padded(x.to(device)), lens.to(device)
    want = decode_topk_ref(x, lens, 64)
    res = []
    for fuse in (True, False):
        ws = make_topk_workspace(5, 64, device)
        ws.thr.fill_(-3)
        ws.cnt.fill_(-3)
        out = torch.full((5, 64), -7, dtype=torch.int32, device=device)
        for _ in range(2):  # the second call runs on the re-armed ticket
            _triton.launch(xd.view(torch.int16), nd, out, ws, ws.cfg, 64, fuse=fuse)
            assert torch.equal(out.cpu(), want)
        assert int(ws.tick.abs().sum()) == 0
        res.append((ws.thr.cpu(), ws.cnt.cpu()))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
    assert int(res[0][0].min()) >= 1 and int(res[0][1].max()) <= make_topk_workspace(
        1, 64, "cpu").cfg.small


@pytest.mark.parametrize("path", PATHS)
def test_workspace_reuse_new_inputs(path, device, monkeypatch):
    """One workspace, three calls (rows of 0, 1, k - 1, k, k + 1 and all columns): what a call
    leaves behind must not leak into the next answer."""
    force_path(monkeypatch, path)
    gen = torch.Generator().manual_seed(5)
    ws = make_topk_workspace(6, 32, device)
    out = torch.empty(6, 32, dtype=torch.int32, device=device)
    for kind in ("random", "crowded", "random"):
        x = make_logits(kind, 6, 2500, gen)
        lens = make_lengths("edges", 6, 2500, 32, gen)  # 0, 1, k - 1, k, k + 1, full
        decode_topk(make_padded(x.to(device)), lens.to(device), 32, out=out, workspace=ws)
        assert torch.equal(out.cpu(), decode_topk_ref(x, lens, 32))


BLOCK_CASES = [(3, 5000, 64, 8, "edges", "special"), (2, 4000, 16, 8, "full", "constant"),
               (2, 3000, 32, 4, "full", "random")]


@pytest.mark.parametrize("rows,cols,nb,block,lens_spec,kind", BLOCK_CASES)
def test_blocks_match_twin(rows, cols, nb, block, lens_spec, kind, device):
    gen = torch.Generator().manual_seed(cols + nb)
    x = make_logits(kind, rows, cols, gen)
    lens = make_lengths(lens_spec, rows, cols, nb * block, gen)
    got = decode_topk_blocks(make_padded(x.to(device)), lens.to(device), nb, block)
    assert torch.equal(got.cpu(), decode_topk_blocks_ref(x, lens, nb, block))


@pytest.mark.parametrize("block,kind", [(8, "crowded"), (8, "constant"), (8, "tied"),
                                        (4, "special"), (64, "rising"), (2, "falling")])
def test_blocks_radix_across_chunks(block, kind, device):
    """Block mode's radix select over several chunks (programs) a row: ties at tau spread over
    chunks are kept lowest block first, rows with fewer candidates than n_blocks keep them all,
    and a second call on the same workspace (histograms re-zeroed) gives the same answer."""
    from dsv4_decode.ops.topk.config import RADIX_COLS

    rows, cols = 7, 4 * RADIX_COLS + 3 * 8 * block  # 5+ chunks a row, the last one partial
    gen = torch.Generator().manual_seed(block)
    x = make_logits(kind, rows, cols, gen)
    nb = 48
    lens = make_lengths("edges", rows, cols, nb * block, gen)
    want = decode_topk_blocks_ref(x, lens, nb, block)
    ws = make_topk_workspace(rows, nb, device, block)
    out = torch.full((rows, nb), -7, dtype=torch.int32, device=device)
    xd, nd = x.to(device), lens.to(device)
    for _ in range(2):
        decode_topk_blocks(xd, nd, nb, block, out=out, workspace=ws)
        assert torch.equal(out.cpu(), want)
        assert int(ws.hist1.abs().sum()) == 0
    for r in (0, 3, 5, 6):  # a single row runs chunks of half the size (5: the full row)
        got = decode_topk_blocks(xd[r:r + 1], nd[r:r + 1], nb, block)
        assert torch.equal(got.cpu(), want[r:r + 1])


def test_blocks_radix_chunk_loops(device):
    """Fewer programs than chunks (the one-launch form on a full GPU): each program loops over
    chunks q, q + P, ... (P = 2 and 3; on the CPU through the three-launch form)."""
    from dsv4_decode.ops.topk import _radix
    from dsv4_decode.ops.topk.config import RADIX_COLS

    rows, cols, nb = 5, 7 * RADIX_COLS - 8, 40
    gen = torch.Generator().manual_seed(21)
    for kind in ("crowded", "special"):
        x = make_padded(make_logits(kind, rows, cols, gen).to(device))
        lens = torch.tensor([cols, cols - 4100, 2 * RADIX_COLS + 5, 0, 1], dtype=torch.int32,
                            device=device)  # 7, 6, 3, 0 and 1 chunks
        want = decode_topk_blocks_ref(x.cpu(), lens.cpu(), nb, 8)
        for programs in (2, 3):
            ws = make_topk_workspace(rows, nb, device, 8)
            ws.csuf.fill_(-7)  # every count read must have been written by this call
            ws.cgt.fill_(-7)
            out = torch.full((rows, nb), -7, dtype=torch.int32, device=device)
            _radix.launch(x.view(torch.int16), lens, out, ws, ws.cfg, nb, programs=programs)
            assert torch.equal(out.cpu(), want)
            assert int(ws.hist1.abs().sum()) == 0


@pytest.mark.parametrize("bits", [0x3FFD, 0x3FFE])
def test_blocks_radix_threshold_at_bin_top(bits, device):
    """tau's low byte at the top of its bin (key1 low byte 254 / 255: the count above tau comes
    from the next suffix slot or from the count above the bin), ties spread over 3 chunks."""
    from dsv4_decode.ops.topk.config import RADIX_COLS

    cols = 3 * RADIX_COLS
    u = torch.full((2, cols), bits, dtype=torch.int16)
    u[:, 5 * 8 + 3] = 0x4000  # 2.0: one bin higher
    u[:, 700 * 8] = 0x4000
    u[:, 300 * 8 + 1:1000 * 8:97 * 8] = bits + 1  # just above tau (same bin for 0x3FFD)
    x = u.view(BF16)
    lens = torch.tensor([cols, cols - 100], dtype=torch.int32)
    for nb in (7, 600):  # ties cut in the first chunk / in the second
        got = decode_topk_blocks(x.to(device), lens.to(device), nb, 8)
        assert torch.equal(got.cpu(), decode_topk_blocks_ref(x, lens, nb, 8))


def test_bad_arguments(device):
    x = torch.randn(2, 64, device=device).to(BF16)
    lens = torch.full((2,), 64, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="logits"):
        decode_topk(x.float(), lens, 4)
    with pytest.raises(ValueError, match="logits"):
        decode_topk(x[0], lens, 4)
    with pytest.raises(ValueError, match="logits"):
        decode_topk(x.t(), lens, 4)
    with pytest.raises(ValueError, match="logits"):
        decode_topk(torch.randn(2, 70, device=device).to(BF16)[:, :60], lens, 4)  # stride 70
    with pytest.raises(ValueError, match="lengths"):
        decode_topk(x, lens.long(), 4)
    with pytest.raises(ValueError, match="k"):
        decode_topk(x, lens, 0)
    with pytest.raises(ValueError, match="k"):
        decode_topk(x, lens, 2049)
    with pytest.raises(ValueError, match="out"):
        decode_topk(x, lens, 4, out=torch.empty(2, 5, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="workspace"):
        decode_topk(x, lens, 4, workspace=make_topk_workspace(2, 8, device))
    with pytest.raises(ValueError, match="n_blocks"):
        decode_topk_blocks(x, lens, 0)
    with pytest.raises(ValueError, match="block"):
        decode_topk_blocks(x, lens, 4, block=3)
    if device.type == "cuda":
        with pytest.raises(ValueError, match="lengths"):
            decode_topk(x, lens.cpu(), 4)


# ---------------------------------------------------------------- production shapes (GPU)

def replay_alternating(call, x_s, n_s, out, inputs, want, replays: int = 500) -> None:
    """Capture ``call`` (reading x_s / n_s, writing out) once, replay it ``replays`` times with
    the two input sets of ``inputs`` copied in by turns: each answer must equal ``want``
    bitwise."""
    graph = capture(call)
    for i in range(replays):
        x, n = inputs[i % 2]
        x_s.copy_(x)
        n_s.copy_(n)
        out.fill_(-7)
        graph.replay()
        assert torch.equal(out, want[i % 2]), f"replay {i}"


@pytest.mark.gpu
@pytest.mark.parametrize("k", [512, 2048])
@pytest.mark.parametrize("rows,cols", [(64, 65536), (2, 262144), (8, 1048576)])
def test_gpu_graph_replay_bitwise(rows, cols, k):
    """Capture once, replay 500 times alternating two input sets: bitwise identical answers.
    64 rows x 64K: one CTA a row at k = 512; 2 x 256K: an unfolded grid; 8 x 1M a folded one
    (segment lists, regions)."""
    gen = torch.Generator().manual_seed(11)
    inputs = [(make_logits(kind, rows, cols, gen).cuda(),
               make_lengths(spec, rows, cols, k, gen).cuda())
              for kind, spec in (("random", "edges"), ("special", "full"))]
    want = [decode_topk_ref(x, n, k) for x, n in inputs]
    x_s, n_s = inputs[0][0].clone(), inputs[0][1].clone()
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    ws = make_topk_workspace(rows, k, "cuda")
    replay_alternating(lambda: decode_topk(x_s, n_s, k, out=out, workspace=ws), x_s, n_s, out,
                       inputs, want)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols", [(6, 1048576), (6, 524288), (12, 65536)])
def test_gpu_blocks_graph_replay_bitwise(rows, cols):
    """Block mode captured once, replayed 500 times alternating two input sets: bitwise
    identical answers. 6 x 1M: the grid-wide radix select (``_radix``: histograms re-zeroed
    by the kernels themselves); 6 x 512K: the LONG cluster form (rows longer than a cluster's
    chunks on several clusters, with the global histograms, shorter ones on one, a row
    switching between the two); 12 x 64K: a cluster a row (``_cluster``)."""
    nb = 2048
    gen = torch.Generator().manual_seed(12)
    inputs = [(make_logits(kind, rows, cols, gen).cuda(),
               make_lengths(spec, rows, cols, nb * 8, gen).cuda())
              for kind, spec in (("random", "eighth"), ("special", "edges"))]
    want = [decode_topk_blocks_ref(x, n, nb, 8) for x, n in inputs]
    x_s, n_s = inputs[0][0].clone(), inputs[0][1].clone()
    out = torch.empty(rows, nb, dtype=torch.int32, device="cuda")
    ws = make_topk_workspace(rows, nb, "cuda", 8)
    replay_alternating(lambda: decode_topk_blocks(x_s, n_s, nb, 8, out=out, workspace=ws), x_s,
                       n_s, out, inputs, want)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["row", "unfolded", "empty", "fused", "folded", "blocks",
                                  "blocks-cluster", "blocks-long"])
def test_gpu_pdl_inputs_written_in_graph(mode):
    """Every kernel is a programmatic dependent launch (sm_90+): here a kernel inside the
    graph writes the logits and lengths just before the call, so a kernel that read them
    before its wait would see the other input set of the previous replay. 200 replays
    alternating two input sets: each answer must be its own set's. ``fused``: the threshold in
    the last group-maxima program (``_triton.launch(fuse=True)``, the bench's comparison).
    ``empty``: the second set's rows all have length 0, so every collect program but each
    row's first leaves before its wait; the answer (all -1) must not come from the other
    set's candidates."""
    from dsv4_decode.ops.topk import _triton

    rows, cols, k, block = {"row": (64, 65536, 512, 1),
                            "unfolded": (2, 262144, 512, 1), "empty": (6, 65536, 512, 1),
                            "fused": (2, 262144, 512, 1), "folded": (8, 1048576, 512, 1),
                            "blocks": (6, 1048576, 2048, 8),
                            "blocks-cluster": (6, 65536, 2048, 8),
                            "blocks-long": (6, 524288, 2048, 8)}[mode]
    gen = torch.Generator().manual_seed(13)
    inputs = [(make_logits(kind, rows, cols, gen).cuda(),
               make_lengths(spec, rows, cols, k * block, gen).cuda())
              for kind, spec in (("random", "edges"),
                                 ("special", "empty" if mode == "empty" else "eighth"))]
    if mode == "fused":
        want = [decode_topk_ref(x, n, k) for x, n in inputs]
        op = lambda x, n, out, workspace: _triton.launch(x.view(torch.int16), n, out, workspace,
                                                         workspace.cfg, k, fuse=True)
    elif block == 1:
        want = [decode_topk_ref(x, n, k) for x, n in inputs]
        op = lambda x, n, **kw: decode_topk(x, n, k, **kw)
    else:
        want = [decode_topk_blocks_ref(x, n, k, block) for x, n in inputs]
        op = lambda x, n, **kw: decode_topk_blocks(x, n, k, block, **kw)
    src_x, src_n = inputs[0][0].clone(), inputs[0][1].clone()
    x_s, n_s = torch.empty_like(src_x), torch.empty_like(src_n)
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    ws = make_topk_workspace(rows, k, "cuda", block)

    def call():  # the producers are kernels (exact bit copies), not copy-engine memcpys
        torch.bitwise_xor(src_x.view(torch.int16), 0, out=x_s.view(torch.int16))
        torch.bitwise_xor(src_n, 0, out=n_s)
        op(x_s, n_s, out=out, workspace=ws)

    replay_alternating(call, src_x, src_n, out, inputs, want, replays=200)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [16, 512])  # fused only for k <= 512 (_triton.launch)
@pytest.mark.parametrize("rows,cols", [(1, 1048576), (6, 65536), (24, 65536), (3, 262144)])
def test_gpu_fused_threshold(rows, cols, k):
    """On real hardware (concurrent CTAs, the ticket's memory ordering): the fused threshold
    equals the separate kernel's, the candidate counts agree, the tickets are re-armed, and
    both answers equal the twin's; 20 calls back to back."""
    from dsv4_decode.ops.topk import _triton

    gen = torch.Generator().manual_seed(rows * cols + k)
    x = make_logits("random", rows, cols, gen).cuda()
    lens = make_lengths("edges", rows, cols, k, gen).cuda()
    want = decode_topk_ref(x, lens, k)
    res = []
    for fuse in (True, False):
        ws = make_topk_workspace(rows, k, "cuda")
        out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
        for _ in range(20):
            ws.thr.fill_(-3)
            _triton.launch(x.view(torch.int16), lens, out, ws, ws.cfg, k, fuse=fuse)
            assert torch.equal(out, want)
        assert int(ws.tick.abs().sum()) == 0
        res.append((ws.thr.clone(), ws.cnt.clone()))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])


# 64 x 512K, k = 512: the strided fold; 48 x 256K: R = 4 on a 6,144-chunk grid (session 38)
GPU_SHAPES = [(1, 65536), (6, 262144), (12, 1048576), (48, 262144), (64, 65536), (64, 524288),
              (64, 1048576), (3, 1), (5, 777), (4, 100003)]


@pytest.mark.gpu
@pytest.mark.parametrize("k", [512, 2048])
@pytest.mark.parametrize("rows,cols", GPU_SHAPES)
@pytest.mark.parametrize("lens_spec", ["edges", "eighth", "full"])
def test_gpu_random_production(rows, cols, k, lens_spec):
    gen = torch.Generator().manual_seed(rows + cols + k)
    x = make_logits("random", rows, cols, gen)
    lens = make_lengths(lens_spec, rows, cols, k, gen)
    xd = x.cuda() if cols % 8 == 0 else make_padded(x.cuda())
    got = decode_topk(xd, lens.cuda(), k)
    want = decode_topk_ref(xd, lens.cuda(), k)
    assert torch.equal(got, want)
    if rows * cols <= 12 * 1048576:
        check_contract(x, lens, k, got)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["crowded", "constant", "rising", "falling", "special",
                                  "hidden", "neg_inf", "tied", "lumped",
                                  "distinct"])
@pytest.mark.parametrize("rows,cols", [(2, 1048576), (6, 65536), (64, 8192)])
@pytest.mark.parametrize("k", [512, 2048])
def test_gpu_patterns(kind, rows, cols, k):
    gen = torch.Generator().manual_seed(7)
    x = make_logits(kind, rows, cols, gen)
    lens = make_lengths("edges" if rows > 2 else "full", rows, cols, k, gen)
    got = decode_topk(x.cuda(), lens.cuda(), k)
    assert torch.equal(got, decode_topk_ref(x.cuda(), lens.cuda(), k))
    check_contract(x, lens, k, got)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "crowded", "special", "tied"])
@pytest.mark.parametrize("rows,cols", [(1, 65536), (6, 40000), (5, 777)])
@pytest.mark.parametrize("k", [512, 2048])
def test_gpu_row_path_forced(kind, rows, cols, k, monkeypatch):
    """One CTA a row at shapes and k the rule gives the four launches (the kernel itself is
    general up to ROW_COLS columns)."""
    force_path(monkeypatch, "row")
    gen = torch.Generator().manual_seed(rows + cols + k)
    x = make_padded(make_logits(kind, rows, cols, gen).cuda())
    lens = make_lengths("edges", rows, cols, k, gen).cuda()
    got = decode_topk(x, lens, k)
    assert torch.equal(got, decode_topk_ref(x, lens, k))


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols,block", [(1, 65536, 8), (12, 65536, 8), (24, 32768, 8),
                                             (5, 12288, 8), (3, 8192, 2), (2, 65536, 64)])
@pytest.mark.parametrize("kind", ["special", "crowded", "constant", "tied"])
@pytest.mark.parametrize("lens_spec", ["eighth", "full", "edges"])
def test_gpu_blocks_cluster(rows, cols, block, kind, lens_spec):
    """A cluster a row (``_cluster``, what the API runs for these shapes on sm_90+): ties at
    tau spread over the cluster's chunks go to the lowest blocks, rows with fewer candidates
    than n_blocks keep them all; clusters of 16 (8 warps a CTA at 1 row, 4 at 12), 8, 4,
    8 (blocks of 2: 1,024-column chunks) and 16 (blocks of 64: 4,096-column chunks)."""
    from dsv4_decode.ops.topk._cluster import cluster_ctas

    nb = min(2048, cols // block)
    assert cluster_ctas(rows, cols, TopkConfig.pick(nb, block)) > 0
    gen = torch.Generator().manual_seed(rows + cols + block)
    x = make_logits(kind, rows, cols, gen).cuda()
    lens = make_lengths(lens_spec, rows, cols, nb * block, gen).cuda()
    got = decode_topk_blocks(x, lens, nb, block)
    assert torch.equal(got, decode_topk_blocks_ref(x, lens, nb, block))


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols", [(1, 524288), (6, 524288), (12, 524288), (6, 1048576),
                                       (12, 1048576), (64, 131072)])
@pytest.mark.parametrize("lens_spec", ["eighth", "full", "edges"])
def test_gpu_blocks(rows, cols, lens_spec):
    """At production widths: 1-12 rows of 512K the LONG cluster form, 1M rows and 64 rows
    the grid-wide radix select (``_cluster.launch``'s rule)."""
    gen = torch.Generator().manual_seed(cols)
    x = make_logits("special", rows, cols, gen).cuda()
    lens = make_lengths(lens_spec, rows, cols, 2048 * 8, gen).cuda()
    got = decode_topk_blocks(x, lens, 2048, 8)
    assert torch.equal(got, decode_topk_blocks_ref(x, lens, 2048, 8))
