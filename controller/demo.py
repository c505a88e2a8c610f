"""The embedded default of ``pdscale controller``: the controller driving a simulated P/D cluster through a
bundled real trace at accelerated time, with a live terminal view, then the same trace under the reactive
(HPA-like) policy, and a side-by-side summary. It is the README's main job: it needs no cluster, no
Prometheus and no GPU, and finishes in about a minute on two cores.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from controller.config import PolicyConfig
from controller.forecasting import load_default_forecaster
from controller.replay_policies import PredictivePolicy, ReactivePolicy
from serving.sim.fleet import FleetSpec, single_pool
from serving.sim.replay import ReplayPolicy, replay
from serving.sim.report import ReplayReport
from serving.workload.readers import read_trace
from serving.workload.trace import Trace


@dataclass(frozen=True)
class DemoResult:
    predictive: ReplayReport
    reactive: ReplayReport
    forecaster: str


def _view(policy: PredictivePolicy, now_s: float, end_s: float, progress: Progress) -> Group:
    table = Table(title=f"controller (virtual t = {now_s:,.0f} s of {end_s:,.0f} s)", expand=False)
    for col in (
        "pool",
        "prefill",
        "decode",
        "standby P/D",
        "arrivals/s",
        "forecast p90 /s",
        "burst p",
        "queue",
    ):
        table.add_column(col, justify="right")
    for name, obs in policy.last_obs.items():
        fc = obs.forecast
        table.add_row(
            name,
            f"{obs.active['prefill']} (+{obs.provisioning['prefill']})",
            f"{obs.active['decode']} (+{obs.provisioning['decode']})",
            f"{obs.standby['prefill']}/{obs.standby['decode']}",
            _num(obs.arrival_rps),
            _num(fc.rate(fc.arrivals_p90)) if fc else "-",
            _num(fc.burst_prob, 2) if fc else "-",
            _num(obs.waiting_requests, 0),
        )
    reasons = policy.decisions[-1][1].reasons if policy.decisions else ()
    why = "\n".join(reasons[-4:]) or "waiting for the first decision"
    return Group(progress, table, Panel(why, title="last decision, why", expand=False))


def _num(x: float, digits: int = 1) -> str:
    return "unknown" if not math.isfinite(x) else f"{x:,.{digits}f}"


def run_demo(
    trace_path: Path,
    *,
    profile: str = "llama3-8b/a100",
    policy: PolicyConfig | None = None,
    slo_ttft_ms: float = 1000.0,
    slo_itl_ms: float = 50.0,
    checkpoint: Path | None = None,
    duration_s: float | None = None,
    speed: float = 0.0,
    console: Console | None = None,
) -> DemoResult:
    """Replay ``trace_path`` under the predictive policy (live view), then the reactive one; return both."""
    console = console or Console()
    trace: Trace = read_trace(trace_path)
    if duration_s is not None:
        trace = trace.window(0.0, duration_s)
    fleet: FleetSpec = single_pool(
        profile=profile, prefill=1, decode=1, slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms
    )
    predictive = PredictivePolicy(policy, forecaster=lambda: load_default_forecaster(checkpoint))
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console)
    task = progress.add_task("predictive", total=max(trace.duration_s, 1.0))
    wall0 = time.perf_counter()
    last_draw = [0.0]
    with Live(console=console, refresh_per_second=4, transient=False) as live:

        def on_progress(now_s: float, end_s: float) -> None:
            progress.update(task, completed=min(now_s, end_s))
            if speed > 0:
                ahead = now_s / speed - (time.perf_counter() - wall0)
                if ahead > 0:
                    time.sleep(ahead)
            if time.perf_counter() - last_draw[0] > 0.25:
                last_draw[0] = time.perf_counter()
                live.update(_view(predictive, now_s, end_s, progress))

        pred = replay(fleet, {"default": trace}, predictive, progress=on_progress)
        live.update(_view(predictive, pred.sim_end_s, trace.duration_s, progress))
    forecaster = predictive.forecaster.name if predictive.forecaster is not None else "?"
    reactive: ReplayPolicy = ReactivePolicy()
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as bar:
        rtask = bar.add_task("reactive (HPA-like), same trace", total=max(trace.duration_s, 1.0))
        react = replay(
            fleet,
            {"default": trace},
            reactive,
            progress=lambda now_s, end_s: bar.update(rtask, completed=min(now_s, end_s)),
        )
    return DemoResult(predictive=pred, reactive=react, forecaster=forecaster)


def summary_table(result: DemoResult, trace_name: str) -> Table:
    """Predictive against reactive: SLO attainment, tail latency, GPU cost and their ratio."""
    p, r = result.predictive, result.reactive
    table = Table(title=f"predictive vs reactive on {trace_name} (forecaster: {result.forecaster})")
    table.add_column("measure")
    table.add_column("predictive", justify="right")
    table.add_column("reactive", justify="right")
    table.add_column("predictive / reactive", justify="right")

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "-"

    table.add_row("requests / completed / dropped", f"{p.requests} / {p.completed} / {p.dropped}",
                  f"{r.requests} / {r.completed} / {r.dropped}", "")  # fmt: skip
    if p.rejected or r.rejected:  # requests no instance can hold (serving.sim.report): SLO misses
        table.add_row("rejected (fit no instance's KV cache)", f"{p.rejected}", f"{r.rejected}", "")
    table.add_row("SLO attainment", f"{p.slo_attainment:.2%}", f"{r.slo_attainment:.2%}", "")
    table.add_row("TTFT p99 ms", f"{p.ttft_ms['p99']:,.0f}", f"{r.ttft_ms['p99']:,.0f}",
                  ratio(p.ttft_ms["p99"], r.ttft_ms["p99"]))  # fmt: skip
    table.add_row("ITL p99 ms", f"{p.itl_ms['p99']:,.1f}", f"{r.itl_ms['p99']:,.1f}",
                  ratio(p.itl_ms["p99"], r.itl_ms["p99"]))  # fmt: skip
    table.add_row(
        "GPU-seconds", f"{p.gpu_seconds:,.0f}", f"{r.gpu_seconds:,.0f}", ratio(p.gpu_seconds, r.gpu_seconds)
    )
    table.add_row("scale events", str(p.scale_events), str(r.scale_events), "")
    return table
