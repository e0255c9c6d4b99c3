"""Probe: sparse_attn configs or kernels per cell, same inputs, one process (one Hopper GPU).

    PYTHONPATH=. python3 scripts/sparse_ab.py [RxQxH ...] [--warps | --triton | --splits W/C,..]
        [--kernels OLD.py[,..]]

For each cell (default: the benchmark's 24) it times each config of ``variants``, twice,
alternated (CUDA graph of 20 calls, median of 20 replays, as the benchmark), and checks each
against the first (bitwise where the splits are the same, else the largest difference relative
to the output's largest value). Variants: the default (``wgmma_config``) and the same config
with each row's splits launched one after the other (``long_first=False``); ``--warps``: the
wgmma kernel's split rule at 8 and at 4 warps throughout (``wgmma_config(..., num_warps=)``)
and the default; ``--splits 2/2,1/4``: the default, then 4-warp configs of W window and C
index-list steps a split (``long_first`` where W != C); ``--triton``: the Triton kernels'
default with and without ``long_first``. Prints one line a cell. No CSV.

``--kernels``: instead, the default config run by this tree's wgmma kernel and by each given
copy of ``_gluon.py`` (e.g. ``git show REV:dsv4_decode/ops/sparse_attn/_gluon.py > old.py``;
a device copy of the tree has no git), its ``_wgmma_attn_kernel`` swapped into the launcher:
a kernel change timed against its predecessor in one process. ``--kernels prefetch`` names
``prefetch_source()``'s patched copy of this tree's ``_gluon.py`` instead of a file.
"""

import sys
from dataclasses import replace

import torch

from dsv4_decode.bench import sparse_attn as SB
from dsv4_decode.bench.timing import graph_time_us
from dsv4_decode.ops.sparse_attn import (
    SparseAttnConfig,
    make_workspace,
    sparse_attn,
    wgmma_config,
)
from dsv4_decode.ops.sparse_attn import _triton as launcher
from dsv4_decode.utils.module_copy import PREFETCH_L2, load_file, load_source, patch

CELLS = [(b, ql, h) for h in (16, 64) for ql in (6, 1) for b in (1, 2, 4, 8, 16, 32)]


def split_config(w_steps, c_steps):
    """The wgmma kernel at 4 warps with w_steps / c_steps steps a window / index-list split."""
    return SparseAttnConfig.with_steps(16, 64, w_steps, SB.WINDOW, SB.SELECTED,
                                       c_steps=c_steps, num_warps=4, wgmma=True, pdl=True,
                                       pdl_entry=True, long_first=w_steps != c_steps)


def variants(rows, heads, warps=False, splits=(), triton=False):
    default = wgmma_config(rows, heads, SB.WINDOW, SB.SELECTED)
    if triton:  # the Triton kernels' default, with and without long-first
        tri = SB.triton_default(rows, heads)
        return {"triton": tri, "triton_interleaved": replace(tri, long_first=False)}
    if splits:
        return {"default": default} | {f"{w}/{c}": split_config(w, c) for w, c in splits}
    if not warps:
        return {"default": default, "interleaved": replace(default, long_first=False)}
    return {"w8": wgmma_config(rows, heads, SB.WINDOW, SB.SELECTED, num_warps=8),
            "w4": wgmma_config(rows, heads, SB.WINDOW, SB.SELECTED, num_warps=4),
            "default": default}


KERNELS = {}  # name -> the _wgmma_attn_kernel it runs (``--kernels``); empty: this tree's


def load_kernel(path):
    """``_wgmma_attn_kernel`` of a copy of ``_gluon.py`` at ``path`` (``prefetch``: of
    ``prefetch_source()``)."""
    if path == "prefetch":
        mod = load_source(prefetch_source(), "alt_prefetch", "dsv4_decode.ops.sparse_attn")
    else:
        mod = load_file(path, prefix="alt_")
    return mod.__name__, mod._wgmma_attn_kernel


# ``--kernels prefetch`` (session 36, prepared without a GPU): the splits ask the L2 for their
# records a step or two ahead (``prefetch.global.L2`` of every 128-byte line of a valid record,
# one address a thread, no replicas), so that the loads they wait on read the L2, not HBM
# (the benchmark rotates 20 input sets: past the L2 from about 8 requests, by the shapes).
# - Index list: the one-stage staging's copies of step i + 1 are issued mid-step i. The
#   prologue asks for step 1's records; step i, after its products, for step i + 2's (index
#   loaded at step i - 1 in the prefetch's own row layout, an L1 hit beside the copies' load;
#   block-table entry after step i's dequantisation).
# - Window: step i's records are loaded into registers at its top, all latency exposed; step i
#   asks for step i + 1's once its own loads are issued (their addresses need no load).
# Results cannot change: bitwise equal to the tree's.
PREFETCH_HELPERS = f'''
PREFETCH_L2 = gl.constexpr({PREFETCH_L2!r})


@gluon.constexpr_function
def _prefetch_layout(probes, warps):
    """[64 records, probes]: one address a thread, no replicas."""
    return gl.BlockedLayout([1, 1], [32 // probes, probes], [warps, 1], [1, 0])


@gluon.constexpr_function
def _probes(nbytes):
    """Probes a record of nbytes needs: no 128-byte line of it farther than 128 bytes from one
    (a power of two, for the layout)."""
    need, p = -(-(nbytes - 1) // 128) + 1, 1
    while p < need:
        p *= 2
    return p


@gluon.jit
def _prefetch_records(base_ptr, rec, valid, NBYTES: gl.constexpr):
    """prefetch.global.L2 of every 128-byte line of the valid records ``rec`` (``rec`` in the
    row layout of ``_prefetch_layout(_probes(NBYTES))``): bytes 0, d, 2d, ... and the last."""
    P: gl.constexpr = _probes(NBYTES)
    pl: gl.constexpr = _prefetch_layout(P, gl.num_warps())
    o = gl.minimum(gl.arange(0, P, layout=gl.SliceLayout(0, pl)) * ((NBYTES - 2) // (P - 1) + 1),
                   NBYTES - 1)
    addr = base_ptr + gl.expand_dims(rec, 1) + gl.expand_dims(o, 0).to(gl.int64)
    ok = gl.expand_dims(valid, 1) & gl.expand_dims(o >= 0, 0)
    gl.inline_asm_elementwise(
        PREFETCH_L2, "=r,l,r", [addr, ok.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)


'''


def prefetch_source() -> str:
    """This tree's ``_gluon.py`` with the L2 prefetches of ``PREFETCH_HELPERS``."""
    from dsv4_decode.ops.sparse_attn import _gluon

    pl = "gl.SliceLayout(1, _prefetch_layout(_probes(D // 2 + D // 16), gl.num_warps()))"
    wl = "gl.SliceLayout(1, _prefetch_layout(_probes(D + D // 32), gl.num_warps()))"
    # after the step's own four chunk loads (both branches), before the barrier
    w3 = "            c3, s3 = _window_chunk_load(win_ptr, rec, valid, 3, D, L3)\n"
    bar = "            gl.thread_barrier()  # every warp's wgmmas of the previous step are done\n"
    return patch(open(_gluon.__file__).read(), [
        ("\n@gluon.jit\ndef _window_split(", PREFETCH_HELPERS + "@gluon.jit\ndef _window_split("),
        (w3 + bar, w3 +
         "            rp, vp = _window_keys(slot, pos, win_ok, w_i0 + (it + 1) * 64, w_hi, ring,"
         f" WINDOW, D, {wl})\n"
         "            _prefetch_records(win_ptr, rp, vp, D + D // 32)\n" + bar),
        ("    _fp4_copy(comp_ptr, raw_s, rsc_s, rec, v0, D)\n",
         "    _fp4_copy(comp_ptr, raw_s, rsc_s, rec, v0, D)\n"
         f"    jp = _index_in(idx_ptr, row, c_0 + 64, c_hi, k_sel, {pl})\n"
         "    rp, vp = _rec(jp, _page(bt_ptr, jp, slot, sel_ok, max_pages, PAGE), n_pages, D,"
         " PAGE)\n"
         "    _prefetch_records(comp_ptr, rp, vp, D // 2 + D // 16)\n"
         f"    jp = _index_in(idx_ptr, row, c_0 + 128, c_hi, k_sel, {pl})\n"),
        ("        _fp4_copy(comp_ptr, raw_s, rsc_s, rec, v1, D)\n",
         "        _fp4_copy(comp_ptr, raw_s, rsc_s, rec, v1, D)\n"
         "        pp = _page(bt_ptr, jp, slot, sel_ok, max_pages, PAGE)\n"),
        ("        m_i, l_i, accs = _softmax_pv(s, ks, p_s, vm, m_i, l_i, accs, qk_scale, mma_o)\n"
         "        j1 = j2\n",
         "        m_i, l_i, accs = _softmax_pv(s, ks, p_s, vm, m_i, l_i, accs, qk_scale, mma_o)\n"
         "        rp, vp = _rec(jp, pp, n_pages, D, PAGE)\n"
         "        _prefetch_records(comp_ptr, rp, vp, D // 2 + D // 16)\n"
         f"        jp = _index_in(idx_ptr, row, c_0 + (it + 3) * 64, c_hi, k_sel, {pl})\n"
         "        j1 = j2\n"),
    ])


def cell(requests, q_len, heads, warps=False, splits=(), triton=False) -> None:
    inp = SB.Inputs(requests, q_len, heads, SB.SELECTED, SB.CALLS)
    if KERNELS:
        names = tuple(KERNELS)
        cfgs = (wgmma_config(inp.rows, heads, SB.WINDOW, SB.SELECTED),) * len(names)
    else:
        names, cfgs = zip(*variants(inp.rows, heads, warps, splits, triton).items(),
                          strict=True)
    kernels = [KERNELS.get(n, launcher._wgmma_attn_kernel) for n in names]
    wss = [make_workspace(inp.rows, heads, SB.D, SB.WINDOW, SB.SELECTED, "cuda", c)
           for c in cfgs]
    outs = [[torch.empty_like(s["out"]) for s in inp.sets] for _ in cfgs]

    def call(v, s):
        a, kw = inp.call_args(s)
        launcher._wgmma_attn_kernel = kernels[v]
        sparse_attn(*a, **kw, out=outs[v][s], workspace=wss[v], config=cfgs[v])

    def make_fn(v):
        i = [0]

        def fn():
            call(v, i[0] % SB.CALLS)
            i[0] += 1
        return fn

    line = f"{requests}x{q_len}x{heads:<3d}"
    ref = None
    times = {}
    for v in range(len(cfgs)):
        call(v, 0)
    for v in list(range(len(cfgs))) * 2:
        times.setdefault(v, []).append(graph_time_us(make_fn(v), calls=20))
    for v, (name, c) in enumerate(zip(names, cfgs, strict=True)):
        o = outs[v][0].float()
        ref = o if ref is None else ref
        same = "bitwise" if torch.equal(o, ref) else \
            f"rel {((o - ref).abs().max() / ref.abs().max()).item():.1e}"
        t = times[v]
        line += f" | {name} {t[0]:7.2f} / {t[1]:7.2f} ({c.w_steps}/{c.c_steps}, {same})"
    print(line, flush=True)


def main(argv) -> None:
    print(torch.cuda.get_device_name())
    if "--kernels" in argv:
        i = argv.index("--kernels")
        KERNELS["tree"] = launcher._wgmma_attn_kernel
        KERNELS.update(load_kernel(p) for p in argv[i + 1].split(","))
        argv = argv[:i] + argv[i + 2:]
    splits = ()
    if "--splits" in argv:
        i = argv.index("--splits")
        splits = [tuple(int(v) for v in s.split("/")) for s in argv[i + 1].split(",")]
        argv = argv[:i] + argv[i + 2:]
    warps, triton = "--warps" in argv, "--triton" in argv
    cells = [tuple(int(x) for x in a.split("x")) for a in argv
             if a not in ("--warps", "--triton")] or CELLS
    for c in cells:
        cell(*c, warps=warps, splits=splits, triton=triton)


if __name__ == "__main__":
    main(sys.argv[1:])
