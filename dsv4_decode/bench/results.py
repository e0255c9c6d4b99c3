"""Benchmark results: one row per implementation per case, appended to
``benchmarks/results/<op>.csv`` with the columns
``op,case,impl,us,gbps,floor_us,gpu,commit,date``, and printed as a side-by-side table.

``case`` is a readable shape string (``rows=6,cols=65536,valid=1/8,k=512``); ``impl`` names the
implementation (``ours``, ``torch``, ``compiled``, ...); ``gbps`` is the floor's bytes over the
measured time; ``floor_us`` the byte floor at ``HBM_TBPS``.
"""

from __future__ import annotations

import csv
import datetime
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

HBM_TBPS = 4.5  # H200 read bandwidth real kernels reach (design doc, Measuring)
COLUMNS = ("op", "case", "impl", "us", "gbps", "floor_us", "gpu", "commit", "date")
RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@dataclass
class Row:
    op: str
    case: str
    impl: str
    us: float
    floor_bytes: float = 0.0  # bytes that must move; 0 when no floor applies

    @property
    def gbps(self) -> float:
        return self.floor_bytes / (self.us * 1e3) if self.us > 0 else 0.0

    @property
    def floor_us(self) -> float:
        return self.floor_bytes / (HBM_TBPS * 1e6)


def case_key(**fields) -> str:
    """``case_key(rows=6, cols=65536)`` -> ``'rows=6,cols=65536'`` (order kept)."""
    return ",".join(f"{k}={v}" for k, v in fields.items())


def _commit() -> str:
    """``DSV4_COMMIT`` when set (a GPU machine running a copy of the tree has no .git), else
    git's short HEAD."""
    if os.environ.get("DSV4_COMMIT"):
        return os.environ["DSV4_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, timeout=10)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def write_rows(rows: list[Row], op: str, out_dir: Path | None = None) -> Path:
    """Append ``rows`` to ``<out_dir or benchmarks/results>/<op>.csv`` (header if new)."""
    out_dir = Path(out_dir) if out_dir else RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{op}.csv"
    new = not path.exists()
    gpu, commit = gpu_name(), _commit()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with path.open("a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(COLUMNS)
        for r in rows:
            w.writerow((r.op, r.case, r.impl, f"{r.us:.2f}", f"{r.gbps:.1f}",
                        f"{r.floor_us:.2f}", gpu, commit, date))
    return path


def print_table(rows: list[Row], impls: list[str]) -> None:
    """One line per case: each impl's µs side by side, then the floor and our GB/s."""
    cases: dict[str, dict[str, Row]] = {}
    for r in rows:
        cases.setdefault(r.case, {})[r.impl] = r
    head = f"{'case':52s} " + " ".join(f"{i:>10s}" for i in impls) + f" {'floor':>8s} {'GB/s':>7s}"
    print(head)
    for case, by in cases.items():
        cells = " ".join(f"{by[i].us:10.2f}" if i in by else f"{'-':>10s}" for i in impls)
        first = by.get(impls[0]) or next(iter(by.values()))
        print(f"{case:52s} {cells} {first.floor_us:8.2f} {first.gbps:7.0f}")
