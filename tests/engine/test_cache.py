"""engine/cache.py: the physical byte layouts, the writers/readers and the page allocator."""

from __future__ import annotations

import pytest
import torch

from dsv4_decode import formats
from dsv4_decode.config import ModelConfig
from dsv4_decode.engine import cache as C


def test_record_sizes():
    assert (C.window_record_bytes(512), C.compressed_record_bytes(512),
            C.index_key_record_bytes(128)) == (528, 288, 68)
    assert C.default_ring(128) == 136 and C.default_ring(128, 20) == 147


def test_window_ring_slot_and_bytes():
    g = torch.Generator().manual_seed(0)
    cache = torch.zeros(3, 12, 33, dtype=torch.uint8)  # D = 32, ring 12
    kv = torch.randn(2, 32, generator=g)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    pos = torch.tensor([25, 7], dtype=torch.int32)
    C.write_window(cache, slots, pos, kv)
    rec = formats.encode_window_record(kv)
    assert torch.equal(cache[2, 25 % 12], rec[0]) and torch.equal(cache[0, 7], rec[1])
    assert int(cache.count_nonzero()) == int(rec.count_nonzero())  # nothing else touched
    assert torch.equal(C.read_window(cache, slots, pos), rec)
    # the logical record: e4m3 codes then the ue8m0 scale of the 32-dim block
    assert torch.equal(formats.dequant_fp8_32(cache[2, 1, :32], cache[2, 1, 32:]),
                       formats.fake_quant_fp8_32(kv[0]))


def test_compressed_pages_through_block_table():
    g = torch.Generator().manual_seed(1)
    page = 4
    pages = torch.zeros(6, page, 18, dtype=torch.uint8)  # D = 32: 16 nibble + 2 scale bytes
    bt = torch.full((2, 3), -1, dtype=torch.int32)
    alloc = C.PageAllocator(bt, 6, page)
    alloc.reserve(1, 6)  # two pages
    alloc.reserve(0, 1)
    assert bt[1, :2].tolist() == [0, 1] and bt[0, 0].item() == 2 and bt[1, 2].item() == -1
    lat = torch.randn(6, 32, generator=g)
    ent = torch.arange(6, dtype=torch.int32)
    C.write_compressed(pages, bt, torch.ones(6, dtype=torch.int32), ent, lat)
    rec = formats.encode_compressed_record(lat)
    assert torch.equal(pages[1, 1], rec[5])  # entry 5 -> page bt[1, 1] = 1, row 1
    assert torch.equal(C.read_compressed(pages, bt, torch.ones(6, dtype=torch.int32), ent), rec)
    assert torch.equal(formats.dequant_nvfp4_16(pages[0, 2, :16], pages[0, 2, 16:]),
                       formats.fake_quant_nvfp4_16(lat[2]))


def test_index_key_two_plane_pages():
    g = torch.Generator().manual_seed(2)
    page, di = 4, 128
    pages = torch.zeros(3, C.index_page_bytes(page, di), dtype=torch.uint8)
    bt = torch.tensor([[2, 0]], dtype=torch.int32)
    keys = torch.randn(6, di, generator=g)
    ent = torch.arange(6, dtype=torch.int32)
    slots = torch.zeros(6, dtype=torch.int32)
    C.write_index_keys(pages, bt, slots, ent, keys, page)
    rec = formats.encode_index_key_record(keys)  # [6, 68] logical
    # entry 5: page bt[0, 1] = 0, row 1: nibbles at 64..127, scales at 4*64 + 4..7
    assert torch.equal(pages[0, 64:128], rec[5, :64])
    assert torch.equal(pages[0, 256 + 4:256 + 8], rec[5, 64:])
    assert torch.equal(pages[2, 0:64], rec[0, :64]) and torch.equal(pages[2, 256:260], rec[0, 64:])
    assert torch.equal(C.read_index_keys(pages, bt, slots, ent, page), rec)
    assert torch.equal(formats.decode_index_key_record(rec), formats.fake_quant_mxfp4_32(keys))


def test_allocator_reuse_and_errors():
    bt = torch.full((2, 2), -1, dtype=torch.int32)
    alloc = C.PageAllocator(bt, 3, 8)
    alloc.reserve(0, 16)
    with pytest.raises(ValueError, match="n_entries: 24 entries need 3 pages"):
        alloc.reserve(1, 24)
    alloc.reserve(1, 8)
    with pytest.raises(ValueError, match="1 more pages needed for slot 1, 0 free"):
        alloc.reserve(1, 9)
    alloc.release(0)
    assert bt[0].tolist() == [-1, -1]
    alloc.reserve(1, 9)
    assert sorted(bt[1].tolist()) == sorted(set(bt[1].tolist())) and -1 not in bt[1].tolist()


def test_allocate_caches_tiny():
    cfg = ModelConfig.preset("tiny-v41")
    caches = C.allocate_caches(cfg, num_slots=3, max_context=40, page_size=4)
    assert caches.window.shape == (5, 3, 16, 33)
    assert sorted(caches.kv) == list(cfg.kv_source_layer_ids)
    for src, kv in caches.kv.items():
        r = cfg.compress_ratios[src]
        assert kv.ratio == r and kv.block_table.shape == (3, -(-(40 // r) // 4))
        assert kv.compressed.shape[1:] == (4, 18) and kv.index_keys.shape[1] == 4 * 17
        assert (kv.block_table == -1).all()
    with pytest.raises(ValueError, match="ring: 4 is shorter than the window 8"):
        C.allocate_caches(cfg, 1, 8, ring=4)
