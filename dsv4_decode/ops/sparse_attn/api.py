"""``sparse_attn``: decode attention over the window and the selected compressed entries, with
sinks, straight from the FP8 / NVFP4 caches (spec §5.5, §5.2, §5.3, §3.3-§3.6)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4_decode.engine.cache import compressed_record_bytes, window_record_bytes
from dsv4_decode.utils.device import is_hopper, sm_count

from . import _triton
from .config import SparseAttnConfig, pick_default


@dataclass
class SparseAttnWorkspace:
    """Split partials of one launch shape (``make_workspace``); reusable across calls and
    CUDA-graph replays of that shape. ``counters`` must start at zero; the kernel leaves them
    at zero."""

    config: SparseAttnConfig
    rows: int
    heads: int
    head_dim: int
    acc: torch.Tensor  # fp32 (bf16: partials_bf16) [rows * head_blocks * n_split * block_h * D]
    m: torch.Tensor  # fp32 [rows * head_blocks * n_split * block_h] (log2 domain)
    l: torch.Tensor  # fp32, same shape as m
    counters: torch.Tensor  # int32 [rows * head_blocks]

    def tensors(self):
        return self.acc, self.m, self.l, self.counters


def pick_config(rows: int, heads: int, head_dim: int, window: int, n_sel: int,
                device: torch.device | str = "cuda") -> SparseAttnConfig:
    """The default launch config for these static shapes on ``device`` (``config.pick_default``:
    measured on the H200; the wgmma kernel only on a Hopper GPU)."""
    dev = torch.device(device)
    return pick_default(rows, heads, head_dim, window, n_sel, sm_count=sm_count(dev),
                        wgmma=is_hopper(dev))


def make_workspace(rows: int, heads: int, head_dim: int, window: int, n_sel: int,
                   device: torch.device | str, config: SparseAttnConfig | None = None
                   ) -> SparseAttnWorkspace:
    """Allocate the workspace for ``rows`` x ``heads`` x ``head_dim`` queries over ``window``
    window keys and an index list of width ``n_sel`` (outside the captured step)."""
    cfg = config or pick_config(rows, heads, head_dim, window, n_sel, device)
    groups = rows * -(-heads // cfg.block_h)
    n = groups * cfg.n_split * cfg.block_h if cfg.n_split > 1 else 0
    f32 = dict(dtype=torch.float32, device=device)
    return SparseAttnWorkspace(
        cfg, rows, heads, head_dim,
        acc=torch.empty(n * head_dim, dtype=torch.bfloat16 if cfg.partials_bf16 else torch.float32,
                        device=device),
        m=torch.empty(n, **f32), l=torch.empty(n, **f32),
        counters=torch.zeros(groups if cfg.n_split > 1 else 0, dtype=torch.int32, device=device))


def _need(cond: bool, msg: str):
    if not cond:
        raise ValueError(msg)


def _check(name: str, t, dtype, dims: int, device):
    _need(isinstance(t, torch.Tensor), f"{name}: needs a tensor, got {type(t).__name__}")
    _need(t.dtype == dtype and t.dim() == dims,
          f"{name}: needs a {dims}-d {dtype} tensor, got {t.dim()}-d {t.dtype}")
    _need(t.device == device, f"{name}: on {t.device}, q is on {device}")
    _need(t.is_contiguous(), f"{name}: must be contiguous")


def sparse_attn(q: torch.Tensor, window_cache: torch.Tensor, positions: torch.Tensor,
                row_slots: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, window: int,
                sinks: torch.Tensor | None = None, compressed: torch.Tensor | None = None,
                block_table: torch.Tensor | None = None, indices: torch.Tensor | None = None,
                softmax_scale: float | None = None, out: torch.Tensor | None = None,
                workspace: SparseAttnWorkspace | None = None,
                config: SparseAttnConfig | None = None) -> torch.Tensor:
    """Sparse decode attention with a per-head sink (spec §5.5), reading the caches in place.

    For query row ``t`` (position ``p = positions[t]``, cache slot ``s = row_slots[t]``) and
    head ``h``, the keys are the window records of positions ``max(0, p-window+1) .. p`` and the
    compressed entries listed in ``indices[t]``; K = V = the dequantised ``D``-dim vector::

        z_j = (q[t, h] . k_j) * softmax_scale              (default D ** -0.5)
        o   = sum_j exp(z_j - m) k_j / (sum_j exp(z_j - m) + exp(sinks[h] - m))
        out[t, h] = o with the last R dims rotated back by -p (interleaved pairs)

    A row with no visible key returns zeros. The rows of one request in a speculative step are
    simply rows at consecutive positions: each sees its own causal window.

    Args (``T`` rows, ``H`` heads, ``D`` head dim (power of two, >= 32), ``R`` rope dims):
        q: bf16 ``[T, H, D]`` (post-RoPE queries).
        window_cache: uint8 ``[num_slots, ring, D + D/32]``, ``ring >= window``: the record of
            position ``p`` of slot ``s`` is ``window_cache[s, p % ring]``: bytes ``0..D-1`` e4m3
            codes of dims ``0..D-1``, byte ``D + b`` the ue8m0 scale (``2^(byte-127)``) of dims
            ``32b..32b+31`` (528 B at D = 512; ``engine/cache.py``). The records of all this
            step's rows must be written before the call (``ring >= window + q_len - 1``).
        positions: int32 ``[T]``; a negative position has no window keys. Positions outside
            ``[0, cos.shape[0])`` are not rotated.
        row_slots: int32 ``[T]`` cache slot of each row; a slot outside ``window_cache`` (or the
            block table) contributes no window (compressed) keys.
        cos, sin: fp32 ``[P, R/2]`` the layer's RoPE table (``ref.rope_tables``): row ``p`` holds
            ``cos / sin(p * f_i)`` of pair ``i`` = dims ``(D-R+2i, D-R+2i+1)``.
        window: window length (128 in V4.1; the window includes the current token).
        sinks: fp32 ``[H]`` per-head sink logits, or None (no sink term).
        compressed: uint8 ``[num_pages, page_size, D/2 + D/16]`` NVFP4 records: bytes
            ``0..D/2-1`` packed e2m1 (byte ``k`` = dim ``2k`` low nibble, ``2k+1`` high), byte
            ``D/2 + b`` the e4m3 scale of dims ``16b..16b+15`` (288 B at D = 512).
        block_table: int32 ``[num_slots, max_pages]``: entry ``j`` of slot ``s`` is record
            ``j % page_size`` of page ``block_table[s, j // page_size]``; -1 = no page.
        indices: int32 ``[T, K]`` compressed entry numbers per row (K = 512 in V4.1); -1 = no
            entry. Entries ``< 0``, ``>= max_pages * page_size`` or on a page of -1 are masked,
            never read. None (with ``compressed`` and ``block_table`` None) for ratio-0 layers.
        softmax_scale: score scale, default ``D ** -0.5``.
        out: bf16 ``[T, H, D]`` to write into (allocated when None).
        workspace: from ``make_workspace`` for these shapes (allocated when None and needed).
        config: launch-config override (``SparseAttnConfig``); default ``pick_config``.

    Returns:
        bf16 ``[T, H, D]`` (``out`` when given).

    Graph safety: with ``out`` and ``workspace`` given nothing is allocated and nothing is read
    back to the host; positions, slots, indices and tables may change between replays. On
    sm_90+ the default launches its kernels as programmatic dependents (``config.pdl_entry``
    / ``pdl``; the Triton kernels only on the one-step layout, 1-2 requests at 16 heads):
    each waits on the device for the kernel before it, so inputs written by the previous
    kernel in the stream are always seen.

    Kernels: on a Hopper GPU (sm_90) the default runs the splits on warpgroup MMAs
    (``config.wgmma``, ``_gluon.py``: same partials, same merge, both kernels dependent
    launches, two CTAs a SM, ``config.wgmma_config``); elsewhere the
    Triton kernels of ``_triton.py``. A ``wgmma`` config off Hopper, or with flags it does
    not take, is a ``ValueError``.
    """
    device = q.device
    _check("q", q, torch.bfloat16, 3, device)
    t, h, d = q.shape
    _need(d >= 32 and d & (d - 1) == 0, f"q: head dim must be a power of two >= 32, got {d}")
    _need(t > 0 and h > 0, f"q: needs at least one row and one head, got {tuple(q.shape)}")
    _check("window_cache", window_cache, torch.uint8, 3, device)
    _need(window_cache.shape[2] == window_record_bytes(d),
          f"window_cache: records of {window_cache.shape[2]} bytes, head dim {d} needs "
          f"{window_record_bytes(d)}")
    _need(isinstance(window, int) and window >= 1, f"window: needs an int >= 1, got {window!r}")
    _need(window_cache.shape[1] >= window,
          f"window_cache: ring of {window_cache.shape[1]} records is shorter than window {window}")
    for name, v in (("positions", positions), ("row_slots", row_slots)):
        _check(name, v, torch.int32, 1, device)
        _need(v.shape[0] == t, f"{name}: needs {t} entries (one per row), got {v.shape[0]}")
    _check("cos", cos, torch.float32, 2, device)
    _check("sin", sin, torch.float32, 2, device)
    _need(cos.shape == sin.shape, f"sin: shape {tuple(sin.shape)} != cos {tuple(cos.shape)}")
    _need(cos.shape[0] > 0 and 0 < 2 * cos.shape[1] <= d,
          f"cos: needs [positions, R/2] with 0 < R <= {d}, got {tuple(cos.shape)}")
    if sinks is not None:
        _check("sinks", sinks, torch.float32, 1, device)
        _need(sinks.shape[0] == h, f"sinks: needs {h} entries (one per head), got "
              f"{sinks.shape[0]}")
    given = [x is not None for x in (compressed, block_table, indices)]
    _need(all(given) or not any(given),
          "compressed / block_table / indices: give all three or none (ratio-0 layer)")
    n_sel = 0
    if indices is not None:
        _check("compressed", compressed, torch.uint8, 3, device)
        _need(compressed.shape[2] == compressed_record_bytes(d),
              f"compressed: records of {compressed.shape[2]} bytes, head dim {d} needs "
              f"{compressed_record_bytes(d)}")
        _check("block_table", block_table, torch.int32, 2, device)
        _check("indices", indices, torch.int32, 2, device)
        _need(indices.shape[0] == t, f"indices: needs {t} rows, got {indices.shape[0]}")
        n_sel = indices.shape[1]
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    if workspace is not None:
        made = (workspace.rows, workspace.heads, workspace.head_dim)
        _need(made == (t, h, d),
              f"workspace: made for (rows, heads, D) = {made}, called with {(t, h, d)}")
        _need(config is None or config == workspace.config,
              "config: differs from the workspace's config")
        cfg = workspace.config
    else:
        cfg = config or pick_config(t, h, d, window, n_sel, device)
    _need(cfg.check(window, n_sel), f"config: inconsistent with window {window} and "
          f"{n_sel} index columns: {cfg}")
    _need(cfg.fits_head_dim(d), f"config: dim_split {cfg.dim_split} needs a power of two "
          f"leaving chunks of >= 32 of the {d} dims")
    problem = cfg.wgmma_problem(d)
    _need(problem is None, f"config: {problem}")
    _need(not cfg.wgmma or is_hopper(device), "config: wgmma needs a Hopper GPU (sm_90)")
    if cfg.n_split > 1 and workspace is None:
        workspace = make_workspace(t, h, d, window, n_sel, device, cfg)
    if out is None:
        out = torch.empty_like(q)
    else:
        _check("out", out, torch.bfloat16, 3, device)
        _need(out.shape == q.shape, f"out: shape {tuple(out.shape)}, needs {tuple(q.shape)}")
    ws = workspace.tensors() if cfg.n_split > 1 else None
    _triton.launch(q, window_cache, positions, row_slots, cos, sin, sinks, compressed,
                   block_table, indices, out, ws, cfg, window, scale)
    return out
