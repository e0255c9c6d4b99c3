"""``dsv4-decode bench plot``: the results CSVs as PNG charts (ours vs baselines vs floor).

For each ``<op>.csv`` one horizontal bar chart: a group of bars per case (the latest row of each
implementation on one GPU, by default the one with the most rows; the legend names the commits
they come from), a tick for the byte floor, log-scaled microseconds. For ``topk.csv`` also
``topk_goals.png``: the issue's 48-cell k = 512 goal table as a grid, each cell ours / goal
(green at or below the goal, red above) with both numbers written in it.
Needs matplotlib (``pip install dsv4_decode[plot]``).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from dsv4_decode.bench.results import RESULTS_DIR


def latest_rows(path: Path, gpu: str | None = None) -> dict[str, dict[str, dict]]:
    """``case -> impl -> row`` keeping the last row per (case, impl) measured on ``gpu``; by
    default on the GPU with the most rows in the file, so that one chart (and the goal grid,
    whose goals are one GPU's) never mixes cards: a later run on another GPU does not replace
    a cell's number."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if gpu is None and rows:
        names = [row["gpu"] for row in rows]
        gpu = max(dict.fromkeys(names), key=names.count)
    table: dict[str, dict[str, dict]] = {}
    for row in rows:
        if row["gpu"] == gpu:
            table.setdefault(row["case"], {})[row["impl"]] = row
    return table


def topk_goal_grid(table: dict[str, dict[str, dict]]):
    """The k = 512 goal cells of ``latest_rows(topk.csv)``: ``(row_labels, col_labels, cells)``
    with ``cells[i][j]`` = ``(ours_us, goal_us, commit)`` for (cols, valid) ``i`` and row count
    ``j``; ``ours_us`` and ``commit`` None where the CSV has no ``ours`` row of that cell."""
    from dsv4_decode.bench.topk import GOAL, ROWS

    labels, cells = [], []
    for (cols, valid), goals in GOAL.items():
        labels.append(f"{cols:,} cols, {valid} valid")
        line = []
        for rows, goal in zip(ROWS, goals, strict=True):
            row = table.get(f"rows={rows},cols={cols},valid={valid},k=512", {}).get("ours")
            line.append((float(row["us"]) if row else None, goal, row["commit"] if row else None))
        cells.append(line)
    return labels, [f"{r} row{'s' if r > 1 else ''}" for r in ROWS], cells


def plot_topk_goals(table: dict[str, dict[str, dict]], out_dir: Path) -> Path | None:
    """``topk_goals.png`` from ``topk_goal_grid`` (module docstring); None without rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    labels, cols, cells = topk_goal_grid(table)
    if all(us is None for line in cells for us, _, _ in line):
        return None
    ratio = [[us / goal if us else float("nan") for us, goal, _ in line] for line in cells]
    fig, ax = plt.subplots(figsize=(9, 6.5))
    img = ax.imshow(ratio, cmap="RdYlGn_r", norm=LogNorm(vmin=0.5, vmax=2.0), aspect="auto")
    for i, line in enumerate(cells):
        for j, (us, goal, _) in enumerate(line):
            text = f"{us:.1f}\n/ {goal:.1f}" if us else f"–\n/ {goal:.1f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(labels)), labels)
    met = sum(us is not None and us <= goal for line in cells for us, goal, _ in line)
    commits = sorted({c for line in cells for us, _, c in line if us is not None})
    ax.set_title(f"decode_topk, k = 512: ours / goal µs ({met} of "
                 f"{sum(map(len, cells))} cells at or below the goal)\n"
                 f"latest 'ours' row of each cell, commit {', '.join(commits)}", fontsize=9)
    bar = fig.colorbar(img, ax=ax, label="ours / goal (log scale)")
    ticks = (0.5, 0.75, 1.0, 1.5, 2.0)
    bar.set_ticks(ticks, labels=[f"{t:g}" for t in ticks])
    bar.minorticks_off()
    fig.tight_layout()
    out = out_dir / "topk_goals.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_op(path: Path, out_dir: Path, gpu: str | None = None) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = latest_rows(path, gpu)
    if not table:
        return None
    impls = sorted({i for by in table.values() for i in by}, key=lambda i: (i != "ours", i))
    cases = list(table)
    height = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(cases) * len(impls) + 1.5))
    for k, impl in enumerate(impls):
        ys = [c + k * height for c in range(len(cases))]
        xs = [float(table[c][impl]["us"]) if impl in table[c] else 0.0 for c in cases]
        commits = sorted({table[c][impl]["commit"] for c in cases if impl in table[c]})
        ax.barh(ys, xs, height=height, label=f"{impl} @ {', '.join(commits)}")
    floors = [max(float(r["floor_us"]) for r in table[c].values()) for c in cases]
    ax.scatter(floors, [c + 0.4 - height / 2 for c in range(len(cases))], marker="|", s=300,
               color="black", label="byte floor", zorder=3)
    ax.set_yticks([c + 0.4 - height / 2 for c in range(len(cases))], cases, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("µs per call (log)")
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)
    any_row = next(iter(next(iter(table.values())).values()))
    ax.set_title(f"{path.stem} on {any_row['gpu']} (latest row of each implementation)")
    fig.tight_layout()
    out = out_dir / f"{path.stem}.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dsv4-decode bench plot", description=__doc__)
    p.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of <op>.csv files")
    p.add_argument("--out", type=Path, default=None, help="where PNGs go (default: --results)")
    p.add_argument("--gpu", default=None, help="plot the rows measured on this GPU name "
                   "(default: the GPU with the most rows in each CSV)")
    args = p.parse_args(argv)
    out_dir = args.out or args.results
    out_dir.mkdir(parents=True, exist_ok=True)
    csvs = sorted(args.results.glob("*.csv"))
    if not csvs:
        print(f"no CSVs in {args.results}")
        return 1
    for path in csvs:
        png = plot_op(path, out_dir, args.gpu)
        print(f"{path.name} -> {png}" if png else f"{path.name}: no rows")
        if path.stem == "topk" and png:
            print(f"{path.name} -> {plot_topk_goals(latest_rows(path, args.gpu), out_dir)}")
    return 0
