"""The executor's physical cache layout, written down once (design doc, Data contracts).

The reference model keeps its own per-request logical records (``formats.py``); the decode step
keeps them here, in static device buffers that kernels index directly. Three caches:

Window ring (every layer, one per layer)
    ``uint8 [num_slots, ring, D + D/32]`` (528 B records at D = 512, 16-byte aligned).
    Record of request slot ``s`` at position ``p`` lives at ``[s, p % ring]``; its bytes are the
    logical window record of ``formats.py``: bytes ``0 .. D-1`` = e4m3 codes of dims ``0 .. D-1``,
    bytes ``D + b`` = ue8m0 scale of dims ``32b .. 32b+31``.
    ``ring >= window + max_q_len - 1``: a speculative step writes the records of all its
    ``q_len`` rows before attention, and the first row (at ``p0``) still needs position
    ``p0 - window + 1``; with ``ring = window`` the later rows would overwrite it. The default is
    ``window + 8`` (136 at window 128: q_len up to 9).

Compressed KV (per KV-source layer), paged
    ``uint8 [num_pages, page_size, D/2 + D/16]`` (288 B records at D = 512, 16-byte aligned).
    Entry ``j`` (0-based compressed position of the request) of slot ``s`` lives at
    ``[block_table[s, j // page_size], j % page_size]``; its bytes are the logical compressed
    record: bytes ``0 .. D/2-1`` packed e2m1 (byte ``k``: dim ``2k`` low nibble, ``2k+1`` high),
    bytes ``D/2 + b`` = e4m3 scale of dims ``16b .. 16b+15``.

Index keys (per KV-source layer), paged, same block table and page size as its compressed KV
    ``uint8 [num_pages, page_size * (Di/2 + Di/32)]`` (Di = index_head_dim = 128: 68 B/entry),
    split in two planes per page so that every key's nibbles start 16-byte aligned:
    bytes ``[r * Di/2, (r+1) * Di/2)`` of the page = packed e2m1 of row ``r`` (``j % page_size``);
    bytes ``page_size * Di/2 + r * Di/32 + b`` = ue8m0 scale of dims ``32b .. 32b+31`` of row
    ``r``.

Block table: ``int32 [num_slots, max_pages]``, one per KV source (compressed KV and index keys of
that source share it); ``-1`` = no page. Readers mask entries whose page is ``-1`` or whose
``j`` is outside ``[0, max_pages * page_size)``.

The writers below are plain torch index-puts over device tensors: graph-safe (no host sync,
nothing allocated beyond the encoded records). ``PageAllocator`` hands out pages on the host,
outside the captured step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dsv4_decode import formats
from dsv4_decode.config import ModelConfig

DEFAULT_PAGE_SIZE = 64
RING_SLACK = 8  # extra ring records beyond the window: speculative steps up to q_len 9


def window_record_bytes(head_dim: int) -> int:
    """Bytes of one FP8 window record: ``D`` e4m3 codes + ``D/32`` ue8m0 scales (528 at 512)."""
    return head_dim + head_dim // 32


def compressed_record_bytes(head_dim: int) -> int:
    """Bytes of one NVFP4 compressed record: ``D/2`` nibble bytes + ``D/16`` e4m3 scales (288)."""
    return head_dim // 2 + head_dim // 16


def index_key_record_bytes(index_head_dim: int) -> int:
    """Bytes of one MXFP4 index key: ``Di/2`` nibble bytes + ``Di/32`` ue8m0 scales (68)."""
    return index_head_dim // 2 + index_head_dim // 32


def default_ring(window: int, max_q_len: int = RING_SLACK + 1) -> int:
    """Ring length for ``window`` that lets a step of ``max_q_len`` rows see full windows."""
    return window + max(RING_SLACK, max_q_len - 1)


def _check_u8(name: str, t: torch.Tensor, dims: int, last: int | None = None):
    if t.dtype != torch.uint8 or t.dim() != dims:
        raise ValueError(f"{name}: needs a {dims}-d uint8 tensor, got {t.dim()}-d {t.dtype}")
    if last is not None and t.shape[-1] != last:
        raise ValueError(f"{name}: last dim must be {last} bytes, got {t.shape[-1]}")


# ----------------------------------------------------------------------------- window ring


def write_window_records(cache: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                         records: torch.Tensor) -> None:
    """Store encoded records ``uint8 [T, D + D/32]`` of rows at (``slots[T]``,
    ``positions[T]``) into the ring ``cache [num_slots, ring, D + D/32]`` at ``p % ring``."""
    _check_u8("cache", cache, 3)
    _check_u8("records", records, 2, cache.shape[-1])
    ring = cache.shape[1]
    cache[slots.long(), positions.long() % ring] = records


def write_window(cache: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                 kv: torch.Tensor) -> None:
    """QAT-FP8/32 encode the post-RoPE latents ``kv [T, D]`` and store them (see
    ``write_window_records``)."""
    write_window_records(cache, slots, positions, formats.encode_window_record(kv))


def read_window(cache: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor):
    """Records ``uint8 [..., D + D/32]`` at (``slots``, ``positions``) (same shapes)."""
    return cache[slots.long(), positions.long() % cache.shape[1]]


# ----------------------------------------------------------------------------- paged caches


def _page_rows(block_table: torch.Tensor, slots: torch.Tensor, entries: torch.Tensor,
               page_size: int):
    """(page ids, rows in page) of entries ``j`` of ``slots`` (no range check: writers only)."""
    e = entries.long()
    return block_table[slots.long(), e // page_size].long(), e % page_size


def write_compressed_records(pages: torch.Tensor, block_table: torch.Tensor,
                             slots: torch.Tensor, entries: torch.Tensor,
                             records: torch.Tensor) -> None:
    """Store compressed records ``uint8 [N, D/2 + D/16]`` as entries ``entries[N]`` of
    ``slots[N]`` through ``block_table`` into ``pages [num_pages, page_size, D/2 + D/16]``.
    The pages must have been allocated (``PageAllocator.reserve``)."""
    _check_u8("pages", pages, 3)
    _check_u8("records", records, 2, pages.shape[-1])
    page, row = _page_rows(block_table, slots, entries, pages.shape[1])
    pages[page, row] = records


def write_compressed(pages, block_table, slots, entries, latent: torch.Tensor) -> None:
    """QAT-NVFP4/16 encode post-RoPE latents ``[N, D]`` and store them as entries."""
    write_compressed_records(pages, block_table, slots, entries,
                             formats.encode_compressed_record(latent))


def read_compressed(pages: torch.Tensor, block_table: torch.Tensor, slots: torch.Tensor,
                    entries: torch.Tensor) -> torch.Tensor:
    """Records ``uint8 [N, D/2 + D/16]`` of entries ``entries[N]`` of ``slots[N]``."""
    page, row = _page_rows(block_table, slots, entries, pages.shape[1])
    return pages[page, row]


def index_page_bytes(page_size: int, index_head_dim: int) -> int:
    return page_size * index_key_record_bytes(index_head_dim)


def write_index_key_records(pages: torch.Tensor, block_table: torch.Tensor,
                            slots: torch.Tensor, entries: torch.Tensor, records: torch.Tensor,
                            page_size: int) -> None:
    """Store logical 68-byte index-key records ``uint8 [N, Di/2 + Di/32]`` into the two-plane
    pages ``uint8 [num_pages, page_size * (Di/2 + Di/32)]`` (layout: module docstring)."""
    _check_u8("pages", pages, 2)
    rb = records.shape[-1]
    if pages.shape[1] != page_size * rb:
        raise ValueError(f"pages: {pages.shape[1]} bytes per page, need page_size * {rb} = "
                         f"{page_size * rb}")
    nb = rb * 16 // 17  # Di/2 nibble bytes (rb = Di/2 + Di/32 = 17 Di / 32)
    page, row = _page_rows(block_table, slots, entries, page_size)
    k = torch.arange(nb, device=pages.device)
    pages[page[:, None], row[:, None] * nb + k] = records[:, :nb]
    s = torch.arange(rb - nb, device=pages.device)
    pages[page[:, None], page_size * nb + row[:, None] * (rb - nb) + s] = records[:, nb:]


def write_index_keys(pages, block_table, slots, entries, keys: torch.Tensor,
                     page_size: int) -> None:
    """QAT-MXFP4/32 encode post-RoPE index keys ``[N, Di]`` and store them."""
    write_index_key_records(pages, block_table, slots, entries,
                            formats.encode_index_key_record(keys), page_size)


def read_index_keys(pages: torch.Tensor, block_table: torch.Tensor, slots: torch.Tensor,
                    entries: torch.Tensor, page_size: int) -> torch.Tensor:
    """Logical records ``uint8 [N, Di/2 + Di/32]`` of entries ``entries[N]`` of ``slots[N]``."""
    rb = pages.shape[1] // page_size
    nb = rb * 16 // 17
    page, row = _page_rows(block_table, slots, entries, page_size)
    k = torch.arange(nb, device=pages.device)
    s = torch.arange(rb - nb, device=pages.device)
    nib = pages[page[:, None], row[:, None] * nb + k]
    sc = pages[page[:, None], page_size * nb + row[:, None] * (rb - nb) + s]
    return torch.cat((nib, sc), dim=-1)


# ----------------------------------------------------------------------------- allocation


class PageAllocator:
    """Host-side page bookkeeping for one block table (run outside the captured step).

    ``reserve(slot, n_entries)`` makes sure ``slot`` owns pages for entries ``0 .. n-1`` and
    writes new page ids into the device block table; ``release(slot)`` returns its pages.
    """

    def __init__(self, block_table: torch.Tensor, num_pages: int, page_size: int):
        self.block_table = block_table
        self.page_size = page_size
        self.free = list(range(num_pages - 1, -1, -1))
        self.owned: dict[int, list[int]] = {}

    def reserve(self, slot: int, n_entries: int) -> None:
        max_pages = self.block_table.shape[1]
        need = -(-n_entries // self.page_size)
        if need > max_pages:
            raise ValueError(f"n_entries: {n_entries} entries need {need} pages, the block table "
                             f"holds {max_pages} per slot")
        have = self.owned.setdefault(slot, [])
        if need - len(have) > len(self.free):
            raise ValueError(f"n_entries: {need - len(have)} more pages needed for slot {slot}, "
                             f"{len(self.free)} free")
        start = len(have)
        while len(have) < need:
            have.append(self.free.pop())
        if need > start:
            new = torch.tensor(have[start:], dtype=torch.int32)
            self.block_table[slot, start:need] = new.to(self.block_table.device)

    def release(self, slot: int) -> None:
        pages = self.owned.pop(slot, [])
        self.free.extend(reversed(pages))
        self.block_table[slot] = -1


@dataclass
class KVSourceCache:
    """Compressed KV and index-key pages of one KV-source layer, with their block table."""

    ratio: int
    compressed: torch.Tensor  # uint8 [num_pages, page_size, D/2 + D/16]
    index_keys: torch.Tensor  # uint8 [num_pages, page_size * (Di/2 + Di/32)]
    block_table: torch.Tensor  # int32 [num_slots, max_pages], -1 = no page
    allocator: PageAllocator = field(repr=False)


@dataclass
class DecodeCaches:
    """All caches of the decode step: a window ring per layer and the paged caches of each
    KV-source layer (``kv[layer_id]``)."""

    window: torch.Tensor  # uint8 [n_layers, num_slots, ring, D + D/32]
    kv: dict[int, KVSourceCache]
    page_size: int
    window_size: int

    def window_layer(self, layer: int) -> torch.Tensor:
        return self.window[layer]


def allocate_caches(cfg: ModelConfig, num_slots: int, max_context: int, *,
                    page_size: int = DEFAULT_PAGE_SIZE, ring: int | None = None,
                    device="cpu") -> DecodeCaches:
    """Allocate every cache for ``num_slots`` requests of up to ``max_context`` tokens.

    Window rings cover all layers (backbone and DSpark drafts); each KV source gets
    ``num_slots * max_pages`` pages, ``max_pages = ceil((max_context // ratio) / page_size)``.
    Buffers start zeroed, block tables at -1.
    """
    if num_slots <= 0 or max_context <= 0 or page_size <= 0:
        raise ValueError(f"num_slots / max_context / page_size: must be positive, got "
                         f"{num_slots} / {max_context} / {page_size}")
    ring = ring or default_ring(cfg.sliding_window)
    if ring < cfg.sliding_window:
        raise ValueError(f"ring: {ring} is shorter than the window {cfg.sliding_window}")
    d, di = cfg.head_dim, cfg.index_head_dim
    n_layers = len(cfg.compress_ratios)
    window = torch.zeros(n_layers, num_slots, ring, window_record_bytes(d), dtype=torch.uint8,
                         device=device)
    kv = {}
    for src in cfg.kv_source_layer_ids:
        r = cfg.compress_ratios[src]
        max_pages = -(-(max_context // r) // page_size)
        n_pages = num_slots * max_pages
        bt = torch.full((num_slots, max_pages), -1, dtype=torch.int32, device=device)
        kv[src] = KVSourceCache(
            ratio=r,
            compressed=torch.zeros(n_pages, page_size, compressed_record_bytes(d),
                                   dtype=torch.uint8, device=device),
            index_keys=torch.zeros(n_pages, index_page_bytes(page_size, di), dtype=torch.uint8,
                                   device=device),
            block_table=bt,
            allocator=PageAllocator(bt, n_pages, page_size),
        )
    return DecodeCaches(window=window, kv=kv, page_size=page_size,
                        window_size=cfg.sliding_window)
