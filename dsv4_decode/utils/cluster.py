"""Thread-block clusters for Triton kernels compiled for one CTA (sm_90+).

Triton 3.6's own ``num_ctas > 1`` does not compile for sm_90a here (its PlanCTA pass fails even
on a reduction; session 29, ``scripts/triton_cluster_probe.py``). A kernel compiled for one CTA
still runs in clusters: the launcher passes the compiled kernel's ``packed_metadata``
(``num_warps, num_ctas, shared``) to ``cuLaunchKernelEx``, which launches ``grid[0] x
num_ctas`` CTAs along x in clusters of ``num_ctas`` when that field says so. ``launch``
compiles the kernel, patches that field (and the dynamic shared memory, for a region of the
kernel's own after Triton's scratch) and launches it; the kernel does the cluster work with the
inline-PTX helpers below.

Contract of a clustered kernel:
- its last runtime argument is ``smem_off``: the byte offset of its own shared region in
  Triton's dynamic shared memory (``global_smem``), past everything Triton allocated. The
  kernel must use Triton shared memory (a cross-warp reduction, a histogram, ...), or Triton
  does not declare ``global_smem``;
- with the grid's x dimension 1, ``tl.program_id(0)`` is the CTA's rank in its cluster;
- it calls ``check_cluster(CTAS)`` first: a launch that is not clustered as compiled (e.g. a
  Triton upgrade that changes the launcher) traps instead of computing a wrong answer;
- every CTA of a cluster runs every cluster barrier (``arrive`` then ``wait``), and no CTA
  exits while another may still read its shared memory (a last ``wait`` before the end).
Graph-safe: the cluster shape is a launch attribute, recorded by CUDA-graph capture.
"""

from __future__ import annotations

import ctypes

import triton
import triton.language as tl

# (kernel, device, ctas, region, constexprs, specialization) -> (smem_off, clusters at once)
_PATCHED: dict = {}
SMEM_LIMIT = 48 * 1024  # dynamic shared memory a launch gets without an opt-in attribute


def _spec(a):
    """What Triton specializes a launch argument on (so one compile serves equal keys)."""
    if hasattr(a, "data_ptr"):
        return (str(a.dtype), a.data_ptr() % 16 == 0)
    if isinstance(a, bool) or not isinstance(a, int):
        return (type(a).__name__, a)
    return (a == 1, a % 16 == 0, -2**31 <= a < 2**31)


class _Attr(ctypes.Structure):  # CUlaunchAttribute with the cluster-dimension value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("x", ctypes.c_uint),
                ("y", ctypes.c_uint), ("z", ctypes.c_uint), ("rest", ctypes.c_char * 52)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("n_attrs", ctypes.c_uint)]


def _max_active_clusters(kern, ctas: int, shared: int) -> int:
    """Clusters of ``ctas`` CTAs of a compiled kernel the GPU holds at once (the driver's
    ``cuOccupancyMaxActiveClusters``: registers, shared memory, and how clusters fit the
    GPCs)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    func = ctypes.c_void_p(kern.function)
    if ctas > 8:  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        cuda.cuFuncSetAttribute(func, 14, 1)
    attr = _Attr(id=4, x=ctas, y=1, z=1)  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cfg = _Config((ctypes.c_uint * 3)(ctas, 1, 1),
                  (ctypes.c_uint * 3)(32 * kern.metadata.num_warps, 1, 1), shared, None,
                  ctypes.pointer(attr), 1)
    n = ctypes.c_int(0)
    err = cuda.cuOccupancyMaxActiveClusters(ctypes.byref(n), func, ctypes.byref(cfg))
    if err:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed with CUresult {err}")
    return n.value


def prepare(fn, args: tuple, consts: dict, ctas: int, region: int) -> tuple[int, int]:
    """Compile ``fn`` for ``args`` / ``consts`` (once per specialization) and make its launches
    clustered: ``(smem_off, clusters)``, the byte offset of the kernel's own region and how
    many clusters the GPU holds at once."""
    device = next(a.device for a in args if hasattr(a, "device"))
    key = (fn, device, ctas, region, tuple(sorted(consts.items())),
           tuple(_spec(a) for a in args))
    got = _PATCHED.get(key)
    if got is None:
        # 16 has the specialization of every offset used below (a multiple of 16, not 1)
        kern = fn.warmup(*args, 16, grid=(1,), **consts)
        kern._init_handles()
        nw, _, shared = kern.packed_metadata
        off = -(-max(shared, 16) // 16) * 16
        if off + region > SMEM_LIMIT:
            raise RuntimeError(f"{fn.__name__}: {off} bytes of Triton shared memory + {region} "
                               f"of its own exceed {SMEM_LIMIT}")
        kern.packed_metadata = (nw, ctas, off + region)
        got = _PATCHED[key] = (off, _max_active_clusters(kern, ctas, off + region))
    return got


def launch(fn, grid: tuple, args: tuple, consts: dict, ctas: int, region: int) -> None:
    """Launch ``fn[grid](*args, smem_off, **consts)`` as ``grid[0] x ctas`` CTAs along x in
    clusters of ``ctas`` (1..16; 16 is a non-portable size that Hopper allows), each CTA with
    ``region`` bytes of shared memory of its own at ``smem_off``."""
    off, _ = prepare(fn, args, consts, ctas, region)
    fn[grid](*args, off, **consts)


@triton.jit
def check_cluster(CTAS: tl.constexpr):
    """Trap unless this CTA runs in a cluster of ``CTAS`` CTAs."""
    n = tl.inline_asm_elementwise("mov.u32 $0, %cluster_nctarank;", "=r", [], dtype=tl.int32,
                                  is_pure=True, pack=1)
    tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.s32 p, $1, 0; @p trap; mov.u32 $0, 0; }",
                              "=r,r", [(n != CTAS).to(tl.int32)], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def smem_addr(byte_off):
    """Shared-window addresses (u32) of ``byte_off`` bytes into the dynamic shared memory."""
    return tl.inline_asm_elementwise(
        "{ .reg .u32 t; mov.u32 t, global_smem; add.u32 $0, t, $1; }", "=r,r", [byte_off],
        dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def st_local(addr, v):
    """Store the u32 ``v`` at this CTA's shared ``addr`` (elementwise)."""
    return tl.inline_asm_elementwise("{ st.shared.u32 [$1], $2; mov.u32 $0, 0; }", "=r,r,r",
                                     [addr, v], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def ld_local(addr):
    """Load the u32 at this CTA's shared ``addr`` (elementwise)."""
    return tl.inline_asm_elementwise("ld.shared.u32 $0, [$1];", "=r,r", [addr],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def count_local(addr, mask):
    """Add 1 to the u32 at this CTA's shared ``addr`` where ``mask`` (elementwise; a shared
    memory atomic, so equal addresses in a warp all count). As ``red_add_rank``: every thread
    holding an element adds, so ``addr`` must not be replicated across threads."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p red.shared.add.u32 [$1], 1; mov.u32 $0, 0; }",
        "=r,r,r", [addr, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def ld_rank(addr, rank):
    """Load the u32 at shared ``addr`` of the cluster's CTA ``rank`` (elementwise)."""
    return tl.inline_asm_elementwise(
        "{ .reg .u32 a; mapa.shared::cluster.u32 a, $1, $2; ld.shared::cluster.u32 $0, [a]; }",
        "=r,r,r", [addr, rank], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def red_add_rank(addr, v, mask, rank):
    """Atomically add ``v`` to the u32 at shared ``addr`` of the cluster's CTA ``rank`` where
    ``mask`` (elementwise). Every element is one add by every thread holding it, so ``v`` must
    not be replicated across threads (1-D tensors of at least the CTA's threads are not)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 a; setp.ne.s32 p, $3, 0; "
        "mapa.shared::cluster.u32 a, $1, $4; @p red.shared::cluster.add.u32 [a], $2; "
        "mov.u32 $0, 0; }",
        "=r,r,r,r,r", [addr, v, mask.to(tl.int32), rank], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def arrive():
    """Arrive at the cluster barrier; this thread's earlier memory accesses (shared, remote
    shared, global) are released to the cluster."""
    tl.inline_asm_elementwise("{ barrier.cluster.arrive.release.aligned; mov.u32 $0, 0; }",
                              "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def wait():
    """Wait until every thread of the cluster has arrived; their released accesses are
    visible after it."""
    tl.inline_asm_elementwise("{ barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0; }",
                              "=r", [], dtype=tl.int32, is_pure=False, pack=1)
