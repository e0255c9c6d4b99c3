"""Weight tests run single-threaded on CPU: on the shared 2-core CI machine intra-op threads
oversubscribe the cores (measured for this folder: 30 s of CPU time -> 14 s, same wall time)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
