"""A digest of everything the simulator produces on a set of scenarios, to show that a change to its code (a
faster hot path, a refactor) moves no result.

Run on two trees and compare the lines: ``PYTHONPATH=TREE .venv/bin/python TREE/bench/bench_sim_digest.py
[--scenarios a,b,...] [--dump DIR]``. Each line: scenario, ticks, the SHA-256 of every per-second scrape
(``Simulator.observe``: ids, states, every gauge, counter and histogram, bytes exact) and of the replay's
report (its ``--json`` document without ``wall_s``, plus the per-request TTFT and ITL arrays and the
timeline), then SLO attainment and GPU-seconds. The replay is deterministic, so equal trees give equal lines;
``--dump DIR`` writes each scenario's report JSON and one line per scrape for a ``diff`` of two trees.

Scenarios (what each exercises):

* ``code-crash``: the Azure code trace's first 900 s on 2+2 instances, least-loaded, a prefill instance
  crashed at 200 s and a decode instance at 400 s (requests routed again, KV kept for pulls lost);
* ``conv-qos``: the Azure conversation trace's first 900 s, seeded P0/P1/P2 classes, the context-aware router
  with one marked prefill and one marked decode instance, an output-length predictor, 3+3 instances;
* ``mooncake``: the bundled Mooncake trace's first 600 s under ``static-peak``;
* ``mmpp-reactive`` / ``mmpp-predictive``: bench_policies' MMPP trace (1200 s) under ``reactive`` and under
  ``predictive`` with the Holt forecaster;
* ``fleet``: three P/D pools under one GPU budget (round-robin on conv with a decode standby, mixed nodes with
  derived interference and the context-aware router on code, mixed nodes with a fixed slowdown on MMPP on
  llama2-7b/h100), a gateway queue and tail promotion with warm standby, under ``reactive``;
* ``colocated``: conv on 2 ``mixed`` instances and a standby, QoS classes, a gateway queue and tail promotion;
* ``cpu-tiny``: the cpu-tiny profile (admission delay, wake-up, decode stalls, deferred first tokens) on a slow
  slice of conv, P/D and colocated pools;
* ``poisson``: bench_sim.py's load (Poisson 30 req/s, conv lengths) for 300 s on 8+8 instances.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_policies import make, workload
from bench_sim import bench_trace

import controller.replay_policies  # noqa: F401  (registers reactive, predictive, ...)
from serving.sim.engine import Simulator, TailPolicy
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts, single_pool
from serving.sim.replay import PolicyOptions, ReplayPolicy, ReplayView, ScaleCommand, make_policy, replay
from serving.sim.router import GatewayPolicy
from serving.sim.samples import InstanceSamples
from serving.workload.outlen import OutputLengthPredictor
from serving.workload.readers import read_trace
from serving.workload.trace import Trace

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "datasets" / "mooncake" / "synthetic_trace.jsonl"


def frame_bytes(s: InstanceSamples) -> bytes:
    """Every field of one scrape, exactly (floats by their bytes)."""
    parts = [repr((s.now_s, s.instance_ids, s.pools, s.roles, s.nodes, s.states)).encode()]
    for group in (s.gauges, s.counters):
        for name in sorted(group):
            parts.append(name.encode())
            parts.append(np.ascontiguousarray(group[name], dtype=np.float64).tobytes())
    for name in sorted(s.histograms):
        h = s.histograms[name]
        parts.append(repr((name, h.bounds_s)).encode())
        parts.append(np.ascontiguousarray(h.counts, dtype=np.int64).tobytes())
        parts.append(np.ascontiguousarray(h.sums, dtype=np.float64).tobytes())
    return b"|".join(parts)


class Recorder:
    """Hashes every scrape it is given (and keeps a short line per scrape for ``--dump``)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.ticks = 0
        self.lines: list[str] = []

    def add(self, s: InstanceSamples) -> None:
        data = frame_bytes(s)
        self.h.update(data)
        self.ticks += 1
        self.lines.append(f"{s.now_s} {hashlib.sha256(data).hexdigest()[:16]} {len(s.instance_ids)}")


class Scraping:
    """A policy wrapper that scrapes every tick (through the view, as the policy itself would) and records it."""

    def __init__(self, inner: ReplayPolicy, rec: Recorder) -> None:
        self.inner = inner
        self.rec = rec
        self.name = inner.name

    def reset(self, fleet: FleetSpec, traces: Any) -> None:
        self.inner.reset(fleet, traces)

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]:
        out = self.inner.on_tick(now_s, view)
        self.rec.add(view.samples)
        return out


@dataclass
class Scenario:
    fleet: FleetSpec
    traces: dict[str, Trace]
    policy: Callable[[], ReplayPolicy]
    crashes: dict[float, str] = field(default_factory=dict)  # tick time -> instance id crashed then
    kwargs: dict[str, Any] = field(default_factory=dict)  # replay()/Simulator keyword arguments


def _prio(trace: Trace, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    return replace(trace, priority=rng.choice([0, 1, 2], len(trace), p=[0.2, 0.6, 0.2]).astype(np.int8))


def _fixed(
    prefill: int | None = None, decode: int | None = None, mixed: int | None = None, standby: int = 0
) -> Callable[[], ReplayPolicy]:
    return lambda: make_policy("fixed", PolicyOptions(prefill, decode, mixed, standby))


def scenarios() -> dict[str, Callable[[], Scenario]]:
    def code_crash() -> Scenario:
        trace, _ = workload("code", 900.0, 3600.0)
        fleet = single_pool(prefill=2, decode=2)
        crashes = {200.0: "default-prefill-0", 400.0: "default-decode-1"}
        return Scenario(fleet, {"default": trace}, _fixed(prefill=2, decode=2), crashes)

    def conv_qos() -> Scenario:
        trace, _ = workload("conv", 900.0, 3600.0)
        pool = replace(
            single_pool(prefill=3, decode=3, router="context-aware").pools[0],
            long_context_prefill=1,
            high_memory_decode=1,
        )
        kw = {"output_predictor": OutputLengthPredictor()}
        return Scenario(
            FleetSpec(pools=(pool,)), {"default": _prio(trace, 3)}, _fixed(prefill=3, decode=3), kwargs=kw
        )

    def mooncake() -> Scenario:
        trace = read_trace(MOONCAKE).window(0.0, 600.0)
        return Scenario(
            single_pool(slo_ttft_ms=5000.0), {"default": trace}, lambda: make_policy("static-peak")
        )

    def mmpp(policy: str) -> Callable[[], Scenario]:
        def build() -> Scenario:
            trace, fleet = workload("mmpp", None, 3600.0)
            return Scenario(fleet, {"default": trace}, lambda: make(policy, "holt", {}))

        return build

    def fleet() -> Scenario:
        conv, _ = workload("conv", 600.0, 3600.0)
        code, _ = workload("code", 600.0, 3600.0)
        mm, _ = workload("mmpp", 600.0, 3600.0)
        pools = (
            PoolSpec(name="chat", router="round-robin", decode=RoleCounts(initial=1, standby=1, max=8)),
            PoolSpec(
                name="code",
                placement="mixed-node",
                router="context-aware",
                prefill=RoleCounts(initial=1, min=1, max=6),
                decode=RoleCounts(initial=1, min=1, max=6),
                long_context_prefill=1,
            ),
            PoolSpec(
                name="burst",
                profile="llama2-7b/h100",
                placement="mixed-node",
                mixed_node_slowdown=1.3,
                prefill=RoleCounts(initial=1, min=1, max=6),
                decode=RoleCounts(initial=1, min=1, max=6),
            ),
        )
        kw = {"gateway": GatewayPolicy(max_waiting=3), "tail": TailPolicy(fraction=0.3, hold_s=20.0)}
        traces = {"chat": _prio(conv, 7), "code": code, "burst": mm}
        return Scenario(
            FleetSpec(pools=pools, gpu_budget=20), traces, lambda: make_policy("reactive"), kwargs=kw
        )

    def colocated() -> Scenario:
        trace, _ = workload("conv", 900.0, 3600.0)
        none = RoleCounts(initial=0, max=0)
        pool = PoolSpec(prefill=none, decode=none, mixed=RoleCounts(initial=2, standby=1, max=8))
        kw = {"gateway": GatewayPolicy(max_waiting=2), "tail": TailPolicy(fraction=0.2, hold_s=30.0)}
        policy = _fixed(mixed=2, standby=1)
        return Scenario(FleetSpec(pools=(pool,)), {"default": _prio(trace, 11)}, policy, kwargs=kw)

    def cpu_tiny() -> Scenario:
        conv, _ = workload("conv", 240.0, 3600.0)
        slow = conv.take(np.arange(0, len(conv), 4))
        small = replace(
            slow,
            prompt_tokens=np.minimum(slow.prompt_tokens, 600),
            output_tokens=np.minimum(slow.output_tokens, 200),
        )
        none = RoleCounts(initial=0, max=0)
        pools = (
            PoolSpec(name="pd", profile="cpu-tiny", slo_ttft_ms=2000.0, slo_itl_ms=200.0),
            PoolSpec(
                name="col",
                profile="cpu-tiny",
                slo_ttft_ms=2000.0,
                slo_itl_ms=200.0,
                prefill=none,
                decode=none,
                mixed=RoleCounts(initial=2, max=4),
            ),
        )
        crashes = {60.0: "col-mixed-1"}
        traces = {"pd": small, "col": _prio(small, 5)}
        return Scenario(FleetSpec(pools=pools), traces, _fixed(), crashes)

    def poisson() -> Scenario:
        trace = bench_trace(300.0, 30.0)
        return Scenario(single_pool(prefill=8, decode=8), {"default": trace}, _fixed(prefill=8, decode=8))

    return {
        "code-crash": code_crash,
        "conv-qos": conv_qos,
        "mooncake": mooncake,
        "mmpp-reactive": mmpp("reactive"),
        "mmpp-predictive": mmpp("predictive"),
        "fleet": fleet,
        "colocated": colocated,
        "cpu-tiny": cpu_tiny,
        "poisson": poisson,
    }


def run_with_crashes(sc: Scenario, policy: ReplayPolicy, rec: Recorder) -> Any:
    """The replay loop of ``serving.sim.replay.replay`` (one-second ticks, drain), with crashes injected."""
    sim = Simulator(sc.fleet, sc.traces, **sc.kwargs)
    policy.reset(sc.fleet, sim.served_traces)

    def view() -> ReplayView:
        return ReplayView(
            now_s=sim.now_s,
            fleet=sim.fleet,
            counts={p.name: sim.counts(p.name) for p in sim.fleet.pools},
            pending={p.name: sim.pending(p.name) for p in sim.fleet.pools},
            scrape=sim.observe,
        )

    def apply(commands: list[ScaleCommand], warm: bool = False) -> None:
        for c in commands:
            sim.set_target(c.pool, c.role, c.active, c.standby, warm=warm)

    apply(policy.on_tick(0.0, view()), warm=True)
    end_s = max(float(t.arrival_s[-1]) for t in sim.traces.values() if len(t))
    limit_s = end_s + 3600.0
    t = 0.0
    while not (t >= limit_s or (t >= end_s and sim.unfinished() == 0)):
        t = min(t + 1.0, limit_s)
        sim.run_until(t)
        if t in sc.crashes:
            sim.fail_instance(sc.crashes[t])
        apply(policy.on_tick(t, view()))
        rec.add(sim.observe())
    return sim.report(policy=policy.name, wall_s=0.0)


def report_bytes(rep: Any) -> tuple[bytes, dict[str, Any]]:
    doc = rep.to_json()
    doc.pop("wall_s", None)
    parts = [json.dumps(doc, sort_keys=True).encode()]
    for arr in (rep.request_ttft_ms, rep.request_itl_ms, rep.arrival_s):
        parts.append(np.ascontiguousarray(arr, dtype=np.float64).tobytes())
    if rep.timeline is not None:
        parts.append(rep.timeline.t_s.tobytes() + rep.timeline.holding_gpu.tobytes())
        for role in sorted(rep.timeline.active):
            parts.append(rep.timeline.active[role].tobytes())
    return b"|".join(parts), doc


def digest(name: str, build: Callable[[], Scenario], dump: Path | None) -> str:
    sc = build()
    rec = Recorder()
    if sc.crashes:
        rep = run_with_crashes(sc, sc.policy(), rec)
    else:
        rep = replay(sc.fleet, sc.traces, Scraping(sc.policy(), rec), **sc.kwargs)
    data, doc = report_bytes(rep)
    frames = rec.h.hexdigest()[:16]
    whole = hashlib.sha256(data).hexdigest()[:16]
    if dump is not None:
        (dump / f"{name}.report.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        (dump / f"{name}.frames.txt").write_text("\n".join(rec.lines) + "\n")
    slo = rep.slo_attainment
    return (
        f"{name}: {rep.requests} requests, {rec.ticks} scrapes sha256 {frames}, report sha256 {whole}, "
        f"SLO {slo:.6f}, GPU-s {rep.gpu_seconds:.3f}" + ("" if math.isfinite(slo) else " (no requests)")
    )


def main() -> None:
    all_scenarios = scenarios()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=",".join(all_scenarios))
    ap.add_argument("--dump", type=Path, default=None, help="write each report and one line per scrape here")
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # over-context and rejection warnings: the same on every tree
    if args.dump is not None:
        args.dump.mkdir(parents=True, exist_ok=True)
    for name in args.scenarios.split(","):
        if name not in all_scenarios:
            raise SystemExit(f"unknown scenario {name!r}: known are {', '.join(all_scenarios)}")
        print(digest(name, all_scenarios[name], args.dump), flush=True)


if __name__ == "__main__":
    main()
