"""Probe: thread-block clusters from Triton 3.6 (one Hopper GPU). A kernel compiled for one
CTA runs in clusters of C CTAs when its ``packed_metadata`` (``(num_warps, num_ctas,
shared)``, what the launcher passes to ``cuLaunchKernelEx``) is patched after ``warmup``: the
launch then has ``grid x C`` CTAs in clusters of C. Triton's own ``num_ctas > 1`` does not
compile even a reduction (its PlanCTA pass fails), so the cluster work is inline PTX:
``%cluster_ctarank``, ``mapa.shared::cluster`` + ``red.shared::cluster`` into another CTA's
shared memory (at Triton's ``global_smem``, declared only when the kernel uses shared memory:
a cross-warp ``tl.sum`` first), ``barrier.cluster.arrive`` / ``wait``.

    PYTHONPATH=. python3 scripts/triton_cluster_probe.py

``k``: each CTA of a cluster adds (rank + 1) into rank 0's shared word; after the cluster
barrier rank 0 stores the sum, C (C + 1) / 2. ``bar_loop``: the cost of a cluster barrier
(release / acquire, and relaxed), from 10 and 1,010 barriers a kernel. Session 29
(docs/kernels/topk.md) ran it.
"""
import contextlib

import torch
import triton
import triton.language as tl


@triton.jit
def k(o_ptr, r_ptr):
    # a cross-warp sum first: Triton then declares its shared memory (global_smem), which the
    # PTX below reuses once the sum is done
    pid = tl.program_id(0) + tl.sum(tl.arange(0, 128) * 0, axis=0)
    # this CTA's rank in its cluster, and the address of its dynamic shared memory
    rank = tl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank; // $1", "=r,r", [pid],
                                     dtype=tl.int32, is_pure=False, pack=1)
    base = tl.inline_asm_elementwise("mov.u32 $0, global_smem; // $1", "=r,r", [rank],
                                     dtype=tl.int32, is_pure=False, pack=1)
    z = tl.inline_asm_elementwise(
        "{ st.shared.u32 [$1], 0; barrier.cluster.arrive.release.aligned; "
        "barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0; }",
        "=r,r", [base], dtype=tl.int32, is_pure=False, pack=1)
    s = tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t, ra; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
        "mapa.shared::cluster.u32 ra, $1, 0; add.u32 t, $2, 1; "
        "@p red.shared::cluster.add.u32 [ra], t; "
        "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
        "ld.shared.u32 $0, [$1]; }",
        "=r,r,r,r", [base, rank, z], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(r_ptr + pid, rank)
    tl.store(o_ptr + pid, s)



@triton.jit
def bar_loop(o_ptr, N: tl.constexpr, RELAXED: tl.constexpr):
    pid = tl.program_id(0) + tl.sum(tl.arange(0, 128) * 0, axis=0)
    acc = pid
    for _ in range(N):
        if RELAXED:
            acc = tl.inline_asm_elementwise(
                "{ barrier.cluster.arrive.relaxed.aligned; barrier.cluster.wait.aligned; "
                "add.u32 $0, $1, 1; }", "=r,r", [acc], dtype=tl.int32, is_pure=False, pack=1)
        else:
            acc = tl.inline_asm_elementwise(
                "{ barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
                "add.u32 $0, $1, 1; }", "=r,r", [acc], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(o_ptr + tl.program_id(0), acc)




@contextlib.contextmanager
def clustered(fn, grid, c, *args, **kw):
    """While open, ``fn[grid](*args, **kw)`` (compiled for one CTA) runs ``grid[0] x c`` CTAs in
    clusters of ``c``: the compiled kernel's ``packed_metadata`` says ``num_ctas = c``."""
    kern = fn.warmup(*args, grid=grid, **kw)
    nw, _, shared = kern.packed_metadata
    kern.packed_metadata = (nw, c, max(shared, 16))
    try:
        yield
    finally:
        kern.packed_metadata = (nw, 1, shared)


def check_dsmem() -> None:
    n = 4  # clusters
    for c in (1, 2, 4, 8, 16):
        o = torch.full((n * c,), -1, dtype=torch.int32, device="cuda")
        r = torch.full((n * c,), -1, dtype=torch.int32, device="cuda")
        with clustered(k, (n,), c, o, r):
            k[(n,)](o, r)
            torch.cuda.synchronize()
        ranks = r.view(n, c).cpu().tolist()
        sums = o.view(n, c)[:, 0].cpu().tolist()
        ok = all(v == list(range(c)) for v in ranks) and all(v == c * (c + 1) // 2 for v in sums)
        print(f"C={c}: ranks {ranks[0]} sums {sums} {'OK' if ok else 'WRONG'}", flush=True)


def barrier_cost() -> None:
    n = 8  # clusters
    for c in (2, 8, 16):
        for relaxed in (False, True):
            o = torch.zeros(n * c, dtype=torch.int32, device="cuda")
            times = []
            for steps in (10, 1010):
                with clustered(bar_loop, (n,), c, o, N=steps, RELAXED=relaxed):
                    bar_loop[(n,)](o, N=steps, RELAXED=relaxed)
                    a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                    a.record()
                    for _ in range(20):
                        bar_loop[(n,)](o, N=steps, RELAXED=relaxed)
                    b.record()
                    torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 20 * 1000)
            per = (times[1] - times[0]) / 1000
            print(f"cluster {c}, {'relaxed' if relaxed else 'release/acquire'}: "
                  f"{per * 1000:.0f} ns a cluster barrier ({times[0]:.1f} / {times[1]:.1f} us)",
                  flush=True)


if __name__ == "__main__":
    check_dsmem()
    barrier_cost()
