"""Probe (no GPU): whether Triton 3.6 keeps a reduction inside each warp, for the MoE router's
top-k passes (docs/kernels/moe.md, sessions 38-39). Compiles for sm_90a and prints, per
kernel, the static SASS counts (instructions, ``BAR``, ``SHFL``) and the blocked layouts of
its TTGIR.

    PYTHONPATH=. python3 scripts/triton_warp_reduce_probe.py

Both kernels take 512 keys at 8 warps and run three top-two passes (the tree's
``_top2_combine``), each pass dropping its two picks, as ``moe._triton._select`` does:
- ``cta``: one ``[512]`` tile, the tree's form (each pass one CTA-wide reduction);
- ``warps``: two ``[8, 32]`` tiles, one element a thread each, reduced along axis 1. Triton's
  default layout for ``[8, 32]`` at 8 warps puts the warps on axis 0 (``warpsPerCTA = [8,
  1]``), so each warp reduces its own 64 keys by shuffles: the warps' top six, not the row's.
  A select built on it needs one exchange of those 48 candidates afterwards.
"""

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsv4_decode.ops.moe._triton import _top2_combine
from dsv4_decode.utils.sm90 import sass

NONE = tl.constexpr(-(2**63))
PICKED = tl.constexpr(-(2**63 - 1))


@triton.jit
def cta(key_ptr, sig_ptr, out_ptr):
    offs = tl.arange(0, 512)
    key = tl.load(key_ptr + offs)
    sig = tl.load(sig_ptr + offs)
    none = tl.full((512,), NONE, tl.int64)
    acc = tl.zeros((), tl.int64)
    for _ in tl.static_range(3):
        k1, s1, k2, s2 = tl.reduce((key, sig, none, tl.zeros_like(sig)), 0, _top2_combine)
        key = tl.where((key == k1) | (key == k2), PICKED, key)
        acc += k1 + k2 + (s1 + s2).to(tl.int64)
    tl.store(out_ptr, acc)


@triton.jit
def warps(key_ptr, sig_ptr, out_ptr):
    offs = tl.arange(0, 8)[:, None] * 64 + tl.arange(0, 32)[None, :]
    a, b = tl.load(key_ptr + offs), tl.load(key_ptr + offs + 32)
    sa, sb = tl.load(sig_ptr + offs), tl.load(sig_ptr + offs + 32)
    none = tl.full((8, 32), NONE, tl.int64)
    acc = tl.zeros((8,), tl.int64)
    for _ in tl.static_range(3):
        # a thread's two keys as one top-two list, then the warp's
        k1, s1, k2, s2 = _top2_combine(a, sa, none, tl.zeros_like(sa), b, sb, none,
                                       tl.zeros_like(sb))
        k1, s1, k2, s2 = tl.reduce((k1, s1, k2, s2), 1, _top2_combine)
        a = tl.where((a == k1[:, None]) | (a == k2[:, None]), PICKED, a)
        b = tl.where((b == k1[:, None]) | (b == k2[:, None]), PICKED, b)
        acc += k1 + k2 + (s1 + s2).to(tl.int64)
    tl.store(out_ptr + tl.arange(0, 8), acc)


def report(fn) -> str:
    sig = {"key_ptr": "*i64", "sig_ptr": "*fp32", "out_ptr": "*i64"}
    k = triton.compile(ASTSource(fn, sig, {}), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 8})
    text = sass(k)
    ins = [w for w in text.splitlines() if w.strip().startswith("/*") and ";" in w]
    layouts = [w.split("=", 1)[1].strip() for w in k.asm["ttgir"].splitlines()
               if w.startswith("#blocked")]
    return (f"{fn.__name__}: {len(ins)} instructions, {sum('BAR' in w for w in ins)} BAR, "
            f"{sum('SHFL' in w for w in ins)} SHFL; layouts {layouts}")


if __name__ == "__main__":
    for fn in (cta, warps):
        print(report(fn))
