"""Probe: the MoE layer (CUDA-graph replay, as ``bench moe``) with routing-record tiles (the
expert kernels' MMA width) of 16 entries against the default 8 (``config.BLOCK_M``), and at
1-6 rows pipeline variants at 8, after checking that every variant gives the default's output
bitwise. One process (one GPU), each variant timed twice, alternated. No CSV: one line a row
count. Session 16 ran its first form (runs 7 and 10: the 8-wide MMA then read the first 8 of
16-entry tiles up to 8 rows, ``api._mma_rows``; above, tiles of 8 against 16).

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
    moe_experts,
    pick_config,
    route,
)


def variants(rows: int):
    """(name, config, record tile)"""
    pick = pick_config(rows, 6, True, 576)
    out = [("tile8", pick, 8), ("tile16", dataclasses.replace(pick, block_m=16), 16)]
    if pick.up_split > 1:  # the split configs (1-6 rows): W1|W3 and W2 pipeline depths
        out.append(("tile8_up" + str(5 - pick.up_stages),
                    dataclasses.replace(pick, up_stages=5 - pick.up_stages), 8))  # 2 <-> 3
        out.append(("tile8_down+1", dataclasses.replace(pick, num_stages=pick.num_stages + 1),
                    8))
    return out


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
            for name, cfg, tile in variants(rows):
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
        print(f"rows={rows}: " + ", ".join(res), flush=True)


if __name__ == "__main__":
    main([int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "1,6,12,48").split(",")])
