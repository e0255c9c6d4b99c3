"""``bench.kernels``' table: the note it prints when kernels overlap (dependent launches)."""

from dsv4_decode.bench.kernels import Breakdown, KernelStats


def test_format_says_when_kernels_overlap():
    """Dependent launches overlap: each kernel's time includes its wait, so the totals exceed
    the span and the table must say so; serial kernels get no such line."""
    overlapping = Breakdown([KernelStats("a", 1, 5.0), KernelStats("b", 2, 3.0)], 8.0, 9.0)
    serial = Breakdown([KernelStats("a", 1, 3.0), KernelStats("b", 1, 4.0)], 7.0, 9.0)
    assert "exceed the span" in overlapping.format("x")
    assert "exceed the span" not in serial.format("y")
