"""Probe (session 33): plain mode's threshold from a sample of the row, three launches, against
the tree's four, same inputs, one process (one GPU).

    PYTHONPATH=. python3 scripts/topk_sample_probe.py [ROWSxCOLSxVALID ...] [--c 2.5]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 scripts/topk_sample_probe.py --cpu

The idea (guess, then verify): the four launches read the row twice in effect (the group
maxima, then the collect's listed segments or, on small grids, the whole chunk again from L2),
and T0 waits for a full pass. Here T0 comes from a sample instead:

1. ``_sample_kernel`` grid (rows,): NP pieces of PIECE contiguous elements spread evenly over
   the row's length (at most 1/16 of a 256K row's bytes), their key1. T0 = the k_s-th
   largest sampled key, k_s = ceil(C * sampled / length), so that about C elements of the
   row are >= T0 (C = ``--c`` x k). Found as: T_p = the k_s-th largest piece maximum (a
   lower bound: k_s pieces reach it, each through one element at least), then the largest t
   in [T_p, T_p + 255] with k_s sampled keys >= t (an 8-step search; a lower t only admits
   more candidates), run where T_p admits more than REFINE / 4 x k_s sampled keys
   (``--refine N``, default 8: twice; 0 or ``--no-refine``: never, T_p is T0).
2. the tree's ``_collect_kernel`` on the small-grid form (a chunk a program, the whole chunk
   from HBM: the only full read), which loads its chunk before its dependent-launch wait,
   i.e. while the sample kernel runs;
3. the tree's ``_select_kernel``.

``--free-t0``: step 1 replaced by a copy of T0 computed beforehand by step 1 on the same
input (what the chain costs without the sample's time).

``--parts G``: step 1 on G programs a row, program g on pieces g, g + G, ..., each storing
its own T0; the collect takes their least (each is a lower bound of its own estimate, so the
least admits more candidates, never fewer).

``--leader``: steps 1 and 2 in one launch (``_leader_kernel``; needs ``--rc`` >= 1 and takes
``--parts``).

``--rc R`` (R > 1): step 2 by ``_collect_stream_kernel`` instead: R chunks a program, strided
over the row, loaded as one tile before the wait, one atomic a program (2R warps).

Not exact as it stands: a row with fewer than k candidates (the estimate too high) would need
the select's fallback, which this probe does not add; it reports the candidate counts (min /
mean / max over the rows of the last call) and whether the output equals the tree's.
"""

import os
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv4_decode.ops.topk import _triton, make_topk_workspace
from dsv4_decode.ops.topk._kth import _kth_largest
from dsv4_decode.ops.topk._words import (
    _mask_words,
    _pdl_enter,
    _row_length,
    _wmax,
    _word_key1,
)
from dsv4_decode.ops.topk.config import COLLECT_MAXNREG, NSEG, WARPS, row_ptx
from dsv4_decode.utils.device import pdl_capable

NP = 1024
RC = 1
GP = 1
LEADER = False
FREE_T0 = False
PIECE = 16

CELLS = [(12, 262144, "all"), (24, 262144, "all"), (48, 262144, "all"), (64, 262144, "all"),
         (12, 262144, "1/8"), (24, 262144, "1/8"), (6, 262144, "all"), (1, 262144, "all"),
         (6, 524288, "all"), (1, 65536, "all"), (12, 65536, "all")]


@triton.jit
def _count_ge(u, t, PTX: tl.constexpr):
    """#{halves of the words ``u`` [N, 8] whose key1 >= t}: one packed compare a word
    (``_row_candidates``) on sm_90, elementwise under the interpreter."""
    if PTX:
        bits = _triton._row_candidates(tl.reshape(u, [u.shape[0] * 2, 4]), t)
        n = tl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [bits], dtype=tl.int32,
                                      is_pure=True, pack=1)
        c = tl.sum(n, axis=0)
    else:
        lo = _triton._at_least_t0(u & 0xFFFF, u == u, t)
        hi = _triton._at_least_t0((u >> 16) & 0xFFFF, u == u, t)
        c = tl.sum(tl.sum(lo.to(tl.int32) + hi.to(tl.int32), axis=1), axis=0)
    return c


@triton.jit
def _sample_t0(x_ptr, row, g, len_e, stride_x, C, NP: tl.constexpr, PIECE: tl.constexpr,
               G: tl.constexpr, REFINE: tl.constexpr, PTX: tl.constexpr):
    """Part g's T0 (see the module docstring)."""
    x32 = (x_ptr + tl.multiple_of(row.to(tl.int64) * stride_x, 8)).to(tl.pointer_type(tl.int32))
    st = tl.maximum((len_e + NP * PIECE - 1) // (NP * PIECE) * PIECE, PIECE)  # covers the row
    i = g + tl.arange(0, NP // G) * G  # this part's pieces
    w = (i * (st // 2))[:, None] + tl.arange(0, PIECE // 2)[None, :]
    u = _mask_words(w, tl.load(x32 + w, mask=(w // 4) * 8 < len_e, other=0), len_e)
    m = tl.sum(tl.minimum(tl.maximum(len_e - i * st, 0), PIECE), axis=0)
    k_s = tl.maximum((C * m + len_e - 1) // tl.maximum(len_e, 1), 1)
    pk = _word_key1(_wmax(u, 1, not PTX), not PTX)
    pk = tl.where(i * st < len_e, pk, 0)
    n_p = tl.sum((pk > 0).to(tl.int32), axis=0)
    t = _kth_largest(pk, pk > 0, n_p, tl.minimum(k_s, n_p), True)
    if REFINE:  # only where the piece maxima's bound admits more than REFINE / 4 the target
        if _count_ge(u, t, PTX) * 4 > REFINE * k_s:
            for b in tl.static_range(7, -1, -1):
                cand = t + (1 << b)
                t = tl.where(_count_ge(u, cand, PTX) >= k_s, cand, t)
    return tl.maximum(tl.where(len_e <= C, 1, t), 1)  # short rows: every element a candidate


@triton.jit
def _sample_kernel(x_ptr, lengths_ptr, thr_ptr, cnt_ptr, parts_ptr, stride_x, stride_g, cols, C,
                   NP: tl.constexpr, PIECE: tl.constexpr, G: tl.constexpr,
                   REFINE: tl.constexpr, PTX: tl.constexpr, PDL: tl.constexpr):
    # pieces as words of two bf16: packed maxima and packed compares, no key transform but on
    # the NP / G piece maxima. G > 1: program g of the row takes pieces g, g + G, ... (each
    # part spans the row) and stores its own T0 at parts[row, g]; the collect takes their
    # minimum (a lower bound of each: more candidates, never fewer)
    row = tl.program_id(0)
    g = tl.program_id(1)
    _, len_e = _row_length(lengths_ptr, row, cols, 1)
    if PDL:
        _pdl_enter()
    t = _sample_t0(x_ptr, row, g, len_e, stride_x, C, NP, PIECE, G, REFINE, PTX)
    if G == 1:
        tl.store(thr_ptr + row, t)
    else:
        tl.store(parts_ptr + row.to(tl.int64) * stride_g + g, t)
    if g == 0:
        tl.store(cnt_ptr + row, 0)


@triton.jit
def _t0_copy_kernel(src_ptr, thr_ptr, cnt_ptr, PDL: tl.constexpr):
    # ``--free-t0``: T0 computed beforehand (the sample kernel on the same input), copied: the
    # three-launch chain's time without the sample's
    row = tl.program_id(0)
    if PDL:
        _pdl_enter()
    tl.store(thr_ptr + row, tl.load(src_ptr + row))
    tl.store(cnt_ptr + row, 0)


@triton.jit
def _collect_tile(u, e0, q, p, len_e, t0, cnt_ptr, cb_ptr, cc_row, NPR, CAP: tl.constexpr,
                  R: tl.constexpr, RW: tl.constexpr, ROW_PTX: tl.constexpr):
    """The R spans of a collect program (``u``: [R * RW, 8] bf16 bits, row r of span q[r]
    from column e0[r]): one atomic for all their candidates, each span's count and base to
    cc."""
    n_in = tl.minimum(tl.maximum(len_e - e0, 0), 8)
    j = tl.arange(0, 8)[None, :]
    if ROW_PTX:
        lo16, hi16 = tl.split(tl.reshape(u, [R * RW, 4, 2]))
        w = (hi16.to(tl.int32) << 16) | (lo16.to(tl.int32) & 0xFFFF)
        bits = _triton._row_candidates(w, t0) & ((1 << n_in) - 1)
        n_a = tl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [bits],
                                        dtype=tl.int32, is_pure=True, pack=1)
    else:
        cand = _triton._at_least_t0(u, j < n_in[:, None], t0)
        n_a = tl.sum(cand.to(tl.int32), axis=1)
    n_c = tl.sum(tl.reshape(n_a, [R, RW]), axis=1)  # per span
    tot = tl.sum(n_c, axis=0)
    base = tot * 0
    if tot > 0:
        base = tl.atomic_add(cnt_ptr, tot, sem="relaxed")
    b_c = base + tl.cumsum(n_c, axis=0) - n_c  # each span's base
    c = tl.arange(0, R)
    tl.store(cc_row + p + c * NPR, n_c | (tl.minimum(b_c, 32767) << 16),
             mask=(p + c * NPR) * (RW * 8) < len_e)
    pre = tl.reshape(tl.cumsum(tl.reshape(n_a, [R, RW]), axis=1), [R * RW]) - n_a
    b_r = tl.reshape(tl.broadcast_to(b_c[:, None], [R, RW]), [R * RW])
    if ROW_PTX:
        _triton._store_rows(bits, pre, b_r, w, (q << _triton.COL_BITS) | e0, cb_ptr, CAP)
    else:
        rank = pre[:, None] + tl.cumsum(cand.to(tl.int32), axis=1) - 1
        pos = b_r[:, None] + rank
        lo = (rank << _triton.RANK_SHIFT) | (u.to(tl.int32) & 0xFFFF)
        hi = (q[:, None] << _triton.COL_BITS) | (e0[:, None] + j)
        lo64 = lo.to(tl.uint32, bitcast=True).to(tl.int64)
        tl.store(cb_ptr + pos, (hi.to(tl.int64) << 32) | lo64, mask=cand & (pos < CAP))


@triton.jit
def _collect_stream_kernel(x_ptr, lengths_ptr, thr_ptr, cnt_ptr, cbuf_ptr, cc_ptr, parts_ptr,
                           stride_x, stride_b, stride_cc, stride_g, cols, NPR,
                           CHUNK: tl.constexpr, CAP: tl.constexpr, R: tl.constexpr,
                           G: tl.constexpr, ROW_PTX: tl.constexpr, PDL: tl.constexpr):
    # The small-grid collect on R chunks a program, strided (program p of the row's NPR takes
    # chunks p, p + NPR, ...: a short row's chunks spread over its first programs), as ONE
    # [R * CHUNK / 8, 8] tile loaded before the wait, and ONE atomic a program for the R
    # spans' candidates (a span is still a chunk: its count and base go to cc as the select
    # reads them).
    if PDL:
        gdc_launch_dependents()
    row = tl.program_id(0)
    p = tl.program_id(1)
    _, len_e = _row_length(lengths_ptr, row, cols, 1)
    x_row = x_ptr + tl.multiple_of(row.to(tl.int64) * stride_x, 8)
    cb_ptr = cbuf_ptr + row.to(tl.int64) * stride_b
    cc_row = cc_ptr + row.to(tl.int64) * stride_cc
    RW: tl.constexpr = CHUNK // 8  # rows of 8 elements a chunk
    r = tl.arange(0, R * RW)
    q = p + (r // RW) * NPR  # each row's chunk (span)
    e0 = q * CHUNK + (r % RW) * 8
    e = e0[:, None] + tl.arange(0, 8)[None, :]
    u = tl.load(x_row + e, mask=(e // 8) * 8 < len_e, other=0)
    if (p * CHUNK < len_e) | (p == 0):
        if PDL:
            gdc_wait()
        if G == 1:
            t0 = tl.load(thr_ptr + row)
        else:  # the parts' least T0; program 0 leaves it for the select
            t0 = tl.min(tl.load(parts_ptr + row.to(tl.int64) * stride_g + tl.arange(0, G)),
                        axis=0)
            if p == 0:
                tl.store(thr_ptr + row, t0)
        _collect_tile(u, e0, q, p, len_e, t0, cnt_ptr + row, cb_ptr, cc_row, NPR, CAP, R, RW,
                      ROW_PTX)


@triton.jit
def _leader_kernel(x_ptr, lengths_ptr, thr_ptr, cnt_ptr, cbuf_ptr, cc_ptr, flag_ptr, stride_x,
                   stride_b, stride_cc, cols, rows, NPR, C, n_ctas, NP: tl.constexpr,
                   PIECE: tl.constexpr, G: tl.constexpr, REFINE: tl.constexpr,
                   CHUNK: tl.constexpr, CAP: tl.constexpr, R: tl.constexpr,
                   PTX: tl.constexpr, PDL: tl.constexpr):
    # ``--leader``: the sample and the collect in ONE launch. A ticket gives each CTA its role
    # in the order the CTAs start: the first rows x G are the rows' sample parts (as
    # ``_sample_kernel``), each publishing its T0 in flags[row, g] (release); the others
    # collect (as ``_collect_stream_kernel``) once they acquired their row's G parts, their
    # chunks loaded before. A part never waits, and every part took a ticket before any
    # collector did, so the spinning collectors cannot hold a part out of the GPU. The last
    # CTA to finish re-arms the flags, the ticket and its own counter for the next call.
    # flags: [rows * G] parts, then the ticket, then the finished count.
    if PDL:
        _pdl_enter()
    tk = tl.atomic_add(flag_ptr + rows * G, 1, sem="relaxed")
    if tk < rows * G:
        row = tk % rows
        g = tk // rows
        _, len_e = _row_length(lengths_ptr, row, cols, 1)
        t = _sample_t0(x_ptr, row, g, len_e, stride_x, C, NP, PIECE, G, REFINE, PTX)
        if g == 0:
            tl.store(cnt_ptr + row, 0)
        tl.debug_barrier()
        tl.atomic_xchg(flag_ptr + row * G + g, t, sem="release")
    else:
        wid = tk - rows * G
        row = wid % rows
        p = wid // rows
        _, len_e = _row_length(lengths_ptr, row, cols, 1)
        x_row = x_ptr + tl.multiple_of(row.to(tl.int64) * stride_x, 8)
        RW: tl.constexpr = CHUNK // 8
        r = tl.arange(0, R * RW)
        q = p + (r // RW) * NPR
        e0 = q * CHUNK + (r % RW) * 8
        e = e0[:, None] + tl.arange(0, 8)[None, :]
        u = tl.load(x_row + e, mask=(e // 8) * 8 < len_e, other=0)
        if (p * CHUNK < len_e) | (p == 0):
            t0 = len_e * 0 + 0x10000
            for gg in tl.static_range(G):
                v = len_e * 0
                while v == 0:
                    v = tl.atomic_add(flag_ptr + row * G + gg, 0, sem="acquire")
                t0 = tl.minimum(t0, v)
            if p == 0:
                tl.store(thr_ptr + row, t0)
            _collect_tile(u, e0, q, p, len_e, t0, cnt_ptr + row,
                          cbuf_ptr + row.to(tl.int64) * stride_b,
                          cc_ptr + row.to(tl.int64) * stride_cc, NPR, CAP, R, RW, PTX)
    tl.debug_barrier()
    done = tl.atomic_add(flag_ptr + rows * G + 1, 1, sem="acq_rel")
    if done == n_ctas - 1:
        i = tl.arange(0, 1024)
        tl.store(flag_ptr + i, 0, mask=i < rows * G + 2)


def launch_sampled(x16, lengths, out, ws, cfg, k, c_mult=2.5, refine=8, pdl=True, rc=1,
                   t0_src=None, parts=1):
    rows, cols = x16.shape
    n_chunks = triton.cdiv(cols, cfg.chunk)
    pdl = pdl and pdl_capable(x16.device)
    dep = dict(PDL=pdl, **({"launch_pdl": True} if pdl else {}))
    if t0_src is not None:
        _t0_copy_kernel[(rows,)](t0_src, ws.thr, ws.cnt, num_warps=1, **dep)
    else:
        _sample_kernel[(rows, parts)](x16, lengths, ws.thr, ws.cnt, ws.gmax, x16.stride(0),
                                      ws.gmax.stride(0), cols, int(c_mult * k), NP=NP,
                                      PIECE=PIECE, G=parts, REFINE=refine,
                                      PTX=pdl_capable(x16.device), num_warps=8, **dep)
    regions = dict(stride_r=ws.rcnt.stride(0), n_reg=1, NR=1)
    if rc == 1 and parts == 1:
        _triton._collect_kernel[(rows, n_chunks)](
            x16, lengths, ws.thr, ws.cnt, ws.seglist, ws.rcnt, ws.cbuf, ws.cc,
            stride_x=x16.stride(0), stride_s=ws.smax.stride(0), stride_b=ws.cbuf.stride(0),
            stride_cc=ws.cc.stride(0), cols=cols, NSEG=NSEG, CAP=cfg.cap, LIST=False,
            P=n_chunks, RS=2048, ROW_PTX=pdl_capable(x16.device) and row_ptx(rows, n_chunks),
            num_warps=WARPS["collect"], maxnreg=COLLECT_MAXNREG, CHUNK=cfg.chunk, **regions,
            **dep)
    else:
        _collect_stream_kernel[(rows, n_chunks // rc)](
            x16, lengths, ws.thr, ws.cnt, ws.cbuf, ws.cc, ws.gmax, x16.stride(0),
            ws.cbuf.stride(0), ws.cc.stride(0), ws.gmax.stride(0), cols, n_chunks // rc,
            CHUNK=cfg.chunk, CAP=cfg.cap, R=rc, G=1 if t0_src is not None else parts,
            ROW_PTX=pdl_capable(x16.device) and row_ptx(rows, n_chunks),
            num_warps=max(4, 2 * rc), **dep)  # R x 4 KB a CTA: 2 warps a chunk (48-64 registers)
    _select(x16, lengths, out, ws, cfg, k, dep)


def _select(x16, lengths, out, ws, cfg, k, dep):
    rows, cols = x16.shape
    n_chunks = triton.cdiv(cols, cfg.chunk)
    regions = dict(stride_r=ws.rcnt.stride(0), n_reg=1, NR=1)
    _triton._select_kernel[(rows,)](
        x16, lengths, ws.thr, ws.cnt, ws.cbuf, ws.cc, ws.scratch, ws.rcnt, out,
        stride_x=x16.stride(0), stride_b=ws.cbuf.stride(0), stride_cc=ws.cc.stride(0),
        stride_o=out.stride(0), cols=cols, n_chunks=n_chunks, K=k,
        NCH=triton.next_power_of_2(n_chunks), NSEG=NSEG, LIST=False, P=n_chunks,
        SMALL=cfg.small, MID=min(2 * cfg.small, cfg.cap), CAP=cfg.cap, SCAN=2048,
        num_warps=WARPS["select"], CHUNK=cfg.chunk, **regions, **dep)


def launch_leader(x16, lengths, out, ws, cfg, k, flags, c_mult=2.0, refine=5, rc=2, parts=1,
                  pdl=True):
    """``--leader``: ``_leader_kernel`` (sample parts and collect, one launch), then the
    select. ``flags``: int32 [rows * parts + 2], zero before the first call (re-armed by
    every call)."""
    rows, cols = x16.shape
    n_chunks = triton.cdiv(cols, cfg.chunk)
    pdl = pdl and pdl_capable(x16.device)
    dep = dict(PDL=pdl, **({"launch_pdl": True} if pdl else {}))
    n_ctas = rows * parts + rows * (n_chunks // rc)
    _leader_kernel[(n_ctas,)](
        x16, lengths, ws.thr, ws.cnt, ws.cbuf, ws.cc, flags, x16.stride(0), ws.cbuf.stride(0),
        ws.cc.stride(0), cols, rows, n_chunks // rc, int(c_mult * k), n_ctas, NP=NP,
        PIECE=PIECE, G=parts, REFINE=refine, CHUNK=cfg.chunk, CAP=cfg.cap, R=rc,
        PTX=pdl_capable(x16.device), num_warps=8, **dep)
    _select(x16, lengths, out, ws, cfg, k, dep)


def cpu_check() -> None:
    from dsv4_decode.ops.topk.ref import decode_topk_ref
    g = torch.Generator().manual_seed(0)
    k = 64
    for rows, cols, lens in [(3, 40960, (40960, 20000, 9000)), (2, 65536, (65536, 5000))]:
        x = torch.randn(rows, cols, generator=g).to(torch.bfloat16)
        x[0] = torch.linspace(-3, 3, cols).to(torch.bfloat16)  # rising: the refine's case
        ln = torch.tensor(lens, dtype=torch.int32)
        ws = make_topk_workspace(rows, k, "cpu")
        out = torch.empty(rows, k, dtype=torch.int32)
        if LEADER:
            flags = torch.zeros(rows * GP + 2, dtype=torch.int32)
            for _ in range(2):  # twice: the flags re-armed by the first call
                launch_leader(x.view(torch.int16), ln, out, ws, ws.cfg, k, flags, 2.5, 8,
                              RC, GP)
            assert int(flags.abs().sum()) == 0, flags
        else:
            launch_sampled(x.view(torch.int16), ln, out, ws, ws.cfg, k, rc=RC, parts=GP)
        ref = decode_topk_ref(x, ln, k)
        print(rows, cols, lens, "candidates", ws.cnt[:rows].tolist(),
              "equal" if torch.equal(out, ref) else "DIFFERENT")


def cell(rows, cols, valid, k, c_mult, refine) -> None:
    from dsv4_decode.bench import topk as TB
    from dsv4_decode.bench.timing import graph_time_us
    xs, lens, _ = TB._inputs(rows, cols, valid)
    ws = make_topk_workspace(rows, k, "cuda")
    ws2 = make_topk_workspace(rows, k, "cuda")
    outs = [torch.empty(rows, k, dtype=torch.int32, device="cuda") for _ in range(2)]

    t0s = {}
    if FREE_T0:  # each input's T0 from the sample kernel, kept for the copy kernel
        for x in xs:
            launch_sampled(x.view(torch.int16), lens, outs[1], ws2, ws2.cfg, k, c_mult, refine,
                           rc=RC, parts=GP)
            t0s[x.data_ptr()] = ws2.thr[:rows].clone()

    flags = torch.zeros(rows * GP + 2, dtype=torch.int32, device="cuda")

    def run(v, x):
        if v == 0:
            _triton.launch(x.view(torch.int16), lens, outs[0], ws, ws.cfg, k)
        elif LEADER:
            launch_leader(x.view(torch.int16), lens, outs[1], ws2, ws2.cfg, k, flags, c_mult,
                          refine, RC, GP)
        else:
            launch_sampled(x.view(torch.int16), lens, outs[1], ws2, ws2.cfg, k, c_mult, refine,
                           rc=RC, t0_src=t0s.get(x.data_ptr()), parts=GP)

    def make_fn(v):
        i = [0]

        def fn():
            run(v, xs[i[0] % len(xs)])
            i[0] += 1
        return fn

    same = True
    for x in xs[:4]:
        run(0, x)
        run(1, x)
        same &= torch.equal(outs[0], outs[1])
    n = ws2.cnt[:rows].float()
    t = [graph_time_us(make_fn(v), calls=20) for v in (0, 1, 0, 1)]

    def sample_only():
        _sample_kernel[(rows, GP)](xs[0].view(torch.int16), lens, ws2.thr, ws2.cnt, ws2.gmax,
                                   cols, ws2.gmax.stride(0), cols, int(c_mult * k), NP=NP,
                                   PIECE=PIECE, G=GP, REFINE=refine, PTX=True, PDL=True,
                                   num_warps=8, launch_pdl=True)
    ts = graph_time_us(sample_only, calls=20)
    tag = (" free-t0" if FREE_T0 else "") + (" leader" if LEADER else "")
    print(f"{rows}x{cols}x{valid} k{k} c{c_mult} np{NP} g{GP} rc{RC} refine{int(refine)}{tag}: "
          f"tree {t[0]:7.2f} / {t[2]:7.2f}  sampled {t[1]:7.2f} / {t[3]:7.2f}  diff "
          f"{(t[1] + t[3] - t[0] - t[2]) / 2:+6.2f} us  sample alone {ts:5.2f}  "
          f"candidates {n.min():.0f} / {n.mean():.0f} / {n.max():.0f}  "
          f"{'same' if same else 'DIFFERENT'}", flush=True)


def main(argv) -> None:
    global NP, RC, FREE_T0, GP, LEADER
    LEADER = "--leader" in argv
    argv = [a for a in argv if a != "--leader"]
    if "--parts" in argv:
        i = argv.index("--parts")
        GP = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    FREE_T0 = "--free-t0" in argv
    argv = [a for a in argv if a != "--free-t0"]
    if "--cpu" in argv:
        RC = int(argv[argv.index("--rc") + 1]) if "--rc" in argv else 1
        assert os.environ.get("TRITON_INTERPRET") == "1"
        cpu_check()
        return
    k, c_mult, refine = 512, 2.5, 0 if "--no-refine" in argv else 8
    if "--refine" in argv:
        i = argv.index("--refine")
        refine = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if "--rc" in argv:
        i = argv.index("--rc")
        RC = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if "--np" in argv:
        i = argv.index("--np")
        NP = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    argv = [a for a in argv if a != "--no-refine"]
    for flag in ("--k", "--c"):
        if flag in argv:
            i = argv.index(flag)
            if flag == "--k":
                k = int(argv[i + 1])
            else:
                c_mult = float(argv[i + 1])
            argv = argv[:i] + argv[i + 2:]
    cells = [(int(r), int(c), v) for r, c, v in (a.split("x") for a in argv)] or CELLS
    print(torch.cuda.get_device_name())
    for rows, cols, valid in cells:
        cell(rows, cols, valid, k, c_mult, refine)


if __name__ == "__main__":
    main(sys.argv[1:])
