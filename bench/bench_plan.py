"""``pdscale plan`` checked against the simulator, and what planning costs.

Run: ``.venv/bin/python bench/bench_plan.py`` (about a minute on a shared 2-core machine).

1. Replay checks: for a few steady Poisson loads (llama3-8b/a100, 120 s, fixed ISL/OSL, no headroom), the
   plan's counts and one instance fewer per pool are replayed with the ``fixed`` policy. Two criteria:
   ``att`` = simulator SLO attainment >= 0.99 (per request TTFT <= SLO and mean ITL <= SLO), and ``p90`` =
   P90 TTFT <= SLO and mean-over-requests ITL <= SLO (what the capacity model sizes for).
2. How conservative the prefill model is: the largest rate one prefill instance serves in the simulator with
   P90 TTFT <= SLO (bisection on the rate, decode over-provisioned) against the model's requests/s.
3. Planning time: ``trace_sizings`` + ``plan_capacity`` for a 1M-request synthetic trace.
"""

from __future__ import annotations

import time

import numpy as np

from serving.sim.plan import LoadPoint, plan_capacity, poisson_trace, replay_check, trace_sizings
from serving.workload.synthetic import SyntheticParams, generate

PROFILE = "llama3-8b/a100"
CASES = (  # rate_rps, isl, osl, slo_ttft_ms, slo_itl_ms
    (20.0, 1024, 256, 500.0, 30.0),
    (20.0, 512, 512, 500.0, 40.0),
    (20.0, 2048, 128, 1000.0, 50.0),
    (30.0, 1500, 300, 800.0, 35.0),
    (12.0, 4096, 256, 1500.0, 40.0),
)


def replay_checks() -> None:
    print("## replay checks (llama3-8b/a100, Poisson 120 s, fixed lengths, headroom 0, seed 0)")
    print("case | plan P+D (shares) | counts | attainment | P90 TTFT ms | mean ITL ms | att>=0.99 | P90 ok")
    for rate, isl, osl, ttft, itl in CASES:
        p = plan_capacity([PROFILE], LoadPoint(rate, isl, osl), ttft, itl, headroom=0.0).first
        trace = poisson_trace(rate, isl, osl, 120.0, seed=0)
        name = f"{rate:g} rps {isl}/{osl} SLO {ttft:g}/{itl:g}"
        head = f"{p.prefill}+{p.decode} ({p.prefill_share:.2f}, {p.decode_share:.2f})"
        for label, (np_, nd) in (
            ("plan", (p.prefill, p.decode)),
            ("P-1", (p.prefill - 1, p.decode)),
            ("D-1", (p.prefill, p.decode - 1)),
        ):
            if np_ < 1 or nd < 1:
                continue
            c = replay_check(PROFILE, trace, np_, nd, ttft, itl, drain_limit_s=300.0)
            print(
                f"{name} | {head} | {label} {np_}+{nd} | {c.slo_attainment:.4f} | {c.ttft_p90_ms:.0f} | "
                f"{c.itl_mean_ms:.1f} | {'yes' if c.meets else 'no'} | {'yes' if c.meets_p90 else 'no'}"
            )


def prefill_conservatism() -> None:
    print("\n## one prefill instance: model requests/s at the P90 TTFT SLO vs the simulator's (bisection)")
    print("isl | SLO ms | model rps (rho) | sim rps at P90 TTFT = SLO | model / sim")
    for isl, ttft in ((1024, 500.0), (2048, 1000.0), (512, 300.0)):
        plan = plan_capacity([PROFILE], LoadPoint(1.0, isl, 64), ttft, 200.0, headroom=0.0).first
        pre = plan.prefill_need.prefill_capacity
        lo, hi = pre.requests_per_s, pre.requests_per_s * 2.0
        for _ in range(9):
            mid = 0.5 * (lo + hi)
            c = replay_check(PROFILE, poisson_trace(mid, isl, 64, 300.0, seed=1), 1, 4, ttft, 200.0)
            lo, hi = (mid, hi) if c.ttft_p90_ms <= ttft else (lo, mid)
        print(
            f"{isl} | {ttft:g} | {pre.requests_per_s:.2f} ({pre.utilisation:.2f}) | {lo:.2f} | "
            f"{pre.requests_per_s / lo:.2f}"
        )


def router_effect() -> None:
    """Prefill minus one, least-loaded vs round-robin: both split Poisson arrivals into smoother streams."""
    from serving.sim.fleet import single_pool
    from serving.sim.replay import PolicyOptions, make_policy, replay

    print("\n## prefill minus one under two routers (attainment, P90 / P99 TTFT ms)")
    for rate, isl, osl, ttft, itl, n_p, n_d in (
        (30.0, 1500, 300, 800.0, 35.0, 4, 3),
        (12.0, 4096, 256, 1500.0, 40.0, 5, 2),
    ):
        trace = poisson_trace(rate, isl, osl, 120.0, seed=0)
        for router in ("least-loaded", "round-robin"):
            fleet = single_pool(
                profile=PROFILE, prefill=n_p, decode=n_d, slo_ttft_ms=ttft, slo_itl_ms=itl, router=router
            )
            policy = make_policy("fixed", PolicyOptions(prefill=n_p, decode=n_d))
            r = replay(fleet, {"default": trace}, policy, drain_limit_s=300.0)
            print(
                f"{rate:g} rps {isl}/{osl} {n_p}+{n_d} {router}: {r.slo_attainment:.4f}, "
                f"{r.ttft_ms['p90']:.0f} / {r.ttft_ms['p99']:.0f}"
            )


def planning_time() -> None:
    trace = generate(SyntheticParams(duration_s=86_400.0, rate_rps=12.0, grid_s=0.5), seed=0)
    t0 = time.perf_counter()
    sizings = trace_sizings(trace)
    t1 = time.perf_counter()
    plans = [plan_capacity([PROFILE, "llama2-7b/h100"], s, 2000.0, 50.0) for s in sizings]
    t2 = time.perf_counter()
    print(f"\n## planning time: {len(trace):,} requests over {trace.duration_s / 3600:.1f} h")
    print(f"trace_sizings {t1 - t0:.3f} s; plan_capacity x {len(plans)} sizings x 2 profiles {t2 - t1:.3f} s")
    for s, pl in zip(sizings, plans, strict=True):
        print(f"  {s.name}: {pl.first.prefill}+{pl.first.decode} ({pl.first.gpus} GPUs)")


if __name__ == "__main__":
    np.seterr(all="ignore")
    replay_checks()
    prefill_conservatism()
    router_effect()
    planning_time()
