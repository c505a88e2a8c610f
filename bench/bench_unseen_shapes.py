"""Predictive against the baselines on every traffic shape no one tuned on, in one run, with a summary.

The shape sets are the ones sessions wrote to check issue 5's "traces and burst patterns the project has never
seen": ``bench/gen_shapes_s11.py`` (11), ``gen_shapes_s14.py`` (10) and ``gen_shapes_s14k.py`` (1), and
``gen_shapes_s18.py`` at seeds 0 and 1 (10 each). Each shape is replayed as ``bench/bench_policies.py --workloads
file:PATH`` replays it (llama3-8b/a100, one P/D pool of 1-64 per role, TTFT 1 s / ITL 50 ms), by predictive with
the shipped forecaster and by the ``--policies`` baselines (default: reactive, dynamo-like, static-peak).

Printed: one markdown row per shape (SLO % / GPU-s per policy; predictive's SLO points over each baseline and its
GPU-s ratio), then a summary per baseline: on how many shapes predictive is at or above it within
``--tolerance`` SLO points (default 0.1), the shapes it loses by more, and the median and range of its GPU-s
ratio. Deterministic figures (seeded shapes, virtual clock); only the wall time depends on the machine.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python bench/bench_unseen_shapes.py [--out DIR] [--sets s11,s14,s14k,s18,s18@1]
[--policies reactive,dynamo-like,static-peak] [--params k=v,...] [--json OUT]`` (~4 min on a 2-core VM).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SETS = {  # set name -> (generator module, seed)
    "s11": ("gen_shapes_s11", 0),
    "s14": ("gen_shapes_s14", 0),
    "s14k": ("gen_shapes_s14k", 0),
    "s18": ("gen_shapes_s18", 0),
    "s18@1": ("gen_shapes_s18", 1),
}


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"bench/{name}.py not found")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


def write_sets(out: Path, sets: list[str]) -> list[tuple[str, Path]]:
    """Every shape of ``sets`` written under ``out/<set>/`` (once; an existing file is kept): (set, path)."""
    from serving.workload import formats as F
    from serving.workload.writers import write_trace

    files: list[tuple[str, Path]] = []
    for name in sets:
        gen, seed = SETS[name]
        directory = out / name.replace("@", "_seed")
        directory.mkdir(parents=True, exist_ok=True)
        for shape, (_, trace) in _module(gen).build(seed).items():
            path = directory / f"{shape}.csv"
            if not path.exists():
                write_trace(trace, path, F.AZURE)
            files.append((name, path))
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/unseen_shapes"), help="where the shape files go")
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    ap.add_argument("--policies", default="reactive,dynamo-like,static-peak", help="the baselines")
    ap.add_argument("--params", default="", help="PolicyConfig overrides for predictive: k=v,k=v")
    ap.add_argument("--tolerance", type=float, default=0.1, help="SLO points counted as a tie")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = ap.parse_args(argv)
    sets = [s for s in args.sets.split(",") if s]
    unknown = sorted(set(sets) - set(SETS))
    if unknown:
        ap.error(f"--sets: unknown {', '.join(unknown)}; known: {', '.join(SETS)}")
    baselines = [p for p in args.policies.split(",") if p]
    bp = _module("bench_policies")
    params = bp._parse_params(args.params)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for set_name, path in write_sets(args.out, sets):
        trace, fleet = bp.workload(f"file:{path}", None, 600.0)
        figures: dict[str, tuple[float, float]] = {}
        for policy in ["predictive", *baselines]:
            rep = bp.run(
                path.stem, trace, fleet, bp.make(policy, "default", params if policy == "predictive" else {})
            )
            figures[policy] = (100.0 * rep.slo_attainment, rep.gpu_seconds)
        rows.append({"set": set_name, "shape": path.stem, "figures": figures})
        print(
            f"{set_name} {path.stem}: done ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True
        )
    head = ["set", "shape", "predictive", *baselines, *[f"Δ SLO / GPU-s vs {b}" for b in baselines]]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        f = row["figures"]
        p_slo, p_gpu = f["predictive"]
        cells = [
            row["set"],
            row["shape"],
            *[f"{f[k][0]:.2f} / {f[k][1]:,.0f}" for k in ["predictive", *baselines]],
        ]
        cells += [f"{p_slo - f[b][0]:+.2f} / {p_gpu / f[b][1]:.2f}" for b in baselines]
        print("| " + " | ".join(cells) + " |")
    print()
    print(
        "| against | shapes | predictive at or above (within the tolerance) | loses by more | GPU-s ratio: median (min-max) |"
    )
    print("|---|---|---|---|---|")
    for b in baselines:
        deltas = [(r["figures"]["predictive"][0] - r["figures"][b][0], r["shape"], r["set"]) for r in rows]
        ratios = [r["figures"]["predictive"][1] / r["figures"][b][1] for r in rows]
        losses = [f"{shape} ({s}) {d:+.2f}" for d, shape, s in deltas if d < -args.tolerance]
        print(
            f"| {b} | {len(rows)} | {len(rows) - len(losses)} | {'; '.join(losses) or 'none'} | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps({"tolerance": args.tolerance, "params": params, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
