"""The seed table's figures: ``pdscale bench seed-table`` (default config) plus a few variants, timed.

For each variant prints one markdown row per QPS (colocated vs P/D TTFT P50/P99, ratio, ITL and E2E P99),
the P/D split chosen, the verdict, and the wall / CPU seconds of the whole run (trace load included).
Everything is seeded; the latencies are deterministic, the times depend on the machine's load.

Run: .venv/bin/python bench/bench_seed_table.py [--variants default,isl512,gpus4-isl512,gpus8,gpus8-itl,marks]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving.sim.replay_cli import default_trace_path
from serving.sim.seed_table import (
    Lengths,
    Quantile,
    SeedTable,
    SeedTableConfig,
    fixed_lengths,
    seed_table,
    shape_verdict,
    trace_lengths,
)

VARIANTS: dict[str, tuple[SeedTableConfig, str]] = {
    "default": (SeedTableConfig(), "azure"),
    "gpus8": (SeedTableConfig(gpus=8), "azure"),
    "marks": (SeedTableConfig(long_context_prefill=1, high_memory_decode=1), "azure"),
    "isl512": (SeedTableConfig(), "isl512"),
    "gpus4-isl512": (SeedTableConfig(gpus=4), "isl512"),
    "gpus8-itl": (SeedTableConfig(gpus=8, headline="itl"), "azure"),
}


def _ms(q: Quantile) -> str:
    if q.timeout:
        return "timeout"
    return "unknown" if math.isnan(q.ms) else f"{q.ms:,.0f}"


def _rows(name: str, t: SeedTable) -> list[str]:
    """Markdown rows; the ratio column is of the variant's headline metric (TTFT unless it says itl)."""
    c = t.config
    split = f"{t.chosen_prefill}P+{c.gpus - t.chosen_prefill}D"
    out = []
    for r in t.rows:
        col, pd = r.colocated.metrics, r.pd.metrics
        out.append(
            f"| {name} | {c.gpus} | {split} | {r.qps:g} | {_ms(col['ttft'].p50)} / {_ms(col['ttft'].p99)} | "
            f"{_ms(pd['ttft'].p50)} / {_ms(pd['ttft'].p99)} | {r.ratio.text()} | "
            f"{_ms(col['itl'].p99)} / {_ms(pd['itl'].p99)} | {_ms(col['e2e'].p99)} / {_ms(pd['e2e'].p99)} |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variants", default="default", help=f"comma-separated, from {sorted(VARIANTS)}")
    args = ap.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {sorted(VARIANTS)}")
    print("| variant | GPUs | P/D split | QPS | colocated TTFT P50 / P99 | P/D TTFT P50 / P99 | ratio P99 "
          "| ITL P99 coloc / P/D | E2E P99 coloc / P/D |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    notes = []
    for name in names:
        config, source = VARIANTS[name]
        wall0, cpu0 = time.perf_counter(), time.process_time()
        lengths: Lengths = (
            trace_lengths(default_trace_path()) if source == "azure" else fixed_lengths(512, 128)
        )
        table = seed_table(config, lengths)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        for line in _rows(name, table):
            print(line)
        notes.append(
            f"- {name}: lengths {lengths.description.split('/')[-1]}; {shape_verdict(table)}; "
            f"{wall:.1f} s wall, {cpu:.1f} s CPU"
        )
    print()
    print("\n".join(notes))


if __name__ == "__main__":
    main()
