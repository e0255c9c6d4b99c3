"""Summarise Nsight Compute's source-level SASS CSV (``ncu --page source --csv --print-source
sass``) as text, per kernel of the report: stall reasons over all samples, the instruction mix,
shared-memory wavefronts (and the excessive ones: bank conflicts), and the instructions with
the most stall samples.

    python3 scripts/ncu_stalls.py NAME.sass.csv [...]   # writes NAME.stalls.txt beside each

``scripts/ncu_probe.sh`` runs it on the device, so only the text comes back.
"""

from __future__ import annotations

import collections
import csv
import sys


def sections(path: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """The CSV's kernels: ``(name, header, rows)`` each. A report of several kernels holds one
    block per kernel, each opened by a ``"Kernel Name", name`` row and its own header row."""
    out = []
    for r in csv.reader(open(path)):
        if r and r[0] == "Kernel Name":
            out.append((r[1] if len(r) > 1 else "?", None, []))
        elif out and out[-1][1] is None:
            out[-1] = (out[-1][0], r, [])
        elif out and len(r) == len(out[-1][1]):
            out[-1][2].append(r)
    return out


def summarize(path: str, top: int = 30) -> str:
    return "".join(f"=== {name}\n" + summarize_kernel(header, data, top)
                   for name, header, data in sections(path))


def summarize_kernel(header: list[str], data: list[list[str]], top: int = 30) -> str:
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, h):
        try:
            return int(r[col[h]] or 0)
        except ValueError:
            return 0

    total = collections.Counter({h: sum(num(r, h) for r in data) for h in stalls})
    n_samples = sum(total.values()) or 1
    out = [f"stall reasons (all samples, {n_samples}):"]
    out += [f"  {h:26s} {v:6d} {100 * v / n_samples:5.1f}%" for h, v in total.most_common(14)]
    mix, n_instr = collections.Counter(), 0
    for r in data:
        words = r[col["Source"]].split()
        if words:
            op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
            mix[op] += num(r, "Instructions Executed")
            n_instr += num(r, "Instructions Executed")
    out.append(f"\nwarp instructions executed: {n_instr}; mix:")
    out += [f"  {op:34s} {c:9d} {100 * c / max(n_instr, 1):5.1f}%" for op, c in mix.most_common(26)]
    shared = sum(num(r, "L1 Wavefronts Shared") for r in data)
    excess = sum(num(r, "L1 Wavefronts Shared Excessive") for r in data)
    out.append(f"\nL1 shared wavefronts {shared}, excessive {excess}")
    out.append(f"\ntop {top} instructions by stall samples:")
    hot = sorted(data, key=lambda r: -num(r, "Warp Stall Sampling (All Samples)"))[:top]
    for r in hot:
        reason = max(stalls, key=lambda h: num(r, h))[len("stall_"):]
        out.append(f"  {num(r, 'Warp Stall Sampling (All Samples)'):6d} {reason:12s} "
                   f"{r[col['Source']].strip()[:70]}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    for p in sys.argv[1:]:
        with open(p.removesuffix(".sass.csv") + ".stalls.txt", "w") as f:
            f.write(summarize(p))
