"""HBM byte floors of a decode step (spec §11), computed from the config and the weight table.

Per TP rank, for ``T`` rows (``B`` requests x ``q_len`` rows each) at context ``L`` per request:

- **static weights**: every stored tensor the rank holds except routed experts, engram tables
  and the embedding table (from ``weights.param_bytes``); read once per step.
- **routed experts**: the expected number of distinct experts touched per layer,
  ``E(T) = E (1 - (1 - k/E)^T)`` (uniform independent routing; upper bound ``min(kT, E)``),
  times the bytes of one expert on the rank, times the layers.
- **gathers**: ``T`` embedding rows and, per engram layer, the rank's ``C/tp`` table rows per row.
- **caches** per request (replicated on every rank, as in vLLM's TP layout): the window
  (``min(L, W)`` records of 528 B per layer), the selected compressed entries
  (``min(index_topk, L // r)`` records of 288 B per layer with ``r > 0``; a request's rows share
  them), and the index keys every indexing layer scores densely (``L // r`` records of 68 B).

Times use ``HBM_TBPS`` (4.5 TB/s, what real kernels reach on an H200).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4_decode.bench.results import HBM_TBPS
from dsv4_decode.config import ModelConfig
from dsv4_decode.formats import (
    COMPRESSED_RECORD_BYTES,
    INDEX_KEY_RECORD_BYTES,
    WINDOW_RECORD_BYTES,
)

SPEC_ROWS_PER_REQUEST = 6  # DSpark verification: 5 drafts + 1


@dataclass(frozen=True)
class StepBytes:
    rows: int
    requests: int
    q_len: int
    static: int
    experts: float  # expected distinct experts per layer
    routed: float
    routed_upper: int
    gathers: int
    caches: int

    @property
    def total(self) -> float:
        return self.static + self.routed + self.gathers + self.caches

    @property
    def floor_us(self) -> float:
        return self.total / (HBM_TBPS * 1e6)


def split_rows(rows: int) -> tuple[int, int]:
    """``rows`` -> (requests, q_len): a multiple of 6 is requests x 6 speculative rows, else one
    row per request."""
    if rows % SPEC_ROWS_PER_REQUEST == 0:
        return rows // SPEC_ROWS_PER_REQUEST, SPEC_ROWS_PER_REQUEST
    return rows, 1


def cache_bytes_per_request(cfg: ModelConfig, context: int) -> int:
    """Window + selected compressed entries + densely scored index keys, one request, one step."""
    total = 0
    ratio = {p.layer: p.ratio for p in cfg.layers}
    for p in cfg.layers[: cfg.num_hidden_layers]:
        total += min(context, cfg.sliding_window) * WINDOW_RECORD_BYTES
        if p.ratio == 0:
            continue
        n_c = context // p.ratio
        total += min(cfg.index_topk, n_c) * COMPRESSED_RECORD_BYTES
        if p.mode in ("full", "reindex"):
            total += (context // ratio[p.kv_source]) * INDEX_KEY_RECORD_BYTES
    return total


def step_bytes(cfg: ModelConfig, tp: int, rows: int, context: int) -> StepBytes:
    """Bytes of one step per rank; caches are modelled for V4.1's records only (0 for V4)."""
    from dsv4_decode.weights import param_bytes

    by = param_bytes(cfg, tp)
    static = sum(v for k, v in by.items()
                 if k not in ("routed_experts", "engram_tables", "embed"))
    n_layers, n_exp, k = cfg.num_hidden_layers, cfg.n_routed_experts, cfg.num_experts_per_tok
    per_expert = by["routed_experts"] / (n_layers * n_exp)
    expected = n_exp * (1 - (1 - k / n_exp) ** rows)
    requests, q_len = split_rows(rows)
    shapes = cfg.rank_shapes(tp)
    row_bytes = cfg.engram_head_dim + cfg.engram_head_dim // 32  # fp8 row + ue8m0 scales
    gathers = rows * cfg.hidden_size * 2 + rows * len(cfg.engram_layer_ids) * (
        shapes.engram_columns * row_bytes)
    return StepBytes(rows, requests, q_len, static, expected, expected * per_expert * n_layers,
                     int(min(k * rows, n_exp) * per_expert * n_layers), gathers,
                     0 if cfg.is_v4 else requests * cache_bytes_per_request(cfg, context))


def format_param_table(cfg: ModelConfig, tp: int) -> str:
    from dsv4_decode.weights import param_bytes, param_counts

    counts, by = param_counts(cfg, tp), param_bytes(cfg, tp)
    lines = [f"parameters and storage bytes per rank (tp={tp}):",
             f"  {'component':16s} {'params':>16s} {'bytes':>18s}"]
    for comp in counts:
        lines.append(f"  {comp:16s} {counts[comp]:16,d} {by[comp]:18,d}")
    lines.append(f"  {'total':16s} {sum(counts.values()):16,d} {sum(by.values()):18,d}")
    return "\n".join(lines)


def format_step_floor(cfg: ModelConfig, tp: int, rows_list: list[int], context: int) -> str:
    lines = [f"HBM byte floor of one decode step per rank (tp={tp}, context {context:,} tokens "
             f"per request, {HBM_TBPS} TB/s; engram tables excluded, their gathered rows "
             f"included):",
             *(["  (V4: cache bytes are not modelled, only weights and gathers)"]
               if cfg.is_v4 else []),
             f"  {'rows':>5s} {'req x q':>8s} {'static MB':>10s} {'E(T)':>7s} {'routed MB':>10s}"
             f" {'(upper)':>9s} {'caches MB':>10s} {'total MB':>10s} {'floor us':>9s}"]
    for rows in rows_list:
        s = step_bytes(cfg, tp, rows, context)
        lines.append(f"  {rows:5d} {f'{s.requests}x{s.q_len}':>8s} {s.static / 1e6:10.1f} "
                     f"{s.experts:7.2f} {s.routed / 1e6:10.1f} {s.routed_upper / 1e6:9.1f} "
                     f"{s.caches / 1e6:10.1f} {s.total / 1e6:10.1f} {s.floor_us:9.1f}")
    return "\n".join(lines)
