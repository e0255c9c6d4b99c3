"""Exact top-k of BF16 indexer logits for decode (1-64 rows, up to 1M columns), graph-safe."""

from .api import TopkWorkspace, decode_topk, decode_topk_blocks, make_topk_workspace
from .ref import decode_topk_blocks_ref, decode_topk_ref

__all__ = [
    "TopkWorkspace",
    "decode_topk",
    "decode_topk_blocks",
    "decode_topk_blocks_ref",
    "decode_topk_ref",
    "make_topk_workspace",
]
