"""The topk cells session 4 left unmeasured: k = 2048 at every shape and block mode (ours only,
no torch baselines; rows appended to OUT/topk.csv per cell). ``python3 scripts/topk_rest.py OUT``"""

import sys

from dsv4_decode.bench import topk as T
from dsv4_decode.bench.results import write_rows

out = sys.argv[1]
jobs = [lambda r=r, c=c: T.bench_blocks(r, c) for c in (524288, 1048576) for r in (1, 6, 12)]
jobs += [lambda r=r, c=c, v=v: T.bench_cell(r, c, v, 2048, False)
         for c in T.COLS for v in ("1/8", "all") for r in T.ROWS]
for job in jobs:
    res = [row for row in job() if row.impl == "ours"]
    for row in res:
        print(f"{row.case:55s} {row.us:9.2f} us", flush=True)
    write_rows(res, "topk", out)
