"""Offline probe (no GPU): can a weight-streaming kernel on Hopper feed mma.sync from registers,
with no shared-memory round trip between the global load and the MMA? The MoE's Triton
kernels cannot choose the register layout of a load, so every decoded weight tile goes through
shared memory (STS, barrier, LDSM). Gluon (``triton.experimental.gluon``, Triton 3.6) can.

The probe compiles, for sm_90a, a [16, 64] x [64, 64] bf16 product per 64-deep K step whose B
operand is read from global memory as 32-bit words in an explicit linear layout, decoded in
registers (``join`` / ``permute`` / ``reshape``) and handed to ``mma_v2`` through
``convert_layout(..., assert_trivial=True)``, which compiles only if the conversion moves no
data. Two word formats:

- ``bf16``: two bf16 of consecutive k a word (the pair each thread's m16n8k16 fragment holds):
  the B-operand layout without its pair bit.
- ``fp4``: eight 4-bit codes a word covering three of the fragment's k bits (k + 1, + 8, + 16;
  the word index carries k + 2, + 4, + 32), as a load-time permutation of the nibbles would
  store them. The decode is a stand-in (shifts and masks to bf16 bits, no scales), not e2m1.

It prints the shared memory each kernel allocates and its SASS counts (``cuobjdump``). Session
10: both 0 bytes, 8 HMMA, no LDS / STS / LDSM / BAR (bf16: 32 LDG, 104 instructions; fp4: 20
LDG, 152 instructions). The activation operand is loaded the same way (its own dot-operand
layout, straight from global memory).

    PYTHONPATH=. python3 scripts/gluon_fragment_probe.py
"""

import os
import re
import subprocess
import tempfile
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.ampere import mma_v2


@gluon.jit
def _probe(x_ptr, w_ptr, o_ptr, K: gl.constexpr, N: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4],
                                                  instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # B's layout for [64, 64] (printed by a failing assert_trivial): registers k+1, k+8, k+16,
    # k+32, n+32; lanes k+2, k+4, n+1, n+2, n+4; warps n+8, n+16. The words [32, 64] drop the
    # first register bit (the pair) and halve k.
    w_l: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[4, 0], [8, 0], [16, 0], [0, 32]],
        lane_bases=[[1, 0], [2, 0], [0, 1], [0, 2], [0, 4]],
        warp_bases=[[0, 8], [0, 16]], block_bases=[], shape=[32, 64])
    acc = gl.zeros([16, N], gl.float32, layout=mma)
    offs_m = gl.arange(0, 16, layout=gl.SliceLayout(1, a_l))
    offs_n = gl.arange(0, N, layout=gl.SliceLayout(0, w_l))
    for kk in range(0, K, 64):
        offs_ka = kk + gl.arange(0, 64, layout=gl.SliceLayout(0, a_l))
        a = gl.load(x_ptr + offs_m[:, None] * K + offs_ka[None, :])
        offs_kw = kk // 2 + gl.arange(0, 32, layout=gl.SliceLayout(1, w_l))
        w = gl.load(w_ptr + offs_n[None, :] * (K // 2) + offs_kw[:, None])  # W [N, K] as words
        lo = (w & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True)
        hi = (w >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True)
        b = gl.join(lo, hi).permute(0, 2, 1).reshape([64, N])
        acc = mma_v2(a, gl.convert_layout(b, b_l, assert_trivial=True), acc)
    om = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    on = gl.arange(0, N, layout=gl.SliceLayout(0, mma))
    gl.store(o_ptr + om[:, None] * N + on[None, :], acc)


@gluon.jit
def _pair(w, s: gl.constexpr):
    """The codes at bits s and s + 16 of each word as two bf16 (a stand-in decode)."""
    q = ((w >> s) & 0x00070007) << 7
    return ((q & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True),
            (q >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True))


@gluon.jit
def _probe_fp4(x_ptr, w_ptr, o_ptr, K: gl.constexpr, N: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4],
                                                  instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # words [8, 64]: word k' holds k = base + {0, 1, 8, 9, 16, 17, 24, 25}, its bits giving
    # k + 2, + 4 (lanes) and + 32 (a register)
    w_l: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[4, 0], [0, 32]],
        lane_bases=[[1, 0], [2, 0], [0, 1], [0, 2], [0, 4]],
        warp_bases=[[0, 8], [0, 16]], block_bases=[], shape=[8, 64])
    acc = gl.zeros([16, N], gl.float32, layout=mma)
    offs_m = gl.arange(0, 16, layout=gl.SliceLayout(1, a_l))
    offs_n = gl.arange(0, N, layout=gl.SliceLayout(0, w_l))
    for kk in range(0, K, 64):
        offs_ka = kk + gl.arange(0, 64, layout=gl.SliceLayout(0, a_l))
        a = gl.load(x_ptr + offs_m[:, None] * K + offs_ka[None, :])
        offs_kw = kk // 8 + gl.arange(0, 8, layout=gl.SliceLayout(1, w_l))
        w = gl.load(w_ptr + offs_n[None, :] * (K // 8) + offs_kw[:, None])
        l00, h00 = _pair(w, 0)  # (k + 16, k + 8) = (0, 0)
        l01, h01 = _pair(w, 4)  # (0, 1)
        l10, h10 = _pair(w, 8)  # (1, 0)
        l11, h11 = _pair(w, 12)  # (1, 1)
        # each join adds the next-fastest register bit: k + 1, then k + 8, then k + 16
        v = gl.join(gl.join(gl.join(l00, h00), gl.join(l01, h01)),
                    gl.join(gl.join(l10, h10), gl.join(l11, h11)))  # [8, N, 2, 2, 2]
        v = v.reshape([2, 2, 2, N, 2, 2, 2])  # k' bits (32, 4, 2), n, (1, 8, 16)
        b = v.permute(0, 6, 5, 1, 2, 4, 3).reshape([64, N])  # k bits 32, 16, 8, 4, 2, 1
        acc = mma_v2(a, gl.convert_layout(b, b_l, assert_trivial=True), acc)
    om = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    on = gl.arange(0, N, layout=gl.SliceLayout(0, mma))
    gl.store(o_ptr + om[:, None] * N + on[None, :], acc)


def report(name, fn) -> None:
    sig = {"x_ptr": "*bf16", "w_ptr": "*i32", "o_ptr": "*fp32", "K": "constexpr",
           "N": "constexpr"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*")}
    kernel = triton.compile(GluonASTSource(fn, sig, {"K": 1024, "N": 64}, attrs),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    tools = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", path],
                              capture_output=True, text=True).stdout
    ops = Counter(re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass))
    print(f"{name}: shared memory {kernel.metadata.shared} bytes; SASS: "
          + ", ".join(f"{op} {ops.get(op, 0)}" for op in ("HMMA", "LDG", "LDS", "STS", "LDSM",
                                                          "BAR"))
          + f"; {sum(ops.values())} instructions")


if __name__ == "__main__":
    report("bf16", _probe)
    report("fp4", _probe_fp4)
