"""``pdscale plan --placement compare``: dedicated against PD-mixed nodes, replayed in the simulator.

Run: ``.venv/bin/python bench/bench_placement.py`` (about 40 s on a shared 2-core machine).

For the steady Poisson loads of bench_plan.py (llama3-8b/a100, 120 s, fixed ISL/OSL, no headroom, seed 0)
it plans both placements (dedicated: P + D nodes; mixed-node: N nodes of one prefill + one decode vLLM at
--gpu-memory-utilization 0.4 / 0.5), replays each with the ``fixed`` policy and prints GPUs, GPU-seconds,
SLO attainment and the winner: first with the interference derived from the operator timings (the
simulator's default since W6, serving/sim/interference.py: per decode run, from its batch, its context and the
prefill iteration in progress beside it), then at fixed decode slowdowns 1.0 to 3.0 (``--mixed-node-slowdown``:
decode steps x slowdown while the node's prefill instance works; prefill is not slowed), to show how much the
verdict rests on the interference model.
"""

from __future__ import annotations

import time

from serving.sim.plan import (
    LoadPoint,
    NodePartition,
    PlanError,
    compare_placements,
    plan_capacity,
    plan_mixed_node,
    poisson_trace,
)

PROFILE = "llama3-8b/a100"
CASES = (  # rate_rps, isl, osl, slo_ttft_ms, slo_itl_ms (bench_plan.py's)
    (20.0, 1024, 256, 500.0, 30.0),
    (20.0, 512, 512, 500.0, 40.0),
    (20.0, 2048, 128, 1000.0, 50.0),
    (30.0, 1500, 300, 800.0, 35.0),
    (12.0, 4096, 256, 1500.0, 40.0),
)
SLOWDOWNS: tuple[float | None, ...] = (None, 1.0, 1.3, 2.0, 3.0)  # None: derived from the operator timings


def run(slowdown: float | None) -> None:
    label = "derived from the operator timings" if slowdown is None else f"{slowdown:g}"
    print(f"## decode slowdown {label} (prefill 0.4 / decode 0.5 of each GPU)")
    print("case | dedicated P+D GPUs att GPU·s | mixed nodes GPUs att GPU·s | winner | reason")
    for rate, isl, osl, ttft, itl in CASES:
        load = LoadPoint(rate, isl, osl)
        name = f"{rate:g} rps {isl}/{osl} SLO {ttft:g}/{itl:g}"
        dedicated = plan_capacity([PROFILE], load, ttft, itl, headroom=0.0).first
        try:
            mixed = plan_mixed_node(
                PROFILE, load, ttft, itl, headroom=0.0, partition=NodePartition(slowdown=slowdown)
            )
        except PlanError as exc:
            print(f"{name} | mixed-node cannot be planned: {exc}")
            continue
        c = compare_placements(dedicated, mixed, poisson_trace(rate, isl, osl, 120.0, seed=0), ttft, itl)
        d, m = c.dedicated, c.mixed_node
        print(
            f"{name} | {d.prefill}+{d.decode} {d.gpus} {d.slo_attainment:.4f} {d.gpu_seconds:.0f} | "
            f"{m.nodes} {m.gpus} {m.slo_attainment:.4f} {m.gpu_seconds:.0f} | {c.winner} | {c.reason} | "
            f"planned at busy slowdown x{mixed.busy_slowdown:.2f}, mean x{mixed.effective_slowdown:.2f}"
        )


def main() -> None:
    t0 = time.perf_counter()
    for slowdown in SLOWDOWNS:
        run(slowdown)
        print()
    print(f"wall {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
