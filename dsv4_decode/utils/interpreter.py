"""The one place that works around Triton 3.6 interpreter defects (``TRITON_INTERPRET=1``).

The interpreter runs kernels on numpy, which has no bf16 or fp8 types: such tensors are held as
raw uint16 / uint8 bit patterns. Three of its operations then compute the wrong thing:

- ``tl.dot`` on bf16 operands multiplies the raw 16-bit patterns as integers;
- fp32 -> fp8 conversion truncates / rounds half-up and neither saturates nor carries into the
  exponent, where the hardware (``cvt.rn.satfinite``) rounds to nearest even and saturates;
- fp32 -> bf16 conversion truncates, where the hardware rounds to nearest even.

``patch_triton_interpreter()`` replaces those three builder methods with versions that convert
through torch, which rounds like the hardware. It is idempotent and does nothing to compiled
(GPU) kernels. ``tests/conftest.py`` calls it on a machine without CUDA.
"""

from __future__ import annotations

import numpy as np
import torch

_PATCHED = False


def _to_torch_float(data: np.ndarray, tl_dtype) -> torch.Tensor:
    """A numpy bit-pattern array of ``tl_dtype`` -> an fp32 torch tensor of its values."""
    import triton.language as tl

    t = torch.from_numpy(np.ascontiguousarray(data))
    if tl_dtype == tl.bfloat16:
        return t.view(torch.bfloat16).float()
    if tl_dtype == tl.float8e4nv:
        return t.view(torch.float8_e4m3fn).float()
    if tl_dtype == tl.float8e5:
        return t.view(torch.float8_e5m2).float()
    return t.float()


def _from_fp32(values: torch.Tensor, tl_dtype) -> np.ndarray:
    """fp32 torch values -> numpy bit patterns of ``tl_dtype``, rounded like the hardware."""
    import triton.language as tl

    if tl_dtype == tl.bfloat16:
        return values.to(torch.bfloat16).view(torch.uint16).numpy()
    if tl_dtype == tl.float8e4nv:
        sat = torch.where(values.isnan(), values, values.clamp(-448.0, 448.0))
        return sat.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    if tl_dtype == tl.float8e5:
        sat = torch.where(values.isnan(), values, values.clamp(-57344.0, 57344.0))
        return sat.to(torch.float8_e5m2).view(torch.uint8).numpy()
    raise NotImplementedError(tl_dtype)


def patch_triton_interpreter() -> None:
    """Install the fixed ``create_dot``, ``create_fp_to_fp`` and ``create_fp_trunc``."""
    global _PATCHED
    if _PATCHED:
        return
    import triton.language as tl
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    exotic = (tl.bfloat16, tl.float8e4nv, tl.float8e5)
    orig_dot = builder.create_dot
    orig_fp_to_fp = builder.create_fp_to_fp
    orig_trunc = builder.create_fp_trunc

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar not in exotic and b.dtype.scalar not in exotic:
            return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        # Exact products of the operands' values, summed in fp32 like the tensor cores.
        av = _to_torch_float(a.data, a.dtype.scalar).numpy()
        bv = _to_torch_float(b.data, b.dtype.scalar).numpy()
        acc = np.matmul(av.astype(np.float32), bv.astype(np.float32))
        return interp.TensorHandle((acc + d.data).astype(d.data.dtype), d.dtype.scalar)

    def _round_to(self, src, dst_type, fallback, *args):
        dst = dst_type.scalar
        if dst in exotic and src.dtype.scalar in (tl.float32, tl.float16, tl.bfloat16):
            vals = _to_torch_float(src.data, src.dtype.scalar)
            return interp.TensorHandle(_from_fp32(vals, dst), dst)
        return fallback(self, src, dst_type, *args)

    builder.create_dot = create_dot
    builder.create_fp_to_fp = lambda self, src, dst_type, rounding_mode: _round_to(
        self, src, dst_type, orig_fp_to_fp, rounding_mode
    )
    builder.create_fp_trunc = lambda self, src, dst_type: _round_to(
        self, src, dst_type, orig_trunc
    )
    _PATCHED = True
