"""Number formats of DeepSeek-V4.1 (spec §3.3-§3.6, §9) and the three cache records.

Everything here is plain torch and exact: the encoders reproduce what the hardware conversion
instructions produce (``cvt.rn.satfinite.e4m3x2.f32``, ``cvt.rn.satfinite.e2m1x2.f32``), so a
kernel's bytes can be compared bit for bit with these.

Formats
-------
- **e4m3** (``float8_e4m3fn``): round to nearest even, saturating to +-448 (no inf; NaN stays NaN).
- **ue8m0**: one unsigned byte ``b`` meaning ``2 ** (b - 127)``.
- **e2m1** (FP4): nibble ``sign << 3 | code``, code 0..7 = magnitudes
  ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``; round to nearest, ties to the even *code*; saturating to 6.
  Packing: byte ``k`` holds element ``2k`` in the low nibble and ``2k+1`` in the high nibble.

Block fake-quants (model semantics, spec §9.2)
---------------------------------------------
- ``fake_quant_fp8_32``   window K=V: e4m3 values, ue8m0 scale per 32 (``amax`` floor 1e-4).
- ``fake_quant_mxfp4_32`` indexer q and k: e2m1 values, ue8m0 scale per 32 (floor ``6*2^-126``).
- ``fake_quant_nvfp4_16`` compressed KV: e2m1 values, e4m3 scale per 16 (floor ``6*2^-9``).

Records (logical byte order; the paged physical layout lives in ``engine/cache.py``)
---------------------------------------------------------------------------------
Sizes below are V4.1's (d = 512, index dim 128); the codecs take any multiple of 32 and keep the
same layout scaled (the tiny test configs use d = 32).

- window record, 528 B: bytes 0..511 = e4m3 of dims 0..511; bytes 512..527 = ue8m0 scale of
  dims ``32b .. 32b+31`` for b = 0..15.
- compressed record, 288 B: bytes 0..255 = packed e2m1 of dims 0..511; bytes 256..287 = e4m3
  scale of dims ``16b .. 16b+15`` for b = 0..31.
- index-key record, 68 B: bytes 0..63 = packed e2m1 of dims 0..127; bytes 64..67 = ue8m0 scale
  of dims ``32b .. 32b+31`` for b = 0..3.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

WINDOW_RECORD_BYTES = 528
COMPRESSED_RECORD_BYTES = 288
INDEX_KEY_RECORD_BYTES = 68

# Midpoints between consecutive e2m1 magnitudes; a tie at midpoint i goes to the even code.
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


# --------------------------------------------------------------------------- scalars


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32-representable values -> e4m3 codes (uint8), RNE, saturating at +-448."""
    x = x.float()
    sat = torch.where(torch.isnan(x), x, x.clamp(-E4M3_MAX, E4M3_MAX))
    return sat.to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """e4m3 codes (uint8) -> fp32."""
    return codes.contiguous().view(torch.float8_e4m3fn).float()


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to the nearest e4m3 value (RNE, saturating); returns fp32."""
    return e4m3_decode(e4m3_encode(x))


def ceil_log2(t: torch.Tensor) -> torch.Tensor:
    """Exact ``ceil(log2(t))`` of positive normal fp32 values, as int32.

    The exponent of ``t``, plus one when any mantissa bit is set; no transcendental rounding.
    """
    mant, exp = torch.frexp(t.float())  # t = mant * 2**exp, mant in [0.5, 1)
    return torch.where(mant == 0.5, exp - 1, exp).to(torch.int32)


def ue8m0_encode(exponent: torch.Tensor) -> torch.Tensor:
    """Power-of-two exponent (int) -> ue8m0 byte ``exponent + 127``, saturated to [-127, 127]
    (the quantizers' amax floors keep real exponents inside; no host read, graph-safe)."""
    return (exponent.to(torch.int32).clamp(-127, 127) + 127).to(torch.uint8)


def ue8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """ue8m0 bytes -> fp32 power of two ``2 ** (b - 127)`` (b = 255 is NaN by the OCP spec)."""
    e = codes.to(torch.int32) - 127
    out = torch.ldexp(torch.ones_like(e, dtype=torch.float32), e)
    return torch.where(codes == 255, torch.full_like(out, float("nan")), out)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 values -> e2m1 nibbles (uint8 in 0..15), ties to the even code, saturating at 6."""
    x = x.float()
    a = x.abs()
    code = torch.zeros_like(a, dtype=torch.int32)
    for i, m in enumerate(_E2M1_MIDPOINTS):
        # The tie at midpoint i belongs to whichever of codes i, i+1 is even.
        code += (a > m) if i % 2 == 0 else (a >= m)
    sign = torch.signbit(x).to(torch.int32)
    return (sign << 3 | code).to(torch.uint8)


def e2m1_decode(nibbles: torch.Tensor) -> torch.Tensor:
    """e2m1 nibbles (uint8 0..15) -> fp32."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=nibbles.device)
    n = nibbles.to(torch.int64)
    mag = table[n & 7]
    return torch.where((n & 8) != 0, -mag, mag)


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to the nearest e2m1 value (ties to even code, saturating); fp32."""
    return e2m1_decode(e2m1_encode(x))


def pack_nibbles(nibbles: torch.Tensor) -> torch.Tensor:
    """``[..., 2n]`` nibbles -> ``[..., n]`` bytes (element 2k low, 2k+1 high)."""
    if nibbles.shape[-1] % 2:
        raise ValueError(f"pack_nibbles needs an even last dim, got {tuple(nibbles.shape)}")
    n = nibbles.to(torch.uint8)
    return n[..., 0::2] | (n[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` bytes -> ``[..., 2n]`` nibbles (inverse of ``pack_nibbles``)."""
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


# --------------------------------------------------------------------------- block quantizers


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.shape[-1] % block:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of the block {block}")
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block)


def quant_fp8_32(x: torch.Tensor):
    """QAT-FP8/32 (spec §3.3). ``x [..., n]`` -> (e4m3 codes ``[..., n]`` uint8,
    ue8m0 bytes ``[..., n/32]``)."""
    xb = _blocks(x, 32)
    amax = xb.abs().amax(-1).clamp_min(1e-4)
    e = ceil_log2(amax * torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32))
    scale = torch.ldexp(torch.ones_like(amax), e)
    q = e4m3_encode(xb / scale[..., None])
    return q.reshape(x.shape), ue8m0_encode(e)


def dequant_fp8_32(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of ``quant_fp8_32``: fp32 ``[..., n]``."""
    v = e4m3_decode(codes).reshape(*codes.shape[:-1], -1, 32)
    return (v * ue8m0_decode(scales)[..., None]).reshape(codes.shape)


def quant_mxfp4_32(x: torch.Tensor):
    """QAT-MXFP4/32 (spec §3.4). ``x [..., n]`` -> (packed e2m1 ``[..., n/2]`` uint8,
    ue8m0 bytes ``[..., n/32]``)."""
    xb = _blocks(x, 32)
    amax = xb.abs().amax(-1).clamp_min(E2M1_MAX * 2.0**-126)
    e = ceil_log2(amax * torch.tensor(1.0 / E2M1_MAX, dtype=torch.float32))
    scale = torch.ldexp(torch.ones_like(amax), e)
    nib = e2m1_encode((xb / scale[..., None]).clamp(-E2M1_MAX, E2M1_MAX))
    return pack_nibbles(nib.reshape(x.shape)), ue8m0_encode(e)


def dequant_mxfp4(packed: torch.Tensor, scales: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Packed e2m1 ``[..., n/2]`` with ue8m0 scales per ``block`` -> fp32 ``[..., n]``.

    Also the routed-expert weight format (block 32, or 16 where a checkpoint says so).
    """
    v = e2m1_decode(unpack_nibbles(packed))
    n = v.shape[-1]
    v = v.reshape(*v.shape[:-1], n // block, block) * ue8m0_decode(scales)[..., None]
    return v.reshape(*v.shape[:-2], n)


def quant_nvfp4_16(x: torch.Tensor):
    """QAT-NVFP4/16 (spec §3.5). ``x [..., n]`` -> (packed e2m1 ``[..., n/2]`` uint8,
    e4m3 scale codes ``[..., n/16]`` uint8)."""
    xb = _blocks(x, 16)
    amax = xb.abs().amax(-1).clamp_min(E2M1_MAX * 2.0**-9)
    scale_codes = e4m3_encode(amax / E2M1_MAX)
    scale = e4m3_decode(scale_codes)
    nib = e2m1_encode((xb / scale[..., None]).clamp(-E2M1_MAX, E2M1_MAX))
    return pack_nibbles(nib.reshape(x.shape)), scale_codes


def dequant_nvfp4_16(packed: torch.Tensor, scale_codes: torch.Tensor) -> torch.Tensor:
    """Inverse of ``quant_nvfp4_16``: fp32 ``[..., n]``."""
    v = e2m1_decode(unpack_nibbles(packed))
    n = v.shape[-1]
    v = v.reshape(*v.shape[:-1], n // 16, 16) * e4m3_decode(scale_codes)[..., None]
    return v.reshape(*v.shape[:-2], n)


def fake_quant_fp8_32(x: torch.Tensor) -> torch.Tensor:
    """``x`` -> dequant(quant_fp8_32(x)) in ``x.dtype``."""
    return dequant_fp8_32(*quant_fp8_32(x)).to(x.dtype)


def fake_quant_mxfp4_32(x: torch.Tensor) -> torch.Tensor:
    """``x`` -> dequant(quant_mxfp4_32(x)) in ``x.dtype``."""
    return dequant_mxfp4(*quant_mxfp4_32(x)).to(x.dtype)


def fake_quant_nvfp4_16(x: torch.Tensor) -> torch.Tensor:
    """``x`` -> dequant(quant_nvfp4_16(x)) in ``x.dtype``."""
    return dequant_nvfp4_16(*quant_nvfp4_16(x)).to(x.dtype)


# --------------------------------------------------------------------------- cache records


def encode_window_record(kv: torch.Tensor) -> torch.Tensor:
    """``kv [..., 512]`` (post-RoPE) -> 528-byte window records ``[..., 528]`` uint8."""
    codes, scales = quant_fp8_32(kv)
    return torch.cat((codes, scales), dim=-1)


def decode_window_record(rec: torch.Tensor) -> torch.Tensor:
    """``[..., 528]`` uint8 -> fp32 ``[..., 512]`` (any ``n + n/32`` bytes -> ``n`` values)."""
    n = rec.shape[-1] * 32 // 33
    return dequant_fp8_32(rec[..., :n], rec[..., n:])


def encode_compressed_record(latent: torch.Tensor) -> torch.Tensor:
    """``latent [..., 512]`` (post-RoPE) -> 288-byte compressed records ``[..., 288]`` uint8."""
    packed, scales = quant_nvfp4_16(latent)
    return torch.cat((packed, scales), dim=-1)


def decode_compressed_record(rec: torch.Tensor) -> torch.Tensor:
    """``[..., 288]`` uint8 -> fp32 ``[..., 512]`` (any ``n/2 + n/16`` bytes -> ``n`` values)."""
    n = rec.shape[-1] * 16 // 9
    return dequant_nvfp4_16(rec[..., : n // 2], rec[..., n // 2 :])


def encode_index_key_record(key: torch.Tensor) -> torch.Tensor:
    """``key [..., 128]`` (post-RoPE) -> 68-byte index-key records ``[..., 68]`` uint8."""
    packed, scales = quant_mxfp4_32(key)
    return torch.cat((packed, scales), dim=-1)


def decode_index_key_record(rec: torch.Tensor) -> torch.Tensor:
    """``[..., 68]`` uint8 -> fp32 ``[..., 128]`` (any ``n/2 + n/32`` bytes -> ``n`` values)."""
    n = rec.shape[-1] * 32 // 17
    return dequant_mxfp4(rec[..., : n // 2], rec[..., n // 2 :])


# --------------------------------------------------------------------------- weights


def quant_fp8_weight(w: torch.Tensor, block: int = 32):
    """Weight ``[out, in]`` -> (``float8_e4m3fn [out, in]``, ue8m0 ``uint8 [ceil(out/b),
    ceil(in/b)]``): one power-of-two scale per ``block x block`` tile (the checkpoint format,
    32 for V4.1, 128 for V4). The scale is the smallest power of two that keeps the tile's
    absolute maximum within 448."""
    out_f, in_f = w.shape
    ro, ri = -(-out_f // block), -(-in_f // block)
    padded = torch.zeros(ro * block, ri * block, dtype=torch.float32, device=w.device)
    padded[:out_f, :in_f] = w.float()
    tiles = padded.reshape(ro, block, ri, block)
    amax = tiles.abs().amax(dim=(1, 3)).clamp_min(2.0**-100)
    e = ceil_log2(amax / E4M3_MAX)
    scale = torch.ldexp(torch.ones_like(amax), e)
    q = (tiles / scale[:, None, :, None]).reshape(ro * block, ri * block)[:out_f, :in_f]
    return e4m3_encode(q).view(torch.float8_e4m3fn), ue8m0_encode(e)


def dequant_fp8_weight(q: torch.Tensor, scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Inverse of ``quant_fp8_weight``: fp32 ``[out, in]``."""
    out_f, in_f = q.shape
    s = ue8m0_decode(scale).repeat_interleave(block, 0).repeat_interleave(block, 1)
    return q.float() * s[:out_f, :in_f]


def quant_mxfp4_weight(w: torch.Tensor, block: int = 32):
    """Expert weight ``[out, in]`` -> (packed e2m1 ``uint8 [out, in/2]``, ue8m0
    ``uint8 [out, in/block]``), scales per ``block`` consecutive input values of a row."""
    out_f, in_f = w.shape
    wb = _blocks(w, block)
    amax = wb.abs().amax(-1).clamp_min(E2M1_MAX * 2.0**-126)
    e = ceil_log2(amax / E2M1_MAX)
    scale = torch.ldexp(torch.ones_like(amax), e)
    nib = e2m1_encode((wb / scale[..., None]).clamp(-E2M1_MAX, E2M1_MAX)).reshape(out_f, in_f)
    return pack_nibbles(nib), ue8m0_encode(e)
