"""Hopper (sm_90) warp-specialized variant of the wgmma kernel (``config.ws``; private).

Session 12, prepared and compiled for sm_90a, not yet run on a GPU: the lean kernel's profile
had the SM idle in its barrier-separated phases (decode, then S^T, then the softmax, then PV),
with two CTAs a SM as the only overlap. Here one CTA splits the work by warps:

- the default partition, one warpgroup (4 warps): q, then per step waits for a key tile,
  ``S^T`` (wgmma, 16 heads), the online softmax, ``acc^T += K^T P^T`` (wgmma), frees the
  tile, and at the end stores the partials (``_gluon._store_partials``);
- a worker partition of 8 warps: the index -> block-table chain, the records' copies
  (``cp.async`` into two staging stages, one step ahead; window records loaded straight into
  registers) and the decode into one of two key tiles, handed over through mbarriers
  (``ready`` / ``empty``, one each a tile).

So the decode of step i + 1 runs on its own warps while the tensor cores and the softmax work on
step i. Same grid, partials and merge as ``_gluon._wgmma_attn_kernel``; the tiles, the decode
and the tile order (spans of 128 dims for NVFP4) are the lean variant's. Shared memory about
183 KB: one CTA a SM (12 warps). Registers: the kernel runs under ``maxnreg`` 168; the worker
partition gets 136, the default partition the rest (232).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma_wait,
)
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._gluon import (
    _cta_row,
    _fp4_copy,
    _fp4_dequant_spans,
    _index,
    _index_in,
    _load_q,
    _p_layout,
    _page,
    _rec,
    _scores_async,
    _softmax_pv,
    _staging,
    _store_partials,
    _tile_layout,
    _win_layout,
    _window_chunk_load,
    _window_chunk_store,
    _window_keys,
)

WORKER_WARPS = gl.constexpr(8)
WORKER_REGS = gl.constexpr(136)
MAXNREG = 168  # 12 warps: 4 x 232 + 8 x 136 registers a thread <= 65,536 / 32


@gluon.jit
def _consumer(k_t, q_s, p_s, ready, empty, idx_ptr, bt_ptr, row, slot, pos, win_ok, sel_ok,
              is_win, i0, i_hi, ring, k_sel, n_pages, max_pages, qk_scale, steps,
              WINDOW: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr):
    """The default partition: the products and the softmax of ``steps`` key tiles ->
    (m, l, acc^T). Each step's validity is loaded here, in the scores' layout."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 16, 16])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    m_i = gl.full([16], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
    l_i = gl.zeros([64, 16], gl.float32, mma)
    acc = gl.zeros([D, 16], gl.float32, mma)
    for it in range(steps):
        b = it % 2
        if is_win:
            _, valid = _window_keys(slot, pos, win_ok, i0 + it * 64, i_hi, ring, WINDOW, D,
                                    rows_l)
        else:
            j = _index_in(idx_ptr, row, i0 + it * 64, i_hi, k_sel, rows_l)
            _, valid = _rec(j, _page(bt_ptr, j, slot, sel_ok, max_pages, PAGE), n_pages, D,
                            PAGE)
        mbarrier.wait(ready.index(b), (it // 2) & 1)
        k_s = k_t.index(b)
        s = warpgroup_mma_wait(0, deps=[_scores_async(k_s, q_s, mma)])
        m_i, l_i, acc = _softmax_pv(s, k_s, p_s, valid, m_i, l_i, acc, qk_scale, mma)
        mbarrier.arrive(empty.index(b), count=1)  # the PV wgmma has read the tile
    return m_i, l_i, acc


@gluon.jit
def _producer(k_t, raw_s, rsc_s, ready, empty, win_ptr, comp_ptr, idx_ptr, bt_ptr, row, slot,
              pos, win_ok, sel_ok, is_win, i0, i_hi, ring, k_sel, n_pages, max_pages, steps,
              WINDOW: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr):
    """The worker partition: ``steps`` key tiles decoded into ``k_t`` (alternating), each
    handed over by ``ready`` once ``empty`` says the consumer is done with it."""
    if is_win:
        rows_w: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, _win_layout(gl.num_warps())))
        for it in range(steps):
            b = it % 2
            rec, valid = _window_keys(slot, pos, win_ok, i0 + it * 64, i_hi, ring, WINDOW, D,
                                      rows_w)
            c0, s0 = _window_chunk_load(win_ptr, rec, valid, 0, D)
            c1, s1 = _window_chunk_load(win_ptr, rec, valid, 1, D)
            c2, s2 = _window_chunk_load(win_ptr, rec, valid, 2, D)
            c3, s3 = _window_chunk_load(win_ptr, rec, valid, 3, D)
            mbarrier.wait(empty.index(b), ((it // 2) & 1) ^ 1)
            k_s = k_t.index(b)
            _window_chunk_store(k_s, c0, s0, 0)
            _window_chunk_store(k_s, c1, s1, 1)
            _window_chunk_store(k_s, c2, s2, 2)
            _window_chunk_store(k_s, c3, s3, 3)
            fence_async_shared()
            mbarrier.arrive(ready.index(b), count=1)
    else:
        j0 = _index(idx_ptr, row, i0, i_hi, k_sel)
        j1 = _index(idx_ptr, row, i0 + 64, i_hi, k_sel)
        rec, v0 = _rec(j0, _page(bt_ptr, j0, slot, sel_ok, max_pages, PAGE), n_pages, D, PAGE)
        _fp4_copy(comp_ptr, raw_s.index(0), rsc_s.index(0), rec, v0, D)
        for it in range(steps):
            b = it % 2
            nx = (it + 1) % 2
            j2 = _index(idx_ptr, row, i0 + (it + 2) * 64, i_hi, k_sel)
            rec, v1 = _rec(j1, _page(bt_ptr, j1, slot, sel_ok, max_pages, PAGE), n_pages, D,
                           PAGE)
            gl.thread_barrier()  # this partition's reads of stage nx (step it - 1) are done
            _fp4_copy(comp_ptr, raw_s.index(nx), rsc_s.index(nx), rec, v1, D)
            async_copy.wait_group(1)  # this thread's copies of step it have landed
            gl.thread_barrier()  # everyone's
            mbarrier.wait(empty.index(b), ((it // 2) & 1) ^ 1)
            _fp4_dequant_spans(k_t.index(b), raw_s.index(b), rsc_s.index(b), D)
            fence_async_shared()
            mbarrier.arrive(ready.index(b), count=1)
            j1 = j2
        async_copy.wait_group(0)


@gluon.jit
def _ws_attn_kernel(
    q_ptr, win_ptr, pos_ptr, slot_ptr, comp_ptr, bt_ptr, idx_ptr,
    ws_acc_ptr, ws_m_ptr, ws_l_ptr,
    n_heads, n_slots, ring, n_bt_slots, n_pages, max_pages, k_sel,
    qk_scale,  # softmax scale * log2(e)
    WINDOW: gl.constexpr, D: gl.constexpr, PAGE: gl.constexpr, W_STEPS: gl.constexpr,
    N_WSPLIT: gl.constexpr, C_STEPS: gl.constexpr, N_SPLIT: gl.constexpr,
    HAS_SEL: gl.constexpr, PDL: gl.constexpr, WAIT: gl.constexpr,
):
    """``_gluon._wgmma_attn_kernel``'s contract (same grid, partials, flags), warp-specialized
    (module docstring). Launched with 4 warps (the default partition) and ``maxnreg`` MAXNREG;
    the worker partition adds WORKER_WARPS."""
    if WAIT:
        gdc_wait()
    if PDL or WAIT:
        gdc_launch_dependents()
    pid_s, pid_h, row, pos, slot, win_ok, sel_ok = _cta_row(pos_ptr, slot_ptr, n_slots,
                                                            n_bt_slots)
    k_t = gl.allocate_shared_memory(gl.bfloat16, [2, 64, D], _tile_layout())
    q_s = gl.allocate_shared_memory(gl.bfloat16, [16, D], _tile_layout())
    p_s = gl.allocate_shared_memory(gl.bfloat16, [64, 16], _p_layout())
    raw_s = gl.allocate_shared_memory(gl.uint8, [2, 64, D // 2], _staging())
    rsc_s = gl.allocate_shared_memory(gl.uint8, [2, 64, D // 16], _staging())
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    is_win = pid_s < N_WSPLIT
    if is_win:
        i0 = pid_s * (W_STEPS * 64)
        i_hi = gl.minimum(i0 + W_STEPS * 64, WINDOW)
        steps = gl.cdiv(i_hi - i0, 64)
        scale = qk_scale
        slot_k = gl.where(win_ok, slot, 0)
    else:
        i0 = (pid_s - N_WSPLIT) * (C_STEPS * 64)
        i_hi = gl.minimum(i0 + C_STEPS * 64, k_sel)
        steps = gl.cdiv(i_hi - i0, 64) if HAS_SEL else 0
        scale = qk_scale * 256.0  # the tiles hold the keys x 2^-8
        slot_k = gl.where(sel_ok, slot, 0)
    if is_win:
        _load_q(q_ptr, q_s, row, pid_h * 16, n_heads, D, 0)
    else:  # the NVFP4 tiles' order (spans of 128 dims)
        _load_q(q_ptr, q_s, row, pid_h * 16, n_heads, D, 128)
    fence_async_shared()
    gl.thread_barrier()
    m_i, l_i, acc = gl.warp_specialize([
        (_consumer, (k_t, q_s, p_s, ready, empty, idx_ptr, bt_ptr, row, slot_k, pos, win_ok,
                     sel_ok, is_win, i0, i_hi, ring, k_sel, n_pages, max_pages, scale, steps,
                     WINDOW, D, PAGE)),
        (_producer, (k_t, raw_s, rsc_s, ready, empty, win_ptr, comp_ptr, idx_ptr, bt_ptr, row,
                     slot_k, pos, win_ok, sel_ok, is_win, i0, i_hi, ring, k_sel, n_pages,
                     max_pages, steps, WINDOW, D, PAGE)),
    ], [WORKER_WARPS], [WORKER_REGS])
    group = row * gl.num_programs(1) + pid_h
    _store_partials(ws_acc_ptr, ws_m_ptr, ws_l_ptr, m_i, l_i, acc, (group * N_SPLIT + pid_s) * 16,
                    is_win, D, 128)
