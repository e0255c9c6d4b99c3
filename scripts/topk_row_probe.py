"""Probe: plain-mode top-k, one CTA a row (``_row``) at several warp counts and tile sizes
against the four-launch pipeline (``_triton``), same inputs, one process (one GPU).

    PYTHONPATH=. python3 scripts/topk_row_probe.py [ROWSxCOLSxVALID ...] [--k 2048]
        [--variants chunks,row-16-8192,row-8-8192] [--kernels]

A variant ``row-W-T`` runs ``_row.launch`` with ``NUM_WARPS = W`` and ``TILE = T``;
``chunks-strided`` / ``chunks-spans`` the four launches with every folded grid's group maxima
folded strided (program p folds chunks p, p + n_p, ...) / in spans of R chunks, whatever
``config.strided_fold`` picks (session 23: docs/kernels/topk.md); ``chunks-fold2-off`` the
four launches without session 27's fold by 2 (grids of ``config.FOLD2_PROGRAMS`` to
``CHUNK_PROGRAMS`` chunk programs unfolded, as before); ``chunks-collect2`` the four launches
with each small-grid collect program taking two chunks (half the CTAs, an atomic a chunk);
``chunks-collect2a`` the same with one atomic for both chunks (one [2 * CHUNK / 8, 8] tile);
``chunks-rowasm`` the collect's span in inline PTX a row of 8 elements (packed bf16 compares,
candidate bits, a store loop over a row's candidates only); ``chunks-nolist-N`` the four
launches with folded grids of at most N chunk programs collected by chunk instead of from
segment lists; ``file:PATH`` the four launches of another ``_triton.py`` (an earlier commit's:
``git show REV:dsv4_decode/ops/topk/_triton.py > PATH``); ``rowfile:PATH`` the one-CTA-a-row
kernel of another ``_row.py``. Each cell is timed variant by variant, the list twice (CUDA
graph of 20 calls, median of 20 replays, as ``bench topk``), after every variant's output was
compared bitwise with the first's; ``--kernels`` then prints each variant's per-kernel
profiler table (``bench.kernels``).
Cells default to the bench's 64K and 256K cells; VALID ``mix`` is row 0 at 1/8 valid and the
others all valid. Prints one line a cell.
"""

import sys

import torch

from dsv4_decode.bench import topk as TB
from dsv4_decode.bench.kernels import kernel_table
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.topk import _row, _triton, make_topk_workspace
from dsv4_decode.ops.topk.config import CHUNK_PROGRAMS, span_log2
from dsv4_decode.utils.module_copy import load_file, load_source, patch

CELLS = [(r, c, v) for c in (65536, 262144) for v in ("1/8", "all")
         for r in (1, 6, 12, 24, 48, 64)]


def runner(name):
    """A launch function for variant ``name``."""
    if name == "chunks":
        return _triton.launch
    if name.startswith("file:"):  # an earlier _triton.py (git show REV:path > PATH)
        return load_file(name[5:], "dsv4_decode.ops.topk", "topk_old_").launch
    if name.startswith("rowfile:"):  # an earlier _row.py
        return load_file(name[8:], "dsv4_decode.ops.topk", "topk_row_old_").launch
    if name in ("chunks-strided", "chunks-spans"):  # every folded grid one way
        mod = load_source(open(_triton.__file__).read(), "topk_" + name[7:],
                          "dsv4_decode.ops.topk")
        mod.strided_fold = lambda rows, n_chunks, k: (name == "chunks-strided"
                                                      and span_log2(rows, n_chunks) > 0)
        return mod.launch
    if name == "chunks-fold2-off":
        return fold2_off_launch()
    if name == "chunks-collect2":
        return collect2_launch()
    if name == "chunks-collect2a":
        return collect2a_launch()
    if name == "chunks-rowasm":
        return rowasm_launch()
    if name.startswith("chunks-nolist-"):
        return nolist_launch(int(name.split("-")[2]))
    _, warps, tile = name.split("-")

    def launch(*args):
        old = _row.NUM_WARPS, _row.TILE
        _row.NUM_WARPS, _row.TILE = int(warps), int(tile)
        try:
            _row.launch(*args)
        finally:
            _row.NUM_WARPS, _row.TILE = old
    return launch


def fold2_off_launch():
    """``chunks-fold2-off``: a copy of ``_triton`` without session 27's fold by 2 on grids of
    ``FOLD2_PROGRAMS`` to ``CHUNK_PROGRAMS`` chunk programs (unfolded there, as before)."""
    mod = load_source(open(_triton.__file__).read(), "topk_fold2_off", "dsv4_decode.ops.topk")
    mod.span_log2 = lambda rows, nc: span_log2(rows, nc) if rows * nc > CHUNK_PROGRAMS else 0
    return mod.launch


def nolist_launch(n: int):
    """``chunks-nolist-N``: a copy of ``_triton`` whose folded grids of at most ``n`` chunk
    programs collect by chunk (no segment lists), the group maxima folded as the rule says."""
    src = patch(open(_triton.__file__).read(), [
        ("    lst = listed(rows, n_chunks)  # large grids collect from segment lists\n",
         f"    lst = log_r > 0 and rows * n_chunks > {n}\n")])
    return load_source(src, f"topk_nolist_{n}", "dsv4_decode.ops.topk").launch


# (anchor, replacement) for chunks-collect2: on small grids (LIST == 0) collect program p takes
# chunks 2p and 2p + 1, both loaded before the wait, one span (and one atomic) each
COLLECT2 = [
    ("    u = tl.load(x_row + e, mask=((e // 8) * 8 < len_e) & (listed == 0), other=0)\n"
     "    if (p * CHUNK < len_e) | (p == 0):\n",
     "    if not LIST:\n"
     "        e = e + p * CHUNK\n"
     "        e1 = e + CHUNK\n"
     "        u1 = tl.load(x_row + e1, mask=(e1 // 8) * 8 < len_e, other=0)\n"
     "    u = tl.load(x_row + e, mask=((e // 8) * 8 < len_e) & (listed == 0), other=0)\n"
     "    if ((p if LIST else 2 * p) * CHUNK < len_e) | (p == 0):\n"),
    ("        else:\n"
     "            _collect_span(u, e < len_e, e, p, t0, cnt_ptr + row, cb_ptr, cc_row, CAP)\n",
     "        else:\n"
     "            _collect_span(u, e < len_e, e, 2 * p, t0, cnt_ptr + row, cb_ptr, cc_row, CAP)\n"
     "            if (2 * p + 1) * CHUNK < len_e:\n"
     "                _collect_span(u1, e1 < len_e, e1, 2 * p + 1, t0, cnt_ptr + row, cb_ptr,\n"
     "                              cc_row, CAP)\n"),
    ("    _collect_kernel[(rows, lp if lst else n_chunks)](",
     "    _collect_kernel[(rows, lp if lst else triton.cdiv(n_chunks, 2))]("),
]


# (anchor, replacement) for chunks-collect2a: as chunks-collect2, but the two chunks are one
# [2 * CHUNK / 8, 8] tile with ONE atomic for both spans (the second span's base follows the
# first's count), so a busy program's chain is as long as one chunk's
COLLECT2A = [
    ("    e = p * CHUNK + tl.arange(0, CHUNK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]\n",
     "    G: tl.constexpr = 2 - LIST\n"
     "    e = (p * (G * CHUNK) + tl.arange(0, G * CHUNK // 8)[:, None] * 8\n"
     "         + tl.arange(0, 8)[None, :])\n"),
    ("    if (p * CHUNK < len_e) | (p == 0):\n",
     "    if (p * (G * CHUNK) < len_e) | (p == 0):\n"),
    ("        else:\n"
     "            _collect_span(u, e < len_e, e, p, t0, cnt_ptr + row, cb_ptr, cc_row, CAP)\n",
     "        else:\n"
     "            _collect_span2(u, e < len_e, e, p, t0, cnt_ptr + row, cb_ptr, cc_row, CAP,\n"
     "                           CHUNK // 8, (cols + CHUNK - 1) // CHUNK)\n"),
    ("@triton.jit\ndef _select_tile(",
     "@triton.jit\n"
     "def _collect_span2(u, valid, e, p, t0, cnt_ptr, cb_ptr, cc_row, CAP: tl.constexpr,\n"
     "                   ROWS: tl.constexpr, n_chunks):\n"
     "    cand = _at_least_t0(u, valid, t0)\n"
     "    ci = cand.to(tl.int32)\n"
     "    n_a = tl.sum(ci, axis=1)\n"
     "    second = tl.arange(0, 2 * ROWS) >= ROWS\n"
     "    n_0 = tl.sum(tl.where(second, 0, n_a), axis=0)\n"
     "    n_q = tl.sum(n_a, axis=0)\n"
     "    cc0 = n_0\n"
     "    cc1 = n_q - n_0\n"
     "    if n_q > 0:\n"
     "        base = tl.atomic_add(cnt_ptr, n_q, sem=\"relaxed\")\n"
     "        cc0 = n_0 | (tl.minimum(base, 32767) << 16)\n"
     "        cc1 = (n_q - n_0) | (tl.minimum(base + n_0, 32767) << 16)\n"
     "        pre = tl.cumsum(n_a, axis=0) - n_a\n"
     "        inrow = tl.cumsum(ci, axis=1) - 1\n"
     "        rank = (pre - tl.where(second, n_0, 0))[:, None] + inrow\n"
     "        pos = base + pre[:, None] + inrow\n"
     "        keep = cand & (pos < CAP)\n"
     "        lo = (rank << RANK_SHIFT) | (u.to(tl.int32) & 0xFFFF)\n"
     "        hi = ((2 * p + second.to(tl.int32))[:, None] << COL_BITS) | e\n"
     "        lo64 = lo.to(tl.uint32, bitcast=True).to(tl.int64)\n"
     "        tl.store(cb_ptr + pos, (hi.to(tl.int64) << 32) | lo64, mask=keep)\n"
     "    tl.store(cc_row + 2 * p, cc0)\n"
     "    if 2 * p + 1 < n_chunks:\n"
     "        tl.store(cc_row + 2 * p + 1, cc1)\n"
     "\n\n@triton.jit\ndef _select_tile("),
    ("    _collect_kernel[(rows, lp if lst else n_chunks)](",
     "    _collect_kernel[(rows, lp if lst else triton.cdiv(n_chunks, 2))]("),
]


def collect2a_launch():
    """``chunks-collect2a``: a copy of ``_triton`` patched by ``COLLECT2A``."""
    return load_source(patch(open(_triton.__file__).read(), COLLECT2A), "topk_collect2a",
                       "dsv4_decode.ops.topk").launch


# chunks-rowasm: the collect's span (``_collect_span``) with the compare as one packed bf16x2
# compare a word (``set.gtu``: greater or unordered, i.e. ``~(x <= v)``), each row's
# candidates as a bit mask, and the store as a loop over a row's set bits in inline PTX, so
# an element that is not a candidate costs no address, packing or store (sm_90 only)
ROWASM_SPAN = """def _collect_span(u, valid, e, q, t0, cnt_ptr, cb_ptr, cc_row, CAP: tl.constexpr):
    R: tl.constexpr = u.shape[0]
    lo16, hi16 = tl.split(tl.reshape(u, [R, 4, 2]))
    w = (hi16.to(tl.int32) << 16) | (lo16.to(tl.int32) & 0xFFFF)
    k = tl.minimum(tl.maximum(t0 - 2, 0), 0xFF80)
    k = tl.where(k == 0x7FFF, 0x7FFE, k)
    vb = tl.where(k >= 0x8000, k - 0x8000, 0xFFFF - k)
    b2 = tl.inline_asm_elementwise(
        "{ .reg .b32 %d, %t; set.gtu.u32.bf16x2 %d, $1, $2; and.b32 $0, %d, 1; "
        "shr.u32 %t, %d, 15; and.b32 %t, %t, 2; or.b32 $0, $0, %t; }",
        "=r,r,r", [w, w * 0 + ((vb << 16) | vb)], dtype=tl.int32, is_pure=True, pack=1)
    bits = tl.sum(b2 << (2 * tl.arange(0, 4)[None, :]), axis=1)
    bits = bits & tl.sum(tl.where(valid, 1 << tl.arange(0, 8)[None, :], 0), axis=1)
    n_a = tl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [bits], dtype=tl.int32,
                                    is_pure=True, pack=1)
    n_q = tl.sum(n_a, axis=0)
    cc = n_q
    if n_q > 0:
        base = tl.atomic_add(cnt_ptr, n_q, sem="relaxed")
        cc = n_q | (tl.minimum(base, 32767) << 16)
        pre = tl.cumsum(n_a, axis=0) - n_a
        e0 = tl.min(e, axis=1)
        wa, wb = tl.split(tl.reshape(w, [R, 2, 2]))
        w0, w2 = tl.split(wa)
        w1, w3 = tl.split(wb)
        z = bits * 0
        tl.inline_asm_elementwise(ROW_STORE, "=r,r,r,r,r,r,r,r,r,l,r",
                                  [bits, pre, z + base, w0, w1, w2, w3,
                                   (q << COL_BITS) | e0, z.to(tl.int64) + cb_ptr.to(tl.int64),
                                   z + CAP], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(cc_row + q, cc)
"""
ROW_STORE = (
    "{ .reg .pred %p<3>; .reg .b32 %m, %low, %t, %k, %r, %pos, %w, %h, %lo, %hi; "
    ".reg .b64 %a; mov.b32 $0, 0; setp.eq.s32 %p0, $1, 0; @%p0 bra done_${:uid}; "
    "mov.b32 %m, $1; mov.b32 %r, $2; loop_${:uid}: neg.s32 %t, %m; and.b32 %low, %m, %t; "
    "add.s32 %t, %low, -1; popc.b32 %k, %t; shr.u32 %t, %k, 1; setp.eq.s32 %p1, %t, 1; "
    "selp.b32 %w, $5, $4, %p1; setp.eq.s32 %p1, %t, 2; selp.b32 %w, $6, %w, %p1; "
    "setp.eq.s32 %p1, %t, 3; selp.b32 %w, $7, %w, %p1; and.b32 %h, %k, 1; "
    "shl.b32 %h, %h, 4; shr.u32 %w, %w, %h; and.b32 %w, %w, 65535; add.s32 %pos, %r, $3; "
    "setp.lt.s32 %p2, %pos, $10; shl.b32 %lo, %r, 17; or.b32 %lo, %lo, %w; "
    "add.s32 %hi, $8, %k; mul.wide.s32 %a, %pos, 8; add.s64 %a, %a, $9; "
    "@%p2 st.global.v2.b32 [%a], {%lo, %hi}; add.s32 %r, %r, 1; xor.b32 %m, %m, %low; "
    "setp.ne.s32 %p0, %m, 0; @%p0 bra loop_${:uid}; done_${:uid}: }")


def rowasm_launch():
    """``chunks-rowasm``: a copy of ``_triton`` whose ``_collect_span`` is ``ROWASM_SPAN``."""
    return rowasm_module().launch


def rowasm_module():
    src = open(_triton.__file__).read()
    start = src.index("def _collect_span(")
    old = src[start:src.index("\n\n\n@triton.jit", start) + 1]
    src = patch(src, [(old, ROWASM_SPAN)]).replace(
        "RANK_SHIFT = tl.constexpr(17)", f"ROW_STORE = tl.constexpr({ROW_STORE!r})\n"
        "RANK_SHIFT = tl.constexpr(17)")
    return load_source(src, "topk_rowasm", "dsv4_decode.ops.topk")


def collect2_launch():
    """``chunks-collect2``: a copy of ``_triton`` patched by ``COLLECT2``."""
    return load_source(patch(open(_triton.__file__).read(), COLLECT2), "topk_collect2",
                       "dsv4_decode.ops.topk").launch


def cell(variants, rows, cols, valid, k, kernels=False) -> None:
    xs, lens, _ = TB._inputs(rows, cols, "all" if valid == "mix" else valid)
    if valid == "mix":  # row 0 at 1/8 valid, the others all valid
        lens[0] = cols // 8
    ws = make_topk_workspace(rows, k, "cuda")
    outs = [torch.empty(rows, k, dtype=torch.int32, device="cuda") for _ in variants]
    runs = [runner(v) for v in variants]

    def make_fn(v):
        i = [0]

        def fn():
            runs[v](xs[i[0] % len(xs)].view(torch.int16), lens, outs[v], ws, ws.cfg, k)
            i[0] += 1
        return fn

    for v, run in enumerate(runs):
        run(xs[0].view(torch.int16), lens, outs[v], ws, ws.cfg, k)
    same = all(torch.equal(outs[0], o) for o in outs[1:])
    t = [[graph_time_us(make_fn(v), calls=20) for v in range(len(variants))] for _ in range(2)]
    cols_txt = "  ".join(f"{n} {a:6.2f}/{b:6.2f}" for n, a, b in zip(variants, *t, strict=True))
    print(f"{rows}x{cols}x{valid} k{k}: {cols_txt}  {'same' if same else 'DIFFERENT'}",
          flush=True)
    if kernels:  # the profiler's per-kernel table of each variant (as bench topk --kernels)
        for v, name in enumerate(variants):
            print(kernel_table(make_fn(v), 20).format(f"{rows}x{cols}x{valid} k{k} {name}"),
                  flush=True)


def main(argv) -> None:
    k, variants = 512, ["chunks", "row-16-8192", "row-8-8192"]
    if "--k" in argv:
        i = argv.index("--k")
        k = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if "--variants" in argv:
        i = argv.index("--variants")
        variants = argv[i + 1].split(",")
        argv = argv[:i] + argv[i + 2:]
    kernels = "--kernels" in argv
    argv = [a for a in argv if a != "--kernels"]
    cells = [(int(r), int(c), v) for r, c, v in (a.split("x", 2) for a in argv)] or CELLS
    print(torch.cuda.get_device_name())
    for rows, cols, valid in cells:
        cell(variants, rows, cols, valid, k, kernels)


if __name__ == "__main__":
    main(sys.argv[1:])
