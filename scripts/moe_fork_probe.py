"""Probe of ``moe_layer``'s fork (session 29): graph-timed parts of the MoE layer, alone and
side by side, TP=4 rank shapes. ``python scripts/moe_fork_probe.py [ROWS,...]``.

Prints µs a layer (CUDA graph of 20 layers, weights rotated as in ``bench moe``) for: the
router alone; the shared expert's tiles alone; the routed tiles alone (routing precomputed);
the router and the shared expert on two streams (the fork without the routed tiles);
``route`` + ``moe_experts`` (serial); ``moe_layer`` (the fork)."""

from __future__ import annotations

import sys

import torch

from dsv4_decode.bench.moe import CALLS, COPIES, D, Layer
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.moe import (
    alloc_moe_workspace,
    alloc_routing,
    moe_experts,
    moe_layer,
    pick_config,
    route,
)
from dsv4_decode.ops.moe.api import _ExpertPlan


def main() -> None:
    rows_list = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "1,6,48").split(",")]
    layer = Layer(384, 576, torch.Generator(device="cuda").manual_seed(0))
    side = torch.cuda.Stream()
    for rows in rows_list:
        probe(layer, side, rows)


def probe(layer: Layer, side: torch.cuda.Stream, rows: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(rows)
    xs = [torch.randn(rows, D, device="cuda", generator=gen).to(torch.bfloat16)
          for _ in range(CALLS)]
    cfg = pick_config(rows, 6, True, 576)
    rs = [alloc_routing(rows, 6, 384, D, "cuda") for _ in range(CALLS)]
    for c in range(CALLS):  # each call's own routing, for the parts that take it as given
        route(xs[c], *layer.gates[c % COPIES], top_k=6, out=rs[c])
    r = alloc_routing(rows, 6, 384, D, "cuda")
    ws = alloc_moe_workspace(rows, 6, D, 576, "cuda", cfg)
    out = torch.empty(rows, D, dtype=torch.bfloat16, device="cuda")
    i = [0]

    def nxt():
        j = i[0] % CALLS
        i[0] += 1
        return j

    def plan(j, routing):
        return _ExpertPlan.make(xs[j], routing, layer.prepared[j % COPIES], out, ws, cfg)

    def p_route():
        j = nxt()
        route(xs[j], *layer.gates[j % COPIES], top_k=6, out=r)

    def p_shared():
        j = nxt()
        p = plan(j, rs[j])
        p.launch(0, p.sh_tiles)

    def p_routed():
        j = nxt()
        p = plan(j, rs[j])
        p.launch(p.sh_tiles, p.m_tiles - p.sh_tiles)
        p.combine()

    def p_fork_router_shared():
        j = nxt()
        p = plan(j, rs[j])
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            p.launch(0, p.sh_tiles)
        route(xs[j], *layer.gates[j % COPIES], top_k=6, out=r)
        main.wait_stream(side)

    def p_serial():
        j = nxt()
        route(xs[j], *layer.gates[j % COPIES], top_k=6, out=r)
        moe_experts(xs[j], r, layer.prepared[j % COPIES], out=out, workspace=ws, config=cfg)

    def p_layer():
        j = nxt()
        moe_layer(xs[j], *layer.gates[j % COPIES], layer.prepared[j % COPIES], top_k=6,
                  routing=r, out=out, workspace=ws, config=cfg)

    parts = [("route", p_route), ("shared", p_shared), ("routed", p_routed),
             ("fork route|shared", p_fork_router_shared), ("serial", p_serial),
             ("layer", p_layer)]
    for rep in range(2):
        for name, fn in parts:
            print(f"rows {rows} rep {rep} {name}: {graph_time_us(fn, calls=CALLS):.2f} us",
                  flush=True)


if __name__ == "__main__":
    main()
