"""Hugging Face checkpoints in the released DeepSeek-V4.1 layout: ``load`` and the synthetic
writer ``save_checkpoint`` (spec §2, §9.1, §10.4).

A checkpoint folder holds ``config.json`` (the V4.1 nested layout, read by
``ModelConfig.from_hf``) and ``*.safetensors`` shards listed by
``model.safetensors.index.json`` (``{"metadata": {...}, "weight_map": {name: file}}``; a folder
with a single unindexed ``*.safetensors`` file also loads). Tensor names are the released
ones, which are the contract names of ``names.param_table`` except for these spellings,
mapped once in ``canonical_name`` / ``_STORAGE``:

- an FP8 scale may be called ``X.weight_scale_inv`` instead of ``X.scale``;
- ue8m0 scales may be stored as ``U8``, ``F8_E8M0`` (same bits) or ``F32`` powers of two;
- packed FP4 experts may be stored as ``U8``, ``I8`` (same bits) or ``F4`` (``[out, in]`` e2m1
  elements, two per byte);
- V4's ``gate.tid2eid`` may be stored as ``I32`` or ``I64`` (expert ids; kept int32);
- ``mtp.*`` (DSpark draft layers) is skipped (out of scope, ``IGNORED_PREFIXES``).

Everything else is checked against the table before any data is read: a missing tensor, an
unknown name, a duplicate, a wrong shape or an unsupported dtype raises ``ValueError`` naming
the tensor and its file. Only this rank's slice of each tensor is read (``safe_open`` slices).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from .. import formats
from ..config import ModelConfig
from .names import Param, param_table, stack_key
from .shard import check_tp, local_shape, pad_to, storage_range

INDEX_FILE = "model.safetensors.index.json"
IGNORED_PREFIXES = ("mtp.",)
_ALIASES = ((".weight_scale_inv", ".scale"),)  # released spelling -> contract spelling
# accepted safetensors dtypes per storage format (first = what save_checkpoint writes)
_STORAGE = {"bf16": ("BF16",), "fp32": ("F32",), "fp8": ("F8_E4M3",), "rows8": ("F8_E4M3",),
            "fp8_scale": ("U8", "F8_E8M0", "F32"), "fp4_scale": ("U8", "F8_E8M0", "F32"),
            "rows8_scale": ("U8", "F8_E8M0", "F32"), "fp4": ("U8", "I8", "F4"),
            "i32": ("I32", "I64")}


def canonical_name(name: str) -> str:
    """The contract name of a released tensor name."""
    for old, new in _ALIASES:
        if name.endswith(old):
            return name[: -len(old)] + new
    return name


def load(model_dir, cfg: ModelConfig | None = None, tp: int = 1, rank: int = 0, device="cpu",
         dequantize: bool = False, progress: bool = True, engram_tables: bool = True
         ) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Load TP rank ``rank`` of ``tp`` of the checkpoint in ``model_dir``.

    cfg: defaults to ``ModelConfig.from_hf(model_dir)``. Returns ``(cfg, weights)`` with
    ``weights`` in the contract (``dsv4_decode.weights``): FP8 weights with their ue8m0 block
    scales and packed MXFP4 experts with their scales, as stored; the routed experts of a layer
    and projection are views of one stacked ``[E, ...]`` tensor (see ``expert_stack``), as
    with ``random_weights``. ``dequantize=True`` turns
    every FP8 / FP4 weight and the engram tables into bf16 (exact: e4m3 / e2m1 times a power
    of two fits bf16) without scale entries and returns ``cfg`` with ``quantized=False``.
    ``engram_tables=False`` skips reading the engram tables (~98 GB per layer in the release;
    their headers are still checked) and leaves them out of the dict.
    """
    model_dir = Path(model_dir)
    cfg = cfg if cfg is not None else ModelConfig.from_hf(model_dir)
    check_tp(cfg, tp, rank)
    device = torch.device(device)
    table = {p.name: p for p in param_table(cfg)}
    where = _locate(model_dir, table)
    by_file: dict[str, list[tuple[str, Param]]] = defaultdict(list)
    for name, (stored, file) in where.items():
        by_file[file].append((stored, table[name]))
    out: dict[str, torch.Tensor] = {}
    stacks: dict[str, torch.Tensor] = {}  # routed experts: one [E, ...] tensor per projection
    with tqdm(total=len(where), unit="tensor", disable=not progress,
              desc=f"load {model_dir.name} (rank {rank}/{tp})") as bar:
        for file, items in by_file.items():
            with safe_open(model_dir / file, framework="pt", device="cpu") as f:
                for stored, p in items:
                    sl = f.get_slice(stored)
                    _check(p, stored, file, sl.get_shape(), sl.get_dtype())
                    if p.component == "engram_tables" and not engram_tables:
                        bar.update()
                        continue
                    t = _read(f, sl, stored, file, p, cfg, tp, rank)
                    if p.expert >= 0:
                        key = stack_key(p)
                        if key not in stacks:
                            stacks[key] = torch.empty((cfg.n_routed_experts, *t.shape),
                                                      dtype=t.dtype, device=device)
                        out[p.name] = stacks[key][p.expert]
                        out[p.name].copy_(t)
                    else:
                        out[p.name] = t.to(device)
                    bar.update()
    out = {n: out[n] for n in table if n in out}  # table order
    if dequantize and cfg.quantized:
        return cfg.replace(quantized=False), _dequantize(out, table, cfg)
    return cfg, out


def load_tokenizer(model_dir):
    """The ``tokenizers.Tokenizer`` of ``model_dir/tokenizer.json``, or None when the folder
    has no ``tokenizer.json``."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        return None
    from tokenizers import Tokenizer  # only needed for text prompts

    return Tokenizer.from_file(str(path))


def save_checkpoint(model_dir, cfg: ModelConfig, weights: dict[str, torch.Tensor],
                    shards: int = 1) -> Path:
    """Write ``weights`` (whole tensors, tp = 1, the contract of ``cfg``) as a checkpoint in
    the released layout: ``config.json`` (``cfg.to_hf()``), ``shards`` safetensors files
    ``model-0000k-of-0000n.safetensors`` of about equal size and the index file. For tests
    and tools; raises ValueError when ``weights`` does not match ``cfg``'s table."""
    table = param_table(cfg)
    names = [p.name for p in table]
    if set(weights) != set(names):
        extra, missing = sorted(set(weights) - set(names)), sorted(set(names) - set(weights))
        raise ValueError(f"weights: do not match the table of cfg (unknown {extra[:5]}, "
                         f"missing {missing[:5]})")
    for p in table:
        t = weights[p.name]
        if tuple(t.shape) != p.shape or t.dtype != p.dtype:
            raise ValueError(f"weights: {p.name} is {t.dtype} {tuple(t.shape)}, the table "
                             f"needs {p.dtype} {p.shape}")
    if shards < 1:
        raise ValueError(f"shards: need at least 1, got {shards}")
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    sizes = [weights[n].numel() * weights[n].dtype.itemsize for n in names]
    total, acc, weight_map = sum(sizes), 0, {}
    groups: list[list[str]] = [[] for _ in range(shards)]
    for n, size in zip(names, sizes, strict=True):
        groups[min(shards - 1, acc * shards // max(total, 1))].append(n)
        acc += size
    for k, group in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        # clone: per-expert entries may be views of one stacked tensor (shared storage)
        save_file({n: weights[n].detach().cpu().contiguous().clone() for n in group},
                  str(model_dir / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in group})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (model_dir / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return model_dir


# --------------------------------------------------------------------------- helpers


def _locate(model_dir: Path, table: dict[str, Param]) -> dict[str, tuple[str, str]]:
    """{contract name: (stored name, file)} for every table entry; ValueError on unknown,
    duplicate or missing names."""
    index = model_dir / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
        if len(files) != 1:
            raise ValueError(f"model_dir: {model_dir} has no {INDEX_FILE} and {len(files)} "
                             f"*.safetensors files (need the index, or exactly one file)")
        with safe_open(files[0], framework="pt") as f:
            weight_map = {k: files[0].name for k in f.keys()}
    where: dict[str, tuple[str, str]] = {}
    for stored, file in weight_map.items():
        if stored.startswith(IGNORED_PREFIXES):
            continue
        name = canonical_name(stored)
        if name not in table:
            raise ValueError(f"checkpoint: unknown tensor {stored!r} in {file} (not in the "
                             f"V4.1 table of this config)")
        if name in where:
            raise ValueError(f"checkpoint: tensor {name!r} appears twice ({where[name][0]!r} in "
                             f"{where[name][1]}, {stored!r} in {file})")
        where[name] = (stored, file)
    for stored, file in where.values():
        if not (model_dir / file).is_file():
            raise ValueError(f"checkpoint: tensor {stored!r} is mapped to {file}, which is not "
                             f"in {model_dir}")
    missing = [n for n in table if n not in where]
    if missing:
        raise ValueError(f"checkpoint: missing tensor {missing[0]!r} (and {len(missing) - 1} "
                         f"more) in {model_dir / INDEX_FILE if index.exists() else model_dir}")
    return where


def _check(p: Param, stored: str, file: str, shape, dtype: str):
    want = p.logical if dtype == "F4" else p.shape
    if dtype not in _STORAGE[p.fmt]:
        raise ValueError(f"checkpoint: tensor {stored!r} in {file} is {dtype}, expected one of "
                         f"{list(_STORAGE[p.fmt])} ({p.fmt})")
    if tuple(shape) != tuple(want):
        raise ValueError(f"checkpoint: tensor {stored!r} in {file} has shape {tuple(shape)}, "
                         f"expected {tuple(want)}")


def _read(f, sl, stored: str, file: str, p: Param, cfg: ModelConfig, tp: int,
          rank: int) -> torch.Tensor:
    """This rank's slice of one tensor, converted to the contract's storage dtype."""
    split = p.split is not None and tp > 1
    if sl.get_dtype() == "F4":  # fp4 elements: read whole, then treat as packed bytes
        t = f.get_tensor(stored).view(torch.uint8)
        if split:
            start, stop, n = storage_range(p, cfg, tp, rank)
            t = pad_to(t.narrow(p.split_dim, start, stop - start), p.split_dim, n)
        return t
    if split:
        start, stop, n = storage_range(p, cfg, tp, rank)
        index = [slice(None)] * len(p.shape)
        index[p.split_dim] = slice(start, stop)
        t = pad_to(sl[tuple(index)], p.split_dim, n)
    else:
        t = sl[:]
    if t.dtype == torch.float32 and p.is_scale:
        return _pow2_to_ue8m0(t, stored, file)
    if t.dtype == torch.int64 and p.dtype == torch.int32:  # V4 tid2eid: expert ids, exact
        t = t.to(torch.int32)
    if t.dtype != p.dtype:
        t = t.view(p.dtype)  # I8 packed FP4, F8_E8M0 scales: same bits
    if tuple(t.shape) != local_shape(p, cfg, tp, rank):
        raise ValueError(f"checkpoint: tensor {stored!r} in {file} sliced to "
                         f"{tuple(t.shape)}, expected {local_shape(p, cfg, tp, rank)}")
    return t


def _pow2_to_ue8m0(t: torch.Tensor, stored: str, file: str) -> torch.Tensor:
    mant, exp = torch.frexp(t)
    if not bool(((mant == 0.5) & (exp - 1 >= -127) & (exp - 1 <= 127)).all()):
        raise ValueError(f"checkpoint: scale {stored!r} in {file} is F32 but not all powers of "
                         f"two in [2^-127, 2^127] (cannot be ue8m0)")
    return (exp - 1 + 127).to(torch.uint8)


def _dequantize(w: dict[str, torch.Tensor], table: dict[str, Param], cfg: ModelConfig):
    """FP8 / MXFP4 / engram-row weights -> bf16 (exact), scale entries dropped."""
    if cfg.weight_block_size[0] != cfg.weight_block_size[1]:
        raise ValueError(f"weight_block_size: dequantize needs square FP8 blocks, got "
                         f"{cfg.weight_block_size}")
    out = {}
    for name, t in w.items():
        p = table[name]
        if p.is_scale:
            continue
        scale = w.get(name[: -len("weight")] + "scale") if p.fmt in ("fp8", "fp4", "rows8") \
            else None
        if p.fmt == "fp8":
            t = formats.dequant_fp8_weight(t, scale, cfg.weight_block_size[0])
        elif p.fmt == "fp4":
            t = formats.dequant_mxfp4(t, scale, cfg.expert_scale_block)
        elif p.fmt == "rows8":
            t = formats.dequant_fp8_32(t.view(torch.uint8), scale)
        out[name] = t.to(torch.bfloat16) if p.fmt in ("fp8", "fp4", "rows8") else t
    return out
