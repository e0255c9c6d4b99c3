"""decode_topk's launch rules (pure functions of the shapes, no kernel): how many programs and
pipeline stages folded grids get, and block mode's cluster a row. Split from test_topk.py,
whose interpreter and GPU tests check what the kernels compute under these rules."""

from __future__ import annotations

from dsv4_decode.ops.topk.config import TopkConfig


def test_many_row_rules():
    """The row-count rules of folded grids: listed collect programs a row (64, 40 from 48
    rows, at k <= 512 32 from 64) and the pipelined fold (R >= 4 on rows of more than 256
    chunks, or at k <= 512 of more than 64 from 64 rows)."""
    from dsv4_decode.ops.topk.config import fold_stages, list_programs

    lp = [list_programs(r, 512) for r in (1, 47, 48, 63, 64, 192)]
    assert lp == [64, 64, 40, 40, 32, 32] and list_programs(64, 2048) == 40
    assert fold_stages(6, 512, 2, 2048) == fold_stages(64, 128, 3, 512) == 5
    assert fold_stages(64, 65, 2, 16) == fold_stages(64, 257, 2, 2048) == 5
    assert fold_stages(6, 512, 1, 512) == fold_stages(48, 128, 3, 512) == 1
    assert fold_stages(64, 64, 3, 512) == fold_stages(64, 128, 3, 2048) == 1


def test_fold_rule():
    """Chunks a group-maxima program folds (log2): R = 8 on rows of at most 256 chunks from
    6,145 chunk programs, R = 4 from 3,073 (session 38), else the smallest R that leaves at
    most 3,072 programs; R = 2 from 768 programs, none below."""
    from dsv4_decode.ops.topk.config import span_log2

    assert [span_log2(r, 128) for r in (5, 6, 12, 24, 25, 48, 49, 64)] == [0, 1, 1, 1, 2, 2, 3, 3]
    assert [span_log2(r, 256) for r in (12, 24, 48)] == [1, 2, 3]
    assert [span_log2(r, 512) for r in (6, 12, 24, 64)] == [1, 1, 2, 3]


def test_cluster_ctas_rule():
    """Block mode's cluster a row: the smallest power of two covering the widest row's chunks
    (4,096 columns at blocks of 8), at most 16, and at most 384 CTAs in all; else 0 (the
    LONG form or the grid-wide radix select)."""
    from dsv4_decode.ops.topk._cluster import cluster_ctas

    cfg = TopkConfig.pick(2048, 8)
    assert [cluster_ctas(1, c, cfg) for c in (8, 4096, 4097, 20000, 65536, 65537)] == [
        1, 1, 2, 8, 16, 0]
    assert cluster_ctas(24, 65536, cfg) == 16 and cluster_ctas(25, 65536, cfg) == 0
    assert cluster_ctas(24, 32768, cfg) == 8
    cfg64 = TopkConfig.pick(2048, 64)  # chunks of 64 blocks of 64: 4,096 columns
    assert cluster_ctas(1, 65536, cfg64) == 16 and cluster_ctas(1, 131072, cfg64) == 0
