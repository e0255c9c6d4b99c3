"""formats.py against hand-computed values (spec §3.3-§3.6)."""

import pytest
import torch

from dsv4_decode import formats as F


def t(*v):
    return torch.tensor(v, dtype=torch.float32)


def test_e2m1_every_tie_goes_to_the_even_code():
    # midpoint -> (code, value): spec §3.6
    ties = t(0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
    assert F.e2m1_encode(ties).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert F.e2m1_round(ties).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert F.e2m1_encode(-ties).tolist() == [8, 10, 10, 12, 12, 14, 14]


def test_e2m1_values_nearest_and_saturation():
    x = t(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.26, 0.74, 2.6, 5.01, 6.5, 100.0)
    assert F.e2m1_encode(x).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 1, 1, 5, 7, 7, 7]
    # negative zero keeps its sign bit; a small negative rounds to -0
    assert F.e2m1_encode(t(-0.0, -0.1)).tolist() == [8, 8]
    assert F.e2m1_decode(torch.arange(16, dtype=torch.uint8)).tolist() == [
        0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]


def test_nibble_packing_low_nibble_is_even_element():
    nib = torch.tensor([1, 2, 15, 0], dtype=torch.uint8)
    packed = F.pack_nibbles(nib)
    assert packed.tolist() == [0x21, 0x0F]
    assert torch.equal(F.unpack_nibbles(packed), nib)
    with pytest.raises(ValueError):
        F.pack_nibbles(torch.zeros(3, dtype=torch.uint8))


def test_e4m3_rounding_saturation_subnormals():
    x = t(1.0, 1.0625, 1.1875, 448.0, 464.0, 1000.0, -1000.0, 2.0**-9, 2.0**-10, 3 * 2.0**-10,
          2.0**-6, 0.0)
    # 1.0625 ties down to 1.0 (even mantissa 0), 1.1875 ties up to 1.25 (even mantissa 2);
    # 464 and beyond saturate to 448 (0x7E); 2^-9 is the smallest subnormal (code 1);
    # 2^-10 ties to 0, 3*2^-10 ties to 2 subnormal units; 2^-6 is the smallest normal (0x08).
    assert F.e4m3_encode(x).tolist() == [0x38, 0x38, 0x3A, 0x7E, 0x7E, 0x7E, 0xFE, 0x01, 0x00,
                                         0x02, 0x08, 0x00]
    assert torch.isnan(F.e4m3_decode(F.e4m3_encode(t(float("nan"))))).all()


def test_ue8m0_and_exact_ceil_log2():
    assert F.ceil_log2(t(1.0, 1.0000001, 0.5, 0.75, 3.0, 2.0**-126)).tolist() == [
        0, 1, -1, 0, 2, -126]
    assert F.ue8m0_decode(torch.tensor([127, 128, 0, 254], dtype=torch.uint8)).tolist() == [
        1.0, 2.0, 2.0**-127, 2.0**127]
    assert F.ue8m0_encode(torch.tensor([-127, 0, 127])).tolist() == [0, 127, 254]
    assert F.ue8m0_encode(torch.tensor([128, -200])).tolist() == [254, 0]  # saturated


def test_fp8_32_scale_edges():
    # amax exactly 448 * 2^k -> scale 2^k (448 * fl(1/448) == 1 in fp32); one ulp above -> 2^(k+1)
    x = torch.zeros(4, 32)
    x[0, 0] = 448.0
    x[1, 3] = torch.nextafter(t(448.0), t(1e9))[0]
    x[2, 5] = -7.0  # 7/448 = 2^-6 exactly
    # row 3 all zero: amax floor 1e-4 -> 1e-4/448 ~ 2.2e-7 -> 2^-22 (byte 105)
    codes, scales = F.quant_fp8_32(x)
    assert scales[:, 0].tolist() == [127, 128, 121, 105]
    assert F.e4m3_decode(codes[0, :1]).item() == 448.0
    assert F.e4m3_decode(codes[2, 5:6]).item() == -448.0


def test_mxfp4_32_scale_edges():
    x = torch.zeros(3, 32)
    x[0, 0] = 6.0  # 6 * fl(1/6) == 1 -> scale 1
    x[1, 0] = 6.5  # -> scale 2, 6.5/2 = 3.25 -> 3 -> 6.0
    # row 2 zero: floor 6*2^-126 -> scale 2^-126 (byte 1)
    packed, scales = F.quant_mxfp4_32(x)
    assert scales[:, 0].tolist() == [127, 128, 1]
    deq = F.dequant_mxfp4(packed, scales)
    assert deq[0, 0].item() == 6.0 and deq[1, 0].item() == 6.0 and deq[2].abs().sum() == 0


def test_nvfp4_16_scale_is_e4m3_of_amax_over_6():
    x = torch.zeros(3, 16)
    x[0, :2] = t(6.0, -3.0)  # scale 1.0 exactly
    x[1, 0] = 7.0  # 7/6 = 1.1666 -> e4m3 1.125; 7/1.125 = 6.22 -> saturates to 6 -> 6.75
    # row 2 zero: floor 6*2^-9 -> scale 2^-9, the smallest e4m3 subnormal (code 1)
    packed, sc = F.quant_nvfp4_16(x)
    assert F.e4m3_decode(sc[:, 0]).tolist() == [1.0, 1.125, 2.0**-9]
    deq = F.dequant_nvfp4_16(packed, sc)
    assert deq[0, :2].tolist() == [6.0, -3.0] and deq[1, 0].item() == 6.75


@pytest.mark.parametrize("enc,dec,fq,n,size,pow2", [
    (F.encode_window_record, F.decode_window_record, F.fake_quant_fp8_32, 512, 528, True),
    (F.encode_compressed_record, F.decode_compressed_record, F.fake_quant_nvfp4_16, 512, 288,
     False),
    (F.encode_index_key_record, F.decode_index_key_record, F.fake_quant_mxfp4_32, 128, 68, True),
])
def test_records_round_trip_to_the_fake_quant(enc, dec, fq, n, size, pow2):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5, n, generator=g) * torch.logspace(-3, 2, n)).to(torch.bfloat16)
    rec = enc(x)
    assert rec.shape == (5, size) and rec.dtype == torch.uint8
    assert torch.equal(dec(rec).to(torch.bfloat16), fq(x))
    if pow2:
        # With power-of-two scales a fake-quantized tensor is a fixed point in value (its codes
        # may change: a block whose max rounded down takes a smaller scale). NVFP4's e4m3 scale
        # of amax/6 has no such property.
        assert torch.equal(fq(fq(x)), fq(x))


def test_weight_formats_round_trip():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(70, 96, generator=g) * 0.02
    q, s = F.quant_fp8_weight(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 3)
    deq = F.dequant_fp8_weight(q, s)
    assert (deq - w).abs().max() <= w.abs().max() * 2.0**-3  # e4m3: 3 mantissa bits
    assert torch.equal(F.dequant_fp8_weight(*F.quant_fp8_weight(deq)), deq)
    p, ps = F.quant_mxfp4_weight(w)
    assert p.shape == (70, 48) and ps.shape == (70, 3)
    deq4 = F.dequant_mxfp4(p, ps)
    assert torch.equal(F.dequant_mxfp4(*F.quant_mxfp4_weight(deq4)), deq4)
    assert (deq4 - w).abs().max() <= w.abs().max() / 3  # e2m1 near 6: steps of 2 in 6
