"""Compile Triton kernels for sm_90 on a machine without a GPU and read ptxas's report.

The interpreter (``TRITON_INTERPRET=1``) skips Triton's compiler: type checks across branches,
layouts, dot shapes and register allocation. A kernel can pass every CPU test and still fail to
compile on an H200. ``spill_stores`` runs the real pipeline (Triton -> PTX -> ptxas for
``sm_90a``) and returns the spill-store bytes ptxas reports; ``sass`` disassembles a compiled
kernel for the probes' instruction counts; ``run_compile_script`` runs a
script that uses it in a child process without the interpreter (the tests set it in theirs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile


def spill_stores(fn, const: dict, num_warps: int, ptr_types: dict[str, str], *,
                 default_ptr: str | None = None, scalar_types: dict[str, str] | None = None,
                 num_stages: int = 1, maxnreg: int = 0, divisible: tuple[str, ...] = ()) -> int:
    """Bytes of register spill stores of ``fn`` (a ``@triton.jit`` or ``@gluon.jit``
    function) compiled for sm_90a with the constexprs ``const``.

    Argument types: names in ``ptr_types`` take that pointer type (16-byte aligned), other
    ``*_ptr`` names ``default_ptr`` when given, names in ``const`` are constexprs, names in
    ``scalar_types`` take that type, everything else ``i32``. Integer arguments named in
    ``divisible`` are multiples of 16 (Triton specializes an integer argument that is one at
    launch, e.g. a row stride of 5120, and the code it runs assumes it)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

    scalar_types = scalar_types or {}

    def arg_type(n):
        if n in const:
            return "constexpr"
        if n in ptr_types:
            return ptr_types[n]
        if default_ptr and n.endswith("_ptr"):
            return default_ptr
        return scalar_types.get(n, "i32")

    sig = {n: arg_type(n) for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in divisible}
    opts = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    kernel = triton.compile(source(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                            options=opts)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.TemporaryDirectory() as d:
        ptx = os.path.join(d, "k.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        info = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o", os.devnull],
                              capture_output=True, text=True).stderr
    return [int(w) for line in info.splitlines() if "spill stores" in line
            for w in line.split() if w.isdigit()][1]


def sass(kernel) -> str:
    """``cuobjdump -sass`` of a compiled kernel (``triton.compile``'s result) as text: the
    probes count its instructions offline."""
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        return subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", cubin],
                              capture_output=True, text=True, check=True).stdout


def run_compile_script(script: str, timeout: int = 300) -> dict:
    """Run ``script`` (Python source printing one JSON object last) in a child process without
    ``TRITON_INTERPRET``; returns that object. AssertionError with the child's stderr if it
    fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
