"""Benchmark of the whole MoE layer (router + routed MXFP4 experts + FP8 shared expert).

``python -m dsv4_decode.bench.moe [--quick] [--out DIR]`` (``dsv4-decode bench moe``): one GPU,
CUDA-graph replay of 20 back-to-back layers, each call with its own input rows, router and
shared-expert copy (8 copies, > L2) and, through its own routing, its own experts of a
384-expert bank, so weights come from HBM as in a real step. Rows 1, 6, 12, 48, 96, 192 at
the TP=4 rank shapes (I = 576) and TP=1 (I = 2304); also the DSpark draft layer (128 experts,
top-3). Implementations: ``ours`` (route + moe_experts, ``pick_config``), ``ours-r1`` (round
1's tiles and launch plan, ``config.ROUND1``), ``ours-nosplit`` (``ours`` without the W1|W3
split K; only where ``ours`` splits), ``ours-d32`` / ``ours-d64`` (``ours`` with the other W2
tile width: 32 columns, twice the CTAs of half the work, where ``ours`` has 64; 64 at 1 row,
where ``pick_config`` takes 32; only where ``ours`` splits, the few-row grids) and ``torch`` (the
PyTorch twin's math per slot, dequantise + matmuls, ``torch.compile``d; only where its gathered
bf16 weights stay small).
The floor: distinct experts touched (measured from each call's routing) x expert bytes +
shared expert + router, at 4.5 TB/s. CSV rows are appended to ``DIR/moe.csv`` after each case
(a run cut short keeps what it timed).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F

from dsv4_decode.bench.results import RESULTS_DIR, Row, case_key, print_table, write_rows
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.formats import quant_fp8_weight
from dsv4_decode.ops.moe import (
    MoEConfig,
    alloc_moe_workspace,
    alloc_routing,
    moe_experts,
    pick_config,
    prepare_moe_weights,
    route,
)
from dsv4_decode.ops.moe.config import ROUND1

D = 5120
CALLS = 20
COPIES = 8  # router + shared expert copies: 8 x 12.8 MB (TP=4) > the 60 MB L2
NOSPLIT = MoEConfig()  # W1|W3 in one K pass, side by side where ours splits


def expert_bytes(d: int, inter: int, block: int = 32) -> int:
    return 2 * inter * d // 2 + 2 * inter * d // block + d * inter // 2 + d * inter // block


def shared_bytes(d: int, inter: int) -> int:
    return 3 * inter * d + (2 * inter // 32) * (d // 32) + (d // 32) * (inter // 32)


class Layer:
    """A 384 (or 128)-expert bank at one TP shape, with COPIES routers and shared experts."""

    def __init__(self, n_exp: int, inter: int, gen: torch.Generator):
        def rbytes(*shape, lo=0, hi=256):
            return torch.randint(lo, hi, shape, dtype=torch.uint8, device="cuda", generator=gen)

        self.n_exp, self.inter = n_exp, inter
        self.w13 = rbytes(n_exp, 2 * inter, D // 2)
        self.s13 = rbytes(n_exp, 2 * inter, D // 32, lo=118, hi=123)
        self.w2 = rbytes(n_exp, D, inter // 2)
        self.s2 = rbytes(n_exp, D, inter // 32, lo=118, hi=123)
        self.gates, self.shared = [], []
        for _ in range(COPIES):
            gw = torch.randn(n_exp, D, device="cuda", generator=gen) * D**-0.5
            self.gates.append((gw.to(torch.bfloat16),
                               torch.randn(n_exp, device="cuda", generator=gen) * 0.1))
            a = quant_fp8_weight(torch.randn(2 * inter, D, device="cuda", generator=gen) * 0.05)
            b = quant_fp8_weight(torch.randn(D, inter, device="cuda", generator=gen) * 0.05)
            self.shared.append((*a, *b))
        # one repacked routed bank; the copies differ only in their shared expert
        first = prepare_moe_weights(self.w13, self.s13, self.w2, self.s2, self.shared[0])
        self.prepared = [dataclasses.replace(first, shared=sh) for sh in self.shared]


def torch_moe(x, gw, gb, w13, s13, w2, s2, sh13, shs13, sh2, shs2, top_k: int):
    """The baseline: router, then per slot gather + dequantise + matmul (capturable)."""
    sigma = torch.sqrt(F.softplus(x.float() @ gw.float().t()))
    ids = torch.topk(sigma + gb, top_k, dim=-1).indices
    w = sigma.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * 1.5

    def deq(p, s):  # [n, o, i/2], [n, o, i/32] -> bf16 [n, o, i], pointwise (fuses)
        nib = torch.stack((p & 15, p >> 4), -1).flatten(-2).to(torch.int32)
        ex, m = (nib & 7) >> 1, (nib & 1).float()
        mag = torch.where(ex == 0, 0.5 * m, (1 + 0.5 * m) * torch.exp2(ex.float() - 1))
        v = torch.where(nib >= 8, -mag, mag).unflatten(-1, (s.shape[-1], -1))
        return (v * torch.exp2(s.float() - 127)[..., None]).flatten(-2).to(torch.bfloat16)

    t, d = x.shape
    flat = ids.flatten()
    gu = torch.bmm(deq(w13[flat], s13[flat]), x.repeat_interleave(top_k, 0)[:, :, None]).float()
    inter = gu.shape[1] // 2
    gu = gu[..., 0]
    h = F.silu(gu[:, :inter].clamp(max=10)) * gu[:, inter:].clamp(-10, 10)
    y = torch.bmm(deq(w2[flat], s2[flat]), h.to(torch.bfloat16)[..., None]).float()[..., 0]
    y = (y.view(t, top_k, d) * w[..., None]).sum(1)

    def fp8(q, s):
        return (q.float() * torch.exp2(s.float() - 127).repeat_interleave(32, 0)
                .repeat_interleave(32, 1)).to(torch.bfloat16)

    g2 = (x @ fp8(sh13, shs13).t()).float()
    hs = F.silu(g2[:, :inter].clamp(max=10)) * g2[:, inter:].clamp(-10, 10)
    return (y + (hs.to(torch.bfloat16) @ fp8(sh2, shs2).t()).float()).to(torch.bfloat16)


def bench_case(layer: Layer, rows: int, top_k: int, tp: int, compiled, with_torch: bool):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    xs = [torch.randn(rows, D, device="cuda", generator=gen).to(torch.bfloat16)
          for _ in range(CALLS)]
    routing = alloc_routing(rows, top_k, layer.n_exp, D, "cuda")
    out = torch.empty(rows, D, dtype=torch.bfloat16, device="cuda")
    distinct = []
    for i, x in enumerate(xs):  # the floor's expert count, from each call's own routing
        route(x, *layer.gates[i % COPIES], top_k=top_k, out=routing)
        distinct.append(torch.unique(routing.ids).numel())
    floor = (sum(distinct) / CALLS * expert_bytes(D, layer.inter)
             + shared_bytes(D, layer.inter) + layer.n_exp * (2 * D + 4))
    case = case_key(rows=rows, tp=tp, experts=layer.n_exp, topk=top_k)
    rows_out = []
    # the default (pick_config), round 1's plan and, where ours splits W1|W3 along K, no split
    variants = [("ours", pick_config(rows, top_k, True, layer.inter))]
    if variants[0][1] != ROUND1:
        variants.append(("ours-r1", ROUND1))
    if variants[0][1].up_split > 1:
        variants.append(("ours-nosplit", NOSPLIT))
        other = 64 if variants[0][1].down_n == 32 else 32  # the other W2 tile width
        variants.append((f"ours-d{other}", dataclasses.replace(variants[0][1], down_n=other)))
    for impl, cfg in variants:
        state = {"i": 0}
        ws = alloc_moe_workspace(rows, top_k, D, layer.inter, "cuda", cfg)

        def ours(cfg=cfg, state=state, ws=ws):
            i = state["i"] % CALLS
            state["i"] += 1
            route(xs[i], *layer.gates[i % COPIES], top_k=top_k, out=routing)
            moe_experts(xs[i], routing, layer.prepared[i % COPIES], out=out, workspace=ws,
                        config=cfg)

        try:
            rows_out.append(Row("moe", case, impl, graph_time_us(ours, calls=CALLS), floor))
        except Exception as err:  # report (e.g. a compile failure), keep going
            print(f"{impl} failed at {case}: {type(err).__name__}: {err}"[:400])
    if with_torch:
        state = {"i": 0}

        def base_fn():
            i = state["i"] % CALLS
            state["i"] += 1
            return compiled(xs[i], *layer.gates[i % COPIES], layer.w13, layer.s13, layer.w2,
                            layer.s2, *layer.shared[i % COPIES], top_k)

        try:
            us = graph_time_us(base_fn, calls=CALLS, replays=5)
        except Exception as err:  # report, keep benchmarking ours
            print(f"torch baseline failed at {case}: {type(err).__name__}: {err}"[:300])
        else:
            rows_out.append(Row("moe", case, "torch", us, floor))
    for r in rows_out:
        print(f"{r.case} {r.impl}: {r.us:.2f} us, floor {r.floor_us:.2f} us, {r.gbps:.0f} GB/s",
              flush=True)
    return rows_out


def kernels(layer: Layer, rows: int, top_k: int) -> str:
    """The profiler's per-kernel table of ``ours`` for one case (``bench.kernels``)."""
    from dsv4_decode.bench.kernels import kernel_table

    gen = torch.Generator(device="cuda").manual_seed(rows)
    xs = [torch.randn(rows, D, device="cuda", generator=gen).to(torch.bfloat16)
          for _ in range(CALLS)]
    routing = alloc_routing(rows, top_k, layer.n_exp, D, "cuda")
    out = torch.empty(rows, D, dtype=torch.bfloat16, device="cuda")
    cfg = pick_config(rows, top_k, True, layer.inter)
    ws = alloc_moe_workspace(rows, top_k, D, layer.inter, "cuda", cfg)
    i = [0]

    def fn():
        j = i[0] % CALLS
        i[0] += 1
        route(xs[j], *layer.gates[j % COPIES], top_k=top_k, out=routing)
        moe_experts(xs[j], routing, layer.prepared[j % COPIES], out=out, workspace=ws, config=cfg)

    return kernel_table(fn, CALLS).format(f"rows={rows},inter={layer.inter},topk={top_k} {cfg}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="dsv4-decode bench moe", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(RESULTS_DIR), help="CSV folder (appends moe.csv)")
    p.add_argument("--quick", action="store_true", help="rows 1, 6, 48 at TP=4 and 6 at TP=1")
    p.add_argument("--no-torch", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--kernels", action="store_true",
                   help="only print per-kernel times and idle gaps of ours (profiler) at "
                        "rows 1, 6, 48, TP=4, no CSV")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench moe needs a CUDA GPU")
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.kernels:
        layer = Layer(384, 576, gen)
        for rows in (1, 6, 48):
            print(kernels(layer, rows, 6), flush=True)
        return
    compiled = torch.compile(torch_moe, dynamic=True)
    plan = [(4, 384, 6, (1, 6, 48) if args.quick else (1, 6, 12, 48, 96, 192)),
            (1, 384, 6, (6,) if args.quick else (1, 6, 12, 48, 96, 192))]
    if not args.quick:
        plan.append((4, 128, 3, (1, 6, 48)))
    rows_all: list[Row] = []
    path = None
    for tp, n_exp, top_k, rows_list in plan:
        layer = Layer(n_exp, 2304 // tp, gen)
        for rows in rows_list:
            # the baseline gathers bf16 weights per slot: keep it under a few GB
            with_torch = not args.no_torch and rows * top_k * (2304 // tp) <= 48 * 6 * 576
            case_rows = bench_case(layer, rows, top_k, tp, compiled, with_torch)
            path = write_rows(case_rows, "moe", args.out)  # per case: a run cut short keeps them
            rows_all += case_rows
        del layer
        torch.cuda.empty_cache()
    print_table(rows_all, ["ours", "ours-r1", "ours-nosplit", "ours-d32", "ours-d64",
                           "torch"])
    print(f"appended {len(rows_all)} rows to {path}")


if __name__ == "__main__":
    main()
