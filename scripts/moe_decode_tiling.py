"""Check: can a load-time bit permutation of MXFP4 words make the bf16 decode cheaper?

    python3 scripts/moe_decode_tiling.py

The MoE's SWAR decode (``ops/moe/_triton.py``) builds each bf16x2 register of a weight word
as ``(q shifted by t) & M``, M = ``0x81C081C0`` (sign, two exponent bits and the mantissa
msb of both halves: the bits a code needs to read as value * 2^-126). A register costs one
``LOP3`` where t = 0 and two (shift, mask) otherwise, or more where its bits must come from
several shifts; today's four registers a word take 11. With a funnel shift over adjacent
words (``SHF.R.W``) every register would cost at most two, and a word would cost 8 or
fewer, if some words' bits could be split into translates of M's bit set.

This searches every way to cover 32, 64, 96 and 128 consecutive bits exactly with
translates of that set (and of the fp16 set ``0x8E008E00``: exponent bits 10-11, mantissa
bit 9, for fp16 operands): there is none, so under shift-and-mask decodes at least one
register a word needs bits from two shifts, as the repack already assumes. Prints the count
of exact covers per width (all 0).
"""


def covers(pattern: list[int], width: int) -> int:
    """The number of exact covers of bits 0..width-1 by translates of ``pattern``."""
    full = (1 << width) - 1
    base = min(pattern)

    def rec(used: int) -> int:
        if used == full:
            return 1
        low = next(i for i in range(width) if not used >> i & 1)  # must be some translate's min
        mask = 0
        for b in pattern:
            bit = low - base + b
            if bit >= width or used >> bit & 1:
                return 0
            mask |= 1 << bit
        return rec(used | mask)

    return rec(0)


def bits(word: int) -> list[int]:
    return [i for i in range(32) if word >> i & 1]


if __name__ == "__main__":
    for name, m in (("bf16 0x81C081C0", 0x81C081C0), ("fp16 0x8E008E00", 0x8E008E00)):
        print(name, {w: covers(bits(m), w) for w in (32, 64, 96, 128)})
