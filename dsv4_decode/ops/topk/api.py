"""Public contract of the exact decode top-k: validate -> allocate -> pick config -> launch."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from dsv4_decode.utils.device import clusters_capable

from . import config
from .config import TopkConfig

MAX_COLS = 1 << 20
MAX_K = 2048


@dataclass(frozen=True)
class TopkWorkspace:
    """Device scratch of one (rows, k, block) shape; reuse it across calls and graph replays.

    Every call overwrites what it reads, so no zeroing is needed between calls.
    - ``tick`` int32 [rows], zero between calls: per-row arrival tickets of the group-maxima
      programs (the last one computes the threshold and re-arms the ticket to 0);
    - ``gmax`` int32 [rows, cfg.groups]: group maxima (rank keys) of the row;
    - ``smax`` int32 [rows, cfg.max_chunks * cfg.nseg]: rank-key maxima of contiguous segments
      of ``cfg.chunk / cfg.nseg`` elements (0 past the length), written by pass 1 for the collect
      pass's pruning (one CTA a row, ``_row``: of 8 columns, up to ``config.ROW_COLS``);
    - ``seglist`` int32 [rows, cfg.max_chunks * cfg.nseg] / ``rcnt`` int32 [rows, cfg.max_chunks]:
      the segments whose maximum reaches T0, ascending, listed per region (the segments of
      ``config.LIST_REGION / NSEG`` chunks) at the region's slice, and their number per region
      (folded grids; written by the threshold kernel, read by the collect; ``_row`` lists its
      8-column segments in ``seglist``);
    - ``thr`` int32 [rows]: T0, the k-th largest group maximum;
    - ``cnt`` int32 [rows]: number of candidates (elements >= T0) seen by the collect pass
      (``_row``: more than ``cfg.cap`` means its exact fallback ran);
    - ``cbuf`` int64 [rows, cfg.cap]: each candidate, its low word its bf16 bits ``| rank inside
      its span << 17``, its high word its index ``| span << 20`` (a span: a chunk, or a batch
      of up to 16 segments of one collect program; one 8-byte store a candidate); ``_row``
      writes the first ``cfg.cap`` int32 words of the row instead (``cbuf`` viewed as int32),
      ``(key1 - 1) << 16 | column``, in column order;
    - ``cc`` int32 [rows, cfg.max_chunks]: per span, its candidate count ``| base << 16``
      (base: its first ``cbuf`` slot; its candidates follow in rank order);
    - ``scratch`` int32 [rows, cfg.cap]: candidates re-ordered by index.

    Block mode's grid-wide radix select (``_radix``; ``cfg.rchunk > 0``; empty in plain mode;
    C = ``cfg.rchunks``; the cluster form, ``_cluster``, keeps its histograms in shared memory;
    in block mode the plain-mode buffers above are allocated empty, ``[rows, 0]``, but for the
    per-row ``tick``, ``thr`` and ``cnt``):
    - ``hist1`` int32 [rows, 512] / ``hist2`` int32 [rows, 256], zero between calls: the row's
      histograms of ``key1 >> 8`` and of the low byte inside the threshold bin (each re-zeroed
      by a later launch, after its last reader);
    - ``meta`` int32 [rows, 8]: the threshold bin and the count above it (three-launch form);
    - ``csuf`` int32 [rows, C, 256] / ``cgt`` int32 [rows, C]: per chunk, the count of keys at
      or above each low byte of the threshold bin, and above the bin;
    - ``bar`` int64 [rows, 16], zero at allocation: the one-launch form's barrier per row
      (word 0: an arrival count in the low 32 bits, 0 between barriers, and a generation above
      it that only grows).
    """

    cfg: TopkConfig
    tick: torch.Tensor
    gmax: torch.Tensor
    smax: torch.Tensor
    seglist: torch.Tensor
    rcnt: torch.Tensor
    thr: torch.Tensor
    cnt: torch.Tensor
    cbuf: torch.Tensor
    cc: torch.Tensor
    scratch: torch.Tensor
    hist1: torch.Tensor
    hist2: torch.Tensor
    meta: torch.Tensor
    csuf: torch.Tensor
    cgt: torch.Tensor
    bar: torch.Tensor

    @property
    def rows(self) -> int:
        return self.thr.shape[0]


def make_topk_workspace(rows: int, k: int, device, block: int = 1) -> TopkWorkspace:
    """Allocate the scratch for ``rows`` rows, ``k`` selected elements, ``block`` (1 = plain)."""
    cfg = TopkConfig.pick(k, block)

    def buf(*shape, zero=False, dtype=torch.int32):
        make = torch.zeros if zero else torch.empty
        return make(*shape, dtype=dtype, device=torch.device(device))

    nch = cfg.rchunks
    plain = 0 if nch else 1  # block mode runs the radix select alone
    return TopkWorkspace(
        cfg=cfg, tick=buf(rows, zero=True),
        gmax=buf(rows, plain * cfg.groups), smax=buf(rows, plain * cfg.max_chunks * cfg.nseg),
        seglist=buf(rows, plain * cfg.max_chunks * cfg.nseg),
        rcnt=buf(rows, plain * cfg.max_chunks),
        thr=buf(rows), cnt=buf(rows),
        cbuf=buf(rows, plain * cfg.cap, dtype=torch.int64),
        cc=buf(rows, plain * cfg.max_chunks), scratch=buf(rows, plain * cfg.cap),
        hist1=buf(rows, 512 if nch else 0, zero=True),
        hist2=buf(rows, 256 if nch else 0, zero=True), meta=buf(rows, 8 if nch else 0),
        csuf=buf(rows, nch, 256), cgt=buf(rows, nch),
        bar=buf(rows, 16 if nch else 0, zero=True, dtype=torch.int64))


def _check(logits, lengths, k, block, out, workspace, k_name) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dtype != torch.bfloat16:
        got = logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits: got {got}, need a torch.bfloat16 tensor")
    if logits.dim() != 2:
        raise ValueError(f"logits: got rank {logits.dim()}, need [rows, cols]")
    rows, cols = logits.shape
    if not 1 <= cols <= MAX_COLS:
        raise ValueError(f"logits: got {cols} columns, need 1..{MAX_COLS}")
    if logits.stride(1) != 1 or logits.stride(0) % 8 != 0:
        raise ValueError(f"logits: got strides {tuple(logits.stride())}, need contiguous rows "
                         "(column stride 1) and a row stride that is a multiple of 8 elements")
    # loads are 16-byte vectors: the last row is read up to cols rounded up to 8
    need = logits.storage_offset() + (rows - 1) * logits.stride(0) + -(-cols // 8) * 8
    if rows and logits.untyped_storage().nbytes() < 2 * need:
        raise ValueError(f"logits: the storage ends inside the last row's 8-column padding "
                         f"(needs {2 * need} bytes, has {logits.untyped_storage().nbytes()}); "
                         "pad the row stride to a multiple of 8 elements")
    if not isinstance(lengths, torch.Tensor) or lengths.dtype != torch.int32:
        got = lengths.dtype if isinstance(lengths, torch.Tensor) else type(lengths).__name__
        raise ValueError(f"lengths: got {got}, need a torch.int32 tensor")
    if tuple(lengths.shape) != (rows,) or not lengths.is_contiguous():
        raise ValueError(f"lengths: got shape {tuple(lengths.shape)}, need contiguous [{rows}]")
    if lengths.device != logits.device:
        raise ValueError(f"lengths: got device {lengths.device}, need {logits.device} "
                         "(the lengths stay on the device; no host copy)")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise ValueError(f"{k_name}: got {k!r}, need an int in 1..{MAX_K}")
    if block not in (1, 2, 4, 8, 16, 32, 64):
        raise ValueError(f"block: got {block!r}, need a power of two in 1..64")
    if out is not None:
        if (not isinstance(out, torch.Tensor) or out.dtype != torch.int32
                or tuple(out.shape) != (rows, k) or out.stride(1) != 1
                or out.device != logits.device):
            desc = (f"{out.dtype} {tuple(out.shape)} strides {tuple(out.stride())} on {out.device}"
                    if isinstance(out, torch.Tensor) else type(out).__name__)
            raise ValueError(f"out: got {desc}, need int32 [{rows}, {k}] with contiguous rows "
                             f"on {logits.device}")
    if workspace is not None:
        cfg = TopkConfig.pick(k, block)
        if (not isinstance(workspace, TopkWorkspace) or workspace.cfg != cfg
                or workspace.rows < rows or workspace.gmax.device != logits.device):
            raise ValueError(f"workspace: does not fit rows={rows}, {k_name}={k}, block={block} "
                             f"on {logits.device}; need make_topk_workspace(rows, k, device, "
                             "block)")


def _run(logits, lengths, k, block, out, workspace) -> torch.Tensor:
    # deferred: importing triton is not needed for the twin
    from . import _cluster, _radix, _row, _triton

    rows = logits.shape[0]
    if out is None:
        out = torch.empty(rows, k, dtype=torch.int32, device=logits.device)
    if rows == 0:
        return out
    if workspace is None:
        workspace = make_topk_workspace(rows, k, logits.device, block)
    cfg = workspace.cfg
    if cfg.rchunk:
        # clusters on sm_90+ (``_cluster`` picks the form; not under the interpreter, which
        # has no inline PTX)
        clustered = clusters_capable(logits.device) and os.environ.get("TRITON_INTERPRET") != "1"
        kernels = _cluster if clustered else _radix
    else:
        kernels = _row if config.one_cta_per_row(*logits.shape, k) else _triton
    kernels.launch(logits.view(torch.int16), lengths, out, workspace, cfg, k)
    return out


def decode_topk(logits: torch.Tensor, lengths: torch.Tensor, k: int, *,
                out: torch.Tensor | None = None,
                workspace: TopkWorkspace | None = None) -> torch.Tensor:
    """Exact top-k column indices of each row of BF16 logits (the indexer's selection).

    Args:
        logits: bf16 [rows, cols], 1 <= cols <= 1,048,576; columns contiguous, row stride a
            multiple of 8 elements.
        lengths: int32 [rows] on the same device: columns ``>= lengths[r]`` of row r are not
            candidates. 0 is allowed; values are clamped to [0, cols] in the kernel.
        k: 1..2048 (512 and 2048 in production).
        out: optional int32 [rows, k] (contiguous rows) written in place and returned.
        workspace: optional scratch from ``make_topk_workspace(rows, k, device)``.

    Returns:
        int32 [rows, k]: for each row the set of the k largest candidates under the order
        NaN > +inf > finite > -inf (-0.0 == +0.0), ties broken towards the lower column, so every
        tensor-parallel rank selects the same set. The order inside a row is unspecified by the
        contract; this implementation returns the columns in ascending order (as
        ``ref.decode_topk_ref`` does), so results are bitwise reproducible. Rows with fewer than
        k candidates list all of them, then ``-1`` to the end.

    Graph safety: lengths are only read on the device; no host synchronisation. With ``out``
    and ``workspace`` given nothing is allocated, so the call can be captured in a CUDA graph
    and replayed with new logits and lengths (in the same tensors). Four kernel launches, or
    one (a CTA a row) for at least ``config.ROW_ROWS`` rows of at most ``config.ROW_COLS``
    columns at k <= 512; on sm_90+ each is a programmatic dependent launch that waits on the
    device for the kernel before it (so logits and lengths written by the previous kernel in
    the stream are always seen).

    Raises:
        ValueError: naming the argument, for a wrong dtype, rank, stride, device, k out of range,
            or an ``out`` / ``workspace`` of the wrong shape.
    """
    _check(logits, lengths, k, 1, out, workspace, "k")
    return _run(logits, lengths, k, 1, out, workspace)


def decode_topk_blocks(logits: torch.Tensor, lengths: torch.Tensor, n_blocks: int = 2048,
                       block: int = 8, *, out: torch.Tensor | None = None,
                       workspace: TopkWorkspace | None = None) -> torch.Tensor:
    """Level-1 candidate blocks of the two-level indexer (spec §5.4): top blocks by maximum.

    Block b covers columns ``[b*block, (b+1)*block)``; its value is the maximum over its valid
    columns (those ``< lengths[r]``). Blocks whose maximum is -inf, or with no valid column, are
    not candidates; the block holding column ``lengths[r] - 1`` is pinned (ranks above every
    value, NaN included). Returns int32 [rows, n_blocks] block indices: the n_blocks largest
    candidate blocks under the order of ``decode_topk`` (ties towards the lower block index),
    in ascending block order, ``-1`` filling the tail.

    Args: as ``decode_topk``, with ``n_blocks`` in 1..2048 in place of k and ``block`` a power
    of two in 1..64 (8 in the model); the workspace is ``make_topk_workspace(rows, n_blocks,
    device, block)``. Same graph safety and errors. An exact radix select on the block keys
    (a histogram of the high byte, one of the low byte inside the threshold bin, then the
    write) in one launch:
    - on sm_90+, rows of at most 16 chunks (64K columns at blocks of 8) and at most 384 CTAs
      in all: a thread-block cluster a row (``_cluster``), meeting in distributed shared
      memory and at cluster barriers; the workspace is not touched;
    - on sm_90+, 1-12 rows of at most 128 chunks (512K columns at blocks of 8, blocks of at
      most 16): several clusters a row (``_cluster``'s LONG form), a row whose length fits 16
      chunks on its first cluster alone, a longer one on all of them as below;
    - otherwise (``_radix``) the row's programs meet at software barriers through global
      memory, the grid sized so it fits on the GPU at once (a kernel beside it on another
      stream can delay it, not block it, unless that kernel waits for this one); three
      launches under the interpreter or with more rows than the GPU holds programs.
    """
    _check(logits, lengths, n_blocks, block, out, workspace, "n_blocks")
    return _run(logits, lengths, n_blocks, block, out, workspace)
