"""Timing on the GPU: CUDA graphs of back-to-back calls, device events, median of replays.

``capture(fn)`` records ``fn()`` in a CUDA graph after a warm-up outside it;
``graph_time_us(fn, calls=20, replays=20)`` captures ``calls`` back-to-back invocations of
``fn()`` in one CUDA graph, replays it ``replays`` times (after warm-up) and returns the median
time per call in microseconds. ``fn`` may rotate among several input sets (so nothing is served
from L2) by closing over a list and a counter: capture records each call's buffers, so give it
``calls`` distinct input sets when the data would otherwise stay in the 60 MB L2.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

L2_BYTES = 60 * 1024 * 1024  # H200


def capture(fn: Callable[[], object], calls: int = 1, warmup: int = 1) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` back-to-back ``fn()``, after ``warmup`` eager calls on a side
    stream (Triton compiles and the caching allocator settles outside the capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def graph_time_us(fn: Callable[[], object], calls: int = 20, replays: int = 20,
                  warmup: int = 3) -> float:
    """Median microseconds per call of ``fn`` over ``replays`` replays of a ``calls``-call graph."""
    graph = capture(fn, calls, warmup)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def eager_time_us(fn: Callable[[], object], iters: int = 20, warmup: int = 3) -> float:
    """Median microseconds of ``fn`` run eagerly (for baselines that cannot be captured)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)
