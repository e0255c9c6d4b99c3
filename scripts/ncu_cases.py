"""Run one benchmark case of an op eagerly, a few calls, for Nsight Compute to profile.

    ncu --clock-control none -k regex:_moe_up --launch-skip 4 --launch-count 1 \
        --section WarpStateStats ... python3 scripts/ncu_cases.py moe 48

Cases: ``sparse_attn REQUESTSxQ_LENxHEADS[:wgmma|:w8|:w4]`` (512 selected + full window, as
the benchmark; ``:wgmma`` the Hopper wgmma kernel's default config, ``:w8`` / ``:w4`` its
split rule at 8 / 4 warps throughout) and
``moe ROWS`` (TP=4 rank shapes, 384 experts, top-6, the benchmark's layer) and
``topk ROWSxCOLSxVALID[:row|:chunks]`` (k = 512, random logits as the benchmark; ``:row`` /
``:chunks`` force the one-CTA-a-row kernel / the four launches). The inputs are the
benchmarks' own (``bench.sparse_attn.Inputs``, ``bench.moe.Layer``, ``bench.topk._inputs``);
each call uses the next input set, so a profiled launch sees the same data a graph replay
would. Pick the launch with
ncu's ``--launch-skip`` (the first calls compile and warm up)."""

from __future__ import annotations

import sys

import torch


def sparse_attn_case(spec: str, calls: int) -> None:
    from dsv4_decode.bench import sparse_attn as B
    from dsv4_decode.ops.sparse_attn import make_workspace, pick_config, sparse_attn

    spec, _, variant = spec.partition(":")
    requests, q_len, heads = (int(v) for v in spec.split("x"))
    inp = B.Inputs(requests, q_len, heads, B.SELECTED, 4)
    cfg = pick_config(inp.rows, heads, B.D, B.WINDOW, B.SELECTED)
    if variant:  # the Hopper wgmma kernel's config: "wgmma" its default, "w8" / "w4" warps
        from dsv4_decode.ops.sparse_attn import wgmma_config

        cfg = wgmma_config(inp.rows, heads, B.WINDOW, B.SELECTED,
                           num_warps=None if variant == "wgmma" else int(variant[1:]))
    print(cfg, flush=True)
    ws = make_workspace(inp.rows, heads, B.D, B.WINDOW, B.SELECTED, "cuda", cfg)
    for i in range(calls):
        a, kw = inp.call_args(i % 4)
        sparse_attn(*a, **kw, out=inp.sets[i % 4]["out"], workspace=ws, config=cfg)
    torch.cuda.synchronize()


def moe_case(spec: str, calls: int) -> None:
    from dsv4_decode.bench import moe as B
    from dsv4_decode.ops.moe import (
        alloc_moe_workspace,
        alloc_routing,
        moe_experts,
        pick_config,
        route,
    )

    rows, top_k = int(spec), 6
    gen = torch.Generator(device="cuda").manual_seed(0)
    layer = B.Layer(384, 576, gen)
    xs = [torch.randn(rows, B.D, device="cuda", generator=gen).to(torch.bfloat16)
          for _ in range(4)]
    routing = alloc_routing(rows, top_k, 384, B.D, "cuda")
    out = torch.empty(rows, B.D, dtype=torch.bfloat16, device="cuda")
    cfg = pick_config(rows, top_k, True, 576)
    print(cfg, flush=True)
    ws = alloc_moe_workspace(rows, top_k, B.D, 576, "cuda", cfg)
    for i in range(calls):
        route(xs[i % 4], *layer.gates[i % B.COPIES], top_k=top_k, out=routing)
        moe_experts(xs[i % 4], routing, layer.prepared[i % B.COPIES], out=out, workspace=ws,
                    config=cfg)
    torch.cuda.synchronize()


def topk_case(spec: str, calls: int) -> None:
    from dsv4_decode.bench import topk as B
    from dsv4_decode.ops.topk import config, decode_topk, make_topk_workspace

    spec, _, path = spec.partition(":")
    rows, cols, valid = spec.split("x")
    rows, cols, k = int(rows), int(cols), 512
    if path:
        config.one_cta_per_row = lambda r, c, kk: path == "row"
    xs, lens, _ = B._inputs(rows, cols, valid)
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    ws = make_topk_workspace(rows, k, "cuda")
    for i in range(calls):
        decode_topk(xs[i % len(xs)], lens, k, out=out, workspace=ws)
    torch.cuda.synchronize()


CASES = {"sparse_attn": sparse_attn_case, "moe": moe_case, "topk": topk_case}

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in CASES:
        raise SystemExit(__doc__)
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    CASES[sys.argv[1]](sys.argv[2], n)
