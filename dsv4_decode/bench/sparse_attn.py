"""Benchmark of ``sparse_attn`` on one GPU: CUDA-graph replay medians, ours vs the compiled twin.

Cases: requests 1..32 x q_len 6 (and 1), 512 selected entries per row + a full 128-key window,
16 heads (a TP=4 rank) and 64 heads (TP=1), head dim 512, rope 64. Implementations:
``ours`` (default config: the wave-count split rule, second merge kernel, FP4 keys dequantised
as even/odd halves; the round-1 variants it replaced are measured in benchmarks/results),
``ours_<layout>`` with ``--layouts`` (the other named layouts of ``LAYOUTS``),
``compiled`` (``torch.compile`` of
``sparse_attn_ref``, fp32 math on the dequantised records: the baseline a user has). Each of
the ``CALLS`` calls captured in one graph uses its own set of slots, pages, q and out (rotating
the inputs; at small batch the 20 sets still fit in the 60 MB L2). The floor is the distinct
bytes one call must read or write (window records + selected records + q + out) at 4.5 TB/s.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from dsv4_decode.bench.results import RESULTS_DIR, Row, case_key, print_table, write_rows
from dsv4_decode.bench.timing import graph_time_us
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
from dsv4_decode.ops.sparse_attn.config import pick_default
from dsv4_decode.utils.device import is_hopper, sm_count

D, ROPE, WINDOW, SELECTED, PAGE = 512, 64, 128, 512, 64
ENTRIES = 4096  # compressed entries per request (indices are drawn among them)
CALLS = 20  # calls per graph = input sets


class Inputs:
    """``CALLS`` input sets for ``requests`` x ``q_len`` rows of ``heads`` heads."""

    def __init__(self, requests: int, q_len: int, heads: int, n_sel: int, sets: int,
                 device="cuda"):
        dev = torch.device(device)
        g = torch.Generator(device=dev).manual_seed(0)
        ring = C.default_ring(WINDOW)
        slots = requests * sets
        pages_per = -(-ENTRIES // PAGE)
        t = requests * q_len
        self.rows, self.n_sel = t, n_sel
        self.window_cache = torch.randint(0, 256, (slots, ring, C.window_record_bytes(D)),
                                          dtype=torch.uint8, device=dev, generator=g)
        # valid e4m3 codes (no NaN 0x7F/0xFF) and ue8m0 scales near 1
        self.window_cache[..., :D] &= 0x77
        self.window_cache[..., D:] = torch.randint(120, 128, (slots, ring, D // 32),
                                                   dtype=torch.uint8, device=dev, generator=g)
        self.compressed = torch.randint(0, 256, (slots * pages_per, PAGE,
                                                 C.compressed_record_bytes(D)),
                                        dtype=torch.uint8, device=dev, generator=g)
        self.compressed[..., D // 2:] = 0x30  # e4m3 scale 0.5
        perm = torch.randperm(slots * pages_per, device=dev, generator=g).int()
        self.block_table = perm.reshape(slots, pages_per).contiguous()
        self.sinks = torch.randn(heads, device=dev, generator=g)
        freqs = 10000.0 ** (-torch.arange(0, ROPE, 2, dtype=torch.float32, device=dev) / ROPE)
        base = torch.randint(ENTRIES, 60000, (requests,), device=dev, generator=g)
        pos = (base[:, None] + torch.arange(q_len, device=dev)[None, :]).flatten().int()
        self.cos, self.sin = rope_tables(freqs, 60000 + q_len)
        self.sets = []
        for s in range(sets):
            row_slots = (s * requests + torch.arange(requests, device=dev)).repeat_interleave(
                q_len).int()
            idx = torch.argsort(torch.rand(t, ENTRIES, device=dev, generator=g), dim=1)
            self.sets.append(dict(
                q=torch.randn(t, heads, D, device=dev, generator=g).to(torch.bfloat16),
                positions=pos.clone(), row_slots=row_slots,
                indices=idx[:, :n_sel].int().contiguous() if n_sel else None,
                out=torch.empty(t, heads, D, dtype=torch.bfloat16, device=dev)))

    def call_args(self, s: int):
        st = self.sets[s]
        sel = st["indices"] is not None
        return ((st["q"], self.window_cache, st["positions"], st["row_slots"], self.cos,
                 self.sin),
                dict(window=WINDOW, sinks=self.sinks, compressed=self.compressed if sel else None,
                     block_table=self.block_table if sel else None, indices=st["indices"]))

    def floor_bytes(self, requests: int, q_len: int, heads: int) -> int:
        st = self.sets[0]
        window = requests * (WINDOW + q_len - 1) * C.window_record_bytes(D)
        sel = 0
        if st["indices"] is not None:
            per_req = st["indices"].reshape(requests, -1)
            sel = sum(int(torch.unique(r).numel()) for r in per_req)
        return window + sel * C.compressed_record_bytes(D) + 2 * 2 * self.rows * heads * D


def triton_default(rows: int, heads: int) -> SparseAttnConfig:
    """The Triton kernels' default for the benchmark's shapes on this GPU (what runs off
    Hopper; on Hopper the default is the wgmma kernel)."""
    return pick_default(rows, heads, D, WINDOW, SELECTED, sm_count(torch.device("cuda")))


def _timed(fn_for_set, sets: int, replays: int = 20) -> float:
    i = [0]

    def call():
        fn_for_set(i[0] % sets)
        i[0] += 1

    return graph_time_us(call, calls=CALLS, replays=replays)


def bench_case(requests: int, q_len: int, heads: int, compiled, layouts: bool = False
               ) -> list[Row]:
    inp = Inputs(requests, q_len, heads, SELECTED, CALLS)
    case = case_key(requests=requests, q_len=q_len, heads=heads, selected=SELECTED)
    floor = inp.floor_bytes(requests, q_len, heads)
    rows = []
    cfg = pick_config(inp.rows, heads, D, WINDOW, SELECTED)
    impls = [("ours", cfg)]
    if cfg.wgmma:  # the Triton kernels' default beside it (same run): what wgmma replaced
        impls.append(("ours_triton", triton_default(inp.rows, heads)))
    if layouts:  # every other named layout as its own implementation, split by the rule
        for name, lay in LAYOUTS.items():
            c = SparseAttnConfig.pick(inp.rows, heads, D, WINDOW, SELECTED, **lay)
            if name != "default" and c != cfg:  # block_h32 is the default at 16 heads
                impls.append((f"ours_{name}", c))
    for impl, c in impls:
        ws = make_workspace(inp.rows, heads, D, WINDOW, SELECTED, "cuda", c)

        def ours(s, c=c, ws=ws):
            a, kw = inp.call_args(s)
            sparse_attn(*a, **kw, out=inp.sets[s]["out"], workspace=ws, config=c)

        try:
            rows.append(Row("sparse_attn", case, impl, _timed(ours, CALLS), floor))
        except Exception as err:  # report and keep going (e.g. one variant fails to compile)
            print(f"{case} {impl}: failed: {type(err).__name__}: {err}")
    if compiled is not None:
        def base(s):
            a, kw = inp.call_args(s)
            inp.sets[s]["out"].copy_(compiled(*a, **kw))

        try:
            us = _timed(base, CALLS, replays=5)  # slow baseline: fewer replays
            rows.append(Row("sparse_attn", case, "compiled", us, floor))
        except Exception as err:
            print(f"{case} compiled: failed: {type(err).__name__}: {err}")
    return rows


SWEEP_CASES = [(1, 6, 16), (8, 6, 16), (32, 6, 16), (1, 6, 64), (32, 6, 64), (1, 1, 16)]


def sweep_variants(rows: int, heads: int) -> dict[str, SparseAttnConfig]:
    """Named configs for one shape: ``ours`` (the default); on Hopper, where that is the
    wgmma kernel, ``ours_triton`` (the Triton kernels' default), else ``wgmma`` (the wgmma
    kernel's config), and the wgmma kernel with half and twice the steps
    (``wgmma_steps<n>``) and its split rule at 8 and at 4 warps throughout (``wgmma_w8`` /
    ``wgmma_w4``).
    Variants of the Triton kernels' default: its merge as a programmatic dependent launch
    (``_pdl``) or by the last CTA (``_fused``), bf16 split partials (``_bf16``), other step
    counts (``_steps<n>``); where it is the one-step 64-key layout, one-step 32-key splits at
    8 and 4 warps (also with the merge as a dependent launch), else
    ``block_n64`` split by the rule; ``block_h32`` (two 32-head blocks) where there are >= 32
    heads. (Session 11 also swept the 4-warp layout capped at 168 / 128 registers: slower
    everywhere, docs/kernels/sparse_attn.md.)"""
    out = {"ours": pick_config(rows, heads, D, WINDOW, SELECTED)}
    # the variants below are of the Triton kernels' default (``ours_triton`` where ours is the
    # wgmma kernel)
    ours = triton_default(rows, heads)
    if ours != out["ours"]:
        out["ours_triton"] = ours
    out |= {"ours_pdl": dataclasses.replace(ours, pdl=True),
            "ours_fused": dataclasses.replace(ours, fused_merge=True),
            "ours_bf16": dataclasses.replace(ours, partials_bf16=True)}
    steps = max(ours.w_steps, ours.c_steps)
    for st in sorted({1, 2, steps // 2, steps * 2} - {0, steps}):
        c = SparseAttnConfig.with_steps(ours.block_h, ours.block_n, st, WINDOW, SELECTED,
                                        num_warps=ours.num_warps)
        if c.n_split <= 20:
            out[f"ours_steps{st}"] = c
    if ours.block_n == 64:  # the one-step regime (1-2 requests): 32-key steps, twice the CTAs
        for warps in (8, 4):
            c = SparseAttnConfig.with_steps(ours.block_h, 32, 1, WINDOW, SELECTED,
                                            num_warps=warps)
            out[f"n32_w{warps}_steps1"] = c
            out[f"n32_w{warps}_steps1_pdl"] = dataclasses.replace(c, pdl=True)
    else:
        out["block_n64"] = SparseAttnConfig.pick(rows, heads, D, WINDOW, SELECTED, block_n=64)
    if is_hopper(torch.device("cuda")):  # the wgmma kernel (session 11)
        wg = out["ours"]
        if not wg.wgmma:  # the one-step layout's cells: the wgmma kernel beside it
            wg = out["wgmma"] = wgmma_config(rows, heads, WINDOW, SELECTED)
        # its steps halved and doubled (its own warps), and the rule at 8 and 4 warps
        # throughout
        for st in sorted({max(wg.w_steps, wg.c_steps) * 2, max(wg.w_steps, wg.c_steps) // 2}
                         - {0}):
            c = SparseAttnConfig.with_steps(16, 64, st, WINDOW, SELECTED, num_warps=wg.num_warps,
                                            wgmma=True, pdl=True, pdl_entry=True)
            if c.n_split > 1:
                out[f"wgmma_steps{st}"] = c
        for warps in (8, 4):
            out[f"wgmma_w{warps}"] = wgmma_config(rows, heads, WINDOW, SELECTED, num_warps=warps)
    if heads >= 32:
        out["block_h32"] = SparseAttnConfig.pick(rows, heads, D, WINDOW, SELECTED, block_h=32)
    seen, unique = set(), {}
    for name, cfg in out.items():  # a config under two names is timed once (the first)
        if cfg not in seen:
            seen.add(cfg)
            unique[name] = cfg
    return unique


def sweep(cases) -> None:
    """Time the variants of ``sweep_variants`` (printed, then one table; no CSV rows)."""
    table: dict[str, dict[str, float | str]] = {}
    for b, ql, h in cases:
        inp = Inputs(b, ql, h, SELECTED, CALLS)
        key = f"{b}x{ql}x{h}"
        for name, c in sweep_variants(inp.rows, h).items():
            ws = make_workspace(inp.rows, h, D, WINDOW, SELECTED, "cuda", c)

            def f(s, c=c, ws=ws, inp=inp):
                a, kw = inp.call_args(s)
                sparse_attn(*a, **kw, out=inp.sets[s]["out"], workspace=ws, config=c)

            try:
                us = _timed(f, CALLS)
                shown = f"{us:9.2f} us"
            except Exception as err:
                us, shown = "fail", f"failed: {type(err).__name__}: {str(err)[:200]}"
            table.setdefault(name, {})[key] = us
            print(f"requests={b},q_len={ql},heads={h} {name:22s} {shown}  {c}", flush=True)
    keys = [f"{b}x{ql}x{h}" for b, ql, h in cases]
    print("\n| variant | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, row in table.items():
        cells = [row.get(k, "") for k in keys]
        print(f"| {name} | " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v)
                                          for v in cells) + " |")


def kernels(requests: int, q_len: int, heads: int) -> str:
    """The profiler's per-kernel table of ``ours`` for one case (``bench.kernels``)."""
    from dsv4_decode.bench.kernels import kernel_table

    inp = Inputs(requests, q_len, heads, SELECTED, CALLS)
    c = pick_config(inp.rows, heads, D, WINDOW, SELECTED)
    ws = make_workspace(inp.rows, heads, D, WINDOW, SELECTED, "cuda", c)
    i = [0]

    def fn():
        s = i[0] % CALLS
        i[0] += 1
        a, kw = inp.call_args(s)
        sparse_attn(*a, **kw, out=inp.sets[s]["out"], workspace=ws, config=c)

    return kernel_table(fn, CALLS).format(f"requests={requests},q_len={q_len},heads={heads} {c}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="dsv4-decode bench sparse_attn",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(RESULTS_DIR), help="CSV folder (appends sparse_attn.csv)")
    p.add_argument("--quick", action="store_true",
                   help="requests 1, 8, 32 x q_len 6 at 16 heads and 1 x 6 at 64 heads")
    p.add_argument("--no-compiled", action="store_true",
                   help="skip the torch.compile baseline")
    p.add_argument("--sweep", action="store_true",
                   help="only time launch-config variants of ours (printed, no CSV rows)")
    p.add_argument("--layouts", action="store_true",
                   help="also time every named layout of LAYOUTS (impl ours_<name>)")
    p.add_argument("--kernels", action="store_true",
                   help="only print per-kernel times and idle gaps of ours (profiler), no CSV")
    p.add_argument("--cases", default=None,
                   help="comma-separated requests x q_len x heads, e.g. 1x6x16,32x6x16 "
                        "(default: the sweep's or the bench's own list)")
    args = p.parse_args(argv)
    picked = None
    if args.cases:
        try:
            picked = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
        except ValueError:
            p.error(f"--cases: needs RxQxH items like 8x6x16, got {args.cases!r}")
        if any(len(c) != 3 for c in picked):
            p.error(f"--cases: needs RxQxH items like 8x6x16, got {args.cases!r}")
    if not torch.cuda.is_available():
        raise SystemExit("bench sparse_attn: needs a CUDA GPU")
    if args.sweep:
        sweep(picked or SWEEP_CASES)
        return
    if args.kernels:
        for b, ql, h in picked or [(1, 6, 16), (8, 6, 16), (32, 6, 16)]:
            print(kernels(b, ql, h), flush=True)
        return
    if args.quick:
        cases = [(1, 6, 16), (8, 6, 16), (32, 6, 16), (1, 6, 64)]
    else:
        cases = [(b, ql, h) for h in (16, 64) for ql in (6, 1) for b in (1, 2, 4, 8, 16, 32)]
    if picked:
        cases = picked
    compiled = None if args.no_compiled else torch.compile(sparse_attn_ref, dynamic=True)
    rows: list[Row] = []
    path = None
    for b, ql, h in cases:
        case_rows = bench_case(b, ql, h, compiled, args.layouts)
        for r in case_rows:  # progress and CSV rows per case: a run cut short keeps them
            print(f"{r.case:45s} {r.impl:18s} {r.us:9.2f} us  floor {r.floor_us:.2f} us",
                  flush=True)
        path = write_rows(case_rows, "sparse_attn", args.out)
        rows += case_rows
    impls = ["ours"] + ([f"ours_{n}" for n in LAYOUTS if n != "default"] if args.layouts else [])
    print_table(rows, impls + ["compiled"])
    print(f"appended {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
