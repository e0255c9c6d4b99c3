"""Benchmark of ``decode_topk`` on one GPU: ours vs torch.topk (bf16) vs fp32 upcast + topk.

Cells: rows 1..64 x cols 65,536..1,048,576 x valid (1/8 or all of each row before its length) x k
512 / 2048, random BF16 logits; block mode (top 2,048 blocks of 8, 1/8 valid, rows of 65,536 to
1,048,576 columns; its old group-maxima path, ``ours_pipeline``, has rows in the CSV up to session
6). Each time is the median of 20 replays of a CUDA graph of 20 back-to-back calls. The calls rotate
over input sets whose total size passes 2 x the 60 MB L2 (small cells keep 20 sets, still
L2-resident, as the indexer's freshly written logits would be). torch.topk has no lengths: it gets
the whole row (favouring it on 1/8-valid cells). The floor is the valid bf16 bytes at 4.5 TB/s.
"""

from __future__ import annotations

import argparse
import math

import torch

from dsv4_decode.bench.results import RESULTS_DIR, Row, case_key, print_table, write_rows
from dsv4_decode.bench.timing import L2_BYTES, graph_time_us
from dsv4_decode.ops.topk import (
    decode_topk,
    decode_topk_blocks,
    decode_topk_blocks_ref,
    make_topk_workspace,
)

CALLS = 20
ROWS = (1, 6, 12, 24, 48, 64)
COLS = (65536, 262144, 524288, 1048576)
# GB300 kernel, k = 512 (µs) by (cols, valid) over ROWS; the goal table.
GOAL = {
    (65536, "1/8"): (7.3, 7.4, 7.7, 8.9, 17.1, 17.4),
    (65536, "all"): (9.0, 9.3, 9.4, 10.3, 17.9, 20.2),
    (262144, "1/8"): (7.4, 7.9, 8.0, 9.9, 19.3, 19.6),
    (262144, "all"): (9.5, 11.3, 10.1, 11.8, 20.8, 22.5),
    (524288, "1/8"): (8.7, 9.0, 9.3, 15.5, 28.5, 35.0),
    (524288, "all"): (12.4, 11.5, 28.9, 37.0, 46.1, 44.7),
    (1048576, "1/8"): (9.4, 10.1, 17.1, 18.6, 34.2, 42.0),
    (1048576, "all"): (12.1, 12.4, 27.3, 44.4, 55.3, 53.6),
}
GOAL_BLOCKS = {(524288, 1): 5.9, (524288, 6): 6.2, (524288, 12): 6.3,
               (1048576, 1): 6.3, (1048576, 6): 6.5, (1048576, 12): 12.7}


def _inputs(rows: int, cols: int, valid: str):
    sets = max(1, min(CALLS, math.ceil(2 * L2_BYTES / (rows * cols * 2))))
    g = torch.Generator(device="cuda").manual_seed(rows * cols)
    xs = [torch.randn(rows, cols, device="cuda", generator=g).to(torch.bfloat16)
          for _ in range(sets)]
    length = cols if valid == "all" else cols // 8
    lens = torch.full((rows,), length, dtype=torch.int32, device="cuda")
    return xs, lens, length


def _timed(make_call, xs) -> float:
    i = [0]

    def fn():
        make_call(xs[i[0] % len(xs)])
        i[0] += 1

    return graph_time_us(fn, calls=CALLS)


def bench_cell(rows: int, cols: int, valid: str, k: int, baselines: bool) -> list[Row]:
    xs, lens, length = _inputs(rows, cols, valid)
    case = case_key(rows=rows, cols=cols, valid=valid, k=k)
    floor = rows * length * 2
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    ws = make_topk_workspace(rows, k, "cuda")
    res = [Row("topk", case, "ours",
               _timed(lambda x: decode_topk(x, lens, k, out=out, workspace=ws), xs), floor)]
    if _fusable(rows, cols, k):
        res.append(_fused(case, xs, lens, out, ws, k, floor))
    if baselines:
        res.append(Row("topk", case, "torch",
                       _timed(lambda x: torch.topk(x, k, dim=1, sorted=False), xs), floor))
        res.append(Row("topk", case, "torch_fp32",
                       _timed(lambda x: torch.topk(x.float(), k, dim=1, sorted=False), xs),
                       floor))
    return res


def bench_blocks(rows: int, cols: int, n_blocks: int = 2048, block: int = 8) -> list[Row]:
    xs, lens, length = _inputs(rows, cols, "1/8")
    case = case_key(rows=rows, cols=cols, valid="1/8", k=n_blocks, mode="blocks")
    out = torch.empty(rows, n_blocks, dtype=torch.int32, device="cuda")
    ws = make_topk_workspace(rows, n_blocks, "cuda", block)
    floor = rows * length * 2
    res = [Row("topk", case, "ours", _timed(lambda x: decode_topk_blocks(
        x, lens, n_blocks, block, out=out, workspace=ws), xs), floor)]
    res.append(Row("topk", case, "torch", _timed(lambda x: decode_topk_blocks_ref(
        x, lens, n_blocks, block), xs), floor))
    return res


def _fusable(rows: int, cols: int, k: int) -> bool:
    """Whether ``_triton.launch(fuse=True)`` fuses the threshold here (k <= 512 on an unfolded
    group-maxima grid, ``config.span_log2``)."""
    from dsv4_decode.ops.topk.config import span_log2

    return k <= 512 and span_log2(rows, -(-cols // 2048)) == 0


def _fused(case, xs, lens, out, ws, k, floor) -> Row:
    """``ours_fused``: the same kernels with the threshold in the last group-maxima program
    of each row (three launches; the default until session 10), to measure what the fusion
    saves or costs. Until session 10 the CSV has the other side, ``ours_4launch``."""
    from dsv4_decode.ops.topk import _triton

    return Row("topk", case, "ours_fused", _timed(lambda x: _triton.launch(
        x.view(torch.int16), lens, out, ws, ws.cfg, k, fuse=True), xs), floor)


KERNEL_CELLS = [(1, 65536, "all", 512), (24, 65536, "all", 512), (1, 1048576, "all", 512),
                (12, 1048576, "all", 512), (64, 1048576, "all", 512)]


BLOCK_KERNEL_CELLS = [(1, 1048576, "1/8", 2048), (12, 1048576, "1/8", 2048)]


def kernels(rows: int, cols: int, valid: str, k: int, block: int = 1) -> str:
    """The profiler's per-kernel table of ``ours`` for one cell (``bench.kernels``); block > 1:
    block mode, top k blocks of ``block`` columns."""
    from dsv4_decode.bench.kernels import kernel_table

    xs, lens, _ = _inputs(rows, cols, valid)
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    ws = make_topk_workspace(rows, k, "cuda", block)
    i = [0]

    def fn():
        x = xs[i[0] % len(xs)]
        if block > 1:
            decode_topk_blocks(x, lens, k, block, out=out, workspace=ws)
        else:
            decode_topk(x, lens, k, out=out, workspace=ws)
        i[0] += 1

    mode = f" mode=blocks of {block}" if block > 1 else ""
    return kernel_table(fn, CALLS).format(f"rows={rows} cols={cols} valid={valid} k={k}{mode}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="dsv4-decode bench topk", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(RESULTS_DIR), help="CSV folder (appends topk.csv)")
    p.add_argument("--quick", action="store_true", help="a few cells only")
    p.add_argument("--no-baselines", action="store_true", help="skip torch.topk baselines")
    p.add_argument("--cells", default=None,
                   help="comma-separated rows x cols x valid x k cells, e.g. 1x65536xallx512,"
                        "64x1048576x1/8x512 (default: the full table, or --quick's)")
    p.add_argument("--kernels", action="store_true",
                   help="only print per-kernel times and idle gaps (profiler) for a few cells")
    p.add_argument("--blocks", action="store_true",
                   help="only the block-mode cells (top 2,048 blocks of 8, 1/8 valid)")
    args = p.parse_args(argv)
    picked = None
    if args.cells:
        try:
            picked = [(int(r), int(c), v, int(k)) for r, c, v, k in
                      (cell.split("x") for cell in args.cells.split(","))]
        except ValueError:
            p.error(f"--cells: needs RxCxVxK items like 1x65536xallx512, got {args.cells!r}")
        if any(v not in ("all", "1/8") for _, _, v, _ in picked):
            p.error(f"--cells: valid must be 'all' or '1/8', got {args.cells!r}")
    if not torch.cuda.is_available():
        raise SystemExit("bench topk: needs a CUDA GPU")
    if args.kernels:
        for cell in picked or KERNEL_CELLS:
            print(kernels(*cell), flush=True)
        for cell in [] if picked else BLOCK_KERNEL_CELLS:
            print(kernels(*cell, block=8), flush=True)
        return
    if args.quick:
        cells = [(1, 65536, "all", 512), (6, 262144, "1/8", 512), (12, 1048576, "all", 512),
                 (64, 1048576, "all", 512), (64, 65536, "1/8", 512), (1, 1048576, "all", 2048),
                 (24, 524288, "all", 2048)]
        block_cells = [(1, 1048576), (12, 524288)]
    else:
        cells = [(r, c, v, k) for k in (512, 2048) for c in COLS for v in ("1/8", "all")
                 for r in ROWS]
        block_cells = [(r, c) for c in (65536, 524288, 1048576) for r in (1, 6, 12, 24, 64)]
    if picked:
        cells, block_cells = picked, []
    if args.blocks:
        cells = []
    rows: list[Row] = []
    path = None
    jobs = [lambda r=r, c=c, v=v, k=k: bench_cell(r, c, v, k, not args.no_baselines)
            for r, c, v, k in cells]
    jobs += [lambda r=r, c=c: bench_blocks(r, c) for r, c in block_cells]
    for job in jobs:  # rows printed and appended per cell: a run cut short keeps what it timed
        res = job()
        for row in res:
            print(f"{row.case:50s} {row.impl:14s} {row.us:9.2f} us", flush=True)
        path = write_rows(res, "topk", args.out)
        rows += res
    print_table(rows, ["ours", "ours_fused", "torch", "torch_fp32"])
    print("\nk = 512 against the GB300 goal (* = 1.2x its 524,288-column number):")
    for row in rows:
        f = dict(kv.split("=") for kv in row.case.split(","))
        if row.impl != "ours" or (f["k"] != "512" and f.get("mode") != "blocks"):
            continue
        r, c = int(f["rows"]), int(f["cols"])
        goal = (GOAL_BLOCKS.get((c, r)) if f.get("mode") == "blocks"
                else GOAL[(c, f["valid"])][ROWS.index(r)] if r in ROWS else None)
        if goal:
            print(f"  {row.case:50s} ours {row.us:7.1f}  goal {goal:5.1f}  x{row.us / goal:4.2f}")
    print(f"appended {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
