"""``utils.module_copy``: the probes' copies of a module, loaded beside the installed one."""

import pytest

from dsv4_decode.ops.topk import _triton, ref
from dsv4_decode.ops.topk.config import NSEG
from dsv4_decode.utils.module_copy import load_file, load_source, patch


def test_copy_of_a_module_with_relative_imports():
    copy = load_file(_triton.__file__, package="dsv4_decode.ops.topk", prefix="old_")
    assert copy.__name__ == "old__triton" and copy is not _triton
    assert copy.ref is ref  # `from . import ref` now names the package's module
    assert copy.launch is not _triton.launch


def test_source_rewrites_only_relative_imports():
    mod = load_source("from .config import NSEG\nfrom . import ref\nimport os\nX = NSEG\n",
                      "probe_src", package="dsv4_decode.ops.topk")
    assert mod.ref is ref and mod.X == NSEG and mod.os.sep


def test_patch_replaces_every_anchor_and_refuses_a_missing_one():
    assert patch("a = 1\nb = 1\n", [("= 1", "= 2"), ("b", "c")]) == "a = 2\nc = 2\n"
    with pytest.raises(ValueError, match="anchor not found"):
        patch("a = 1\n", [("a = 1", "a = 2"), ("a = 1", "a = 3")])
