"""Probe: which CTAs set the time of the few-row MoE expert kernels, the shared expert's (FP8,
twice the bytes a CTA) or the routed experts' (MXFP4)? Per-kernel profiler medians of a graph
replay (``bench.kernels.kernel_table``, as ``bench moe --kernels``) at TP=4 rank shapes, for
the whole layer and the shared expert alone (``valid_rows = 0``: every row is padding, so the
routed tiles exit at once). (The routed experts alone, ``shared=None``, are no probe: the
kernels then compile their shared-expert branch for other pointer types, and their register
use changes; session 8 measured them slower than the whole layer.) No CSV.

    PYTHONPATH=. python3 scripts/moe_shared_tail.py 1,6
"""

import sys

import torch

from dsv4_decode.bench import moe as B
from dsv4_decode.bench.kernels import kernel_table
from dsv4_decode.ops.moe import alloc_moe_workspace, alloc_routing, moe_experts, pick_config, route


def table(layer: B.Layer, rows: int, variant: str) -> str:
    gen = torch.Generator(device="cuda").manual_seed(rows)
    xs = [torch.randn(rows, B.D, device="cuda", generator=gen).to(torch.bfloat16)
          for _ in range(B.CALLS)]
    routing = alloc_routing(rows, 6, 384, B.D, "cuda")
    out = torch.empty(rows, B.D, dtype=torch.bfloat16, device="cuda")
    cfg = pick_config(rows, 6, True, 576)
    ws = alloc_moe_workspace(rows, 6, B.D, 576, "cuda", cfg)
    valid = torch.zeros(1, dtype=torch.int32, device="cuda") if variant == "shared" else None
    weights = layer.prepared
    i = [0]

    def fn():
        j = i[0] % B.CALLS
        i[0] += 1
        route(xs[j], *layer.gates[j % B.COPIES], top_k=6, valid_rows=valid, out=routing)
        moe_experts(xs[j], routing, weights[j % B.COPIES], out=out, workspace=ws, config=cfg)

    return kernel_table(fn, B.CALLS).format(f"rows={rows} {variant}")


def main(rows_list: list[int]) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    layer = B.Layer(384, 576, gen)
    for rows in rows_list:
        for variant in ("all", "shared"):
            print(table(layer, rows, variant), flush=True)


if __name__ == "__main__":
    main([int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "1,6").split(",")])
