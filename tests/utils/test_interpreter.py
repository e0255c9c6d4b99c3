"""The interpreter workaround computes bf16 dots and fp8/bf16 conversions like the hardware."""

import torch
import triton
import triton.language as tl

from dsv4_decode import formats


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))


@triton.jit
def _convert_kernel(x_ptr, f8_ptr, bf_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)
    tl.store(f8_ptr + r, x.to(tl.float8e4nv))
    tl.store(bf_ptr + r, x.to(tl.bfloat16))


def test_bf16_dot(device):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 32, generator=g).to(torch.bfloat16).to(device)
    b = torch.randn(32, 16, generator=g).to(torch.bfloat16).to(device)
    c = torch.full((16, 16), float("nan"), device=device)
    _dot_kernel[(1,)](a, b, c, 16, 16, 32)
    ref = a.float() @ b.float()
    torch.testing.assert_close(c, ref, rtol=1e-5, atol=1e-5)


def test_fp8_and_bf16_conversion_round_like_hardware(device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, generator=g) * 100
    # ties, saturation and subnormals of e4m3
    x[:6] = torch.tensor([1000.0, -1000.0, 464.0, 0.0029296875, 1.0625, 1.1875])
    x = x.to(device)
    f8 = torch.empty(256, dtype=torch.float8_e4m3fn, device=device)
    bf = torch.empty(256, dtype=torch.bfloat16, device=device)
    _convert_kernel[(1,)](x, f8, bf, 256)
    assert torch.equal(f8.view(torch.uint8).cpu(), formats.e4m3_encode(x.cpu()))
    assert torch.equal(bf.cpu(), x.cpu().to(torch.bfloat16))
