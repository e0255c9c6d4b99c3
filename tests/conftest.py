"""Test setup: on a machine without CUDA the Triton kernels run under the interpreter.

- sets ``TRITON_INTERPRET=1`` before Triton is imported when CUDA is absent, and installs the
  interpreter workarounds of ``dsv4_decode.utils.interpreter``;
- the ``gpu`` marker (production shapes, CUDA graphs) is skipped without CUDA;
- every test runs with one intra-op CPU thread: the tests' ops are small, and on a 2-core CI
  machine torch's threads oversubscribe the cores (measured on tests/reference: 127 s -> 10 s).
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
    from dsv4_decode.utils.interpreter import patch_triton_interpreter

    patch_triton_interpreter()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def device():
    """The device kernels run on: cuda when present, else cpu (interpreter)."""
    return torch.device("cuda" if HAS_CUDA else "cpu")
