"""Sparse decode attention with sinks over the FP8 window ring and the NVFP4 paged cache."""

from .api import SparseAttnWorkspace, make_workspace, pick_config, sparse_attn
from .config import LAYOUTS, SparseAttnConfig, wgmma_config
from .ref import rope_tables, sparse_attn_ref

__all__ = ["LAYOUTS", "SparseAttnConfig", "SparseAttnWorkspace", "make_workspace", "pick_config",
           "rope_tables", "sparse_attn", "sparse_attn_ref", "wgmma_config"]
