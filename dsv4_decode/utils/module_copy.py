"""Another copy of one of the package's modules, loaded beside the installed one: a file from
an earlier commit (``git show REV:path > old.py``) or a patched source. The probes in
``scripts/`` time kernels against their predecessors in one process with it."""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
import types


def load_source(source: str, name: str, package: str | None = None) -> types.ModuleType:
    """A module named ``name`` from ``source``. ``package``: where the original lives; its
    relative imports (``from . import x``, ``from .y import z``) are made absolute to it."""
    if package:
        source = re.sub(r"^from \.(\w*) import",
                        lambda m: f"from {package}{'.' + m[1] if m[1] else ''} import",
                        source, flags=re.M)
    path = os.path.join(tempfile.mkdtemp(), name + ".py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_file(path: str, package: str | None = None, prefix: str = "") -> types.ModuleType:
    """``load_source`` of the file at ``path``, named ``prefix`` + its base name."""
    with open(path) as f:
        source = f.read()
    return load_source(source, prefix + os.path.splitext(os.path.basename(path))[0], package)


# Timing stamps for patched kernel copies (Triton source text, pasted above the first kernel a
# probe patches): ``_clk`` stores the SM's cycle counter after a CTA barrier (phases of one
# CTA, made serial by the barrier); ``_gt`` the global nanosecond timer, no barrier.
STAMPS = '''
@triton.jit
def _clk(dbg_ptr, i):
    tl.debug_barrier()
    t = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [tl.program_id(0)],
                                  dtype=tl.int64, is_pure=False, pack=1)
    tl.store(dbg_ptr + i, t)


@triton.jit
def _gt(dbg_ptr, i):
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [tl.program_id(0)],
                                  dtype=tl.int64, is_pure=False, pack=1)
    tl.store(dbg_ptr + i, t)


'''


def patch(source: str, patches: list[tuple[str, str]]) -> str:
    """``source`` with each (anchor, replacement) applied to every occurrence of the anchor;
    an anchor not found (the source changed) raises ``ValueError``."""
    for anchor, repl in patches:
        if anchor not in source:
            raise ValueError(f"anchor not found (the source changed): {anchor[:60]!r}")
        source = source.replace(anchor, repl)
    return source
