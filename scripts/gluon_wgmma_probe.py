"""Probe: the MoE's MXFP4 weight stream on wgmma, the way sparse_attn's Hopper kernel reads its
keys (session 11): the packed words staged by ``cp.async``, decoded into a bf16 tile in shared
memory, and the tensor cores read the tile (A = 64 weight rows a warpgroup, B = up to 16 token
rows). The Triton step (``_mx4_dot``) instead sends every decoded tile through ``ldmatrix`` into
``mma.sync``; it streams 2.48-2.51 TB/s here (session 11, ``gluon_fragment_probe.py``), and its
loop issues about 3.9 instructions a weight a lane. This kernel's decode is the MoE's own
(``api.repack_mxfp4`` words: one AND gives two bf16 of consecutive k, ``mul.rn.bf16x2`` applies
the ue8m0 scale), about 1.75 instructions a value, plus one 16-byte shared store per 8 values.

``_mxfp4_wgmma``: one warpgroup a CTA, 64 weight rows, K steps of ``BK`` inputs, ``STAGES``
``cp.async`` stages of (words, scales, x tile), the decoded tile stored as int32 pairs through
a reinterpreted view of the bf16 NVMMA tile, one synchronous wgmma a step; several CTAs a SM
overlap one another's phases.

Offline (no GPU) it prints registers, shared memory and SASS counts (``cuobjdump``). Session 11
(sm_90a): at 128-deep steps and 3 stages, 48 registers and 41 KB of shared memory (5 CTAs, 20
warps a SM, against the Triton step's 94 registers and about 10 warps a SM), no spills; the
loop is 245 instructions a warp a step, 980 warp instructions per 8,192 weights: the same as
the Triton step's 988. So the decode plus the copies cost what the Triton step's decode plus
``ldmatrix`` / ``mma.sync`` cost; what could differ is latency hiding (twice the warps, no
``ldmatrix`` round trip before each MMA). With a GPU (``--gpu``) it checks the product against
torch (which also checks that the int32 view of the bf16 NVMMA tile maps bytes as assumed) and
times it beside the Triton step, alternated in one process, streaming ~141 MB of weights (48
experts of W1|W3 at TP = 4) at 16 token rows, as ``gluon_fragment_probe.py``. Session 12, run
1 (H200): exact against torch (max relative error 3.3e-6 in all three configs), 1.02 / 1.14 /
0.96 TB/s at (128, 3) / (128, 4) / (256, 3) against the Triton step's 2.52.

    PYTHONPATH=. python3 scripts/gluon_wgmma_probe.py [--gpu]
"""

import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

sys.path.insert(0, os.path.dirname(__file__))
from gluon_fragment_probe import (  # noqa: E402
    K_IN,
    STREAM_ROWS,
    TRITON,
    _triton_stream,
    check_inputs,
    report,
    stream_inputs,
    time_alternated,
)

from dsv4_decode.ops.moe.api import repack_mxfp4  # noqa: E402

CONFIGS = [(128, 3), (128, 4), (256, 3)]  # (BK, STAGES)


@gluon.jit
def _bf16x2_mul(a, b):
    """Two bf16 in each int32 of ``a`` times those of ``b`` (``mul.rn.bf16x2``)."""
    return gl.inline_asm_elementwise("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", [a, b],
                                     dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _issue(w_ptr, s_ptr, x_ptr, w_st, s_st, x_st, n0, kk, K: gl.constexpr, BK: gl.constexpr):
    """cp.async of step ``kk``'s words [64, BK/8], scales [64, BK/32] and x [16, BK]."""
    wl: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (BK // 32), BK // 32], [4, 1], [1, 0])
    sl: gl.constexpr = gl.BlockedLayout([1, BK // 32], [32, 1], [4, 1], [1, 0])
    xl: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BK // 64), BK // 64], [4, 1], [1, 0])
    r = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, wl))
    c = gl.arange(0, BK // 8, layout=gl.SliceLayout(0, wl))
    async_copy.async_copy_global_to_shared(
        w_st, w_ptr + gl.expand_dims(r.to(gl.int64) * (K // 8) + kk // 8, 1) + gl.expand_dims(c, 0))
    r = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, sl))
    c = gl.arange(0, BK // 32, layout=gl.SliceLayout(0, sl))
    async_copy.async_copy_global_to_shared(
        s_st, s_ptr + gl.expand_dims(r.to(gl.int64) * (K // 32) + kk // 32, 1)
        + gl.expand_dims(c, 0))
    t = gl.arange(0, 16, layout=gl.SliceLayout(1, xl))
    c = gl.arange(0, BK, layout=gl.SliceLayout(0, xl))
    async_copy.async_copy_global_to_shared(
        x_st, x_ptr + gl.expand_dims(t * K + kk, 1) + gl.expand_dims(c, 0))
    async_copy.commit_group()


@gluon.jit
def _decode(w_t, w_st, s_st, BK: gl.constexpr):
    """One stage's words and scales -> the bf16 tile ``w_t`` [64, BK] (written as int32 pairs:
    ``repack_mxfp4``'s word j decodes to the pairs of k = 8j + 0-1, 2-3, 4-5, 6-7 as
    P0 = q & M, P2 = (q << 6) & M, P1 = (q << 3) & M, P3 = the sign-spread one)."""
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [32 // (BK // 32), BK // 32, 1], [4, 1, 1],
                                        [2, 1, 0])
    q = w_st.reshape([64, BK // 32, 4]).load(L3)
    s = s_st.load(gl.SliceLayout(2, L3)).to(gl.int32)
    b = (s + 63) << 7  # bf16 bits of 2^(s-64)
    sc = gl.expand_dims(b | (b << 16), 2)
    m = -2118090304  # 0x81C081C0
    p0 = _bf16x2_mul(q & m, sc)
    p1 = _bf16x2_mul((q << 3) & m, sc)
    p2 = _bf16x2_mul((q << 6) & m, sc)
    p3 = _bf16x2_mul(((q >> 4) & 0x00C000C0) | ((q >> 5) & 0x01000100)
                     | ((q << 1) & -2147450880), sc)  # 0x80008000
    pairs = gl.join(gl.join(p0, p2), gl.join(p1, p3))  # [64, BK/32, 4, 2, 2]: k pairs in order
    w_t.store(pairs.permute(0, 1, 2, 4, 3).reshape([64, BK // 2]))


@gluon.jit
def _mxfp4_wgmma(x_ptr, w_ptr, s_ptr, o_ptr, N, K: gl.constexpr, BK: gl.constexpr,
                 STAGES: gl.constexpr):
    """``out[t, n] = sum_k x[t, k] W[n, k]`` for 16 rows of x (bf16 ``[16, K]``) and this CTA's
    64 weight rows (``repack_mxfp4`` words ``[N, K/8]``, ue8m0 ``[N, K/32]``), fp32
    ``[16, N]``."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 16, 16])
    t_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                             rank=2)
    t32_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32,
                                               rank=2)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    n0 = gl.program_id(0) * 64
    w_st = gl.allocate_shared_memory(gl.int32, [STAGES, 64, BK // 8], flat)
    s_st = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, BK // 32], flat)
    x_st = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 16, BK], t_l)
    w_t = gl.allocate_shared_memory(gl.bfloat16, [64, BK], t_l)
    for p in gl.static_range(STAGES - 1):
        _issue(w_ptr, s_ptr, x_ptr, w_st.index(p), s_st.index(p), x_st.index(p), n0, p * BK,
               K, BK)
    acc = gl.zeros([64, 16], gl.float32, mma)
    for i in range(K // BK):
        st = i % STAGES
        async_copy.wait_group(STAGES - 2)  # step i's copies (this thread's) have landed
        gl.thread_barrier()  # everyone's; the previous wgmma is done with w_t and its stage
        _decode(w_t._reinterpret(gl.int32, [64, BK // 2], t32_l), w_st.index(st),
                s_st.index(st), BK)
        fence_async_shared()
        gl.thread_barrier()
        nx = (i + STAGES - 1) % STAGES  # the stage of step i - 1: free again
        if i + STAGES - 1 < K // BK:
            _issue(w_ptr, s_ptr, x_ptr, w_st.index(nx), s_st.index(nx), x_st.index(nx), n0,
                   (i + STAGES - 1) * BK, K, BK)
        else:
            async_copy.commit_group()  # an empty group keeps wait_group's count
        acc = warpgroup_mma(w_t, x_st.index(st).permute((1, 0)), acc)
    async_copy.wait_group(0)
    rows = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    toks = gl.arange(0, 16, layout=gl.SliceLayout(0, mma))
    gl.store(o_ptr + gl.expand_dims(toks * N, 0) + gl.expand_dims(rows, 1),
             acc * 9.223372036854775808e18)  # 2**63


def run_gpu() -> None:
    packed, scales, x, want = check_inputs()
    k, n = K_IN, STREAM_ROWS
    xs, scs, out = x.cuda(), scales.cuda(), torch.empty(16, 256, device="cuda")
    words = repack_mxfp4(packed).cuda()
    for bk, stages in CONFIGS:
        out.fill_(float("nan"))
        _mxfp4_wgmma[(256 // 64,)](xs, words, scs, out, 256, K=k, BK=bk, STAGES=stages,
                                   num_warps=4)
        err = (out.cpu() - want).abs().max().item() / want.abs().max().item()
        print(f"wgmma BK={bk} stages={stages} against torch: max relative error {err:.2e}",
              flush=True)
    words, sc, out, nbytes = stream_inputs()
    runs = {f"wgmma BK={bk} stages={stages}": (
        lambda bk=bk, stages=stages: _mxfp4_wgmma[(n // 64,)](
            xs, words, sc, out, n, K=k, BK=bk, STAGES=stages, num_warps=4))
        for bk, stages in CONFIGS}
    runs["triton"] = lambda: _triton_stream[(n // TRITON["BN"],)](xs, words, sc, out, n, K=k,
                                                                 **TRITON)
    time_alternated(runs, nbytes)


if __name__ == "__main__":
    sig = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "o_ptr": "*fp32", "N": "i32",
           "K": "constexpr", "BK": "constexpr", "STAGES": "constexpr"}
    for bk, stages in CONFIGS:
        report(f"mxfp4 wgmma (Gluon, 64 rows, {bk}-deep, {stages} stages)", _mxfp4_wgmma, sig,
               {"K": 5120, "BK": bk, "STAGES": stages})
    if "--gpu" in sys.argv:
        run_gpu()
