"""Reference tests run single-threaded on CPU: their ops are tiny, and on a shared 2-core CI
machine intra-op threads oversubscribe the cores (measured: 127 s -> 10 s for this folder)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
