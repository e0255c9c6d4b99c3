"""MoE of one decode step (spec §6): router front, routed MXFP4 experts, FP8 shared expert.

Public entry points:

- ``route(x, gate_weight, gate_bias, top_k=6, route_scale=1.5)`` -> ``Routing``
  (2 launches: split-K logits; select, one CTA per row, whose last CTA writes the routing
  record; 1 up to 4 rows: the last logits CTA selects and writes the record);
- ``build_routing(ids, weights, n_experts)`` -> ``Routing`` from given ids (1 launch);
- ``prepare_moe_weights(w13, w13_scales, w2, w2_scales, shared)`` -> ``MoEWeights`` (load
  time: checks, and repacks the MXFP4 nibbles for the kernels);
- ``moe_experts(x, routing, weights)`` -> ``[T, D]`` bf16 (2 launches up to 3 rows: W1|W3 +
  SwiGLU, W2 + combine; 3 above: + the combine launch);
- ``alloc_routing`` / ``alloc_moe_workspace`` (buffers for graph capture).

Graph safety: with ``out`` / ``workspace`` given nothing is allocated, nothing is synchronised,
and every grid depends only on shapes (sized for the worst case; idle CTAs exit at once).
Determinism: no float atomics; every replay of the same inputs is bitwise identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from . import _triton as K
from .config import BLOCK_M, MoEConfig, pick_config

MAX_ENTRIES = 4096  # rows * top_k handled by the one-CTA routing record (sort width)

_ROUTER_BLOCK_E = 64
_ROUTER_K_CHUNK = 256
_ROUTER_BLOCK_K = 128
_SELECT_ROWS = 4
_SELECT_WARPS = 8
_COMBINE_BLOCK_D = 1024
# Rows up to which W2's last CTA per column block does the combine. Measured on the H200 at
# 0e9b594 (profiler, TP=4): W2 + its combine 11.87 µs against 10.11 + 2.27 (launch) at 1 row,
# 32.45 against 27.33 + 2.72 at 6 rows: the fused sum costs ~1.76 + 0.67 (T - 1) µs on W2's
# tail, the launch ~2.3-2.7 µs + ~0.7 µs of idle gap, even at T ~ 3.
_COMBINE_FUSED_ROWS = 3


def _np2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _k_step(want: int, k: int) -> int:
    """The largest power of two <= ``want`` dividing ``k`` (>= 32: k is a multiple of 32); the
    kernels' K loops have no tail."""
    while k % want:
        want //= 2
    return want


def _join_gate_up(cfg: MoEConfig, k_step: int, block: int) -> bool:
    """W1|W3 takes W1's and W3's rows in one tile a step (``_moe_up_kernel``'s JOIN) where one
    ``[up_n, k_step/block]`` scale tile has fewer than 4 bytes a thread: Triton streams a load
    through cp.async only from 4 bytes a thread, so a smaller tile is a plain load that every
    K step waits for (Nsight Compute, session 6: the split configs' largest stall). Measured
    on the H200 (docs/kernels/moe.md, session 7): joined wins in the split configs (1 and 6
    rows), separate tiles win with 256-deep steps (12 and 48 rows, whose tiles stream)."""
    return cfg.up_n * (k_step // block) < 4 * 32 * cfg.num_warps


def _fail(arg: str, got, need: str):
    raise ValueError(f"{arg}: got {got}, needs {need}")


# --------------------------------------------------------------------------- routing record


@dataclass(frozen=True)
class Routing:
    """The routing of ``T`` rows and the record the expert kernels consume (device buffers).

    ids      int32 ``[T, k]``: expert of slot i of row t, descending score; -1 = no expert
             (padding rows); the slot's entry number is ``n = t*k + i``.
    weights  fp32 ``[T, k]``: routing weight of each slot (0 where ids is -1).
    entries  int32 ``[max_tiles * block_m]``: entry numbers grouped by expert (ascending expert
             id, entry order within an expert), each group padded with -1 to a multiple of
             ``block_m``; everything after the last group is -1. Tile ``j`` of the expert
             kernels serves ``entries[j*block_m : (j+1)*block_m]``, all of one expert.
    tiles    int32 ``[max_tiles]``: the expert of tile ``j`` (-1: idle tile, past the last group).
    tick     int32 ``[1]``, zero: ticket counter of ``route``'s select CTAs (the last to arrive
             writes the record; it leaves the counter at zero again).
    logits   fp32 ``[S, T, E]``: split-K partial router logits (scratch of ``route``).
    n_experts, block_m: static.
    """

    ids: torch.Tensor
    weights: torch.Tensor
    entries: torch.Tensor
    tiles: torch.Tensor
    tick: torch.Tensor
    logits: torch.Tensor
    n_experts: int
    block_m: int = BLOCK_M

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    @property
    def top_k(self) -> int:
        return self.ids.shape[1]

    @property
    def max_tiles(self) -> int:
        return self.entries.numel() // self.block_m


def max_tiles(rows: int, top_k: int, n_experts: int, block_m: int = BLOCK_M) -> int:
    """Worst-case tile count: ``sum_e ceil(c_e / bm) <= (T*k + min(E, T*k) * (bm-1)) // bm``."""
    n = rows * top_k
    return (n + min(n_experts, n) * (block_m - 1)) // block_m


def alloc_routing(rows: int, top_k: int, n_experts: int, hidden: int, device,
                  block_m: int = BLOCK_M) -> Routing:
    """Empty ``Routing`` buffers for ``rows`` rows (reuse them as ``out=`` under a graph)."""
    if rows < 1 or rows * top_k > MAX_ENTRIES:
        _fail("rows", rows, f">= 1 and rows * top_k <= {MAX_ENTRIES}")
    split = triton.cdiv(hidden, _ROUTER_K_CHUNK)
    i32 = dict(dtype=torch.int32, device=device)
    return Routing(
        ids=torch.empty(rows, top_k, **i32),
        weights=torch.empty(rows, top_k, dtype=torch.float32, device=device),
        entries=torch.empty(max_tiles(rows, top_k, n_experts, block_m) * block_m, **i32),
        tiles=torch.empty(max_tiles(rows, top_k, n_experts, block_m), **i32),
        tick=torch.zeros(1, **i32),
        logits=torch.empty(split, rows, n_experts, dtype=torch.float32, device=device),
        n_experts=n_experts, block_m=block_m)


def _record_consts(r: Routing) -> dict:
    cap = r.entries.numel()
    return dict(CAP=cap, NP=_np2(max(r.ids.numel(), 16)), E_PAD=_np2(max(r.n_experts, 16)),
                BLOCK_M=r.block_m, FILL=min(1024, _np2(cap)))


def _launch_record(r: Routing) -> None:
    K._route_record_kernel[(1,)](r.ids, r.entries, r.tiles, r.ids.numel(), **_record_consts(r),
                                 num_warps=8)


def _check_out_routing(out: Routing, rows, top_k, n_experts, hidden):
    want = alloc_routing.__name__ + f"({rows}, {top_k}, {n_experts}, {hidden}, ...)"
    if (out.rows, out.top_k, out.n_experts) != (rows, top_k, n_experts) or \
            out.logits.shape[0] != triton.cdiv(hidden, _ROUTER_K_CHUNK):
        _fail("out", f"Routing(rows={out.rows}, top_k={out.top_k}, E={out.n_experts})", want)


def route(x: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor,
          top_k: int = 6, route_scale: float = 1.5, valid_rows: torch.Tensor | None = None,
          out: Routing | None = None) -> Routing:
    """Router front (spec §6.1) and routing record.

    x            bf16 ``[T, D]`` (row stride free, unit column stride).
    gate_weight  bf16 ``[E, D]`` contiguous; gate_bias fp32 ``[E]`` (selection only).
    valid_rows   optional int32 ``[1]`` on the device: rows ``>= valid_rows[0]`` are padding
                 (ids -1, weights 0; the experts then give them only the shared expert).
    Returns ``Routing``: ``ids`` = the ``top_k`` experts of largest ``sqrt(softplus(W x)) +
    bias`` (fp32 logits, descending, ties to the lower id), ``weights`` = their unbiased
    ``sigma / (sum sigma + 1e-20) * route_scale``. ``out``: preallocated ``alloc_routing``.
    """
    if x.dim() != 2 or x.dtype != torch.bfloat16 or x.stride(1) != 1:
        _fail("x", f"{x.dtype} {tuple(x.shape)}", "bf16 [T, D] with unit column stride")
    t, d = x.shape
    if gate_weight.dtype != torch.bfloat16 or gate_weight.dim() != 2 or \
            gate_weight.shape[1] != d or not gate_weight.is_contiguous():
        _fail("gate_weight", f"{gate_weight.dtype} {tuple(gate_weight.shape)}",
              f"contiguous bf16 [E, {d}]")
    e = gate_weight.shape[0]
    if gate_bias.dtype != torch.float32 or tuple(gate_bias.shape) != (e,):
        _fail("gate_bias", f"{gate_bias.dtype} {tuple(gate_bias.shape)}", f"fp32 [{e}]")
    if not 1 <= top_k <= min(e, 16):
        _fail("top_k", top_k, f"1 <= top_k <= min(E={e}, 16)")
    if valid_rows is not None and (valid_rows.dtype != torch.int32 or valid_rows.numel() != 1
                                   or valid_rows.device != x.device):
        _fail("valid_rows", f"{valid_rows.dtype} {tuple(valid_rows.shape)}",
              "int32 [1] on the device of x")
    for name, ten in (("gate_weight", gate_weight), ("gate_bias", gate_bias)):
        if ten.device != x.device:
            _fail(name, ten.device, f"the device of x ({x.device})")
    if out is None:
        out = alloc_routing(t, top_k, e, d, x.device)
    _check_out_routing(out, t, top_k, e, d)
    split = out.logits.shape[0]
    block_t = min(64, _np2(max(t, 16)))
    select = t <= _SELECT_ROWS  # the last logits CTA selects all rows (1 launch)
    sel_rows = min(_SELECT_ROWS, _np2(t))  # 1 row: a [1, E] tile, 4x less per thread
    sel = dict(SPLIT=split, TOP_K=top_k, HAS_VALID=valid_rows is not None,
               **_record_consts(out))
    valid = valid_rows if valid_rows is not None else out.ids
    # <= 4 rows: 8 warps for the select in the last CTA (a shorter dependent chain: 2 values a
    # thread at 1 row); the logits keep their bits (each element is the same chain of
    # m16n8k16 MMAs in K order at 4 or 8 warps)
    K._router_logits_kernel[(triton.cdiv(e, _ROUTER_BLOCK_E), split, triton.cdiv(t, block_t))](
        x, gate_weight, out.logits, gate_bias, valid, out.ids, out.weights, out.entries,
        out.tiles, out.tick, t, d, x.stride(0), float(route_scale), E=e, BLOCK_T=block_t,
        BLOCK_E=_ROUTER_BLOCK_E, BLOCK_K=_ROUTER_BLOCK_K, K_CHUNK=_ROUTER_K_CHUNK,
        SELECT=select, SEL_ROWS=sel_rows, K_PAD=max(_np2(top_k), 16 // sel_rows), **sel,
        num_warps=_SELECT_WARPS if select else 4)
    if not select:
        # One CTA of 8 warps per row: [1, E] tiles of 2 values a thread, so ptxas keeps all
        # SPLIT partial loads in flight at once (4 rows x 4 warps: 16 values a thread, loads
        # interleaved with the adds, ~6 dependent L2 round trips; docs/kernels/moe.md).
        K._router_select_kernel[(t,)](
            out.logits, gate_bias, valid, out.ids, out.weights, out.entries, out.tiles,
            out.tick, t, float(route_scale), E=e, BLOCK_T=1, K_PAD=_np2(top_k), **sel,
            num_warps=_SELECT_WARPS)
    return out


def build_routing(ids: torch.Tensor, weights: torch.Tensor, n_experts: int, hidden: int = 0,
                  out: Routing | None = None) -> Routing:
    """Routing record for given ``ids int32 [T, k]`` (values in ``[0, n_experts)`` or -1; the
    ids of one row distinct) and ``weights fp32 [T, k]`` (one launch; copies into ``out``)."""
    if ids.dim() != 2 or ids.dtype != torch.int32:
        _fail("ids", f"{ids.dtype} {tuple(ids.shape)}", "int32 [T, k]")
    if weights.dtype != torch.float32 or weights.shape != ids.shape:
        _fail("weights", f"{weights.dtype} {tuple(weights.shape)}",
              f"fp32 {tuple(ids.shape)}")
    t, k = ids.shape
    if out is None:
        out = alloc_routing(t, k, n_experts, max(hidden, 1), ids.device)
    if (out.rows, out.top_k, out.n_experts) != (t, k, n_experts):
        _fail("out", f"Routing(rows={out.rows}, top_k={out.top_k}, E={out.n_experts})",
              f"alloc_routing({t}, {k}, {n_experts}, ...)")
    out.ids.copy_(ids)
    out.weights.copy_(weights)
    _launch_record(out)
    return out


# --------------------------------------------------------------------------- experts


@dataclass(frozen=True)
class MoEWorkspace:
    """Scratch of ``moe_experts`` for ``T`` rows, ``k`` slots: ``h`` bf16 ``[T*k + T, I]``
    (SwiGLU outputs; the last T rows are the shared expert's), ``part`` fp32
    ``[T*k + T, D]`` (per-entry W2 outputs, summed in slot order by the combine), ``gu`` fp32
    ``[S, T*k + T, 2I]`` (W1|W3 split-K partials, S = the config's ``up_split``; ``S = 0``
    when it is 1), ``tick`` int32 ``[tick_size(...)]``, zeros: the ticket counters of the
    last-arriving-CTA epilogues (``_triton._last_arrival``: every call leaves them at zero
    again). Not to be shared by two calls in flight at once (e.g. on two streams)."""

    h: torch.Tensor
    part: torch.Tensor
    gu: torch.Tensor
    tick: torch.Tensor


def _tick_layout(rows: int, top_k: int, hidden: int, inter: int, cfg: MoEConfig):
    """(W1|W3 tickets: one per (m tile, n block) for the most m tiles any routing of these rows
    has (``max_tiles <= rows * top_k``), W2 tickets: one per D column block)."""
    m_tiles = rows * top_k + -(-rows // cfg.block_m)
    return m_tiles * -(-inter // cfg.up_n), -(-hidden // cfg.down_n)


def alloc_moe_workspace(rows: int, top_k: int, hidden: int, inter: int, device,
                        config: MoEConfig | None = None) -> MoEWorkspace:
    """Workspace for ``moe_experts(..., config=config)``; ``config=None``: the one
    ``pick_config`` gives for these rows on ``device``."""
    cfg = config or pick_config(rows, top_k, torch.device(device).type == "cuda", inter, hidden)
    n = rows * top_k + rows
    split = cfg.up_split if cfg.up_split > 1 else 0
    return MoEWorkspace(h=torch.empty(n, inter, dtype=torch.bfloat16, device=device),
                        part=torch.empty(n, hidden, dtype=torch.float32, device=device),
                        gu=torch.empty(split, n, 2 * inter, dtype=torch.float32, device=device),
                        tick=torch.zeros(sum(_tick_layout(rows, top_k, hidden, inter, cfg)),
                                         dtype=torch.int32, device=device))


# Bit positions (code bit 0, 1, 2, sign) of value k = 8j + o in repacked word j (_triton.py).
REPACK_BITS = ((6, 7, 8, 15), (22, 23, 24, 31), (0, 1, 2, 9), (16, 17, 18, 25),
               (3, 4, 5, 12), (19, 20, 21, 28), (10, 11, 13, 14), (26, 27, 29, 30))


def repack_mxfp4(packed: torch.Tensor) -> torch.Tensor:
    """Checkpoint MXFP4 rows ``uint8 [..., K/2]`` (low nibble = even k) -> the kernels' layout
    ``int32 [..., K/8]``: word ``j`` holds the 8 values ``k = 8j + o``, the 4 bits of value
    ``o`` (e2m1 code bits 0..2, sign) at bits ``REPACK_BITS[o]``. A bit permutation within
    each 4 bytes: the bytes read per step are unchanged. Load time only (allocates)."""
    if packed.dtype != torch.uint8 or packed.shape[-1] % 4:
        _fail("packed", f"{packed.dtype} {tuple(packed.shape)}", "uint8 [..., K/2], K % 8 == 0")
    n_words = packed.shape[-1] // 4
    out = torch.empty(*packed.shape[:-1], n_words, dtype=torch.int32, device=packed.device)
    flat_in, flat_out = packed.reshape(-1, packed.shape[-1]), out.view(-1, n_words)
    step = max(1, (1 << 24) // packed.shape[-1])  # rows per chunk: bounded temporaries
    for r in range(0, flat_in.shape[0], step):
        chunk = flat_in[r:r + step].to(torch.int64)
        nib = torch.stack((chunk & 15, chunk >> 4), -1).reshape(chunk.shape[0], n_words, 8)
        word = torch.zeros(chunk.shape[0], n_words, dtype=torch.int64, device=packed.device)
        for o, bits in enumerate(REPACK_BITS):
            for b, pos in enumerate(bits):
                word |= ((nib[..., o] >> b) & 1) << pos
        flat_out[r:r + step] = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
    return out


def granule_major(words: torch.Tensor) -> torch.Tensor:
    """Repacked rows ``int32 [E, N, K/8]`` -> ``[E, K/64, N, 8]``: each 64-input granule of
    all N rows is one contiguous block. ``prepare_moe_weights`` lays W2 out this way where
    I % 128 == 64 (TP=4: I = 576), where W2's K step can only be 64 inputs: a step of a CTA's
    32-64 rows is then one contiguous 1-2 KB run of whole lines instead of one 32-byte sector
    of every 288-byte row (measured: W2 -9 % at 6 and 48 rows, the layer -2.3 to -3.4 % from
    6 rows). Where the steps read 64-128 bytes a row (W1|W3; W2 at I = 2304) this layout
    measured slower (docs/kernels/moe.md, session 9). Load time only."""
    e, n, kw = words.shape
    if kw % 8:
        _fail("words", tuple(words.shape), "[E, N, K/8] with K % 64 == 0")
    return words.view(e, n, kw // 8, 8).permute(0, 2, 1, 3).contiguous()


@dataclass(frozen=True)
class MoEWeights:
    """One MoE layer's expert weights in the kernels' layout (``prepare_moe_weights``).

    w13         int32 ``[E, 2I, D/8]``: W1 (rows 0..I-1) then W3 (rows I..2I-1), MXFP4 repacked
                by ``repack_mxfp4``; w13_scales uint8 ``[E, 2I, D/b]`` ue8m0 per ``b`` inputs.
    w2          int32 ``[E, D, I/8]``, or where I % 128 == 64 granule-major ``[E, I/64, D, 8]``
                (``granule_major``: ``w2[e, g, n, j]`` = word ``8g + j`` of row n, inputs
                ``64g .. 64g + 63``); w2_scales uint8 ``[E, D, I/b]`` (row-major).
    shared      None or ``(w13 e4m3 [2I, D], scale uint8 [2I/32, D/32], w2 e4m3 [D, I],
                scale uint8 [D/32, I/32])``: the checkpoint layout, one ue8m0 per 32x32 block.
    block       b, the MXFP4 scale block: 32 (V4.1) or 16.
    """

    w13: torch.Tensor
    w13_scales: torch.Tensor
    w2: torch.Tensor
    w2_scales: torch.Tensor
    shared: tuple | None
    block: int

    @property
    def n_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w2.shape[2] if self.w2_granule else self.w2.shape[1]

    @property
    def w2_granule(self) -> bool:
        """W2 stored granule-major (``granule_major``)."""
        return self.w2.dim() == 4

    @property
    def inter(self) -> int:
        return self.w13.shape[1] // 2


def prepare_moe_weights(w13: torch.Tensor, w13_scales: torch.Tensor, w2: torch.Tensor,
                        w2_scales: torch.Tensor, shared=None) -> MoEWeights:
    """Load-time step: checkpoint-layout stacked tensors -> ``MoEWeights``.

    w13 uint8 ``[E, 2I, D/2]`` (W1 rows then W3 rows of each expert; two e2m1 per byte, low
    nibble = even input index) + w13_scales uint8 ``[E, 2I, D/b]``; w2 uint8 ``[E, D, I/2]`` +
    w2_scales uint8 ``[E, D, I/b]``; b = 32 or 16 (read from the scale shapes); ``shared`` as
    in ``MoEWeights``. The bits are permuted within each 32-bit word (``repack_mxfp4``) so the
    kernel turns 8 values into bf16 with a few 32-bit operations, and where I % 128 == 64
    W2's words are stored granule-major (``granule_major``: each K step of a CTA reads whole
    lines); the scales and the shared expert keep the checkpoint layout.
    ue8m0 scale bytes must lie in [64, 191] (weights between 2^-64 and 2^66; real checkpoints
    use ~110..130): the kernels scale by ``2^(s-64)`` in bf16. Not for the decode step: it
    allocates the repacked copies.
    """
    e, d, inter, block = _check_weights(w13, w13_scales, w2, w2_scales, shared)
    shared = None if shared is None else tuple(t.contiguous() for t in shared)
    w2 = repack_mxfp4(w2)
    if inter % 128 == 64:
        w2 = granule_major(w2)
    return MoEWeights(repack_mxfp4(w13), w13_scales.contiguous(), w2, w2_scales.contiguous(),
                      shared, block)


def stack_experts(state: dict, prefix: str, n_experts: int) -> MoEWeights:
    """Checkpoint tensors of one MoE layer (``{prefix}experts.{e}.w1.weight`` ... and
    ``{prefix}shared_experts.w1.weight`` ..., spec §2) -> ``prepare_moe_weights``."""
    def ex(e, w, what):
        return state[f"{prefix}experts.{e}.{w}.{what}"]

    w13 = torch.stack([torch.cat((ex(e, "w1", "weight"), ex(e, "w3", "weight")))
                       for e in range(n_experts)])
    s13 = torch.stack([torch.cat((ex(e, "w1", "scale"), ex(e, "w3", "scale")))
                       for e in range(n_experts)])
    w2 = torch.stack([ex(e, "w2", "weight") for e in range(n_experts)])
    s2 = torch.stack([ex(e, "w2", "scale") for e in range(n_experts)])
    sh = f"{prefix}shared_experts."
    shared = None
    if f"{sh}w1.weight" in state:
        shared = (torch.cat((state[f"{sh}w1.weight"], state[f"{sh}w3.weight"])),
                  torch.cat((state[f"{sh}w1.scale"], state[f"{sh}w3.scale"])),
                  state[f"{sh}w2.weight"], state[f"{sh}w2.scale"])
    return prepare_moe_weights(w13, s13, w2, s2, shared)


def _check_weights(w13, w13_scales, w2, w2_scales, shared):
    """Checkpoint-layout checks; returns (E, D, I, block)."""
    if w13.dim() != 3 or w13.dtype != torch.uint8:
        _fail("w13", f"{w13.dtype} {tuple(w13.shape)}", "uint8 [E, 2I, D/2] (packed e2m1)")
    e, i2, dh = w13.shape
    d, i = 2 * dh, i2 // 2
    if i2 % 2 or i % 32 or d % 32:
        _fail("w13", tuple(w13.shape), "I and D multiples of 32")
    if w13_scales.dtype != torch.uint8 or w13_scales.dim() != 3 or \
            tuple(w13_scales.shape[:2]) != (e, i2) or d % w13_scales.shape[2] or \
            d // w13_scales.shape[2] not in (16, 32):
        _fail("w13_scales", f"{w13_scales.dtype} {tuple(w13_scales.shape)}",
              f"uint8 [{e}, {i2}, {d}/b] with b = 32 or 16")
    block = d // w13_scales.shape[2]
    if w2.dtype != torch.uint8 or tuple(w2.shape) != (e, d, i // 2):
        _fail("w2", f"{w2.dtype} {tuple(w2.shape)}", f"uint8 [{e}, {d}, {i // 2}]")
    if w2_scales.dtype != torch.uint8 or tuple(w2_scales.shape) != (e, d, i // block):
        _fail("w2_scales", f"{w2_scales.dtype} {tuple(w2_scales.shape)}",
              f"uint8 [{e}, {d}, {i // block}] (same block as w13_scales)")
    if shared is not None:
        if len(shared) != 4:
            _fail("shared", f"{len(shared)} tensors", "(w13, w13_scale, w2, w2_scale)")
        want = ((torch.float8_e4m3fn, (i2, d)), (torch.uint8, (i2 // 32, d // 32)),
                (torch.float8_e4m3fn, (d, i)), (torch.uint8, (d // 32, i // 32)))
        names = ("shared[0] (w13)", "shared[1] (w13 scale)", "shared[2] (w2)",
                 "shared[3] (w2 scale)")
        for name, ten, (dt, shape) in zip(names, shared, want, strict=True):
            if ten.dtype != dt or tuple(ten.shape) != shape:
                _fail(name, f"{ten.dtype} {tuple(ten.shape)}", f"{dt} {list(shape)}")
    return e, d, i, block


def moe_experts(x: torch.Tensor, routing: Routing, weights: MoEWeights,
                out: torch.Tensor | None = None, workspace: MoEWorkspace | None = None,
                config: MoEConfig | None = None) -> torch.Tensor:
    """``out[t] = sum_i weights[t, i] * E_{ids[t, i]}(x[t]) + Shared(x[t])`` (spec §6.2-6.3).

    x           bf16 ``[T, D]``, unit column stride.
    routing     ``Routing`` of the same T (from ``route`` or ``build_routing``).
    weights     ``MoEWeights`` from ``prepare_moe_weights`` (MXFP4 routed experts, optional FP8
                shared expert).
    Expert math: ``g, u = W1 x, W3 x`` (fp32 accumulate of bf16 x and the exactly dequantised
    weights), ``h = silu(min(g, 10)) * clamp(u, -10, 10)`` rounded to bf16, ``W2 h`` in fp32;
    the combine sums the k slots in order in fp32, then the shared expert, and rounds to bf16.
    Rows whose slots are all -1 (padding) get the shared expert only.
    out         optional bf16 ``[T, D]`` (unit column stride); workspace optional
                ``alloc_moe_workspace``; config optional ``MoEConfig`` (``pick_config``).
    """
    if x.dim() != 2 or x.dtype != torch.bfloat16 or x.stride(1) != 1:
        _fail("x", f"{x.dtype} {tuple(x.shape)}", "bf16 [T, D] with unit column stride")
    if not isinstance(weights, MoEWeights):
        _fail("weights", type(weights).__name__, "MoEWeights (prepare_moe_weights)")
    t = x.shape[0]
    n_exp, d, inter, block = weights.n_experts, weights.hidden, weights.inter, weights.block
    if x.shape[1] != d:
        _fail("x", tuple(x.shape), f"[T, {d}] (D of the weights)")
    if routing.rows != t or routing.n_experts != n_exp:
        _fail("routing", f"rows={routing.rows}, E={routing.n_experts}", f"rows={t}, E={n_exp}")
    for name, ten in (("weights", weights.w13), ("routing", routing.ids)):
        if ten.device != x.device:
            _fail(name, ten.device, f"the device of x ({x.device})")
    if out is None:
        out = torch.empty(t, d, dtype=torch.bfloat16, device=x.device)
    elif out.dtype != torch.bfloat16 or tuple(out.shape) != (t, d) or out.stride(1) != 1:
        _fail("out", f"{out.dtype} {tuple(out.shape)}", f"bf16 [{t}, {d}], unit column stride")
    k = routing.top_k
    cfg = config or pick_config(t, k, x.is_cuda, inter, d)
    if cfg.block_m != routing.block_m:
        _fail("config.block_m", cfg.block_m, f"routing.block_m = {routing.block_m}")
    split = cfg.up_split
    if d % (32 * split):
        _fail("config.up_split", split, f"D = {d} divisible by 32 * up_split")
    n_up_ticks, n_down_ticks = _tick_layout(t, k, d, inter, cfg)
    if workspace is None:
        workspace = alloc_moe_workspace(t, k, d, inter, x.device, cfg)
    elif tuple(workspace.h.shape) != (t * k + t, inter) or \
            tuple(workspace.part.shape) != (t * k + t, d) or \
            (split > 1 and tuple(workspace.gu.shape) != (split, t * k + t, 2 * inter)) or \
            workspace.tick.numel() != n_up_ticks + n_down_ticks:
        _fail("workspace", f"h {tuple(workspace.h.shape)}, gu {tuple(workspace.gu.shape)}",
              f"alloc_moe_workspace({t}, {k}, {d}, {inter}, device, config) (up_split {split})")
    n_entries = t * k
    tiles = routing.max_tiles
    shared = weights.shared
    sh_tiles = triton.cdiv(t, cfg.block_m) if shared is not None else 0
    m_tiles = tiles + sh_tiles
    w = weights
    sw13, ss13, sw2, ss2 = shared if shared is not None else (w.w13, w.w13_scales, w.w2,
                                                              w.w2_scales)
    launch = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                  INTERPRETER=not x.is_cuda)
    up_launch = dict(launch, num_stages=cfg.up_stages)
    if cfg.up_maxnreg and x.is_cuda:
        up_launch["maxnreg"] = cfg.up_maxnreg
    # grids (n tiles [x split], m tiles): the m tile varies slowest, so the shared expert's
    # tiles (first) start first; axis 1 <= 65535 holds (T <= 4096 / k entries)
    up_k = _k_step(cfg.up_k, d // split)
    join = _join_gate_up(cfg, up_k, block)
    up_args = (x, routing.entries, routing.tiles, w.w13, w.w13_scales, sw13, ss13, workspace.h,
               workspace.gu, workspace.tick, t, x.stride(0), n_entries, sh_tiles)
    up_const = dict(D=d, I=inter, TOP_K=k, SCALE_BLOCK=block, BLOCK_M=cfg.block_m,
                    BLOCK_N=cfg.up_n, BLOCK_K=up_k, SPLIT=split)
    n_items = triton.cdiv(inter, cfg.up_n) * split  # of one tile
    K._moe_up_kernel[(n_items, m_tiles)](*up_args, **up_const, JOIN=join, **up_launch)
    # The rule: the combine rides on W2's last CTA per column block up to 3 rows; above, a
    # launch of T x D/1024 CTAs does it (measured at 0e9b594, docs/kernels/moe.md).
    combine = t <= min(cfg.block_m, _COMBINE_FUSED_ROWS)
    K._moe_down_kernel[(triton.cdiv(d, cfg.down_n), m_tiles)](
        workspace.h, routing.entries, routing.tiles, w.w2, w.w2_scales, sw2, ss2, workspace.part,
        routing.ids, routing.weights, out, workspace.tick[n_up_ticks:], t, n_entries, sh_tiles,
        out.stride(0), D=d, I=inter, TOP_K=k, SCALE_BLOCK=block, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.down_n, BLOCK_K=_k_step(cfg.down_k, inter), COMBINE=combine,
        W2_GRANULE=w.w2_granule, **launch)
    if not combine:
        K._moe_combine_kernel[(t, triton.cdiv(d, _COMBINE_BLOCK_D))](
            workspace.part, routing.ids, routing.weights, out, d, n_entries, out.stride(0),
            TOP_K=k, HAS_SHARED=shared is not None, BLOCK_D=_COMBINE_BLOCK_D, num_warps=4)
    return out
