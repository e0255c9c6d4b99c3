"""sparse_attn against its fp32 twin, with tolerances earned from PyTorch's own bf16 math.

CPU (interpreter): small head dims (32/64) plus one production-dim case; GPU: production shapes
(D 512, rope 64, window 128, 512 selected), heads 8/16/32/64, 1-32 requests x q_len 1/6, and
CUDA-graph replay with new indices and positions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from dsv4_decode import formats
from dsv4_decode.bench.timing import capture
from dsv4_decode.engine import cache as C
from dsv4_decode.ops.sparse_attn import (
    LAYOUTS,
    SparseAttnConfig,
    make_workspace,
    pick_config,
    rope_tables,
    sparse_attn,
    sparse_attn_ref,
    wgmma_config,
)
from dsv4_decode.ops.sparse_attn.config import pick_default  # the Triton kernels' default
from dsv4_decode.utils.device import is_hopper


@dataclass
class Case:
    requests: int
    q_len: int
    heads: int
    n_sel: int  # index-list width (0: ratio-0 layer)
    head_dim: int = 32
    rope_dim: int = 8
    window: int = 8
    sinks: bool = True
    spread: bool = True  # requests at very different positions
    page_size: int = 4
    seed: int = 0

    @property
    def id(self) -> str:
        return (f"B{self.requests}xq{self.q_len}-H{self.heads}-K{self.n_sel}-D{self.head_dim}"
                f"-W{self.window}-{'sink' if self.sinks else 'nosink'}")


class Inputs:
    """Random caches written through engine/cache.py, rows at consecutive positions per request,
    index lists with -1, out-of-range and unallocated-page entries."""

    def __init__(self, c: Case, device):
        g = torch.Generator().manual_seed(c.seed)
        d, w = c.head_dim, c.window
        self.case = c
        ring = C.default_ring(w, c.q_len)
        n_slots = c.requests + 2  # unused slots stay poisoned
        base = [3 + 5 * i for i in range(c.requests)]  # partly filled windows
        if c.spread:
            base = [[2, 900, 70000, 40][i % 4] + 37 * (i // 4) for i in range(c.requests)]
        max_pos = max(base) + c.q_len
        # Compressed entries written per request: those visible at ratio 1, capped (the kernel
        # does not check visibility; the indexer only lists visible entries).
        n_entries = [min(b + c.q_len, 600) for b in base]
        max_pages = -(-max(n_entries) // c.page_size) + 1
        n_pages = c.requests * max_pages + 3
        # Poison: bytes that decode to NaN (e4m3 0x7F) wherever nothing valid was written.
        # Caches live on `device` from the start (encoding there is fast on a GPU); the random
        # values come from a CPU generator (the same inputs on every machine).
        u8 = dict(dtype=torch.uint8, device=device)
        self.window_cache = torch.full((n_slots, ring, C.window_record_bytes(d)), 0x7F, **u8)
        self.compressed = torch.full((n_pages, c.page_size, C.compressed_record_bytes(d)), 0x7F,
                                     **u8)
        self.block_table = torch.full((n_slots, max_pages), -1, dtype=torch.int32,
                                      device=device)
        alloc = C.PageAllocator(self.block_table, n_pages, c.page_size)
        slots = torch.randperm(n_slots, generator=g)[: c.requests]
        pos, row_slots = [], []
        for r in range(c.requests):
            s, b = int(slots[r]), base[r]
            p_last = b + c.q_len - 1
            first = max(0, p_last - ring + 1)
            kp = torch.arange(first, p_last + 1, dtype=torch.int32, device=device)
            C.write_window(self.window_cache, torch.full_like(kp, s), kp,
                           torch.randn(len(kp), d, generator=g).to(device))
            alloc.reserve(s, n_entries[r])
            ent = torch.arange(n_entries[r], dtype=torch.int32, device=device)
            C.write_compressed(self.compressed, self.block_table, torch.full_like(ent, s), ent,
                               torch.randn(len(ent), d, generator=g).to(device) * 2)
            pos += list(range(b, b + c.q_len))
            row_slots += [s] * c.q_len
        t = len(pos)
        self.positions = torch.tensor(pos, dtype=torch.int32)
        self.row_slots = torch.tensor(row_slots, dtype=torch.int32)
        self.q = torch.randn(t, c.heads, d, generator=g).to(torch.bfloat16)
        self.sinks = torch.randn(c.heads, generator=g) if c.sinks else None
        freqs = 10000.0 ** (-torch.arange(0, c.rope_dim, 2, dtype=torch.float32) / c.rope_dim)
        self.cos, self.sin = rope_tables(freqs, max_pos + 1)
        self.indices = None
        if c.n_sel:
            vis = torch.tensor([n_entries[i // c.q_len] for i in range(t)])
            idx = (torch.rand(t, c.n_sel, generator=g) * vis[:, None]).long().int()
            noise = torch.rand(t, c.n_sel, generator=g)
            idx[noise < 0.15] = -1
            idx[noise > 0.95] = max_pages * c.page_size + 7  # past the block table
            # An entry on an allocated slot's unallocated page (page id -1): masked.
            idx[:, -1] = (max_pages - 1) * c.page_size
            self.indices = idx
        for name in ("positions", "row_slots", "q", "sinks", "cos", "sin", "indices"):
            v = getattr(self, name)
            if v is not None:
                setattr(self, name, v.to(device))

    def kwargs(self):
        sel = self.indices is not None
        return dict(window=self.case.window, sinks=self.sinks,
                    compressed=self.compressed if sel else None,
                    block_table=self.block_table if sel else None, indices=self.indices)

    def args(self):
        return self.q, self.window_cache, self.positions, self.row_slots, self.cos, self.sin


def compare(inp: Inputs, got: torch.Tensor, what: str = "") -> None:
    """``got`` vs the fp32 twin, within twice PyTorch's own bf16 error. A failure names the
    rows and heads that are off (NaN or beyond the bound), their positions and slots, and the
    worst element, so one GPU log line says whether it is a split, a head block or a row."""
    ref = sparse_attn_ref(*inp.args(), **inp.kwargs()).float()
    ref16 = sparse_attn_ref(*inp.args(), **inp.kwargs(), compute_dtype=torch.bfloat16).float()
    assert not torch.isnan(ref).any(), f"{what}: NaN in the reference (poisoned record read)"
    diff = (got.float() - ref).abs()
    torch_err = (ref16 - ref).abs().max().item()
    bound = max(2 * torch_err, 2**-7 * ref.abs().max().item(), 1e-6)
    bad = torch.isnan(got) | (diff > bound)  # NaN: unwritten output or a masked record read
    if bad.any():
        rows, heads = bad.any(-1).nonzero(as_tuple=True)
        diff = torch.where(torch.isnan(diff), float("inf"), diff)
        t, h, d = (int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
        pytest.fail(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements off ({int(torch.isnan(got).sum())}"
            f" NaN), bound {bound:.3g} (torch bf16 err {torch_err:.3g}); bad rows "
            f"{sorted(set(rows.tolist()))[:16]}, heads {sorted(set(heads.tolist()))[:16]}; "
            f"worst [{t}, {h}, {d}]: got {got[t, h, d].item():.4g} ref {ref[t, h, d].item():.4g}"
            f" at position {int(inp.positions[t])}, slot {int(inp.row_slots[t])}")


def check(inp: Inputs, **kw) -> torch.Tensor:
    out = torch.full_like(inp.q, float("nan"))  # poison: every element must be written
    got = sparse_attn(*inp.args(), **inp.kwargs(), out=out, **kw)
    assert got is out
    t, h, d = inp.q.shape
    n_sel = 0 if inp.indices is None else inp.indices.shape[1]
    cfg = kw.get("config") or (kw["workspace"].config if kw.get("workspace") else
                               pick_config(t, h, d, inp.case.window, n_sel, inp.q.device))
    compare(inp, got, f"{inp.case.id} {cfg}")
    return got


CPU_CASES = [
    Case(3, 1, 4, 0),  # ratio-0 layer, tiny model heads
    Case(2, 6, 16, 20, sinks=False),
    Case(2, 6, 8, 36),
    Case(1, 3, 32, 16, head_dim=64, rope_dim=16, window=16),
    Case(4, 1, 64, 5, spread=False),  # windows not yet full (p < window - 1)
]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.id)
def test_matches_reference(case, device):
    check(Inputs(case, device))


@pytest.mark.parametrize("variant", ["two_splits", "four_splits_fused", "four_splits_kernel",
                                     "nine_splits_fused", "nine_splits_kernel",
                                     "nine_splits_kernel_bf16", "nine_splits_fused_bf16"])
def test_split_and_merge_variants(variant, device):
    """Both merges, with the split count a power of two and not (9 splits: the merge's
    all-splits-at-once loads padded to 16, the padding masked), and bf16 partials."""
    n_split, *rest = variant.split("_")
    n_sel = 128 if n_split == "nine" else 40
    inp = Inputs(Case(2, 2, 16, n_sel, window=16, seed=1), device)
    steps = 4 if n_split == "two" else 1  # 1 window + 3 (8) index steps of 16 keys
    cfg = SparseAttnConfig.with_steps(16, 16, steps, 16, n_sel, num_warps=4,
                                      fused_merge="kernel" not in rest,
                                      partials_bf16="bf16" in rest)
    assert cfg.n_split == {"two": 2, "four": 4, "nine": 9}[n_split]
    check(inp, config=cfg)


@pytest.mark.parametrize("fused", [False, True])
def test_long_first_launch_order(fused, device):
    """``long_first`` (the splits slowest in the grid, the kind with more steps first): the
    same partials and the same answer as each row's splits together, bitwise, with either
    merge, at a split with window steps != index-list steps (window 1 split of 1 step, index
    list 3 splits of 2 steps of 16 keys)."""
    inp = Inputs(Case(3, 2, 32, 90, window=16, seed=4), device)
    cfg = SparseAttnConfig(16, 16, 1, 1, 2, 3, num_warps=4, fused_merge=fused)
    assert cfg.check(16, 90)
    got = [check(inp, config=dataclasses.replace(cfg, long_first=lf)).clone()
           for lf in (False, True)]
    assert torch.equal(got[0], got[1])


@pytest.mark.parametrize("partials", ["fp32", "bf16"])
def test_production_dims(partials, device):
    """D 512 / rope 64 / window 128 (bf16 tiles of 32 x 512, FP4 and FP8 paths, 2 splits;
    the scales read as words), with fp32 and bf16 partials."""
    inp = Inputs(Case(1, 2, 16, 64, head_dim=512, rope_dim=64, window=128, page_size=64),
                 device)
    cfg = dataclasses.replace(pick_config(2, 16, 512, 128, 64, device),
                              partials_bf16=partials == "bf16")
    check(inp, config=cfg)


PROD_CPU = dict(head_dim=512, rope_dim=64, window=128, page_size=64)


@pytest.mark.parametrize("layout", [n for n in LAYOUTS if n != "default"])
def test_layouts_production_dims(layout, device):
    """Every named layout at D 512 (window, FP4 and merge paths), as the rule splits it, and
    with one split of each kind (no merge for the window-only row set)."""
    inp = Inputs(Case(1, 2, 32, 96, **PROD_CPU, seed=6), device)  # 32 heads: for block_h32
    check(inp, config=SparseAttnConfig.pick(2, 32, 512, 128, 96, **LAYOUTS[layout]))
    lay = SparseAttnConfig.pick(2, 32, 512, 128, 0, **LAYOUTS[layout])
    one = SparseAttnConfig.with_steps(lay.block_h, lay.block_n, 128 // lay.block_n, 128, 0,
                                      num_warps=lay.num_warps, dim_split=lay.dim_split)
    assert one.n_split == 1
    check(Inputs(Case(2, 1, 32, 0, **PROD_CPU, seed=7), device), config=one)


@pytest.mark.parametrize("n_sel", [40, 0])
def test_dim_split_small_head_dim(n_sel, device):
    """dim_split 2 at D 64 (32-dim chunks), with several splits and the merge, and window-only
    with one split finalised in place."""
    inp = Inputs(Case(2, 3, 16, n_sel, head_dim=64, rope_dim=16, window=16, seed=4), device)
    steps = 2 if n_sel else 1
    cfg = SparseAttnConfig.with_steps(16, 16, steps, 16, n_sel, num_warps=2, dim_split=2)
    assert cfg.n_split == (3 if n_sel else 1)
    check(inp, config=cfg)


@pytest.mark.parametrize("dim_split", [1, 2])
def test_fp4_tiles_are_exact(dim_split, device):
    """With one visible key (no window, one index entry, no sink, RoPE off) the output is that
    compressed record's value exactly: the decoded tiles (scaled by 2^-8 and back) are exact."""
    inp = Inputs(Case(2, 1, 16, 8, head_dim=64, rope_dim=16, sinks=False, seed=8), device)
    inp.positions.fill_(-1)  # no window keys
    inp.indices.fill_(-1)
    inp.indices[:, 3] = 2  # entry 2 is written for every request (n_entries >= 3)
    inp.cos, inp.sin = torch.ones_like(inp.cos), torch.zeros_like(inp.sin)
    cfg = SparseAttnConfig.with_steps(16, 16, 1, 8, 8, num_warps=2, dim_split=dim_split)
    out = sparse_attn(*inp.args(), **inp.kwargs(), config=cfg)
    entry = torch.tensor([2], dtype=torch.int32, device=device)
    for t in range(out.shape[0]):
        rec = C.read_compressed(inp.compressed, inp.block_table, inp.row_slots[t:t + 1], entry)
        key = formats.decode_compressed_record(rec.cpu()).to(torch.bfloat16)
        assert torch.equal(out[t].cpu(), key.expand(16, -1))


def test_rows_without_keys_are_zero(device):
    """A padding row (slot -1) sees nothing: zeros with and without the sink; a row whose index
    list is all -1 sees its window only."""
    for sinks in (True, False):
        inp = Inputs(Case(2, 2, 16, 24, sinks=sinks, seed=2), device)
        inp.row_slots[1] = -1
        inp.indices[2] = -1
        got = check(inp)
        assert torch.equal(got[1].float(), torch.zeros_like(got[1].float()))


def test_workspace_reuse_and_counters(device):
    """One workspace across calls with new positions and indices: results stay right and the
    fused merge leaves its arrival counters at zero."""
    inp = Inputs(Case(2, 3, 16, 30, seed=3), device)
    cfg = SparseAttnConfig.pick(6, 16, 32, 8, 30, fused_merge=True)
    assert cfg.n_split > 1
    ws = make_workspace(6, 16, 32, 8, 30, device, cfg)
    for step in range(2):
        check(inp, workspace=ws)
        assert int(ws.counters.abs().sum()) == 0
        inp.indices = torch.roll(inp.indices, 1, dims=1)
        inp.positions = inp.positions - step  # earlier positions: smaller windows


def _bad(inp, **over):
    args = dict(zip(("q", "window_cache", "positions", "row_slots", "cos", "sin"), inp.args(),
                    strict=True))
    kw = inp.kwargs()
    for k, v in over.items():
        (args if k in args else kw)[k] = v
    return lambda: sparse_attn(*args.values(), **kw)


@pytest.mark.parametrize("name,make,match", [
    ("q dtype", lambda i: dict(q=i.q.float()), "q: needs a 3-d torch.bfloat16"),
    ("record bytes", lambda i: dict(window_cache=i.window_cache[..., :-1].contiguous()),
     "window_cache: records of"),
    ("ring", lambda i: dict(window=i.window_cache.shape[1] + 1), "shorter than window"),
    ("positions", lambda i: dict(positions=i.positions.long()), "positions: needs a 1-d"),
    ("sinks", lambda i: dict(sinks=i.sinks[:2]), "sinks: needs 4 entries"),
    ("partial", lambda i: dict(indices=None), "give all three or none"),
    ("compressed", lambda i: dict(compressed=i.compressed[..., :-1].contiguous()),
     "compressed: records of"),
    ("out", lambda i: dict(out=torch.empty(2, 4, 32, dtype=torch.bfloat16, device=i.q.device)),
     "out: shape"),
    ("dim_split", lambda i: dict(config=SparseAttnConfig.with_steps(16, 16, 1, 8, 4, num_warps=2,
                                                                    dim_split=2)),
     "config: dim_split 2 needs"),
    ("wgmma head dim", lambda i: dict(config=dataclasses.replace(
        SparseAttnConfig.with_steps(16, 16, 1, 4, 4, num_warps=4), wgmma=True)),
     "config: wgmma: needs head dim 512"),
    ("wgmma warps", lambda i: dict(config=dataclasses.replace(
        SparseAttnConfig.with_steps(16, 64, 1, 4, 4, num_warps=2), wgmma=True)),
     "config: wgmma: needs 4 or 8 warps"),
])
def test_bad_arguments(name, make, match, device):
    inp = Inputs(Case(1, 1, 4, 4), device)
    with pytest.raises(ValueError, match=match):
        _bad(inp, **make(inp))()


# ----------------------------------------------------------------------------- GPU


PROD = dict(head_dim=512, rope_dim=64, window=128, page_size=64)
GPU_CASES = [
    Case(b, ql, h, k, sinks=s, **PROD)
    for (b, ql) in ((1, 1), (1, 6), (2, 6), (8, 6), (32, 1), (32, 6))
    for h in (8, 16, 32, 64)
    for k, s in ((512, True), (0, True), (200, False))
    if not (h in (8, 32) and b in (2, 32) and k != 512)  # keep the grid to ~60 cases
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.id)
def test_gpu_production_shapes(case):
    """The default config (on a Hopper GPU the wgmma kernel, elsewhere the Triton kernels)."""
    check(Inputs(case, torch.device("cuda")))


TRITON_CASES = [
    Case(1, 6, 16, 512, **PROD), Case(8, 6, 16, 512, **PROD), Case(32, 6, 16, 512, **PROD),
    Case(2, 6, 64, 200, sinks=False, **PROD), Case(32, 1, 16, 0, **PROD),
    Case(1, 1, 64, 512, **PROD), Case(4, 6, 32, 512, **PROD), Case(8, 6, 8, 512, **PROD),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", TRITON_CASES, ids=lambda c: c.id)
def test_gpu_triton_default(case):
    """The Triton kernels' default (``pick_default`` without wgmma: what runs off Hopper) at
    production shapes, also on a Hopper GPU, where the default is the wgmma kernel."""
    inp = Inputs(case, torch.device("cuda"))
    t, h, _ = inp.q.shape
    check(inp, config=pick_default(t, h, 512, 128, case.n_sel))


LAYOUT_CASES = [  # few shapes: each layout x shape is its own kernel to compile (window-only
    # layouts run on the CPU, test_layouts_production_dims)
    Case(1, 6, 16, 512, **PROD), Case(8, 6, 16, 512, **PROD),
    Case(2, 6, 64, 200, sinks=False, **PROD),
]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", [n for n in LAYOUTS if n != "default"])
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=lambda c: c.id)
def test_gpu_layouts(case, layout):
    """The named layouts at production shapes, split by the rule for their CTAs per SM."""
    inp = Inputs(case, torch.device("cuda"))
    t, h, _ = inp.q.shape
    check(inp, config=SparseAttnConfig.pick(t, h, 512, 128, case.n_sel, **LAYOUTS[layout]))


def test_wgmma_config_warps():
    """``wgmma_config``'s warps: the default (8 warps for one-step splits that fill at most 3/4
    of the SMs, else 4), 8 or 4 throughout by request; other counts refused."""
    assert wgmma_config(6, 16, 128, 512).num_warps == 8
    assert wgmma_config(192, 16, 128, 512).num_warps == 4
    assert wgmma_config(192, 16, 128, 512, num_warps=8).num_warps == 8
    with pytest.raises(ValueError, match="num_warps"):
        wgmma_config(48, 16, 128, 512, num_warps=2)


# the fastest (window / index-list steps a split) of session 14's run 6 (H200, every benchmark
# cell against 2/2, 2/3, 1/4, 2/5 and 2/8) by (row, head block) groups; 16 x 1 x 16 (16
# groups: one-step splits 11.44 us, 2/2 11.26) is left out
MEASURED_SPLITS = {24: (1, 1), 32: (2, 2), 48: (2, 2), 64: (2, 3), 96: (1, 4), 128: (1, 4),
                   192: (2, 8), 384: (2, 8), 768: (2, 8)}


def test_wgmma_split_rule_picks_the_measured_best():
    """``_split_schedule`` (the wgmma split rule's schedule model) picks run 6's fastest pair
    at every group count of the benchmark, long-first where the two kinds' steps differ, and
    each config covers the window and the index list exactly."""
    for groups, (w, c) in MEASURED_SPLITS.items():
        for rows, heads in ((groups, 16), (groups // 4, 64)):
            cfg = wgmma_config(rows, heads, 128, 512)
            assert (cfg.w_steps, cfg.c_steps) == (w, c), (rows, heads, cfg)
            assert cfg.long_first == (w != c) and cfg.check(128, 512), cfg
    cfg = wgmma_config(192, 16, 128, 0)  # window only: two one-step splits
    assert (cfg.w_steps, cfg.n_split, cfg.long_first) == (1, 2, False), cfg


def test_wgmma_needs_hopper(device):
    """The wgmma config is refused, with a clear error, off a Hopper GPU (the CPU here)."""
    if device.type == "cuda":
        pytest.skip("a CPU check")
    inp = Inputs(Case(1, 6, 16, 512, **PROD), device)
    with pytest.raises(ValueError, match="wgmma needs a Hopper GPU"):
        check(inp, config=wgmma_config(6, 16, 128, 512))


WGMMA_CASES = [
    Case(1, 6, 16, 512, **PROD), Case(8, 6, 16, 512, **PROD), Case(32, 6, 16, 512, **PROD),
    Case(32, 1, 16, 512, **PROD), Case(2, 6, 64, 200, sinks=False, **PROD),
    Case(4, 6, 32, 0, **PROD), Case(8, 6, 8, 512, **PROD),
]


@pytest.mark.gpu
@pytest.mark.parametrize("warps", [8, 4])
@pytest.mark.parametrize("case", WGMMA_CASES, ids=lambda c: c.id)
def test_gpu_wgmma(case, warps):
    """The Hopper wgmma kernel (``config.wgmma``) against the twin: window and index-list
    splits, partial lists, ratio-0 (window only), 8 / 16 / 32 / 64 heads; at 8 and 4 warps
    (4: S^T from registers), also at three steps a split (the loops' carried index chains)."""
    if not is_hopper(torch.device("cuda")):
        pytest.skip("wgmma: Hopper only")
    inp = Inputs(case, torch.device("cuda"))
    t, h, _ = inp.q.shape
    check(inp, config=wgmma_config(t, h, 128, case.n_sel, num_warps=warps))
    three = SparseAttnConfig.with_steps(16, 64, 3, 128, case.n_sel, num_warps=warps)
    if three.n_split > 1:  # (the window alone is one split of two steps)
        check(inp, config=dataclasses.replace(three, wgmma=True))


@pytest.mark.gpu
@pytest.mark.parametrize("case", LAYOUT_CASES[:2] + [Case(32, 6, 16, 512, **PROD)],
                         ids=lambda c: c.id)
def test_gpu_partials_bf16(case):
    """bf16 split partials (the sweep's ``_bf16`` variants) at production shapes."""
    inp = Inputs(case, torch.device("cuda"))
    t, h, _ = inp.q.shape
    check(inp, config=dataclasses.replace(pick_default(t, h, 512, 128, case.n_sel),
                                          partials_bf16=True))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["triton", "wgmma"])
@pytest.mark.parametrize("case", LAYOUT_CASES[:2], ids=lambda c: c.id)
def test_gpu_merge_pdl(case, kernel):
    """The merge kernel as a programmatic dependent launch (waits for the partials), after
    the Triton kernels' default; and the wgmma kernel (Hopper), whose default has both
    kernels dependent, with plain launches (``pdl`` and ``pdl_entry`` off)."""
    inp = Inputs(case, torch.device("cuda"))
    t, h, _ = inp.q.shape
    if kernel == "wgmma":
        if not is_hopper(inp.q.device):
            pytest.skip("wgmma: Hopper only")
        cfg = wgmma_config(t, h, 128, case.n_sel)
        assert cfg.pdl and cfg.pdl_entry, cfg
        check(inp, config=dataclasses.replace(cfg, pdl=False, pdl_entry=False))
        return
    check(inp, config=dataclasses.replace(pick_default(t, h, 512, 128, case.n_sel), pdl=True))


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_gpu_merge_repeatable(fused):
    """The round-1 GPU run failed once at 8 x 6 rows x 64 heads (fused merge, 3 splits), a shape
    whose split config passed at 32 x 6 x 16 heads: repeat it with both merges at the round-1
    kernel split (10 index steps) and at the default split, so an intermittent merge race
    shows up (and which merge has it). 5 repeats each (was 10; all passed in round 2)."""
    dev = torch.device("cuda")
    inp = Inputs(Case(8, 6, 64, 512, **PROD), dev)
    t = inp.q.shape[0]
    round1 = SparseAttnConfig.with_steps(16, 32, 10, 128, 512, num_warps=8, fused_merge=fused)
    for cfg in (round1,
                dataclasses.replace(pick_default(t, 64, 512, 128, 512), fused_merge=fused)):
        for _ in range(5):
            check(inp, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("merge", ["fused", "kernel", "kernel_pdl", "one_step", "one_step_pdl",
                                   "wgmma", "wgmma_w8", "wgmma_w4"])
def test_gpu_graph_replay_new_indices_and_positions(merge):
    """Replays of one captured call with new indices, positions and q (the merge kernel also
    as a programmatic dependent launch: a PDL edge inside the graph). ``one_step``: the
    default at 1 request (one-step 64-key splits without prefetch code, 10 partials merged),
    ``wgmma``: the Hopper kernel's default at 16 requests, ``wgmma_w8`` / ``wgmma_w4``: it at
    8 and 4 warps, four steps a split (their multi-step copies and index chains),
    otherwise 4 requests split by the 8-warp rule (multi-step loops)."""
    dev = torch.device("cuda")
    if merge.startswith("wgmma") and not is_hopper(dev):
        pytest.skip("wgmma: Hopper only")
    requests = {"one_step": 1, "one_step_pdl": 1}.get(merge, 16 if "wgmma" in merge else 4)
    inp = Inputs(Case(requests, 6, 16, 512, **PROD), dev)
    t = inp.q.shape[0]
    if requests == 1:  # the Triton one-step layout (PDL variants)
        cfg = pick_default(t, 16, 512, 128, 512)
        assert cfg.c_steps == cfg.w_steps == 1 and cfg.n_split > 1, cfg
    elif merge == "wgmma":
        cfg = wgmma_config(t, 16, 128, 512)
        assert cfg.c_steps > 1, cfg  # the copies and the index chain run ahead in a loop
    elif merge in ("wgmma_w8", "wgmma_w4"):
        cfg = dataclasses.replace(
            SparseAttnConfig.with_steps(16, 64, 4, 128, 512, num_warps=int(merge[-1])),
            wgmma=True, pdl=True, pdl_entry=True)
    else:
        cfg = SparseAttnConfig.pick(t, 16, 512, 128, 512, fused_merge=merge == "fused")
    if not merge.startswith("wgmma"):  # the wgmma configs keep their dependent launches
        cfg = dataclasses.replace(cfg, pdl=merge.endswith("_pdl"))
    ws = make_workspace(t, 16, 512, 128, 512, dev, cfg)
    out = torch.empty_like(inp.q)
    run = lambda: sparse_attn(*inp.args(), **inp.kwargs(), out=out, workspace=ws)
    graph = capture(run)
    g = torch.Generator(device="cpu").manual_seed(5)
    for step in range(3):
        new_idx = inp.indices.cpu()[:, torch.randperm(512, generator=g)]
        new_idx[:, : 50 * step] = -1
        inp.indices.copy_(new_idx)
        inp.positions.sub_(step)  # still inside the written ring and entries
        inp.q.copy_(torch.randn_like(inp.q.float()).to(torch.bfloat16))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        compare(inp, out, f"replay {step} of {cfg}")
        if cfg.fused_merge:
            assert int(ws.counters.abs().sum()) == 0, f"replay {step}: counters {ws.counters}"


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["triton", "wgmma"])
@pytest.mark.parametrize("requests", [1, 8])
def test_gpu_pdl_inputs_written_in_graph(requests, kernel):
    """The attention kernel as a programmatic dependent launch (``pdl_entry``, sm_90+): here
    kernels inside the graph write q, the positions and the index lists just before the call,
    so reading any of them before the wait would see the previous replay's set. Triton, 1
    request: the one-step layout (its default; the merge is a dependent launch too); 8: the
    4-warp multi-step one (not its default: measured slower). wgmma (Hopper): its default
    config, both flags on (one-step splits at 1 request, 2-step splits at 8). Four replays
    alternating two input sets, each against the twin."""
    dev = torch.device("cuda")
    if kernel == "wgmma" and not is_hopper(dev):
        pytest.skip("wgmma: Hopper only")
    inp = Inputs(Case(requests, 6, 16, 512, **PROD), dev)
    g = torch.Generator(device="cpu").manual_seed(9)
    sets = [(inp.q.clone(), inp.positions.clone(), inp.indices.clone()),
            (torch.randn_like(inp.q.float()).to(torch.bfloat16), inp.positions - 3,
             inp.indices.cpu()[:, torch.randperm(512, generator=g)].to(dev))]
    src = [s.clone() for s in sets[0]]
    t = inp.q.shape[0]
    if kernel == "wgmma":
        cfg = wgmma_config(t, 16, 128, 512)
        assert cfg.pdl and cfg.pdl_entry, cfg
    else:
        cfg = dataclasses.replace(pick_default(t, 16, 512, 128, 512), pdl_entry=True)
    ws = make_workspace(t, 16, 512, 128, 512, dev, cfg)
    out = torch.empty_like(inp.q)

    def call():  # exact bit copies by kernels (not copy-engine memcpys)
        torch.bitwise_xor(src[0].view(torch.int16), 0, out=inp.q.view(torch.int16))
        torch.bitwise_xor(src[1], 0, out=inp.positions)
        torch.bitwise_xor(src[2], 0, out=inp.indices)
        sparse_attn(*inp.args(), **inp.kwargs(), out=out, workspace=ws)

    graph = capture(call)
    for i in range(4):
        for dst, new in zip(src, sets[i % 2], strict=True):
            dst.copy_(new)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        compare(inp, out, f"replay {i} of {cfg}")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["triton", "wgmma", "wgmma_w4"])
@pytest.mark.parametrize("magnitude", [3.0, 1e-3])
def test_gpu_records_are_exact_bf16(kernel, magnitude):
    """The dequantised tiles are exact: with one key per row the output is that key (bf16).
    ``triton``: the Triton kernels' fp32 decode; ``wgmma``: the Hopper kernel's bf16x2 decode
    (its default here is at 8 warps; ``wgmma_w4`` at 4 warps, whose NVFP4 chunks are read in
    wgmma's register A layout); ``1e-3``: e4m3 scales down to subnormal."""
    dev = torch.device("cuda")
    if kernel.startswith("wgmma") and not is_hopper(dev):
        pytest.skip("wgmma: Hopper only")
    inp = Inputs(Case(2, 1, 16, 512, sinks=False, **PROD), dev)
    inp.positions.fill_(-1)  # no window keys
    inp.indices.fill_(-1)
    inp.indices[:, 7] = 3
    inp.cos = torch.ones_like(inp.cos)
    inp.sin = torch.zeros_like(inp.sin)
    entry = torch.tensor([3], dtype=torch.int32, device=dev)
    for t in range(inp.row_slots.shape[0]):  # entry 3 may be unwritten (NaN poison): write it
        latent = (torch.randn(1, 512, device=dev) * magnitude).to(torch.bfloat16)
        C.write_compressed(inp.compressed, inp.block_table, inp.row_slots[t:t + 1], entry, latent)
    if kernel.startswith("wgmma"):
        cfg = wgmma_config(2, 16, 128, 512, num_warps=4 if kernel == "wgmma_w4" else None)
    else:
        cfg = pick_default(2, 16, 512, 128, 512)
    out = sparse_attn(*inp.args(), **inp.kwargs(), config=cfg)
    for t in range(out.shape[0]):
        rec = C.read_compressed(inp.compressed, inp.block_table, inp.row_slots[t:t + 1], entry)
        key = formats.decode_compressed_record(rec.cpu()).to(torch.bfloat16)
        assert torch.equal(out[t].cpu(), key.expand(16, -1))


# ----------------------------------------------------------------------------- sm90 compile

_COMPILE_SM90 = r'''
import json
import triton
from dsv4_decode.utils.sm90 import spill_stores
from dsv4_decode.ops.sparse_attn import _triton as K
from dsv4_decode.ops.sparse_attn import LAYOUTS, SparseAttnConfig, pick_config

PTR = dict(q_ptr="*bf16", win_ptr="*u8", pos_ptr="*i32", slot_ptr="*i32", cos_ptr="*fp32",
           sin_ptr="*fp32", sink_ptr="*fp32", comp_ptr="*u8", bt_ptr="*i32", idx_ptr="*i32",
           out_ptr="*bf16", ws_acc_ptr="*fp32", ws_m_ptr="*fp32", ws_l_ptr="*fp32",
           cnt_ptr="*i32")


def build(fn, const, num_warps, **ptr):
    return spill_stores(fn, const, num_warps, {**PTR, **ptr}, scalar_types={"qk_scale": "fp32"})


out = {}


def main(name, cfg, n_sel, fused, pdl=False, **ptr):
    const = dict(WINDOW=128, D=512, R2=32, PAGE=64, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
                 W_STEPS=cfg.w_steps, N_WSPLIT=cfg.n_wsplit, C_STEPS=cfg.c_steps,
                 N_SPLIT=cfg.n_split, HAS_SEL=n_sel > 0, HAS_SINK=True, FUSED_MERGE=fused,
                 DIM_SPLIT=cfg.dim_split, PDL=pdl, NS=triton.next_power_of_2(cfg.n_split),
                 FUSED_DM=K.FUSED_MERGE_DIMS, WAIT=True,  # pdl_entry: a dependent launch
                 LONG_FIRST=cfg.long_first)
    out[name] = build(K._sparse_attn_kernel, const, cfg.num_warps, **ptr)


# the defaults (pick_config: block_n64 one-step splits at 6 rows x 16 heads, the 4-warp layout
# at 64 heads and at 48 rows), and the fused last-CTA merge on the 8-warp rule's layout
for rows, heads, n_sel in ((6, 16, 512), (6, 64, 512), (48, 16, 512), (6, 16, 0)):
    main(f"default-{rows}x{heads}-K{n_sel}", pick_config(rows, heads, 512, 128, n_sel, "cpu"),
         n_sel, False)
for n_sel in (512, 0):
    main(f"fused-K{n_sel}", SparseAttnConfig.pick(6, 16, 512, 128, n_sel), n_sel, True)
for rows in (6, 192):  # bf16 partials (sweep variant) on both default layouts
    main(f"partials_bf16-{rows}x16", pick_config(rows, 16, 512, 128, 512, "cpu"), 512, False,
         ws_acc_ptr="*bf16")
for name, layout in LAYOUTS.items():
    if name != "default":
        main(name, SparseAttnConfig.pick(48, 64, 512, 128, 512, **layout), 512, False,
             pdl=name == "block_n64")
# the merge at the default splits (10 at 1 x 6, 5 from 4 x 6), 20 (one step a split at 1 request,
# sweep) with PDL, and 32-head blocks
for n_split, block_h, pdl, acc in ((10, 16, False, "*fp32"), (5, 16, False, "*fp32"),
                                   (20, 16, True, "*fp32"), (10, 32, False, "*fp32"),
                                   (5, 16, False, "*bf16")):
    const = dict(D=512, DM=K.merge_dims(512, n_split, block_h), R2=32, BLOCK_H=block_h,
                 N_SPLIT=n_split, NS=triton.next_power_of_2(n_split), HAS_SINK=True, PDL=pdl)
    out[f"merge-{n_split}-h{block_h}-pdl{pdl}-{acc[1:]}"] = build(K._merge_kernel, const, 4,
                                                                  ws_acc_ptr=acc)
# the Hopper wgmma kernel (Gluon) at its default configs (one-step at 8 warps at 6 rows, at
# 4 warps at 12 and 24; the rule at 4 warps from 32), window only, 8 warps with several
# steps, and plain launches
from dsv4_decode.ops.sparse_attn import _gluon as G, wgmma_config
for rows, n_sel, warps, dep in ((6, 512, None, True), (12, 512, None, True),
                                (24, 512, None, True), (32, 512, None, True),
                                (48, 512, None, True), (192, 512, None, True),
                                (48, 0, None, True), (192, 512, 8, True), (48, 512, 4, False)):
    cfg = wgmma_config(rows, 16, 128, n_sel, num_warps=warps)
    const = dict(WINDOW=128, D=512, PAGE=64, W_STEPS=cfg.w_steps, N_WSPLIT=cfg.n_wsplit,
                 C_STEPS=cfg.c_steps, N_SPLIT=cfg.n_split, HAS_SEL=n_sel > 0,
                 PDL=cfg.pdl and dep, WAIT=cfg.pdl_entry and dep, LONG_FIRST=cfg.long_first)
    name = f"wgmma-{rows}-K{n_sel}-w{cfg.num_warps}{'' if dep else '-plain'}"
    out[name] = spill_stores(G._wgmma_attn_kernel, const, cfg.num_warps, PTR,
                             scalar_types={"qk_scale": "fp32"},
                             maxnreg=128 if cfg.num_warps == 8 else 0)
print(json.dumps(out))
'''


def test_compiles_for_sm90_without_spills():
    """The production configs go through Triton's whole sm_90 pipeline (TTIR -> PTX -> ptxas)
    without a GPU; the compiler's own checks (types across branches, layouts, dot shapes) run
    here, which the interpreter skips. No register spills at the default configs nor at the
    named layouts (``LAYOUTS``, 8 x 6 rows x 64 heads)."""
    from dsv4_decode.utils.sm90 import run_compile_script

    spills = run_compile_script(_COMPILE_SM90)
    # the 4-warp default layout (from 4 requests x 6 rows, and 64 heads) sits at the
    # 255-register cap: 32 and 24 bytes of spills since session 5's three-step address chain
    # (16 and 0 before), all outside the K loops (cuobjdump: STL / LDL only in the prologue and
    # the partial store). Its bf16-partials sweep variant spills 100 B (84 before).
    assert spills.pop("default-48x16-K512") <= 32
    assert spills.pop("default-6x64-K512") <= 24
    assert spills.pop("partials_bf16-192x16") <= 100
    assert spills.pop("block_h32") <= 20  # a sweep layout, 255 registers (0 before session 5)
    assert spills == {k: 0 for k in spills}, spills  # the wgmma kernel's included
