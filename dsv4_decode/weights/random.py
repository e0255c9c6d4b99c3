"""Random weights at any config, generated directly in the checkpoint's storage formats.

``random_weights(cfg, seed, device, tp, rank)`` returns the WEIGHT DICT CONTRACT of
``dsv4_decode.weights`` for one TP rank: same names, shapes, dtypes and formats as a loaded
checkpoint (``names.param_table``), so kernels, the reference and the engine run on it unchanged.

Generation (fast enough for one TP=4 rank of v41-flash, ~75 GB, in seconds on a GPU):
- quantized values are random bytes made on the device: FP4 experts are uniform random bytes
  (both nibbles uniform over the 16 e2m1 codes); FP8 codes are random bytes whose exponent
  field is forced into 4..11 (magnitudes 2^-3 .. 30, random sign and mantissa; never the NaN
  codes 0x7F / 0xFF);
- each block scale is ``2^(c-1)`` or ``2^(c+1)``, chosen at random per block with the mix
  that makes the expected mean square of the dequantized weight equal the target RMS below,
  so the scales vary by 4x from block to block (a kernel reading the wrong scale fails);
- bf16 / fp32 tensors are ``mean + std * randn``;
- the routed experts of a layer live in one stacked ``[E, ...]`` tensor per projection; the
  per-expert entries are views of it (``expert_stack`` hands it out without a copy).

Reproducibility and TP: every split tensor larger than 64 MiB is cut along its split dim into
fixed units (8 equal parts, or the engram hash-column buckets), each drawn from its own
generator seeded by ``(seed, name, unit)``; smaller ones are one unit, drawn whole on every
rank. A rank's shard is therefore exactly the matching slice of the tp = 1 tensor for every
tp, and replicated tensors are identical on every rank. Values depend on the seed and the
device (CPU and CUDA generators differ; CUDA's draw layout follows the GPU's SM count, so use
one GPU model), not on tp.

Magnitudes (the stream S starts at RMS ~1; every sublayer adds outputs of RMS ~0.1-0.3):
- linear weights ``N(0, 1/fan_in)``: unit-RMS inputs give unit-RMS outputs (q, kv, indexer,
  compressor, expert w1/w3, shared w1/w3, wo_a); the projections that write into the stream
  (``wo_b``, expert and shared ``w2``) carry a gain of ``OUT_GAIN`` = 0.3, and ``engram.wkv``
  0.5 (its V half is added to the stream through a sigmoid gate);
- RMSNorm weights, engram ``q_weight`` / ``k_weight``: ``N(1, 0.1)``;
- mHC: ``hc_*_fn ~ N(0, 1/(N*D))`` so the mix logits ``m`` are ~N(0, 1); ``hc_*_scale ~ 0.5``;
  ``hc_*_base`` = 0 for pre and post (pre ~ 0.5, post ~ 1) and +2 on the diagonal of the
  ``N x N`` residual logits (each stream keeps ~70 % of itself; Sinkhorn well conditioned),
  plus ``N(0, 0.1)`` everywhere;
- ``attn_sink ~ N(0, 0.1)``; router ``gate.weight ~ N(0, 0.25/D)`` (logits ~N(0, 0.5^2): near
  uniform, yet a clear top-k), ``gate.bias`` / ``bias_vl ~ N(0, 0.05)``;
- ``embed ~ N(0, 1)``, ``head ~ N(0, 1/D)`` (logits ~N(0, 1)); engram table rows RMS 1.
- V4 only: compressor position bias ``ape ~ N(0, 0.5)`` (gate logits are ~N(0, 1));
  ``hc_head_fn ~ N(0, 1/(N*D))``, ``hc_head_base ~ N(0, 0.1)``, ``hc_head_scale ~ 0.5``;
  ``gate.tid2eid``: per token ``top_k`` distinct expert ids, uniform.
Through the reference model (``tests/weights/test_activations_o1.py``) the stream RMS goes
from 1.0 to ~1.6 over 26 layers; attention adds ~0.12, the MoE ~0.22, engram ~0.25.

Engram tables of the released config are ~98 GB per layer (25 GB per TP=4 rank):
``engram_tables=False`` leaves the ``engram.embed.*`` entries out of the dict altogether (a
consumer that needs them fails with a KeyError, never reads stand-in values).
"""

from __future__ import annotations

import hashlib
import math

import torch
from tqdm import tqdm

from ..config import ModelConfig
from ..formats import E2M1_VALUES
from .names import Param, engram_offsets, param_table, stack_key
from .shard import check_tp, local_shape, storage_range

OUT_GAIN = 0.3  # gain of the projections that write into the residual streams
UNITS = 8  # generation units along a split dim (the largest tp)
_WHOLE_BYTES = 1 << 26  # split tensors up to this size (all ranks) are drawn whole
_CHUNK = 1 << 26  # int64 words per in-place pass when shaping FP8 codes (bounds temps)


def random_weights(cfg: ModelConfig, seed: int = 0, device="cpu", tp: int = 1, rank: int = 0,
                   progress: bool = False, engram_tables: bool = True) -> dict[str, torch.Tensor]:
    """Seeded random weights of ``cfg`` for TP rank ``rank`` of ``tp`` on ``device``.

    Returns ``{checkpoint name: tensor}`` in the storage formats of ``names.param_table`` (FP8
    weights with ue8m0 32x32 block scales, packed MXFP4 experts when ``cfg.quantized``; bf16
    otherwise), rank-local shards per spec §10.4. ``engram_tables=False`` omits the engram
    tables (see the module docstring). Raises ValueError when ``cfg`` cannot be split ``tp``
    ways. Not graph related (allocates); run once at start-up.
    """
    check_tp(cfg, tp, rank)
    device = torch.device(device)
    groups: dict[str, list[Param]] = {}
    for p in param_table(cfg):
        if p.component == "engram_tables" and not engram_tables:
            continue
        groups.setdefault(stack_key(p), []).append(p)
    sizes = {k: len(ps) * math.prod(local_shape(ps[0], cfg, tp, rank)) * ps[0].dtype.itemsize
             for k, ps in groups.items()}
    out: dict[str, torch.Tensor] = {}
    with tqdm(total=sum(sizes.values()), unit="B", unit_scale=True, disable=not progress,
              desc=f"random weights (rank {rank}/{tp})") as bar:
        for key, ps in groups.items():
            stacked = ps[0].expert >= 0
            t = _generate(key, ps[0], len(ps) if stacked else 0, cfg, seed, device, tp, rank)
            if stacked:
                for e, p in enumerate(ps):
                    out[p.name] = t[e]
            else:
                out[ps[0].name] = t
            bar.update(sizes[key])
    return out


def init_stats(p: Param, cfg: ModelConfig) -> tuple[float | torch.Tensor, float]:
    """(mean, std) that ``p``'s values are drawn with (for a scale: of the weight it scales)."""
    name = p.weight_name
    D, N = cfg.hidden_size, cfg.hc_mult
    if name.endswith("norm.weight") or name.endswith(("engram.q_weight", "engram.k_weight")):
        return 1.0, 0.1
    if name.endswith("_fn"):
        return 0.0, 1.0 / math.sqrt(N * D)
    if name == "hc_head_base":
        return 0.0, 0.1
    if name.endswith(".ape"):
        return 0.0, 0.5
    if name.endswith("_base"):
        mean = torch.zeros((2 + N) * N)
        mean[2 * N:].view(N, N).diagonal().fill_(2.0)
        return mean, 0.1
    if name.endswith("_scale"):
        return 0.5, 0.05
    if name.endswith("attn_sink"):
        return 0.0, 0.1
    if name.endswith(".gate.weight"):
        return 0.0, 0.5 / math.sqrt(D)
    if name.endswith((".gate.bias", ".gate.bias_vl")):
        return 0.0, 0.05
    if name == "embed.weight" or name.endswith("engram.embed.weight"):
        return 0.0, 1.0
    fan_in = p.logical[1]
    if name.endswith(("wo_b.weight", "w2.weight")):
        return 0.0, OUT_GAIN / math.sqrt(fan_in)
    if name.endswith("engram.wkv.weight"):
        return 0.0, 0.5 / math.sqrt(fan_in)
    return 0.0, 1.0 / math.sqrt(fan_in)  # every other linear, and head.weight


# --------------------------------------------------------------------------- generation


def _seed(seed: int, key: str, unit: int) -> int:
    h = hashlib.blake2b(f"{seed}/{key}/{unit}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def _units(p: Param, cfg: ModelConfig, stack: int) -> list[tuple[int, int]]:
    """Fixed generation units [u0, u1) in storage indices along ``p.split_dim``: the whole
    tensor when it is replicated or small (every rank draws it and keeps its slice), else 8
    equal parts or the engram hash-column buckets (a rank draws only the units it holds)."""
    n = p.shape[p.split_dim]
    nbytes = max(stack, 1) * math.prod(p.shape) * p.dtype.itemsize
    if p.split is None or nbytes <= _WHOLE_BYTES:
        return [(0, n)]
    if p.split == "engram":
        bounds = engram_offsets(cfg, p.engram)
        return [(bounds[c], bounds[c + 1]) for c in range(len(bounds) - 1)]
    size = -(-n // UNITS)
    return [(k * size, min((k + 1) * size, n)) for k in range(UNITS) if k * size < n]


def _generate(key: str, p: Param, stack: int, cfg: ModelConfig, seed: int, device: torch.device,
              tp: int, rank: int) -> torch.Tensor:
    shape = local_shape(p, cfg, tp, rank)
    full = (stack, *shape) if stack else shape
    dim = p.split_dim + (1 if stack else 0)
    if p.split is None or tp == 1:
        start, stop, n = 0, p.shape[p.split_dim], p.shape[p.split_dim]
    else:
        start, stop, n = storage_range(p, cfg, tp, rank)
    out = torch.empty(full, dtype=p.dtype, device=device)
    if n > stop - start:  # zero-padded vocab rows of the last rank
        out.narrow(dim, stop - start, n - (stop - start)).zero_()
    for u, (u0, u1) in enumerate(_units(p, cfg, stack)):
        o0, o1 = max(u0, start), min(u1, stop)
        if o0 >= o1:
            continue
        dst = out.narrow(dim, o0 - start, o1 - o0)
        whole = (o0, o1) == (u0, u1) and dst.is_contiguous()
        if whole:
            buf = dst
        else:
            ushape = list(full)
            ushape[dim] = u1 - u0
            buf = torch.empty(ushape, dtype=p.dtype, device=device)
        g = torch.Generator(device=device)
        g.manual_seed(_seed(seed, key, u))
        _fill(buf, p, cfg, g)
        if not whole:
            dst.copy_(buf.narrow(dim, o0 - u0, o1 - o0))
    return out


def _fill(buf: torch.Tensor, p: Param, cfg: ModelConfig, g: torch.Generator):
    """Fill the contiguous ``buf`` (one generation unit of ``p``) from ``g``."""
    if p.fmt == "i32":  # tid2eid: distinct expert ids per token
        r = torch.rand(buf.shape[0], cfg.n_routed_experts, generator=g, device=buf.device)
        buf.copy_(r.argsort(dim=-1)[:, : buf.shape[1]])
    elif p.fmt in ("fp8", "rows8", "fp4"):
        raw = buf.view(torch.uint8).view(-1)
        in_place = raw.numel() % 8 == 0 and raw.data_ptr() % 8 == 0
        # same draws either way: one int64 word per 8 bytes of the unit
        words = raw.view(torch.int64) if in_place else torch.empty(
            -(-raw.numel() // 8), dtype=torch.int64, device=buf.device)
        words.random_(-(2**63), None, generator=g)
        if p.fmt != "fp4":
            _shape_e4m3_(words)
        if not in_place:
            raw.copy_(words.view(torch.uint8)[: raw.numel()])
    elif p.is_scale:
        base, thresh = _scale_bytes(init_stats(p, cfg)[1],
                                    FP4_CODE_RMS if p.fmt == "fp4_scale" else FP8_CODE_RMS)
        r = torch.empty(-(-buf.numel() // 8), dtype=torch.int64, device=buf.device)
        r = r.random_(-(2**63), None, generator=g).view(torch.uint8)[: buf.numel()]
        up = (r < thresh).to(torch.uint8).view(buf.shape)
        buf.fill_(base)
        buf.add_(up).add_(up)
    else:
        mean, std = init_stats(p, cfg)
        x = torch.randn(buf.shape, generator=g, device=buf.device, dtype=torch.float32)
        if isinstance(mean, torch.Tensor):
            mean = mean.to(buf.device)
        buf.copy_(x.mul_(std).add_(mean))


def _bytes8(b: int) -> int:
    """The int64 (two's complement) whose 8 bytes all equal ``b``."""
    v = int.from_bytes(bytes([b]) * 8, "little")
    return v - (1 << 64) if v >= 1 << 63 else v


def _shape_e4m3_(words: torch.Tensor):
    """Random bytes (packed 8 per int64) -> e4m3 codes with exponent field 4..11, sign and
    mantissa kept, in place; byte-wise (SWAR) ops that never carry across bytes."""
    tmp = torch.empty(min(words.numel(), _CHUNK), dtype=words.dtype, device=words.device)
    for s in range(0, words.numel(), _CHUNK):
        w = words[s:s + _CHUNK]
        e = torch.bitwise_right_shift(w, 3, out=tmp[: w.numel()])  # each byte's bits 3-5
        e &= _bytes8(0x07)
        e += _bytes8(0x04)
        e <<= 3  # 4..11 into bits 3-6
        w &= _bytes8(0x87)
        w |= e


def _code_rms_e4m3() -> float:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    words = codes.view(torch.int64).clone()
    _shape_e4m3_(words)
    return words.view(torch.float8_e4m3fn).float().pow(2).mean().sqrt().item()


FP8_CODE_RMS = _code_rms_e4m3()
FP4_CODE_RMS = math.sqrt(sum(v * v for v in E2M1_VALUES) / len(E2M1_VALUES))


def _scale_bytes(std: float, code_rms: float) -> tuple[int, int]:
    """(base, thresh): a block's ue8m0 byte is ``base + 2 * (r < thresh)`` for a uniform random
    byte r, i.e. the scale is ``2^(c-1)`` or ``2^(c+1)`` around ``c = round(log2(std /
    code_rms))``, mixed so that E[scale^2] * code_rms^2 = std^2 (up to the 1/256 resolution of
    thresh). Both exponents always occur (the mix weight lies in [0.07, 0.47])."""
    ratio = std / code_rms
    c = round(math.log2(ratio))
    q = ratio * ratio / 4.0**c  # in [1/2, 2): (1 - p) / 4 + 4 p = q
    thresh = round(256 * (4 * q - 1) / 15)
    base = 127 + c - 1
    if not 1 <= base <= 252:
        raise ValueError(f"std: {std} needs scales near 2^{c}, outside the ue8m0 range")
    return base, thresh
