"""Probe: the MoE layer (CUDA-graph replay, as ``bench moe``) with the expert kernels' MMA
width at 8 entries (``api._mma_rows``, 1-8 rows) against 16, and pipeline variants at 8; above
8 rows, record tiles of 8 entries (``alloc_routing(block_m=8)`` with ``MoEConfig(block_m=8)``)
against 16, after checking that both give the same output bitwise. One process (one GPU), each
variant timed twice, alternated. No CSV: one line a row count.

    PYTHONPATH=. python3 scripts/moe_mma_rows_ab.py [1,6,12,48]
"""

import dataclasses
import sys

import torch

from dsv4_decode.bench import moe as B
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.moe import (
    alloc_moe_workspace,
    alloc_routing,
    api,
    moe_experts,
    pick_config,
    route,
)

RULE = api._mma_rows


def variants(rows: int):
    pick = pick_config(rows, 6, True, 576)
    if rows > 8:  # (name, config, MMA-width rule, record tile)
        return [("tile16", pick, RULE, 16),
                ("tile8", dataclasses.replace(pick, block_m=8), RULE, 8)]
    out = [("mma16", pick, lambda r, bm: bm), ("mma8", pick, RULE)]
    if pick.up_split > 1:  # the split configs (1-6 rows): a third W1|W3 stage, W2 stages
        out.append(("mma8_up3", dataclasses.replace(pick, up_stages=3), RULE))
        out.append(("mma8_down+1", dataclasses.replace(pick, num_stages=pick.num_stages + 1),
                    RULE))
    return [v + (16,) for v in out]


def main(rows_list):
    gen = torch.Generator(device="cuda").manual_seed(0)
    layer = B.Layer(384, 576, gen)
    for rows in rows_list:
        xs = [torch.randn(rows, B.D, device="cuda", generator=gen).to(torch.bfloat16)
              for _ in range(B.CALLS)]
        routings = {b: alloc_routing(rows, 6, 384, B.D, "cuda", block_m=b) for b in (8, 16)}
        out = torch.empty(rows, B.D, dtype=torch.bfloat16, device="cuda")
        res, first = [], {}
        for _rep in range(2):
            for name, cfg, rule, tile in variants(rows):
                api._mma_rows = rule
                routing = routings[tile]
                ws = alloc_moe_workspace(rows, 6, B.D, 576, "cuda", cfg)
                route(xs[0], *layer.gates[0], top_k=6, out=routing)
                y = moe_experts(xs[0], routing, layer.prepared[0], workspace=ws, config=cfg)
                ref = first.setdefault("y", y.clone())
                if not torch.equal(y, ref):
                    res.append(f"{name} DIFFERS by {(y.float() - ref.float()).abs().max():.3g}")
                state = {"i": 0}

                def fn(cfg=cfg, ws=ws, state=state, xs=xs, routing=routing, out=out):
                    i = state["i"] % B.CALLS
                    state["i"] += 1
                    route(xs[i], *layer.gates[i % B.COPIES], top_k=6, out=routing)
                    moe_experts(xs[i], routing, layer.prepared[i % B.COPIES], out=out,
                                workspace=ws, config=cfg)

                res.append(f"{name} {graph_time_us(fn, calls=B.CALLS):.2f}")
        api._mma_rows = RULE
        print(f"rows={rows}: " + ", ".join(res), flush=True)


if __name__ == "__main__":
    main([int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "1,6").split(",")])
