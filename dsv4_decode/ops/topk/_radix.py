"""Radix-select kernel of ``decode_topk_blocks`` (private). Design: docs/kernels/topk.md.

Block mode ranks at most 2**20 / block elements (131,072 blocks of 8), so an exact radix
select on the 17-bit ``key1`` is cheap enough to need no candidate buffer, no fallback and no
sampling. A row's elements are cut into chunks of ``CE``; program (row, q) of P a row owns
chunks q, q + P, ... (P = all the row's chunks where the grid allows), and only the row's
*active* chunks (those starting before its length) do any work. All rows at once, every
length read on the device, three phases:

1. key1 of the chunk; the histogram of ``key1 >> 8`` (512 bins: the pinned key 65,537 lands
   in bin 256) added to the row's ``hist1`` with integer atomics.
2. every program reads ``hist1`` and finds bin B holding the K-th largest key1 (no single
   program decides for the others); the 256-bin histogram of the low byte of its keys in bin
   B, added to ``hist2`` and stored per chunk as suffix counts ``csuf[c, l] = #{key1 >= B * 256
   + l}`` (``cgt[c] = #{key1 >> 8 > B}``).
3. every program reads ``hist2``, finds tau = B * 256 + L (the K-th largest key1) and the ties
   at tau to keep, and gathers two suffix counts per earlier chunk of its row for its output
   offset and the ties before it (ties go to the lower index). It writes its keys > tau and its
   share of the ties at its offset, ascending; program 0 of each row pads with -1.

One launch (``PHASE = 0``) whenever every program of the grid can be resident at once (P is
cut to fit): the phases are separated by a barrier among the row's working programs (``bar``:
one int64 word a row, arrival count and generation), and the first chunk's keys stay in
registers. A single row runs chunks of half the size (``config.RADIX_COLS``).
Under the interpreter (which runs programs one after another, so nobody could wait for
another), on the CPU, or with more rows than the GPU holds programs, three launches
(``PHASE = 1, 2, 3``) re-read the chunks each phase (from L2) and pass B through ``meta``.
The histograms are re-zeroed after their last reader: ``hist2`` by program 0 at the
start of phase 1 (the previous call's phase 3 is over), ``hist1`` by program 0 after phase 2.
Fewer than K candidates: no bin reaches K, so B = 0 and L = 0, tau = 0 and every candidate
(key1 > 0) is written. Integer atomics make the histograms order-independent: every call and
graph replay writes bitwise the same output.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from dsv4_decode.utils.device import pdl_capable

from ._words import (
    NEG_INF_KEY1,
    PIN_KEY1,
    _key1,
    _mask_words,
    _pdl_enter,
    _row_length,
    _wmax,
    _word_key1,
)

H1 = tl.constexpr(512)  # bins of key1 >> 8 (0..256)
H2 = tl.constexpr(256)  # bins of the low byte
# meta slots per row (three-launch form: phase 2's program 0 -> phase 3): B, count above B
M_BIN, M_ABOVE = (tl.constexpr(i) for i in range(2))
META = tl.constexpr(8)
NUM_WARPS = 4
PDL_ROWS = 6  # rows up to which the select is a programmatic dependent launch (``launch``)


@triton.jit
def _chunk_keys(x_ptr, lengths_ptr, row, c, stride_x, cols, BLOCK: tl.constexpr,
                CE: tl.constexpr, TWIN: tl.constexpr, EAGER: tl.constexpr = False):
    """key1 of the blocks ``e`` of chunk c ([CE]): the largest key1 of a block's columns inside
    the length, 0 for a block with none or whose maximum is -inf (spec §5.4: only blocks above
    -inf); the block holding the row's last column pinned above everything (``PIN_KEY1``).
    The columns load as words of two bf16 and reduce by packed maxima (``_words._wmax``),
    so a block of 8 costs one key transform, not eight. ``EAGER``: the loads cover the chunk up
    to the row's width, not its length, so they need not wait for the length's load."""
    length, len_e = _row_length(lengths_ptr, row, cols, BLOCK)
    # the API checks the row stride is a multiple of 8 elements: 16-byte loads whatever the
    # stride's own divisibility (stated on the product: on the stride alone it does not carry)
    x_row = x_ptr + tl.multiple_of(row.to(tl.int64) * stride_x, 8)
    e = c * CE + tl.arange(0, CE)
    w = e[:, None] * (BLOCK // 2) + tl.arange(0, BLOCK // 2)[None, :]  # [CE, BLOCK / 2] words
    # masked per 8 columns (16 B), so the loads vectorize; reading up to 7 columns past the
    # length stays inside the row (the API checks the row stride and the storage for it)
    u = tl.load(x_row.to(tl.pointer_type(tl.int32)) + w,
                mask=(w // 4) * 8 < (cols if EAGER else length), other=0)
    u = _mask_words(w, u, length)
    if BLOCK == 2:  # one word a block: its halves' keys (the packed form spilled registers)
        u = tl.reshape(u, [CE])
        key1 = tl.maximum(_key1(u & 0xFFFF), _key1((u >> 16) & 0xFFFF))
    else:
        key1 = _word_key1(_wmax(u, 1, TWIN), TWIN)
    key1 = tl.where(key1 > NEG_INF_KEY1, key1, 0)
    key1 = tl.where((e == (length - 1) // BLOCK) & (length > 0), PIN_KEY1, key1)
    return key1, e


@triton.jit
def _largest_bin(g, base, K, NB: tl.constexpr):
    """The largest bin b with base + #{values in bins >= b} >= K (0 when none reaches K), and
    base + the count above it. ``g``: the [NB] histogram. (Session 30 tried one suffix scan
    and one packed maximum in place of these four reductions: +0.2 µs at one row, run 10.)"""
    b = tl.arange(0, NB)
    at_least = base + tl.sum(g, axis=0) - tl.cumsum(g, axis=0) + g
    bsel = tl.max(tl.where(at_least >= K, b, 0), axis=0)
    return bsel, base + tl.sum(tl.where(b > bsel, g, 0), axis=0)


@triton.jit
def _load_acquire(ptr):
    """One gpu-scope acquire load of an int64 (a plain load that orders what follows)."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b64 $0, [$1];", "=l,l", [ptr],
                                     dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _row_barrier(bar_ptr, row, n_arrive):
    """Wait until the row's n_arrive working programs have all arrived. ``bar`` int64
    [rows, 16] (a 128-byte line a row): word 0 holds the arrival count (low 32 bits, 0 between
    barriers) and a generation (high bits, only grows). The last to arrive clears the count
    and bumps the generation in ONE atomic; the others poll with acquire loads. Every thread's
    atomics and stores before it are visible after it (CTA barrier, then acq_rel / release
    gpu-scope atomics on one side, acquire loads on the other)."""
    tl.debug_barrier()
    w_ptr = bar_ptr + row * 16
    old = tl.atomic_add(w_ptr, 1, sem="acq_rel", scope="gpu")
    if (old & 0xFFFFFFFF) == n_arrive - 1:
        one_gen = tl.full([], 1 << 32, tl.int64)
        tl.atomic_add(w_ptr, one_gen - n_arrive, sem="release", scope="gpu")
    else:
        gen = old >> 32
        while (_load_acquire(w_ptr) >> 32) == gen:
            pass
    tl.debug_barrier()


@triton.jit
def _hist_high(key1, h1_row):
    h = tl.histogram(key1 >> 8, H1, mask=key1 > 0)
    tl.atomic_add(h1_row, h, mask=h > 0, sem="relaxed")


@triton.jit
def _hist_low(key1, bsel, c, h2_row, csuf_row, cgt_row):
    """Phase 2 of chunk c: its low-byte histogram inside bin ``bsel`` and its suffix counts."""
    hi = key1 >> 8
    h = tl.histogram(key1 & 0xFF, H2, mask=(key1 > 0) & (hi == bsel))
    tl.atomic_add(h2_row, h, mask=h > 0, sem="relaxed")
    n_gt = tl.sum((hi > bsel).to(tl.int32), axis=0)
    suf = n_gt + tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h  # #{key1 >= bsel * 256 + l}
    tl.store(csuf_row + c * H2 + tl.arange(0, H2), suf)
    tl.store(cgt_row + c, n_gt)


@triton.jit
def _write(key1, e, c, tau, lsel, ties, csuf_row, cgt_row, o_row, NCH: tl.constexpr):
    """Phase 3 of chunk c: offset and ties before it from the earlier chunks' suffix counts,
    then its keys > tau and its share of the ties at tau, ascending."""
    p = tl.arange(0, NCH)
    before = p < c
    ge = tl.load(csuf_row + p * H2 + lsel, mask=before, other=0, cache_modifier=".cg")
    top = lsel == H2 - 1  # the count above tau is then the count above the bin
    gt = tl.where(top, tl.load(cgt_row + p, mask=before, other=0, cache_modifier=".cg"),
                  tl.load(csuf_row + p * H2 + lsel + 1, mask=before & (lsel < H2 - 1), other=0,
                          cache_modifier=".cg"))
    eq = ge - gt
    kept = gt + tl.minimum(tl.maximum(ties - (tl.cumsum(eq, axis=0) - eq), 0), eq)
    tie0 = tl.sum(eq, axis=0)
    is_eq = ((key1 == tau) & (key1 > 0)).to(tl.int32)
    keep = (key1 > tau) | ((is_eq == 1) & (tie0 + tl.cumsum(is_eq, axis=0) - is_eq < ties))
    ki = keep.to(tl.int32)
    tl.store(o_row + tl.sum(kept, axis=0) + tl.cumsum(ki, axis=0) - ki, e, mask=keep)


@triton.jit
def _radix_kernel(x_ptr, lengths_ptr, hist1_ptr, hist2_ptr, meta_ptr, csuf_ptr, cgt_ptr, bar_ptr,
                  out_ptr, stride_x, stride_o, cols, K, NCH: tl.constexpr, BLOCK: tl.constexpr,
                  CE: tl.constexpr, KP: tl.constexpr, PHASE: tl.constexpr, TWIN: tl.constexpr,
                  PDL: tl.constexpr):
    if PDL:  # launched as a programmatic dependent: wait for the kernel before, then let the
        _pdl_enter()  # next launch (this grid's CTAs have all started: none is kept out)
    _radix_row(x_ptr, lengths_ptr, hist1_ptr, hist2_ptr, meta_ptr, csuf_ptr, cgt_ptr, bar_ptr,
               out_ptr, stride_x, stride_o, cols, K, tl.program_id(0), tl.program_id(1),
               tl.num_programs(1), NCH, BLOCK, CE, KP, PHASE, TWIN)


@triton.jit
def _radix_row(x_ptr, lengths_ptr, hist1_ptr, hist2_ptr, meta_ptr, csuf_ptr, cgt_ptr, bar_ptr,
               out_ptr, stride_x, stride_o, cols, K, row, q, P, NCH: tl.constexpr,
               BLOCK: tl.constexpr, CE: tl.constexpr, KP: tl.constexpr, PHASE: tl.constexpr,
               TWIN: tl.constexpr):
    """Program q of the P working on ``row`` (``_cluster`` runs it too, for its long rows).
    It owns chunks q, q + P, q + 2P, ... of the row: the first one's keys stay in registers
    through the phases, later ones are re-read (L2)."""
    _, len_e = _row_length(lengths_ptr, row, cols, BLOCK)
    n_act = (len_e + CE - 1) // CE
    m_row = meta_ptr + row * META
    h1_row = hist1_ptr + row * H1 + tl.arange(0, H1)
    h2_row = hist2_ptr + row * H2 + tl.arange(0, H2)
    csuf_row = csuf_ptr + row.to(tl.int64) * (NCH * H2)
    cgt_row = cgt_ptr + row * NCH
    o_row = out_ptr + row.to(tl.int64) * stride_o
    if PHASE <= 1:
        if q == 0:  # the previous call's phase 3 read it last
            tl.store(h2_row, tl.zeros([H2], tl.int32))
    if q < n_act:
        key1, e = _chunk_keys(x_ptr, lengths_ptr, row, q, stride_x, cols, BLOCK, CE, TWIN)
        if PHASE <= 1:
            _hist_high(key1, h1_row)
            c = q + P
            while c < n_act:
                _hist_high(_chunk_keys(x_ptr, lengths_ptr, row, c, stride_x, cols, BLOCK, CE,
                                       TWIN)[0], h1_row)
                c += P
        if PHASE == 0:
            _row_barrier(bar_ptr, row, tl.minimum(n_act, P))
        if (PHASE == 0) | (PHASE == 2):
            bsel, above = _largest_bin(tl.load(h1_row, cache_modifier=".cg"), 0, K, H1)
            if PHASE == 2:
                if q == 0:
                    tl.store(m_row + M_BIN, bsel)
                    tl.store(m_row + M_ABOVE, above)
            _hist_low(key1, bsel, q, h2_row, csuf_row, cgt_row)
            c = q + P
            while c < n_act:
                _hist_low(_chunk_keys(x_ptr, lengths_ptr, row, c, stride_x, cols, BLOCK, CE,
                                      TWIN)[0], bsel, c, h2_row, csuf_row, cgt_row)
                c += P
        if PHASE == 0:
            _row_barrier(bar_ptr, row, tl.minimum(n_act, P))
            if q == 0:  # every program read it before arriving
                tl.store(h1_row, tl.zeros([H1], tl.int32))
        if PHASE == 3:
            bsel = tl.load(m_row + M_BIN)
            above = tl.load(m_row + M_ABOVE)
        if (PHASE == 0) | (PHASE == 3):
            g2 = tl.load(h2_row, cache_modifier=".cg")
            lsel, greater = _largest_bin(g2, above, K, H2)
            tau = bsel * 256 + lsel
            ties = K - greater  # ties at tau to keep, lowest index first (more than exist: all)
            _write(key1, e, q, tau, lsel, ties, csuf_row, cgt_row, o_row, NCH)
            c = q + P
            while c < n_act:
                k2, e2 = _chunk_keys(x_ptr, lengths_ptr, row, c, stride_x, cols, BLOCK, CE,
                                     TWIN)
                _write(k2, e2, c, tau, lsel, ties, csuf_row, cgt_row, o_row, NCH)
                c += P
            if q == 0:
                n_eq = tl.sum(tl.where(tl.arange(0, H2) == lsel, g2, 0), axis=0)
                i = tl.arange(0, KP)
                tl.store(o_row + i, -1, mask=(i >= greater + tl.minimum(n_eq, ties)) & (i < K))
    if PHASE == 3:
        if q == 0:  # phase 2, its last reader, is over
            tl.store(h1_row, tl.zeros([H1], tl.int32))
    if (PHASE == 0) | (PHASE == 3):
        if (q == 0) & (n_act == 0):  # no candidate in the row
            i = tl.arange(0, KP)
            tl.store(o_row + i, -1, mask=i < K)


_CAPACITY = {}  # compiled variant of the one-launch kernel -> its CTAs resident at once


def _resident_ctas(kernel, device) -> int:
    """How many CTAs of a compiled kernel the GPU holds at once (registers, threads, shared
    memory, the 32-CTA limit per SM, times the SMs)."""
    kernel._init_handles()
    props = torch.cuda.get_device_properties(device)
    threads = kernel.metadata.num_warps * 32
    regs = -(-max(kernel.n_regs, 1) // 8) * 8 * threads
    smem = kernel.metadata.shared + 1024  # the driver reserves 1 KB a CTA
    per_sm = min(props.regs_per_multiprocessor // regs,
                 props.max_threads_per_multi_processor // threads,
                 props.shared_memory_per_multiprocessor // smem, 32)
    return per_sm * props.multi_processor_count


def programs_per_row(args, rows, n_chunks, block, ce, k, device, pdl=False) -> int:
    """Programs a row for the one-launch form: all its chunks, or as many as keep the whole
    grid resident at once (so no barrier waits on a program that never starts); 0 = use the
    three launches (interpreter, CPU, or more rows than the GPU holds programs)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return 0
    # Triton compiles one variant per multiple-of-16 pattern of the integer arguments
    key = (device, block, ce, k, pdl) + tuple(a % 16 == 0 for a in args if isinstance(a, int))
    if key not in _CAPACITY:
        compiled = _radix_kernel.warmup(*args, grid=(1, 1), **_consts(block, ce, k, 0, pdl))
        _CAPACITY[key] = _resident_ctas(compiled, device)
    return min(n_chunks, _CAPACITY[key] // rows)


def _consts(block, ce, k, phase, pdl=False, twin=False) -> dict:
    return dict(BLOCK=block, CE=ce, KP=triton.next_power_of_2(k), PHASE=phase, TWIN=twin,
                PDL=pdl, num_warps=NUM_WARPS, **({"launch_pdl": True} if pdl else {}))


def launch(x16, lengths, out, ws, cfg, k: int, programs: int | None = None,
           pdl: bool = True) -> None:
    """Run the select: one launch where the grid fits the GPU at once, else three.
    ``x16``: the bf16 logits viewed as int16 [rows, cols]. ``programs``: at most this many
    programs a row (the tests pass fewer than the chunks to run the chunk loops). ``pdl``
    (default; sm_90+, up to ``PDL_ROWS`` rows): programmatic dependent launches
    (``_words._pdl_enter``); ``pdl=False``: plain ones, for the benchmark's comparison."""
    rows, cols = x16.shape
    ce = cfg.radix_chunk(rows)
    n_chunks = triton.cdiv(triton.cdiv(cols, cfg.block), ce)
    args = (x16, lengths, ws.hist1, ws.hist2, ws.meta, ws.csuf, ws.cgt, ws.bar, out,
            x16.stride(0), out.stride(0), cols, k, ws.cgt.shape[1])
    # session 10, same process (scripts/pdl_ab.py): -0.28 / -0.48 us at 1 row x 512K / 1M,
    # -0.27 / -0.09 at 6 rows, -0.14 / +1.42 at 12 (my guess, not measured: the dependent
    # grid's CTAs take the slots the previous call's free one by one, not the launch's order)
    pdl = pdl and rows <= PDL_ROWS and pdl_capable(x16.device)
    fused = programs_per_row(args, rows, n_chunks, cfg.block, ce, k, x16.device, pdl)
    p = min(fused or n_chunks, programs or n_chunks)
    for phase in (0,) if fused else (1, 2, 3):
        _radix_kernel[(rows, p)](*args, **_consts(cfg.block, ce, k, phase, pdl,
                                                  not x16.is_cuda))
