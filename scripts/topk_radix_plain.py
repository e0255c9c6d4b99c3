"""Probe: would plain mode's small grids gain from block mode's radix select (``_radix``)?
Then where block mode's one launch spends its time: 1 row of 1M columns at lengths from 0
(program 0 only pads) to 1/8 of the row (32 chunks), top 2,048 blocks of 8.

Runs the three radix kernels with ``BLOCK = 1`` (one element per column) and chunks of CE
columns on the small-grid cells, checks each answer against ``decode_topk``, and prints the
median µs (the bench's method: a CUDA graph of 20 calls, median of 20 replays) beside
``decode_topk``'s. Not a supported path: the workspace here is built by hand.
``python3 scripts/topk_radix_plain.py``
"""

import types

import torch
import triton

from dsv4_decode.bench import topk as T
from dsv4_decode.ops.topk import _radix, decode_topk, decode_topk_blocks, make_topk_workspace

CELLS = [(1, 65536, "all"), (6, 65536, "all"), (12, 65536, "all"), (24, 65536, "all"),
         (1, 65536, "1/8"), (1, 262144, "all"), (6, 262144, "1/8"), (1, 1048576, "1/8")]
K = 512


def radix_ws(rows, nch):
    def z(*shape):
        return torch.zeros(*shape, dtype=torch.int32, device="cuda")

    return types.SimpleNamespace(hist1=z(rows, 512), hist2=z(rows, 256), meta=z(rows, 8),
                                 csuf=z(rows, nch, 256), cgt=z(rows, nch),
                                 bar=torch.zeros(rows, 16, dtype=torch.int64, device="cuda"))


def cell(rows, cols, valid):
    xs, lens, _ = T._inputs(rows, cols, valid)
    out = torch.empty(rows, K, dtype=torch.int32, device="cuda")
    ws = make_topk_workspace(rows, K, "cuda")
    line = [f"rows={rows} cols={cols} valid={valid} k={K}",
            f"ours {T._timed(lambda x: decode_topk(x, lens, K, out=out, workspace=ws), xs):7.2f}"]
    for ce in (1024, 2048, 4096):
        nch = triton.next_power_of_2(triton.cdiv(cols, ce))
        rws = radix_ws(rows, nch)
        cfg = types.SimpleNamespace(block=1, radix_chunk=lambda rows, ce=ce: ce)
        got = torch.empty_like(out)
        _radix.launch(xs[0].view(torch.int16), lens, got, rws, cfg, K)
        ok = torch.equal(got, decode_topk(xs[0], lens, K))
        us = T._timed(lambda x, rws=rws, cfg=cfg, got=got: _radix.launch(
            x.view(torch.int16), lens, got, rws, cfg, K), xs)
        line.append(f"radix{ce} {us:7.2f}{'' if ok else ' WRONG'}")
    print("  ".join(line), flush=True)


for spec in CELLS:
    cell(*spec)
x = torch.randn(1, 1 << 20, device="cuda").to(torch.bfloat16)
out = torch.empty(1, 2048, dtype=torch.int32, device="cuda")
ws = make_topk_workspace(1, 2048, "cuda", 8)
for n in (0, 8, 4096, 16384, 65536, 131072):
    lens = torch.full((1,), n, dtype=torch.int32, device="cuda")
    us = T._timed(lambda x, lens=lens: decode_topk_blocks(x, lens, 2048, 8, out=out,
                                                          workspace=ws), [x])
    print(f"blocks 1 x 1M length {n:7d} ({-(-n // 4096)} chunks): {us:6.2f} us", flush=True)
