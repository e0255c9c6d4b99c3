"""Where a graph replay's time goes: per-kernel durations and the idle gaps between kernels.

``kernel_table(fn, calls=20, replays=5)`` captures ``calls`` back-to-back ``fn()`` in one CUDA
graph (as ``timing.graph_time_us`` does), replays it under ``torch.profiler`` (CUPTI records
every kernel node of a replayed graph) and returns, per kernel name in first-launch order, the
launches per call and the median duration of one launch, plus the per-call totals: ``busy``
(the union of kernel intervals) and ``span`` (first kernel start to last kernel end), whose
difference is the time no kernel of the graph ran (launch latency and dependency gaps).
Kernel durations from CUPTI exclude the launch itself, so ``span`` is a little below the
event-timed ``graph_time_us``. With programmatic dependent launches (topk's kernels and
sparse_attn's one-step layout on sm_90+) a kernel starts while the one before it still runs
and waits on the device: its duration then includes that wait, the kernels' totals add up to
more than ``span``, and ``format`` says so under the table.

Used by ``bench topk|sparse_attn|moe --kernels``; numbers are printed
(kernel names are the Triton function names), not written to the CSVs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dsv4_decode.bench.timing import capture


@dataclass
class KernelStats:
    name: str
    per_call: float  # launches per call
    median_us: float  # one launch


@dataclass
class Breakdown:
    kernels: list[KernelStats]
    busy_us: float  # per call: union of kernel intervals
    span_us: float  # per call: first start to last end

    def format(self, label: str) -> str:
        lines = [f"{label}: span {self.span_us:.2f} us/call, kernels busy {self.busy_us:.2f}, "
                 f"idle {self.span_us - self.busy_us:.2f}"]
        for k in self.kernels:
            lines.append(f"    {k.name[:60]:60s} x{k.per_call:<5.2g} {k.median_us:8.2f} us "
                         f"(total {k.per_call * k.median_us:.2f})")
        total = sum(k.per_call * k.median_us for k in self.kernels)
        if total > 1.02 * self.span_us:
            lines.append(f"    (the kernels' totals, {total:.2f} us, exceed the span: they "
                         "overlap, as dependent launches do; each time includes its wait for "
                         "the kernel before it)")
        return "\n".join(lines)


def kernel_table(fn: Callable[[], object], calls: int = 20, replays: int = 5) -> Breakdown:
    """Per-kernel medians and per-call busy / span of a ``calls``-call graph of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    graph = capture(fn, calls, warmup=3)
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    events = [e for e in prof.events()
              if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0
              and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    if not events:
        raise RuntimeError("the profiler recorded no kernels of the replayed graph")
    events.sort(key=lambda e: e.time_range.start)
    order, durs = [], {}
    for e in events:
        if e.name not in durs:
            order.append(e.name)
            durs[e.name] = []
        durs[e.name].append(e.time_range.elapsed_us())
    n = calls * replays
    kernels = [KernelStats(name, len(durs[name]) / n, statistics.median(durs[name]))
               for name in order]
    busy, end = 0.0, None
    for e in events:  # union of intervals (kernels of one graph may overlap)
        s, t = e.time_range.start, e.time_range.end
        if end is None or s >= end:
            busy += t - s
            end = t
        elif t > end:
            busy += t - end
            end = t
    # span: per replay, first start to last end (replays are separated by host gaps)
    per_replay = len(events) // replays
    spans = []
    for r in range(replays):
        chunk = events[r * per_replay:(r + 1) * per_replay]
        spans.append(max(e.time_range.end for e in chunk) - chunk[0].time_range.start)
    return Breakdown(kernels, busy / n, statistics.median(spans) / calls)
