"""Probe: which parts of the MoE layer's programmatic dependent launches (``MoEConfig.pdl``)
gain, timed as ``bench moe`` does (CUDA-graph replay, weights rotated past L2). No CSV: one
line a case.

    PYTHONPATH=. python3 scripts/moe_pdl_sweep.py

Variants: ``plain`` (``pdl=False``) and ``pdl<p>`` for parts ``p`` of ``api._PDL_PARTS``
(1: the router releases W1|W3 once its logits are stored, 2: the shared expert's W1|W3 CTAs
prefetch their weights into L2 before the wait, 4: W2's CTAs do), each graph captured with
that setting.
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

PARTS = (0, 1, 3, 5, 7, 4, 6)
CASES = {"tp4": (384, 576, 6, (1, 6, 48, 192)), "tp1": (384, 2304, 6, (1, 48)),
         "draft": (128, 576, 3, (1,))}


def case_line(layer: B.Layer, inter: int, top_k: int, rows: int, gen) -> str:
    xs = [torch.randn(rows, B.D, device="cuda", generator=gen).to(torch.bfloat16)
          for _ in range(B.CALLS)]
    routing = alloc_routing(rows, top_k, layer.n_exp, B.D, "cuda")
    out = torch.empty(rows, B.D, dtype=torch.bfloat16, device="cuda")
    pick = pick_config(rows, top_k, True, inter)
    ws = alloc_moe_workspace(rows, top_k, B.D, inter, "cuda", pick)
    res = []
    for parts in (None,) + PARTS:
        cfg = dataclasses.replace(pick, pdl=parts is not None)
        api._PDL_PARTS = 7 if parts is None else parts
        state = {"i": 0}

        def fn(cfg=cfg, state=state):
            i = state["i"] % B.CALLS
            state["i"] += 1
            route(xs[i], *layer.gates[i % B.COPIES], top_k=top_k, out=routing)
            moe_experts(xs[i], routing, layer.prepared[i % B.COPIES], out=out, workspace=ws,
                        config=cfg)

        label = "plain" if parts is None else f"pdl{parts}"
        res.append(f"{label} {graph_time_us(fn, calls=B.CALLS):.2f}")
    api._PDL_PARTS = 7
    return ", ".join(res)


def main(which: list[str]) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name in which:
        n_exp, inter, top_k, rows_list = CASES[name]
        layer = B.Layer(n_exp, inter, gen)
        for rows in rows_list:
            print(f"{name} rows={rows}: {case_line(layer, inter, top_k, rows, gen)}", flush=True)
        del layer
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1].split(",") if len(sys.argv) > 1 else list(CASES))
