"""Side by side: two or more runs of bench/reference_table.sh (SLO % / GPU-s per row, totals, ratios).

    python bench/reference_compare.py /tmp/ref14 /tmp/candidate [...]

Reads each directory's main/more/sine300/sine1200/shapes.txt (bench_policies.py's printed markdown
tables, predictive rows). Prints one markdown table: a row per workload, each run's SLO % / GPU-s, the
last run's SLO points and GPU-s ratio against the first, and the totals of the 14 reference rows and of
the shapes. A row missing from a run is shown as "missing", never dropped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

FILES = ("main", "more", "sine300", "sine1200", "shapes")


def _name(file: str, workload: str) -> str:
    if file == "sine300":
        return "sine-300"
    if file == "sine1200":
        return "sine-1200"
    if workload == "sine":
        return "sine-600"
    if workload.startswith("file:"):
        return Path(workload[5:]).stem
    return workload


def read_run(directory: Path) -> dict[str, tuple[float, float, str]]:
    """Workload name → (SLO %, GPU-s, the table it came from) of the predictive rows of one run's tables."""
    rows: dict[str, tuple[float, float, str]] = {}
    for file in FILES:
        path = directory / f"{file}.txt"
        if not path.exists():
            continue
        header: list[str] | None = None
        for line in path.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if "workload" in cells and "GPU-s" in cells:
                header = cells
                continue
            if header is None or len(cells) != len(header) or cells[header.index("policy")] != "predictive":
                continue
            slo = float(cells[header.index("SLO attained")].rstrip("%"))
            gpu = float(cells[header.index("GPU-s")].replace(",", ""))
            rows[_name(file, cells[header.index("workload")])] = (slo, gpu, file)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "runs", nargs="+", type=Path, help="reference_table.sh output directories; the first is the base"
    )
    args = ap.parse_args(argv)
    runs = [read_run(d) for d in args.runs]
    for d, r in zip(args.runs, runs, strict=True):
        if not r:
            print(
                f"error: no predictive rows under {d} (expected {', '.join(f + '.txt' for f in FILES)})",
                file=sys.stderr,
            )
            return 2
    names: list[str] = []
    for r in runs:
        names += [n for n in r if n not in names]
    head = ["row", *(d.name or str(d) for d in args.runs), "Δ SLO points", "GPU-s ratio"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    totals = {"reference": [0.0] * len(runs), "shapes": [0.0] * len(runs)}
    for n in names:
        cells = []
        for i, r in enumerate(runs):
            if n in r:
                cells.append(f"{r[n][0]:.2f} / {r[n][1]:,.0f}")
                totals["shapes" if r[n][2] == "shapes" else "reference"][i] += r[n][1]
            else:
                cells.append("missing")
        base, last = runs[0].get(n), runs[-1].get(n)
        if base and last:
            cells += [f"{last[0] - base[0]:+.2f}", f"{last[1] / base[1]:.3f}" if base[1] else "-"]
        else:
            cells += ["-", "-"]
        print(f"| {n} | " + " | ".join(cells) + " |")
    for k, t in totals.items():
        ratio = f"{t[-1] / t[0]:.4f}" if t[0] else "-"
        print(f"| **total {k} GPU-s** | " + " | ".join(f"{v:,.0f}" for v in t) + f" | | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
