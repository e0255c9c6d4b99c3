"""``dsv4-decode bench plot``: the results CSVs as PNG charts (ours vs baselines vs floor).

For each ``<op>.csv`` one horizontal bar chart: a group of bars per case (the latest row of each
implementation on the chosen GPU; the legend names the commits they come from), a tick for the
byte floor, log-scaled microseconds.
Needs matplotlib (``pip install dsv4_decode[plot]``).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from dsv4_decode.bench.results import RESULTS_DIR


def latest_rows(path: Path, gpu: str | None = None) -> dict[str, dict[str, dict]]:
    """``case -> impl -> row`` keeping the last row per (case, impl), optionally for one GPU."""
    table: dict[str, dict[str, dict]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if gpu and row["gpu"] != gpu:
                continue
            table.setdefault(row["case"], {})[row["impl"]] = row
    return table


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
    p.add_argument("--gpu", default=None, help="only rows measured on this GPU name")
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
    return 0
