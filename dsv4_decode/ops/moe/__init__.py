"""MoE op (spec §6): router front, routed MXFP4 experts, FP8 shared expert, combine."""

from .api import (
    MoEWeights,
    MoEWorkspace,
    Routing,
    alloc_moe_workspace,
    alloc_routing,
    build_routing,
    moe_experts,
    prepare_moe_weights,
    repack_mxfp4,
    route,
    stack_experts,
)
from .config import MoEConfig, pick_config
from .ref import moe_experts_ref, route_ref

__all__ = [
    "MoEConfig", "MoEWeights", "MoEWorkspace", "Routing", "alloc_moe_workspace", "alloc_routing",
    "build_routing", "moe_experts", "moe_experts_ref", "pick_config", "prepare_moe_weights",
    "repack_mxfp4", "route", "route_ref", "stack_experts",
]
