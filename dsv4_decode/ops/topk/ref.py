"""PyTorch twin of ``decode_topk`` / ``decode_topk_blocks``: the same contract, written plainly.

Order: every bf16 value gets a 17-bit *rank key* ``key1``, ``0`` meaning "not a candidate":

    bits u (uint16)  ->  key = 0xFFFF - u        if the sign bit is set (negative values)
                         key = u + 0x8000        otherwise
    -0.0 is mapped to +0.0 first (they compare equal), every NaN to key 0xFFFF;
    key1 = key + 1 for columns before the row's length, 0 after it.

so NaN > +inf > finite (numeric order) > -inf. Ties are broken towards the lower column by the
combined value ``key1 * 2**20 + (2**20 - 1 - col)``, unique per column (cols <= 2**20), whose
descending order is the selection order. The twin returns the selected columns in ascending
order, then -1 padding, which is also what the kernels return.
"""

from __future__ import annotations

import torch

COL_BITS = 20  # columns < 2**20 = 1,048,576
COL_MASK = (1 << COL_BITS) - 1
PIN_KEY1 = 65537  # block mode: the pinned block ranks above every value, NaN included
NEG_INF_KEY1 = 0x007F + 1  # key1 of -inf


def rank_keys(logits: torch.Tensor) -> torch.Tensor:
    """bf16 [rows, cols] -> int32 [rows, cols] key (0..65535) preserving NaN > +inf > ... > -inf."""
    u = logits.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF  # [rows, cols]
    u = torch.where(u == 0x8000, torch.zeros_like(u), u)  # -0 == +0
    key = torch.where(u >= 0x8000, 0xFFFF - u, u + 0x8000)
    return torch.where((u & 0x7FFF) > 0x7F80, torch.full_like(u, 0xFFFF), key)


def _select(key1: torch.Tensor, k: int) -> torch.Tensor:
    """key1 int [rows, n] (0 = not a candidate) -> int32 [rows, k] indices, -1 filled."""
    rows, n = key1.shape
    idx = torch.arange(n, device=key1.device, dtype=torch.int64)
    comb = key1.to(torch.int64) * (1 << COL_BITS) + (COL_MASK - idx)  # [rows, n], unique per row
    comb = torch.where(key1 > 0, comb, torch.full_like(comb, -1))
    if n < k:  # pad so torch.topk can take k
        comb = torch.cat([comb, comb.new_full((rows, k - n), -1)], dim=1)
    top = torch.topk(comb, k, dim=1, sorted=False).values  # [rows, k]
    cols = torch.where(top >= 0, COL_MASK - (top & COL_MASK), 1 << COL_BITS)  # pad sorts last
    cols = cols.sort(dim=1).values
    return torch.where(cols < (1 << COL_BITS), cols, -1).to(torch.int32)


def decode_topk_ref(logits: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    """Twin of ``decode_topk``: bf16 [rows, cols], int32 [rows] -> int32 [rows, k]."""
    rows, cols = logits.shape
    col = torch.arange(cols, device=logits.device)
    valid = col[None, :] < lengths.to(torch.int64).clamp(0, cols)[:, None]  # [rows, cols]
    key1 = torch.where(valid, rank_keys(logits) + 1, 0)
    return _select(key1, k)


def block_keys_ref(logits: torch.Tensor, lengths: torch.Tensor, block: int = 8) -> torch.Tensor:
    """Block keys of ``decode_topk_blocks``: int32 [rows, ceil(cols / block)], 0 = not a candidate.

    Block b's key is the largest key1 of its valid columns; a block whose maximum is -inf (or has
    no valid column) is not a candidate (spec §5.4: only B_b > -inf); the block holding column
    ``length - 1`` is pinned above everything (``PIN_KEY1``).
    """
    rows, cols = logits.shape
    nb = -(-cols // block)
    col = torch.arange(cols, device=logits.device)
    lens = lengths.to(torch.int64).clamp(0, cols)  # [rows]
    key1 = torch.where(col[None, :] < lens[:, None], rank_keys(logits) + 1, 0)
    key1 = torch.nn.functional.pad(key1, (0, nb * block - cols))  # [rows, nb * block]
    bkey = key1.view(rows, nb, block).amax(dim=2)  # [rows, nb]
    bkey = torch.where(bkey > NEG_INF_KEY1, bkey, 0)
    last = (lens - 1).clamp(min=0) // block  # [rows]
    pin = (torch.arange(nb, device=logits.device)[None, :] == last[:, None]) & (lens[:, None] > 0)
    return torch.where(pin, PIN_KEY1, bkey).to(torch.int32)


def decode_topk_blocks_ref(logits: torch.Tensor, lengths: torch.Tensor, n_blocks: int = 2048,
                           block: int = 8) -> torch.Tensor:
    """Twin of ``decode_topk_blocks``: bf16 [rows, cols], int32 [rows] -> int32 [rows, n_blocks]."""
    return _select(block_keys_ref(logits, lengths, block), n_blocks)
