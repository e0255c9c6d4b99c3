"""Probe: the MoE layer's time (CUDA-graph replay, as ``bench moe``) for ``MoEConfig`` variants
around ``pick_config``'s choice, at TP=4 shapes (``--tp1``: TP=1's, I = 2304). No CSV: it
prints one line a row count.

    PYTHONPATH=. python3 scripts/moe_sweep.py 1,6,12,48 [stages | wide | tiles | layout] [--tp1]

Variants: W1|W3 split K 2 / 4 / 8 / 16 (3 stages, 128 registers, as the split configs),
W2 tiles of 32 / 64 / 128 columns; with ``stages``: pipeline depths instead, W2 2 / 3 / 4 / 5
stages and W1|W3 1 / 2 / 3 / 4 (4 with the register cap lifted, else it spills), and in the
split configs W1|W3 capped at 128 / 104 / 96 / 80 registers (8 / 9 / 10 / 12 CTAs a SM); with
``wide`` (for ``ROUND1``'s rows, 12 up): W1|W3 at more CTAs a SM (capped at 168 or 160
registers, 64-row tiles of 4 warps, 128-deep joined steps), W2 at 4 stages; with ``tiles``:
routing-record tiles (the expert kernels' MMA width) of 16 against the default 8, alternated
twice, after checking that both give bitwise the same output (session 16's runs 7 and 10 ran
this as ``scripts/moe_mma_rows_ab.py``, since folded in here); with ``layout``: ``pick`` on
the bank as ``prepare_moe_weights`` lays it out (W2 granule-major at I = 576) and on the same
bank with W2 row-major, in one process (one GPU: no device-to-device spread). Variants equal
to ``pick`` are skipped. Session 7 ran a first version of it (other variant names, same
timing; run 6, log in ``benchmarks/results/h200-session7/``) to check the rule after the
joined W1|W3 tile: ``pick`` was within 0.15 us of the best variant at every row count.
Session 8 ran the ``stages`` mode (runs 6-8 of ``h200-session8``), session 9 with the register
caps (run 1 of ``h200-session9``).
"""

import dataclasses
import sys

import torch

from dsv4_decode.bench import moe as B
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.moe import (
    MoEConfig,
    alloc_moe_workspace,
    alloc_routing,
    moe_experts,
    pick_config,
    repack_mxfp4,
    route,
)


def variants(rows: int, mode: str = "", inter: int = 576) -> dict[str, MoEConfig]:
    pick = pick_config(rows, 6, True, inter)
    out = {"pick": pick}
    if mode == "tiles":  # routing-record tiles (the MMA width) of 16 against the default 8
        return {"pick": pick, "tile16": dataclasses.replace(pick, block_m=16)}
    if mode == "wide":  # W1|W3 occupancy around ROUND1 (192 registers: 5 CTAs a SM)
        out["w13_cap168"] = dataclasses.replace(pick, up_maxnreg=168)  # 6 CTAs, 12 B spilled
        out["w13_cap160_stages2"] = dataclasses.replace(pick, up_maxnreg=160, up_stages=2)
        out["n64_warps4"] = dataclasses.replace(pick, up_n=64, num_warps=4)  # W2 4 warps too
        out["w13_k128_stages4_cap128"] = dataclasses.replace(pick, up_k=128, up_stages=4,
                                                             up_maxnreg=128)  # joined
        out["w2_stages4"] = dataclasses.replace(pick, num_stages=4)
        return {k: v for k, v in out.items() if k == "pick" or v != pick}
    if mode == "stages":
        for n in (2, 3, 4, 5):
            out[f"w2_stages{n}"] = dataclasses.replace(pick, num_stages=n)
        for n in (1, 2, 3):
            out[f"w13_stages{n}"] = dataclasses.replace(pick, up_stages=n)
        out["w13_stages4_nocap"] = dataclasses.replace(pick, up_stages=4, up_maxnreg=0)
        if pick.up_split > 1:  # register caps: 8 / 9 / 10 / 12 CTAs a SM
            for cap in (128, 104, 96, 80):
                out[f"w13_maxnreg{cap}"] = dataclasses.replace(pick, up_maxnreg=cap)
        return {k: v for k, v in out.items() if k == "pick" or v != pick}
    for split in (2, 4, 8, 16):
        out[f"s{split}"] = MoEConfig(up_split=split, up_stages=3, up_maxnreg=128,
                                     down_n=pick.down_n)
    for width in (32, 64, 128):
        out[f"d{width}"] = dataclasses.replace(pick, down_n=width)
    return {k: v for k, v in out.items() if k == "pick" or v != pick}


def main(rows_list: list[int], mode: str = "", inter: int = 576) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    layer = B.Layer(384, inter, gen)
    if mode == "layout":  # the same bank with W2 row-major (the kernels read it by its rank)
        rows_w2 = repack_mxfp4(layer.w2)
        row_major = [dataclasses.replace(p, w2=rows_w2) for p in layer.prepared]
    for rows in rows_list:
        xs = [torch.randn(rows, B.D, device="cuda", generator=gen).to(torch.bfloat16)
              for _ in range(B.CALLS)]
        routings = {}  # one record a tile size (MoEConfig.block_m)
        out = torch.empty(rows, B.D, dtype=torch.bfloat16, device="cuda")
        res, first = [], {}
        if mode == "layout":
            pick = pick_config(rows, 6, True, inter)
            runs = [("pick", pick, layer.prepared), ("w2_rowmajor", pick, row_major)] * 2
        else:
            runs = [(name, cfg, layer.prepared)
                    for name, cfg in variants(rows, mode, inter).items()]
            if mode == "tiles":  # alternated: pick, tile16, pick, tile16
                runs = runs + runs
        for name, cfg, bank in runs:
            ws = alloc_moe_workspace(rows, 6, B.D, inter, "cuda", cfg)
            if cfg.block_m not in routings:
                routings[cfg.block_m] = alloc_routing(rows, 6, 384, B.D, "cuda",
                                                      block_m=cfg.block_m)
            routing = routings[cfg.block_m]
            if mode == "tiles":  # the same sums in the same order: outputs bitwise equal
                route(xs[0], *layer.gates[0], top_k=6, out=routing)
                y = moe_experts(xs[0], routing, bank[0], workspace=ws, config=cfg)
                ref = first.setdefault("y", y.clone())
                if not torch.equal(y, ref):
                    res.append(f"{name} DIFFERS by {(y.float() - ref.float()).abs().max():.3g}")
            state = {"i": 0}

            def fn(cfg=cfg, ws=ws, state=state, xs=xs, routing=routing, out=out, bank=bank):
                i = state["i"] % B.CALLS
                state["i"] += 1
                route(xs[i], *layer.gates[i % B.COPIES], top_k=6, out=routing)
                moe_experts(xs[i], routing, bank[i % B.COPIES], out=out, workspace=ws,
                            config=cfg)

            try:
                res.append(f"{name} {graph_time_us(fn, calls=B.CALLS):.2f}")
            except Exception as err:  # e.g. a split that does not divide D: report, go on
                res.append(f"{name} failed ({type(err).__name__}: {str(err)[:100]})")
        print(f"rows={rows}: " + ", ".join(res), flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--tp1"]
    main([int(r) for r in (args[0] if args else "1,6,12,48").split(",")],
         args[1] if len(args) > 1 else "", 2304 if "--tp1" in sys.argv else 576)
