"""Probe: where the router's single-CTA tail spends its time (one Hopper GPU).

    PYTHONPATH=. python3 scripts/moe_router_stamps.py

Writes a copy of ``ops/moe/_triton.py`` with ``%clock64`` stamps (each after a CTA barrier)
in the last logits CTA's select and record (1 row) and in the select kernel's (6 and 48 rows),
and ``%globaltimer`` stamps at each logits CTA's start and end; swaps it into ``api.K``; runs
``route`` 30 times a row count and prints the last run's phases. ``clk``: cycles from the
ticket (1 the partial sums, 2 the keys, 3-5 the top-2 passes, 9 the stores, 11 the record's
ticket (select kernel), 12-13 its ids and fills, 14 the sort, 15-16 the neighbour gathers
and the running max, 18 the scan, 17 the stores, 20 the end (1 row)). The patch is by string
replacement on the source: ``PATCHES`` fails loudly on a missing anchor. The barriers make the
phases serial, so their sum can exceed what the unstamped kernel takes (docs/kernels/moe.md,
session 15).
"""

import sys

import torch

from dsv4_decode.ops.moe import api
from dsv4_decode.utils.module_copy import STAMPS, load_source, patch

# (anchor, replacement): the replacement keeps the anchor's text and adds stamps / dbg_ptr
PATCHES = [
    ("@triton.jit\ndef _router_logits_kernel(x_ptr,",
     STAMPS + "@triton.jit\ndef _router_logits_kernel(dbg_ptr, x_ptr,"),
    ("    pid_t = tl.program_id(2)\n    offs_e",
     "    pid_t = tl.program_id(2)\n    cta = pid_e + tl.num_programs(0) * pid_s\n"
     "    _gt(dbg_ptr, 1000 + cta)\n    offs_e"),
    ("    if SELECT:\n"
     "        if _last_arrival(tick_ptr, tl.num_programs(0) * tl.num_programs(1)):\n"
     "            ids, ent = _select(part_ptr,",
     "    _gt(dbg_ptr, 2000 + cta)\n    if SELECT:\n"
     "        if _last_arrival(tick_ptr, tl.num_programs(0) * tl.num_programs(1)):\n"
     "            _gt(dbg_ptr, 3000)\n            _clk(dbg_ptr, 0)\n"
     "            ids, ent = _select(dbg_ptr, part_ptr,"),
    ("            _record_keys(tl.reshape(key,",
     "            _clk(dbg_ptr, 10)\n            _record_keys(dbg_ptr, tl.reshape(key,"),
    ("                         tiles_ptr, CAP, NP, E_PAD, BLOCK_M, FILL)\n\n",
     "                         tiles_ptr, CAP, NP, E_PAD, BLOCK_M, FILL)\n"
     "            _clk(dbg_ptr, 20)\n            _gt(dbg_ptr, 3001)\n\n"),
    ("def _router_select_kernel(part_ptr,", "def _router_select_kernel(dbg_ptr, part_ptr,"),
    ("    _select(part_ptr, bias_ptr,",
     "    _gt(dbg_ptr, 4000 + tl.program_id(0))\n    _clk(dbg_ptr, 0)\n"
     "    _select(dbg_ptr, part_ptr, bias_ptr,"),
    ("    if _last_arrival(tick_ptr, tl.num_programs(0)):\n        _record(ids_ptr,",
     "    _clk(dbg_ptr, 10)\n    if _last_arrival(tick_ptr, tl.num_programs(0)):\n"
     "        _gt(dbg_ptr, 4100)\n        _clk(dbg_ptr, 11)\n        _record(dbg_ptr, ids_ptr,"),
    ("def _select(part_ptr,", "def _select(dbg_ptr, part_ptr,"),
    ("        z += parts[s]\n", "        z += parts[s]\n    _clk(dbg_ptr, 1)\n"),
    ("    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # signed order == float order\n",
     "    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # signed order == float order\n"
     "    _clk(dbg_ptr, 2)\n"),
    ("            sel = tl.where(kk == i + 1, s2[:, None], sel)\n",
     "            sel = tl.where(kk == i + 1, s2[:, None], sel)\n"
     "        _clk(dbg_ptr, 3 + i // 2)\n"),
    ("    return ids, ent\n", "    _clk(dbg_ptr, 9)\n    return ids, ent\n"),
    ("def _record(ids_ptr,", "def _record(dbg_ptr, ids_ptr,"),
    ("    _record_keys(tl.where(e >= 0,",
     "    _clk(dbg_ptr, 12)\n    _record_keys(dbg_ptr, tl.where(e >= 0,"),
    ("def _record_keys(key,", "def _record_keys(dbg_ptr, key,"),
    ("    key = tl.sort(key)  # the valid keys first, in (expert, entry) order\n",
     "    _clk(dbg_ptr, 13)\n"
     "    key = tl.sort(key)  # the valid keys first, in (expert, entry) order\n"
     "    _clk(dbg_ptr, 14)\n"),
    ("    rank = i - tl.associative_scan(",
     "    _clk(dbg_ptr, 15)\n    rank = i - tl.associative_scan("),
    ("    dest = i + tl.cumsum(pad, 0) - pad\n",
     "    _clk(dbg_ptr, 16)\n    dest = i + tl.cumsum(pad, 0) - pad\n    _clk(dbg_ptr, 18)\n"),
    ("    tl.store(tiles_ptr + dest // BLOCK_M, ke, mask=kvalid)\n",
     "    tl.store(tiles_ptr + dest // BLOCK_M, ke, mask=kvalid)\n    _clk(dbg_ptr, 17)\n"),
]


def stamped_module():
    return load_source(patch(open(api.K.__file__).read(), PATCHES), "moe_stamped")


class _WithDbg:
    """``api.K`` stand-in: the stamped router kernels take the stamp buffer first."""

    def __init__(self, mod, dbg):
        self.mod, self.dbg = mod, dbg

    def __getattr__(self, name):
        kernel = getattr(self.mod, name)
        if name not in ("_router_logits_kernel", "_router_select_kernel"):
            return kernel
        dbg = self.dbg

        class Launcher:
            def __getitem__(self, grid):
                return lambda *a, **kw: kernel[grid](dbg, *a, **kw)
        return Launcher()


def phases(d) -> dict:
    starts = [v for v in d[1000:1200].tolist() if v]
    ends = [v for v in d[2000:2200].tolist() if v]
    row = {"logits_ns": max(ends) - min(starts), "start_spread_ns": max(starts) - min(starts)}
    if d[3000]:
        row |= {"ticket_ns": d[3000].item() - max(ends), "tail_ns": d[3001].item() - d[3000].item()}
    if d[4000]:
        sel = [v for v in d[4000:4100].tolist() if v]
        row["select_to_record_ticket_ns"] = d[4100].item() - min(sel)
    clk = d[:21].tolist()
    row["clk"] = {i: clk[i] - clk[0] for i in range(1, 21) if clk[i]}
    return row


def main() -> None:
    dbg = torch.zeros(8192, dtype=torch.int64, device="cuda")
    api.K = _WithDbg(stamped_module(), dbg)
    g = torch.Generator(device="cuda").manual_seed(0)
    n_exp, hidden = 384, 5120
    w = (torch.randn(n_exp, hidden, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    b = torch.randn(n_exp, device="cuda", generator=g) * 0.01
    for rows in (1, 6, 48):
        x = torch.randn(rows, hidden, device="cuda", generator=g).to(torch.bfloat16)
        out = api.alloc_routing(rows, 6, n_exp, hidden, "cuda")
        for _ in range(30):
            dbg.zero_()
            api.route(x, w, b, out=out)
        torch.cuda.synchronize()
        print(f"rows={rows}", phases(dbg.cpu()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
