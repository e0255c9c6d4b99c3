"""``bench plot``'s top-k goal grid (``topk_goals.png``) from a results CSV."""

from __future__ import annotations

import csv

import pytest

from dsv4_decode.bench.plot import latest_rows, plot_topk_goals, topk_goal_grid
from dsv4_decode.bench.topk import GOAL, ROWS

FIELDS = ["op", "case", "impl", "us", "gbps", "floor_us", "gpu", "commit", "date"]


def write_csv(path, rows, gpu="H200"):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for row in rows:
            case, impl, us, commit = row[:4]
            w.writerow(dict(op="topk", case=case, impl=impl, us=us, gbps=1, floor_us=1,
                            gpu=row[4] if len(row) > 4 else gpu, commit=commit,
                            date="2026-11-30"))


def test_goal_grid_takes_the_latest_ours_row_of_each_cell(tmp_path):
    cell = "rows=6,cols=65536,valid=all,k=512"
    write_csv(tmp_path / "topk.csv", [
        (cell, "ours", 20.0, "aaaaaaa"),
        (cell, "torch", 90.0, "aaaaaaa"),
        (cell, "ours", 8.5, "bbbbbbb"),  # later row: wins
        ("rows=6,cols=65536,valid=all,k=2048", "ours", 1.0, "ccccccc"),  # not a goal cell
    ])
    labels, cols, cells = topk_goal_grid(latest_rows(tmp_path / "topk.csv"))
    assert len(labels) == len(GOAL) and len(cols) == len(ROWS)
    i = list(GOAL).index((65536, "all"))
    assert cells[i][ROWS.index(6)] == (8.5, GOAL[(65536, "all")][1], "bbbbbbb")
    assert sum(us is not None for line in cells for us, _, _ in line) == 1


def test_goal_plot_written(tmp_path):
    pytest.importorskip("matplotlib")
    write_csv(tmp_path / "topk.csv", [("rows=1,cols=65536,valid=1/8,k=512", "ours", 7.0, "x")])
    out = plot_topk_goals(latest_rows(tmp_path / "topk.csv"), tmp_path)
    assert out == tmp_path / "topk_goals.png" and out.stat().st_size > 10_000
    write_csv(tmp_path / "topk.csv", [("rows=1,cols=65536,valid=1/8,k=2048", "ours", 7.0, "x")])
    assert plot_topk_goals(latest_rows(tmp_path / "topk.csv"), tmp_path) is None


def test_latest_rows_keep_to_one_gpu(tmp_path):
    """A later row from another GPU does not replace a cell's number: by default the GPU with
    the most rows, or the one named."""
    cell = "rows=64,cols=1048576,valid=all,k=512"
    write_csv(tmp_path / "topk.csv", [
        (cell, "ours", 54.2, "aaaaaaa"),
        (cell, "torch", 547.0, "aaaaaaa"),
        (cell, "ours", 66.2, "bbbbbbb", "H100"),  # later, another card
    ])
    assert latest_rows(tmp_path / "topk.csv")[cell]["ours"]["us"] == "54.2"
    h100 = latest_rows(tmp_path / "topk.csv", "H100")
    assert h100[cell]["ours"]["us"] == "66.2" and "torch" not in h100[cell]
    assert latest_rows(tmp_path / "topk.csv", "B200") == {}
