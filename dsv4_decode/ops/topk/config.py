"""Launch configuration of ``decode_topk``: one frozen dataclass and the rule that picks it.

Vocabulary: an *element* is what is ranked: a column (plain mode, ``block = 1``) or a block of
``block`` columns (block mode). ``k`` is the number of elements returned.
"""

from __future__ import annotations

from dataclasses import dataclass


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


# Segments per chunk: pass 1 stores the maximum of each 1/NSEG of a chunk (128 columns in plain
# mode) so the collect pass re-reads only segments that can hold a candidate. Listed grids at
# k > 512 use twice as many (``TopkConfig.nseg``): session 34, run 3 (``topk_row_probe.py``,
# same process, µs), 32 against 16 at k = 2,048: 64 x 1M all 85.0 -> 76.8, 24 x 1M all
# 48.8 -> 46.9, 64 x 256K all 47.6 -> 45.9, where ~30 % of a row's segments reach T0 and are
# re-read; at k = 512 (a few % listed) the threshold's longer scan costs more than the collect
# saves (64 x 1M all 54.4 -> 55.3, 64 x 512K all 38.3 -> 41.0); 64 a chunk lost at both k.
NSEG = 16

# Block mode's radix select: a chunk (one program's share of a row) is RADIX_COLS columns,
# at most RADIX_ELEMENTS elements; half that for a single row (more programs for the one row:
# measured on the H200, session 6 run 7, 1 x 1M 1/8: 8.64 us against 9.37; from 6 rows the
# larger chunks win, 12 x 1M 13.50 against 16.63). 4,096 columns keep the per-program
# histograms short (4 blocks of 8 a thread at 4 warps); the element cap keeps blocks of 2 and
# 4 from spilling registers (sm_90 compile test).
RADIX_COLS = 4096
RADIX_ELEMENTS = 512

# Plain mode collects a chunk a program (no segment lists) up to this many chunk programs (rows
# x chunks of 2,048 columns); beyond, the group maxima fold R >= 2 chunks (``span_log2``) and a
# long row is listed. Session 10 (scripts/topk_fold_sweep.py, programmatic dependent launches,
# µs), folding and listing against neither: at 1,536-2,048 programs neither won in 6 of 7
# cells (48 x 64K all 27.73 -> 19.05, 64 x 64K all 33.09 -> 22.93, 12 x 256K 1/8 16.85 ->
# 12.92, 6 x 512K all 20.56 -> 17.51; lost 48 x 64K 1/8 15.47 -> 15.96); at 3,072 it won at
# 1/8 valid and lost at all valid (12 x 512K all 21.72 -> 25.47); from 6,144 it lost
# everywhere (12 x 1M all 28.36 -> 38.63).
CHUNK_PROGRAMS = 2048
# From FOLD2_PROGRAMS chunk programs up to CHUNK_PROGRAMS the group maxima fold 2 chunks a
# program while the collect stays a chunk a program. Session 26 (run 4) folded by 2 from 768
# or 1,536 programs with the lists: 1/8 valid -0.2 to -1.4 µs, all valid +1.1 to +3.4 (the
# listed collect). Session 27 (run 1, ``scripts/topk_row_probe.py --variants
# chunks,chunks-fold2-768,chunks-fold2-1536``, µs, same process) without them: 12 x 256K
# 9.15 -> 8.58 at 1/8, 13.47 -> 13.10 all valid; 6 x 512K 9.08 -> 8.75 / 12.75 -> 12.80;
# 24 x 64K 7.93 -> 7.61 / 10.78 -> 10.53 (768 programs); 6 x 256K 7.57 -> 7.59 / 9.87 -> 9.97.
FOLD2_PROGRAMS = 768
# Register cap of the group-maxima programs that fold R = 2 chunks at k <= 512: 40 registers
# (sm_90a, no spills; 47 without the segment maxima, 56 with them), so twelve 4-warp CTAs fit
# a SM instead of nine and the 1,536 programs of a 3,072-chunk grid are resident at once.
# Session 28 (run 7, ``scripts/topk_row_probe.py``, µs, same process, uncapped / capped): at
# 1/8 valid, where 7/8 of those programs only read the length, 12 x 512K 9.73 -> 9.27,
# 24 x 256K 10.57 -> 10.12, 6 x 1M 9.79 -> 9.46; all valid 12 x 512K 16.34 -> 16.14,
# 6 x 1M 15.50 -> 15.55, but 24 x 256K 16.39 -> 16.76; the 768-program grids within 0.1.
# (Capping the unpipelined R = 8 fold at 56 registers gained 0.6 at 64 x 256K all and lost
# 0.4 at 48 x 256K and 48 x 512K all.) At k = 2,048 (run 8) the cap lost 0.9-1.5 all valid
# (24 x 256K 26.79 -> 28.32, 12 x 512K 26.39 -> 27.46, 6 x 1M 27.08 -> 27.92) for 0.3-0.45
# at 1/8: not there.
FOLD2_MAXNREG = 40

# Segments a threshold program lists at NSEG segments a chunk: 2,048, 128 chunks (4 programs a
# 1M row; each computes T0 too: at 1,024, 8 programs a row, the threshold took 10.3 µs at
# 64 x 1M, against 3.3 for T0 alone). A region spans the same chunks at ``TopkConfig.nseg``.
LIST_REGION = 2048
# Pipeline stages of a folding group-maxima program (``_fold._fold_span``) on 1M-column
# grids folded by R >= 4. Session 21 (runs 2-5): 64 x 1M all 84.3 -> 78.5 µs, 48 x 1M
# 66.9 -> 63.2; +2.3 at 64 x 1M 1/8, +1.2 to +1.8 at 1/8 on 256K-512K rows (plain loop
# there; session 22, run 5, on 512K rows: 1/8 +1.5 to +3.5, all valid -1.5 to +0.2). 5
# stages, not 4, since the packed maxima (session 24, run 4, R = 8): 64 x 1M all 57.9 ->
# 57.4, 48 x 1M all 47.6 -> 47.1, 64 x 1M 1/8 24.8 -> 23.2; 6 stages were slower than 5 in
# all three. At k <= 512 from FOLD_STAGES_ROWS rows on 256K-512K rows too (session 37, two
# H100 runs, same process): 64 x 256K all -0.6 / -1.0, 1/8 -0.5 / -0.4, 64 x 512K within
# 0.1; at 48 rows it lost (256K all +1.3, 512K all +1.0), so not below; k = 2,048 not measured.
FOLD_STAGES = 5
FOLD_STAGES_ROWS = 64


def fold_stages(rows: int, n_chunks: int, log_r: int, k: int) -> int:
    """Pipeline stages of a group-maxima program that folds R = 2**log_r chunks of a grid of
    ``rows`` rows of ``n_chunks`` chunks, for the top ``k``: ``FOLD_STAGES`` where it folds
    by R >= 4 on 1M-column rows, or at k <= 512 on rows of more than 64 chunks (128K
    columns) from ``FOLD_STAGES_ROWS`` rows; else 1."""
    many = rows >= FOLD_STAGES_ROWS and k <= 512
    long_rows = n_chunks > 256 or (n_chunks > 64 and many)
    return FOLD_STAGES if long_rows and log_r >= 2 else 1


# Warps a CTA of each ``_triton`` kernel (``scripts/topk_warps.py`` times other choices in one
# process).
WARPS = {"group_max": 4, "threshold": 8, "collect": 4, "select": 8}
# The collect's register cap, set when its compare and stores were elementwise (then 84: 6
# four-warp CTAs a SM, no spills; ptxas took 89-92 left alone). Since session 27's
# ``_store_rows`` it takes 34 registers on small grids and 50 listed (sm_90a), under the cap.
COLLECT_MAXNREG = 84

# Plain mode runs one CTA a row (``_row``: one launch, its hand-offs CTA barriers) for rows of
# at most ROW_COLS columns when there are at least ROW_ROWS of them and k <= 512; otherwise
# the four-launch pipeline (``_triton``). One SM a row is slow on a long row but flat in the
# rows. Measured on the H200 (µs, k = 512, 64K columns): session 17 (runs 4-6,
# scripts/topk_row_probe.py): all valid 17.6 at 1 row against 9.6, 19.9 at 64 against 22.8;
# 1/8 valid 8.9-9.0 at 1-64 rows against 10.0-18.2. Session 18 (run 4,
# scripts/topk_stamps.py, T0 by parts): 1/8 valid 7.0 at 1 row against 8.9, all valid 14.3 /
# 14.5 / 16.3 at 1 / 12 / 64 rows against 8.4 / 11.7 / 23.5: from 24 rows (the four launches:
# 15.4 all valid, 11.8 at 1/8) it wins both; at 12 it would lose 2.8 at all valid. At
# k = 2,048 the select costs more (session 17: 24 x 64K all 34.7 against 25.0). Session 24
# (run 2, both paths on packed bf16 maxima, same process): 1/8 valid 6.6-7.0 at 1-64 rows
# against 7.2-12.2, all valid 13.8 / 14.0 / 15.8 / 16.3 at 1 / 12 / 24 / 64 rows against
# 7.9 / 9.6 / 11.6 / 17.8: below 24 rows the four launches stay (their all-valid cells meet
# the goal, the one-CTA ones would miss it by x1.5); at 24 the row's 1/8 cell meets it and
# the four launches missed both. Session 26 (run 3, same process; the threshold reading the
# length before its wait): four launches / ``_row`` at 24 rows 8.62 / 6.08 at 1/8 valid,
# 10.72 / 14.65 all valid, 10.77 / 14.63 with row 0 at 1/8 and the rest all valid; at 32
# rows 9.17 / 6.13, 12.46 / 14.80; at 48 rows 10.0 / 6.2, 14.53 / 15.03. Both meet the goals
# at 1/8 from 24 rows and neither all valid at 24, so the choice is the batch with a long
# row (any batch past its first few steps): the four launches up to 47 rows, ``_row`` from 48
# (at 48 it loses 0.5 all valid and gains 3.8 at 1/8).
ROW_COLS = 65536  # at most 2**16: ``_row`` packs a candidate's column in 16 bits
ROW_ROWS = 48


# Collect programs a row on folded grids (``P`` of ``_triton``'s kernels: also the most chunks a
# row collected by chunk may have; a longer row is listed): LIST_PROGRAMS, one listed span each
# up to 64 spans (1,024 listed segments; ~730 on random 1M rows at k = 512), strided loops
# beyond. From LIST_MANY_ROWS rows LIST_PROGRAMS_MANY: a random 256K-1M row at k = 512 lists
# ~39-46 spans, and the programs past a row's spans are waves of CTAs that only exit (session
# 22, run 8, 40 against 64 programs: 64 x 1M all 61.5 -> 58.8 µs, 48 x 1M all 49.5 -> 48.5,
# 64 x 256K all 34.3 -> 33.6; at fewer rows the loops cost more: 12 x 1M all +1.4, and
# 24 x 1M 1/8 +1.6, whose 64-chunk rows are listed then). At k <= 512 from LIST_MOST_ROWS
# rows LIST_PROGRAMS_MOST: 64 x 1M all -0.48 µs on the H200 (sessions 28 and 29), -0.77 and
# -0.95 on an H100 (session 37); at 48 rows 32 programs cost +0.2 at 256K and 1M all (session
# 29). k = 2,048 lists more segments a row and was not measured with 32.
LIST_PROGRAMS = 64
LIST_PROGRAMS_MANY = 40
LIST_MANY_ROWS = 48
LIST_PROGRAMS_MOST = 32
LIST_MOST_ROWS = 64


def listed(rows: int, n_chunks: int) -> bool:
    """Whether plain mode's grid collects from the threshold's segment lists (its rows longer
    than ``list_programs`` chunks; shorter ones still a chunk a program): past
    ``CHUNK_PROGRAMS`` programs."""
    return rows * n_chunks > CHUNK_PROGRAMS


def list_programs(rows: int, k: int) -> int:
    """Collect programs a row of a folded plain-mode grid of ``rows`` rows, for the top ``k``."""
    if rows >= LIST_MOST_ROWS and k <= 512:
        return LIST_PROGRAMS_MOST
    return LIST_PROGRAMS_MANY if rows >= LIST_MANY_ROWS else LIST_PROGRAMS


def one_cta_per_row(rows: int, cols: int, k: int) -> bool:
    """Whether plain mode runs ``_row`` (one CTA a row, one launch) for this shape."""
    return cols <= ROW_COLS and rows >= ROW_ROWS and k <= 512


def span_log2(rows: int, n_chunks: int) -> int:
    """log2 of the chunks R one group-maxima program folds: R = 1 (no folding) below
    ``FOLD2_PROGRAMS`` programs, R = 2 up to ``CHUNK_PROGRAMS``; beyond, for rows of at most
    256 chunks (512K columns), R = 8 on grids of more than 6,144 chunks and R = 4 on grids of
    3,073 to 6,144; else the smallest R >= 2 (at most 8) that leaves at most 3,072 programs.

    Measured on the H200 (``scripts/topk_span_sweep.py``, every folded k = 512 cell at R = 2 /
    4 / 8, µs). Session 18 (run 6): all valid, R = 2 was fastest in every cell (12 x 1M 24.8
    against 27.9 at R = 8, 64 x 1M 81.1 / 84.7); at 1/8 valid (most programs idle) larger R
    won as the grid grew. Session 19 (runs 3, 6, after short rows on folded grids were
    collected by chunk): at 1/8 valid R = 8 won on the 256K and 512K rows from 6,144 chunks
    (24 x 512K 14.6 against 16.1 at R = 2, 64 x 256K 18.7 against 20.9 at R = 4), at a price
    of 0.8 to 2.3 all valid (24 x 512K 30.9 / 29.2, 64 x 256K 49.1 / 48.3 / 46.8 at R = 8 /
    4 / 2); on 1M rows R = 8 lost both ways at 12 rows (1/8 15.4 / 15.2 at R = 4, all 27.8 /
    25.3 at R = 2). Session 38 (runs 1-3 on an H100, same process, µs, R = 4 / 8): on the
    6,144-chunk grids R = 4 won at both k, 48 x 256K all 23.93 / 24.94 and 24.26 / 24.89,
    1/8 12.37 / 13.56 and 12.20 / 13.38, 24 x 512K all 21.69 / 21.99, 1/8 11.05 / 11.36; at
    k = 2,048 48 x 256K all 39.28 / 41.68, 1/8 18.63 / 20.11, 24 x 512K 1/8 18.30 / 19.60;
    from 8,192 chunks R = 8 stays: 64 x 256K 1/8 13.02 against 14.51 at R = 4, 48 x 512K 1/8
    14.49 / 14.73 and all valid 34.82 / 35.17 (64 x 512K all 44.68 / 44.00, one run, its 1/8
    not timed)."""
    if rows * n_chunks <= CHUNK_PROGRAMS:
        return int(rows * n_chunks >= FOLD2_PROGRAMS and n_chunks >= 2)
    if n_chunks <= 256 and rows * n_chunks > 3072:
        return 3 if rows * n_chunks > 6144 else 2
    r = 2
    while r < 8 and rows * n_chunks > 3072 * r and 2 * r <= n_chunks:
        r *= 2
    return r.bit_length() - 1


# The collect's span by rows of 8 in inline PTX (``_triton._store_rows``, sm_90) from
# ROW_PTX_PROGRAMS chunk programs; below, the elementwise form. The PTX rows issue fewer
# instructions an element but chain more latency in a program (the row loop, the bit
# assembly): they pay where the collect is issue-bound (many busy programs), not on small
# grids, whose few busy programs wait on latency. Session 28 (run 2,
# ``scripts/topk_row_probe.py``, same process, µs, PTX rows / elementwise): below 768 programs
# at 1/8 valid 6.84 / 6.47 (1 x 64K), 7.55 / 7.19 (6 x 64K), 7.52 / 7.30 (12 x 64K), 7.15 /
# 6.95 (1 x 256K), 7.30 / 7.16 (1 x 1M), all valid 8.59 / 8.57 (12 x 64K) but 7.63 / 7.98
# (6 x 64K) and 7.96 / 8.29 (1 x 1M), whose goals are far; at 768 (6 x 256K) 7.52 / 7.59 and
# 9.70 / 10.00 (session 27, run 8: -0.3 to -1.4 µs all valid on 768-3,072 programs).
ROW_PTX_PROGRAMS = 768


def row_ptx(rows: int, n_chunks: int) -> bool:
    """Whether the collect runs its PTX rows (on sm_90+) on a grid of rows x n_chunks chunks."""
    return rows * n_chunks >= ROW_PTX_PROGRAMS


# Folded grids of at least STRIDED_PROGRAMS chunk programs on rows of at most 256 chunks (512K
# columns) fold strided (``_triton._group_max_kernel``'s STRIDED: program p takes chunks p,
# p + n_p, ..., one chunk a load, 63 registers against 96, so the group maxima run in one wave).
# Session 23 (run 7, ``scripts/topk_row_probe.py --variants chunks-spans,chunks-strided``,
# µs, same process, after the select's middle tile): 64 x 512K all 44.4 -> 42.7 (the goal,
# 44.7, met), 1/8 18.5 -> 20.7 (goal 35.0); 64 x 256K all -1.4 but 1/8 +2.4 (goal 19.6);
# 48 x 256K-512K within 0.1 but 48 x 256K 1/8 +1.2; 1M rows 1/8 -1.0 / -2.0 at 64 / 48 rows,
# all valid +0.8 to +3.8 (runs 1-2: the pipelined fold's chunks in flight lost). At k = 2,048
# (run 8) 64 x 512K 1/8 25.1 -> 32.1 (all valid -0.7, run 3 against session 22's bench). So
# only at k <= 512, where it turns a goal cell.
STRIDED_PROGRAMS = 16384


def strided_fold(rows: int, n_chunks: int, k: int) -> bool:
    """Whether plain mode's group maxima fold chunks strided (see ``STRIDED_PROGRAMS``)."""
    return (k <= 512 and span_log2(rows, n_chunks) > 0 and n_chunks <= 256
            and rows * n_chunks >= STRIDED_PROGRAMS)


@dataclass(frozen=True)
class TopkConfig:
    """Static sizes of plain mode's four kernels (``_triton``) and of block mode's radix select
    (``_radix``); all powers of two.

    - ``chunk``: columns per program of plain mode's two row-wide passes;
    - ``lmax``: log2(chunk), the coarsest group level (one group per chunk);
    - ``target``: the group-maxima pass picks the level with ``target <= groups < 2 * target``
      valid groups (``target`` in [1.5k, 2k]: the k-th largest of m >= 1.5k group maxima
      keeps about m * ln(m / (m - k)) <= 1.65k candidates on random data);
    - ``groups``: workspace slots per row for the group maxima (bounds every level's count);
    - ``small`` / ``cap``: candidate-tile sizes of the final selection; more than ``cap``
      candidates takes the exact single-CTA fallback;
    - ``max_chunks``: programs per row of the row-wide passes at 2**20 columns;
    - ``nseg``: segments a chunk on grids collected from segment lists (``NSEG``, twice that
      at k > 512);
    - ``rchunk`` / ``rchunks``: block mode runs the radix select (``_radix``) with chunks of
      ``rchunk`` elements (``rchunk // 2`` for a single row); ``rchunks`` bounds the chunks a
      row at 2**20 columns; 0 in plain mode, which runs the four kernels above.
    """

    k: int
    block: int
    chunk: int
    lmax: int
    target: int
    groups: int
    small: int
    cap: int
    max_chunks: int
    nseg: int
    rchunk: int
    rchunks: int

    @staticmethod
    def pick(k: int, block: int = 1) -> TopkConfig:
        chunk = 2048  # 4 KB of bf16 per program: enough CTAs at 1 row
        # a level below lmax has < 2 * target + chunk groups (lmax: <= 2**20 / 2048 = 512);
        # target = 2k where that fits 3k + chunk rounded up (k = 2048: 1.5k, halving the tile)
        groups = max(_pow2_at_least(3 * k + chunk), 1024)
        target = max(k, min(2 * k, (groups - chunk) // 2))
        small = max(_pow2_at_least(2 * k), 128)
        rchunk = min(RADIX_COLS // block, RADIX_ELEMENTS) if block > 1 else 0
        return TopkConfig(
            k=k,
            block=block,
            chunk=chunk,
            lmax=chunk.bit_length() - 1,
            target=target,
            groups=groups,
            small=small,
            cap=min(4 * small, 8192),
            max_chunks=512,  # 2**20 columns / 2048 columns per program
            nseg=NSEG if k <= 512 else 2 * NSEG,
            rchunk=rchunk,
            rchunks=2 * (1 << 20) // (block * rchunk) if rchunk else 0,
        )

    def radix_chunk(self, rows: int) -> int:
        """Elements a chunk of the radix select for ``rows`` rows (see RADIX_COLS)."""
        return self.rchunk // 2 if rows == 1 else self.rchunk
