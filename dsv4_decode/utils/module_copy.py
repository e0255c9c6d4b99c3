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
