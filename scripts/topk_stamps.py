"""Probe: where a plain-mode top-k call spends its time, from timer stamps (one Hopper GPU).

    PYTHONPATH=. python3 scripts/topk_stamps.py [ROWSxCOLSxVALID ...] [--k 512] [--phases]
        [--triton PATH]

Patched copies of ``ops/topk/_triton.py`` (or of ``--triton PATH``, another ``_triton.py``: a
probe variant, an earlier commit's) and ``_row.py`` (``utils.module_copy.patch``: a missing
anchor fails loudly) take a stamp buffer first. In every kernel each CTA takes the
``%globaltimer`` at its entry, after its dependent-launch wait and at its end, kept per kernel
as the earliest and latest over the CTAs (atomic min / max). A CUDA graph of 20 calls (each
call its own slots, as the bench's graph) is replayed; the line per cell and path gives, as
medians over calls 2-19, in µs: the call period (first entry to the next call's first entry),
then per kernel ``wait`` (first entry -> first CTA past its wait: what it waited on the kernel
before), ``run`` (first CTA past its wait -> last CTA's end), ``gap`` (the kernel before's
last end -> this one's first CTA past its wait: the dependent-launch hand-off).

``--phases`` adds second copies with ``%clock64`` stamps after CTA barriers at phase boundaries
(the barriers make them serial, so the sum can exceed the unstamped time) and prints the
cycles of row 0's CTA from its wait, the end over the rows and the rows' candidate counts:
``_row`` (fold of tile 0, the other tiles, the group maxima, T0, the collect (list, re-read),
the select (tau, need, ``_write_kept``)) and the four launches' select kernel (loads, tau,
need, then on tiles of at most 2,048 slots the on-chip placing, on larger ones the span prefix
/ gather, the scatter to index order, the reload and ``_write_kept``).
"""

import argparse
import re
import statistics
import sys

import torch

from dsv4_decode.bench import topk as TB
from dsv4_decode.bench.timing import capture, graph_time_us
from dsv4_decode.ops.topk import _row, _triton, make_topk_workspace
from dsv4_decode.utils.module_copy import STAMPS, load_file, load_source, patch

CALLS = 20
SLOTS = 64 + 64 * 32  # per call: 8 kernels x 8 timeline slots, then 32 phase slots a row
BIG = (1 << 62)

EVENT = '''
@triton.jit
def _ev(dbg_ptr, slot):
    """globaltimer: the earliest at slot, the latest at slot + 1, over the CTAs."""
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [tl.program_id(0)],
                                  dtype=tl.int64, is_pure=False, pack=1)
    tl.atomic_min(dbg_ptr + slot, t, sem="relaxed")
    tl.atomic_max(dbg_ptr + slot + 1, t, sem="relaxed")


'''


def _timeline(src: str, first_id: int) -> tuple[str, list[str]]:
    """``src`` with timeline stamps in every ``*_kernel`` and ``DBG`` passed at its launches."""
    names = []
    out = []
    for part in re.split(r"(?=^@triton\.jit\ndef )", src, flags=re.M):
        m = re.match(r"@triton\.jit\ndef (_\w+_kernel)\(", part)
        if m:
            j = first_id + len(names)
            names.append(m[1])
            part = part.replace(f"def {m[1]}(", f"def {m[1]}(dbg_ptr, ", 1)
            end = part.index("\n\n\n") if "\n\n\n" in part else len(part.rstrip("\n"))
            body, rest = part[:end], part[end:]
            body = body.replace("    if PDL:", f"    _ev(dbg_ptr, {8 * j})\n    if PDL:", 1)
            body = re.sub(r"^(\s+)(_pdl_enter\(\)|gdc_wait\(\))$",
                          rf"\1\2\n\1_ev(dbg_ptr, {8 * j + 2})", body, flags=re.M)
            part = body + f"\n    _ev(dbg_ptr, {8 * j + 4})" + rest
        out.append(part)
    src = "".join(out)
    src = re.sub(r"(_\w+_kernel\[[^\n]*\]\(\n\s+)", r"\1DBG, ", src)
    return src.replace("\n\n@triton.jit\n", "\n\n" + EVENT + "@triton.jit\n", 1), names


# (anchor, replacement) for --phases: %clock64 after a barrier, row r's slots at 64 + 32 r
PHASES = [
    ("    row = tl.program_id(0)\n    _, len_e",
     "    row = tl.program_id(0)\n    ph = dbg_ptr + 64 + row * 32\n    _clk(ph, 0)\n"
     "    _, len_e"),
    ("    acc = _fold(x_row, s_row, 0, u0, len_e, TILE, TWIN)\n",
     "    acc = _fold(x_row, s_row, 0, u0, len_e, TILE, TWIN)\n    _clk(ph, 1)\n"),
    ("    # group b's maximum", "    _clk(ph, 2)\n    # group b's maximum"),
    ("    t0 = _part_bound(", "    _clk(ph, 3)\n    t0 = _part_bound("),
    ("    if n_t <= 1:\n", "    _clk(ph, 4)\n    if n_t <= 1:\n"),
    ("    tl.store(cnt_ptr + row, n)", "    _clk(ph, 5)\n    tl.store(cnt_ptr + row, n)"),
    ("    o_ptr = out_ptr + row", "    _clk(ph, 6)\n    o_ptr = out_ptr + row"),
    ("def _select(kb,", "def _select(ph, kb,"),
    ("        _select(kb,", "        _select(ph, kb,"),
    ("    tau, need = _kth_above(key1, m, n, t0, K, SIZE <= 4096)",
     "    _clk(ph, 8)\n    tau, need = _kth_above(key1, m, n, t0, K, SIZE <= 4096)"),
    ("    gt = m & (key1 > tau)\n", "    _clk(ph, 9)\n    gt = m & (key1 > tau)\n"),
    ("    _write_kept(gt, m & (key1 == tau), need, p & 0xFFFF, n, o_ptr, K)\n",
     "    _clk(ph, 10)\n    _write_kept(gt, m & (key1 == tau), need, p & 0xFFFF, n, o_ptr, K)\n"
     "    _clk(ph, 11)\n"),
    ("def _collect_listed(x_row,", "def _collect_listed(ph, x_row,"),
    ("        n = _collect_listed(x_row,", "        n = _collect_listed(ph, x_row,"),
    ("    tl.debug_barrier()\n    n_go =", "    _clk(ph, 12)\n    n_go ="),
]
# (anchor, replacement) for --phases in the four launches' select kernel (row r's slots as above)
SELECT_PHASES = [
    ("    b_off = row.to(tl.int64) * stride_b\n    o_ptr = out_ptr",
     "    b_off = row.to(tl.int64) * stride_b\n    ph = dbg_ptr + 64 + row * 32\n    _clk(ph, 0)\n"
     "    o_ptr = out_ptr"),
    ("    if n <= SMALL:\n        _select_tile(v.to(", "    _clk(ph, 1)\n    if n <= SMALL:\n"
     "        _select_tile(ph, v.to("),
    ("def _select_loaded(b_ptr,", "def _select_loaded(ph, b_ptr,"),
    ("    _select_tile(w.to(", "    _select_tile(ph, w.to("),
    ("_select_loaded(cbuf_ptr", "_select_loaded(ph, cbuf_ptr"),
    ("def _select_tile(packed,", "def _select_tile(ph, packed,"),
    ("    gt = m & (key1 > tau)\n", "    _clk(ph, 3)\n    gt = m & (key1 > tau)\n"),
    # tiles of <= 2,048 slots: placed on chip (one stamp at the end)
    ("                      cc, n, o_ptr, K)\n",
     "                      cc, n, o_ptr, K)\n        _clk(ph, 7)\n"),
    # larger tiles: the scratch permutation
    ("        flag = tl.where(gt, 2,", "        _clk(ph, 4)\n        flag = tl.where(gt, 2,"),
    ("        tl.debug_barrier()  # global scratch written", "        _clk(ph, 5)\n"
     "        tl.debug_barrier()  # global scratch written"),
    ("need, v & COL_MASK, n, o_ptr,\n                    K)\n",
     "need, v & COL_MASK, n, o_ptr,\n                    K)\n        _clk(ph, 7)\n"),
]
SELECT_NAMES = {1: "loads issued", 3: "tau, need (+ loads)", 4: "prefix, gather", 5: "scatter",
                7: "placed on chip (<= 2,048 slots) / reload, write"}
PHASE_NAMES = {1: "fold tile 0", 2: "other tiles", 3: "group maxima", 4: "T0",
               12: "list", 5: "collect", 6: "barrier", 8: "load cands", 9: "tau, need", 10: "gt",
               11: "write", 7: "end"}


def stamped(phases: bool, source: str = ""):
    """(the patched _triton (``source``: another ``_triton.py``, e.g. a probe variant's
    patched copy), the patched _row, their kernel names by id)."""
    tsrc = open(source or _triton.__file__).read()
    if phases:
        tsrc = patch(tsrc, SELECT_PHASES).replace(
            "\n\n@triton.jit\ndef _level", "\n\n" + STAMPS + "@triton.jit\ndef _level")
    tsrc, tnames = _timeline(tsrc, 0)
    tmod = load_source(tsrc, "topk_triton_stamped" + ("_ph" if phases else ""),
                       "dsv4_decode.ops.topk")
    rsrc = open(_row.__file__).read()  # (its helpers come from ``_words``: no stamps there)
    if phases:
        rsrc = patch(rsrc, PHASES)
        rsrc = rsrc.replace("\n\n@triton.jit\ndef _cols",
                            "\n\n" + STAMPS + "@triton.jit\ndef _cols")
        last = "        _exact_fallback(x_row, lengths_ptr, row, cols, o_ptr, K, SCAN)\n"
        rsrc = rsrc.replace(last, last + "    _clk(ph, 7)\n")
    rsrc, rnames = _timeline(rsrc, len(tnames))
    rmod = load_source(rsrc, "topk_row_stamped" + ("_ph" if phases else ""),
                       "dsv4_decode.ops.topk")
    return tmod, rmod, tnames + rnames


def _init(dbg):
    dbg.zero_()
    dbg[:, 0:64:2] = BIG  # the earliest-of slots


def _caller(mod, inputs, k, dbg=None):
    """A call of ``mod.launch`` on the next logits of ``inputs``; with ``dbg``, each of CALLS
    consecutive calls gets its own stamp slots (bound at capture)."""
    xs, lens, out, ws = inputs
    i = [0]

    def fn():
        if dbg is not None:
            mod.DBG = dbg[i[0] % CALLS]
        mod.launch(xs[i[0] % len(xs)].view(torch.int16), lens, out, ws, ws.cfg, k)
        i[0] += 1
    return fn


def run_path(mod, inputs, k, dbg):
    """Replay a graph of CALLS stamped calls; return the stamp buffer (CPU)."""
    graph = capture(_caller(mod, inputs, k, dbg), CALLS, 3)
    for _ in range(3):
        _init(dbg)
        graph.replay()
    torch.cuda.synchronize()
    return dbg.cpu()


def timeline(d, names) -> str:
    med = statistics.median
    used = [j for j in range(len(names)) if d[0, 8 * j + 1] > 0]
    firsts = [min(d[c, 8 * j].item() for j in used) for c in range(CALLS)]
    txt = [f"period {med(firsts[c + 1] - firsts[c] for c in range(1, CALLS - 1)) / 1e3:.2f}"]
    prev = None
    for j in used:
        s = 8 * j
        calls = range(1, CALLS - 1)
        wait = med(d[c, s + 2] - d[c, s] for c in calls).item() / 1e3
        run = med(d[c, s + 5] - d[c, s + 2] for c in calls).item() / 1e3
        item = f"{names[j].strip('_').replace('_kernel', '')}: wait {wait:.2f} run {run:.2f}"
        if prev is not None:
            gap = med(d[c, s + 2] - d[c, 8 * prev + 5] for c in calls).item() / 1e3
            item += f" gap {gap:.2f}"
        txt.append(item)
        prev = j
    return " | ".join(txt)


def phases(d, rows, names) -> str:
    """Row 0's phases (cycles from its first stamp) and the end over the rows."""
    c = CALLS // 2
    per_row = []
    for r in range(rows):
        base = 64 + 32 * r
        clk = d[c, base:base + 32].tolist()
        per_row.append({i: clk[i] - clk[0] for i in names if clk[i]})
    order = [i for i in (1, 2, 3, 4, 12, 5, 6, 8, 9, 10, 11, 7) if i in per_row[0]]
    txt, last = [], 0
    for i in order:
        t = per_row[0][i]
        txt.append(f"{names[i]} {t - last}")
        last = t
    ends = sorted(p.get(7, 0) for p in per_row)
    return ("cycles (row 0): " + ", ".join(txt) + f"; end over rows: min {ends[0]} median "
            f"{ends[len(ends) // 2]} max {ends[-1]}")


def main(argv) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cells", nargs="*", help="ROWSxCOLSxVALID, e.g. 6x65536x1/8 (default: 8 cells)")
    p.add_argument("--k", type=int, default=512)
    p.add_argument("--phases", action="store_true", help="also the clock64 phases (see above)")
    p.add_argument("--triton", default="", help="stamp this _triton.py instead of the tree's")
    args = p.parse_args(argv)
    k, want_phases = args.k, args.phases
    cells = [(int(r), int(c), v) for r, c, v in (a.split("x") for a in args.cells)] or [
        (1, 65536, "1/8"), (1, 65536, "all"), (12, 65536, "all"), (64, 65536, "all"),
        (1, 262144, "all"), (1, 1048576, "1/8"), (1, 1048576, "all"), (12, 1048576, "all")]
    tmod, rmod, names = stamped(False, args.triton)
    ptmod, pmod, _ = stamped(True, args.triton) if want_phases else (None, None, None)
    dbg = torch.zeros(CALLS, SLOTS, dtype=torch.int64, device="cuda")
    print(torch.cuda.get_device_name(), flush=True)
    for rows, cols, valid in cells:
        xs, lens, _ = TB._inputs(rows, cols, valid)
        ws = make_topk_workspace(rows, k, "cuda")
        inputs = (xs, lens, torch.empty(rows, k, dtype=torch.int32, device="cuda"), ws)
        plain_t = load_file(args.triton, "dsv4_decode.ops.topk", "topk_src_") if args.triton \
            else _triton
        paths = [("chunks", plain_t, tmod)]
        if cols <= _row.ROW_COLS:
            paths.append(("row", _row, rmod))
        for name, plain, mod in paths:
            us = graph_time_us(_caller(plain, inputs, k), calls=CALLS)
            line = timeline(run_path(mod, inputs, k, dbg), names)
            print(f"{rows}x{cols}x{valid} k{k} {name}: unstamped {us:.2f} | {line}", flush=True)
            if pmod is not None:
                d = run_path(pmod if name == "row" else ptmod, inputs, k, dbg)
                ph = phases(d, rows, PHASE_NAMES if name == "row" else SELECT_NAMES)
                n = ws.cnt[:rows].tolist()
                print(f"{rows}x{cols}x{valid} k{k} {name} phases: {ph}; candidates "
                      f"{min(n)}..{max(n)}", flush=True)

if __name__ == "__main__":
    main(sys.argv[1:])
