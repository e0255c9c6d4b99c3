"""Time ``random_weights`` for one TP rank and print the per-component storage bytes.

    python -m dsv4_decode.weights --preset v41-flash --tp 4 --rank 0 --device cuda \\
        [--engram-tables] [--repeat 3] [--out benchmarks/results]

Appends one row per run to ``<out>/random_weights.csv`` (op ``random_weights``, impl ``ours``,
``floor_bytes`` = the bytes written, so ``gbps`` is the generation rate).
"""

from __future__ import annotations

import argparse
import time

import torch

from ..bench.results import Row, case_key, print_table, write_rows
from ..config import PRESETS, ModelConfig
from . import param_bytes, random_weights


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dsv4_decode.weights", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="v41-flash", choices=PRESETS)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--engram-tables", action="store_true",
                    help="also generate the engram tables (25 GB per layer per TP=4 rank)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=None, help="CSV folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    cfg = ModelConfig.preset(args.preset)
    sizes = param_bytes(cfg, args.tp)
    for comp, n in sizes.items():
        print(f"{comp:>16s} {n / 1e9:10.3f} GB")
    random_weights(ModelConfig.preset("tiny-v41"), device=args.device)  # warm-up
    rows = []
    for _ in range(args.repeat):
        _sync(args.device)
        t0 = time.perf_counter()
        w = random_weights(cfg, device=args.device, tp=args.tp, rank=args.rank, progress=True,
                           engram_tables=args.engram_tables)
        _sync(args.device)
        dt = time.perf_counter() - t0
        # per-expert views of one stacked tensor do not overlap: their sizes add up
        nbytes = sum(t.numel() * t.dtype.itemsize for t in w.values())
        print(f"{len(w)} tensors, {nbytes / 1e9:.2f} GB in {dt:.2f} s "
              f"({nbytes / dt / 1e9:.1f} GB/s)")
        case = case_key(preset=args.preset, tp=args.tp, rank=args.rank,
                        tables=int(args.engram_tables))
        rows.append(Row("random_weights", case, "ours", dt * 1e6, floor_bytes=nbytes))
        del w
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    print_table(rows, ["ours"])
    print(write_rows(rows, "random_weights", args.out))


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
