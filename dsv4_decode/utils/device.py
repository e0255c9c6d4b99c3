"""What the launchers ask of the GPU they run on."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=8)
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (cached: launchers ask on every call); 132 (an
    H200's) for a non-CUDA device, so that the interpreter sizes grids as on the GPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


@functools.lru_cache(maxsize=8)
def pdl_capable(device: torch.device) -> bool:
    """Whether ``device`` runs programmatic dependent launches (``griddepcontrol``: a CUDA GPU
    of compute capability 9.0 or later). False for a non-CUDA device (the interpreter)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@functools.lru_cache(maxsize=8)
def is_hopper(device: torch.device) -> bool:
    """Whether ``device`` is a Hopper GPU (compute capability 9.0: wgmma, which Blackwell's
    sm_100 does not run). False for a non-CUDA device (the interpreter)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def clusters_capable(device: torch.device) -> bool:
    """Whether ``device`` runs thread-block clusters with distributed shared memory: the same
    GPUs as ``pdl_capable`` (both came with compute capability 9.0). False for a non-CUDA
    device (the interpreter)."""
    return pdl_capable(device)
