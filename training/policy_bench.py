"""Every scaling policy side by side on the same traces and cluster profile (``pdscale bench``; issue 7).

One process replays each trace through the simulator once per policy (``static-peak``, ``reactive``,
``dynamo-like``, ``predictive``, ``oracle`` by default) and reduces each replay to :class:`PolicyFigures`:
SLO attainment, TTFT and ITL percentiles, GPU-seconds and their ratio to the oracle's, scale events.
With several traces the figures are also aggregated over them (:func:`aggregate`): GPU-seconds and scale
events summed, SLO attainment weighted by requests, percentiles pooled over every request.

The predictive policy gets its ``PolicyConfig`` from ``pools[0].policy`` of a controller config file when
one is given (:func:`load_predictive_config`; how a tuned configuration is benchmarked) and either the
shipped forecaster checkpoint (``default``) or the Holt baseline (``holt``).

Plots (matplotlib Agg, imported lazily): :func:`plot_capacity` and :func:`plot_ttft_cdf`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

import controller.replay_policies  # noqa: F401  (registers reactive, dynamo-like, predictive, oracle)
from controller.config import ControllerConfig, PolicyConfig, load_yaml_model
from controller.replay_policies import PredictivePolicy
from forecaster.types import Forecaster
from serving.sim.fleet import FleetSpec, single_pool
from serving.sim.replay import PolicyOptions, ReplayPolicy, make_policy, policy_names, replay
from serving.sim.report import ReplayReport, percentiles
from serving.workload.trace import Trace

POLICIES = ("static-peak", "reactive", "dynamo-like", "predictive", "oracle")
ForecasterChoice = Literal["default", "holt"]
FORECASTERS: tuple[ForecasterChoice, ...] = ("default", "holt")
ARRIVAL_BIN_S = 10.0  # arrival rate in the capacity plot is averaged over this many seconds
# progress(trace name, policy name, fraction of that replay done in [0, 1])
Progress = Callable[[str, str, float], None]


@dataclass(frozen=True)
class BenchSettings:
    """What every replay of one bench shares. ``None`` profile/SLOs: ``single_pool``'s defaults
    (llama3-8b/a100, TTFT 1000 ms, ITL 50 ms)."""

    policies: tuple[str, ...] = POLICIES
    profile: str | None = None
    slo_ttft_ms: float | None = None
    slo_itl_ms: float | None = None
    predictive: PolicyConfig = field(default_factory=PolicyConfig)
    forecaster: ForecasterChoice = "default"
    tick_s: float = 1.0

    def problems(self) -> list[str]:
        """One message per broken rule; empty when valid."""
        out = []
        if not self.policies:
            out.append("no policy to run: give --policy at least once (or none for all five)")
        known = policy_names()
        for name in self.policies:
            if name not in known:
                out.append(f"unknown policy {name!r}: registered are {', '.join(known)}")
        if len(set(self.policies)) != len(self.policies):
            out.append(f"a policy is named twice: {list(self.policies)}")
        for name in ("slo_ttft_ms", "slo_itl_ms"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                out.append(f"--{name.replace('_', '-')} must be a finite number > 0, got {v}")
        if self.forecaster not in FORECASTERS:
            out.append(f"--forecaster must be one of {', '.join(FORECASTERS)}, got {self.forecaster!r}")
        if not (math.isfinite(self.tick_s) and self.tick_s > 0):
            out.append(f"tick_s must be > 0, got {self.tick_s}")
        return out

    def fleet(self) -> FleetSpec:
        """The one-pool P/D fleet every policy is replayed on."""
        kwargs: dict[str, Any] = {}
        if self.profile is not None:
            kwargs["profile"] = self.profile
        if self.slo_ttft_ms is not None:
            kwargs["slo_ttft_ms"] = self.slo_ttft_ms
        if self.slo_itl_ms is not None:
            kwargs["slo_itl_ms"] = self.slo_itl_ms
        return single_pool(**kwargs)


def load_predictive_config(path: Path) -> PolicyConfig:
    """``pools[0].policy`` of a controller config file (``pdscale controller --config`` / ``pdscale tune``).

    Raises ``controller.config.ConfigError`` naming the file and the field (``pools.0.policy.headroom``).
    """
    return load_yaml_model(path, ControllerConfig).pools[0].policy


def make_bench_policy(name: str, settings: BenchSettings) -> ReplayPolicy:
    """The policy ``name`` as the bench runs it: predictive with the settings' config and forecaster,
    every other registered policy with its defaults."""
    if name != "predictive":
        return make_policy(name, PolicyOptions())
    if settings.forecaster == "holt":

        def holt() -> Forecaster:
            from forecaster.baselines import Holt

            return Holt()

        return PredictivePolicy(settings.predictive, forecaster=holt)
    return PredictivePolicy(settings.predictive)


@dataclass(frozen=True)
class PolicyFigures:
    """One policy's figures on one trace (or aggregated over several). NaN = unknown (JSON ``null``)."""

    policy: str
    requests: int
    completed: int
    unfinished: int
    slo_attainment: float
    ttft_ms: Mapping[str, float]  # p50, p90, p99
    itl_ms: Mapping[str, float]  # per-request mean ITL: p50, p90, p99
    gpu_seconds: float
    gpu_ratio_to_oracle: float  # NaN when the oracle did not run (or held no GPU)
    scale_events: int
    wall_s: float
    error: str | None = None  # the replay failed (e.g. an SLO out of the profile's reach): figures unknown
    over_context: int = 0  # requests past the profile's max_model_len (served; see serving.sim.report)
    rejected: int = 0  # requests no instance can hold (refused, count as SLO misses; see serving.sim.report)

    @staticmethod
    def failed(policy: str, requests: int, error: str) -> PolicyFigures:
        """A policy whose replay raised: every figure unknown, the reason kept."""
        nan = {"p50": math.nan, "p90": math.nan, "p99": math.nan}
        return PolicyFigures(
            policy, requests, 0, requests, math.nan, nan, nan, math.nan, math.nan, 0, math.nan, error
        )

    def to_json(self) -> dict[str, Any]:
        def clean(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "error": self.error,
            "requests": self.requests,
            "completed": self.completed,
            "unfinished": self.unfinished,
            "rejected": self.rejected,
            "over_context": self.over_context,
            "slo_attainment": clean(self.slo_attainment),
            "ttft_ms": {k: clean(v) for k, v in self.ttft_ms.items()},
            "itl_ms": {k: clean(v) for k, v in self.itl_ms.items()},
            "gpu_seconds": clean(self.gpu_seconds),
            "gpu_hours": clean(self.gpu_seconds / 3600.0),
            "gpu_ratio_to_oracle": clean(self.gpu_ratio_to_oracle),
            "scale_events": self.scale_events,
            "wall_s": clean(self.wall_s),
        }


def _ratio(gpu_s: float, oracle_gpu_s: float | None) -> float:
    if oracle_gpu_s is None or not oracle_gpu_s > 0:
        return math.nan
    return gpu_s / oracle_gpu_s


def policy_figures(report: ReplayReport, oracle_gpu_s: float | None) -> PolicyFigures:
    """One replay's figures; the GPU-seconds ratio is to ``oracle_gpu_s`` (``None``: not run -> NaN)."""
    return PolicyFigures(
        policy=report.policy,
        requests=report.requests,
        completed=report.completed,
        unfinished=report.unfinished,
        slo_attainment=report.slo_attainment,
        ttft_ms=dict(report.ttft_ms),
        itl_ms=dict(report.itl_ms),
        gpu_seconds=report.gpu_seconds,
        gpu_ratio_to_oracle=_ratio(report.gpu_seconds, oracle_gpu_s),
        scale_events=report.scale_events,
        wall_s=report.wall_s,
        over_context=report.over_context,
        rejected=report.rejected,
    )


@dataclass(frozen=True, eq=False)
class TraceBench:
    """Every policy replayed on one trace, in run order: the reports of those that ran (for plots) and the
    error of those whose replay raised."""

    name: str
    trace: Trace = field(repr=False)
    fleet: FleetSpec = field(repr=False)
    policies: tuple[str, ...]
    reports: Mapping[str, ReplayReport] = field(repr=False)
    errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def figures(self) -> dict[str, PolicyFigures]:
        oracle = self.reports.get("oracle")
        floor = oracle.gpu_seconds if oracle is not None else None
        return {
            name: policy_figures(self.reports[name], floor)
            if name in self.reports
            else PolicyFigures.failed(name, len(self.trace), self.errors[name])
            for name in self.policies
        }

    def to_json(self) -> dict[str, Any]:
        pool = self.fleet.pools[0]
        return {
            "source": self.trace.source,
            "format": self.trace.format,
            "requests": len(self.trace),
            "duration_s": self.trace.duration_s,
            "profile": pool.profile,
            "slo_ttft_ms": pool.slo_ttft_ms,
            "slo_itl_ms": pool.slo_itl_ms,
            "policies": {name: f.to_json() for name, f in self.figures.items()},
        }


def trace_names(paths: Sequence[Path]) -> list[str]:
    """A short, file-name-safe, unique name per trace (its file stem; ``-2``, ``-3``... on a clash)."""
    out: list[str] = []
    for path in paths:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem) or "trace"
        name, n = base, 1
        while name in out:
            n += 1
            name = f"{base}-{n}"
        out.append(name)
    return out


def run_trace(
    name: str, trace: Trace, settings: BenchSettings, *, progress: Progress | None = None
) -> TraceBench:
    """Replay ``trace`` under each of ``settings.policies`` on the same fleet; ``progress`` every tick.

    A replay that raises ``ValueError`` or ``NotImplementedError`` (a policy refusing the fleet, an SLO the
    profile cannot meet) is recorded in ``errors`` and the others still run."""
    problems = settings.problems()
    if problems:
        raise ValueError("; ".join(problems))
    if len(trace) == 0:
        raise ValueError(f"trace {name!r} ({trace.source}) has no requests")
    fleet = settings.fleet()
    pool = fleet.pools[0].name
    reports: dict[str, ReplayReport] = {}
    errors: dict[str, str] = {}
    for policy in settings.policies:

        def tick(now_s: float, end_s: float, policy: str = policy) -> None:
            if progress is not None:
                progress(name, policy, min(now_s / end_s, 1.0) if end_s > 0 else 0.0)

        try:
            chosen = make_bench_policy(policy, settings)
            reports[policy] = replay(fleet, {pool: trace}, chosen, tick_s=settings.tick_s, progress=tick)
        except (ValueError, NotImplementedError) as exc:
            errors[policy] = str(exc) or type(exc).__name__
        if progress is not None:
            progress(name, policy, 1.0)
    return TraceBench(name, trace, fleet, settings.policies, reports, errors)


def aggregate(benches: Sequence[TraceBench]) -> dict[str, PolicyFigures]:
    """Figures over all traces: GPU-seconds, requests and scale events summed, SLO attainment weighted by
    requests, TTFT/ITL percentiles pooled over every request with a first token, ratio = summed GPU-s over
    the oracle's summed GPU-s (NaN unless the oracle ran on every trace). Policies named on every trace only;
    one that failed on any trace is failed in the aggregate too, with each trace's reason."""
    if not benches:
        return {}
    names = [n for n in benches[0].policies if all(n in b.policies for b in benches)]
    oracle_ran = all("oracle" in b.reports for b in benches)
    oracle_gpu_s = sum(b.reports["oracle"].gpu_seconds for b in benches) if oracle_ran else None
    out: dict[str, PolicyFigures] = {}
    for name in names:
        requests = sum(len(b.trace) for b in benches)
        failed = [f"{b.name}: {b.errors[name]}" for b in benches if name not in b.reports]
        if failed:
            out[name] = PolicyFigures.failed(name, requests, "; ".join(failed))
            continue
        reps = [b.reports[name] for b in benches]
        met = sum(r.slo_attainment * r.requests for r in reps if r.requests)
        gpu_s = sum(r.gpu_seconds for r in reps)
        out[name] = PolicyFigures(
            policy=name,
            requests=requests,
            completed=sum(r.completed for r in reps),
            unfinished=sum(r.unfinished for r in reps),
            slo_attainment=met / requests if requests else math.nan,
            ttft_ms=percentiles(np.concatenate([r.request_ttft_ms for r in reps])),
            itl_ms=percentiles(np.concatenate([r.request_itl_ms for r in reps])),
            gpu_seconds=gpu_s,
            gpu_ratio_to_oracle=_ratio(gpu_s, oracle_gpu_s),
            scale_events=sum(r.scale_events for r in reps),
            wall_s=sum(r.wall_s for r in reps),
            over_context=sum(r.over_context for r in reps),
            rejected=sum(r.rejected for r in reps),
        )
    return out


def bench_json(benches: Sequence[TraceBench], settings: BenchSettings) -> dict[str, Any]:
    """The ``--json`` document: ``traces`` -> name -> {source, ..., ``policies`` -> policy -> figures},
    top-level ``policies`` -> policy -> figures aggregated over the traces (see :func:`aggregate`), and
    the ``settings`` (policies, forecaster, the predictive policy's config)."""
    return {
        "traces": {b.name: b.to_json() for b in benches},
        "policies": {name: f.to_json() for name, f in aggregate(benches).items()},
        "settings": {
            "policies": list(settings.policies),
            "forecaster": settings.forecaster,
            "tick_s": settings.tick_s,
            "predictive_policy": settings.predictive.model_dump(),
        },
    }


# -- plots -------------------------------------------------------------------------------------------
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_capacity(bench: TraceBench, path: Path) -> Path:
    """One panel per policy, shared time axis: the arrival rate (req/s, mean per ``ARRIVAL_BIN_S``) on the
    left axis against active instances by role (steps) on the right axis."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    n = len(bench.reports)
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.9 * n + 0.8), sharex=True, squeeze=False)
    arrivals = bench.trace.arrival_s
    n_bins = int(np.floor(float(arrivals[-1]) / ARRIVAL_BIN_S)) + 1 if len(arrivals) else 1
    counts = np.bincount(np.floor(arrivals / ARRIVAL_BIN_S).astype(np.int64), minlength=n_bins)
    edges = np.arange(n_bins + 1) * ARRIVAL_BIN_S
    # decode dashed over a solid prefill: equal counts stay visible
    styles: dict[str, dict[str, Any]] = {
        "prefill": {"color": "tab:blue", "lw": 1.6},
        "decode": {"color": "tab:orange", "lw": 1.4, "ls": "--"},
        "mixed": {"color": "tab:green", "lw": 1.4},
    }
    for ax, (name, report) in zip(axes[:, 0], bench.reports.items(), strict=True):
        ax.stairs(counts / ARRIVAL_BIN_S, edges, fill=True, color="0.85", label="arrivals")
        ax.set_ylabel("req/s")
        cap = ax.twinx()
        top = 1
        if report.timeline is not None:
            tl = report.timeline
            for role, series in tl.active.items():
                if series.max() > 0:
                    style = styles[role]
                    cap.step(tl.t_s, series, where="post", label=f"{role} active", **style)
            cap.step(tl.t_s, tl.holding_gpu, where="post", color="0.3", ls=":", lw=1, label="holding GPUs")
            top = max(top, int(tl.holding_gpu.max()))
        cap.set_ylabel("instances")
        cap.set_ylim(0, top * 1.1 + 0.5)
        cap.yaxis.set_major_locator(MaxNLocator(integer=True))
        cap.legend(loc="upper right", fontsize="x-small")
        ax.set_title(
            f"{name}: SLO {report.slo_attainment:.1%}, {report.gpu_seconds:,.0f} GPU-s", fontsize="small"
        )
    axes[-1, 0].set_xlabel("time, s")
    fig.suptitle(f"{bench.name}: arrivals (grey) vs active instances by role", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_ttft_cdf(bench: TraceBench, path: Path) -> Path:
    """One TTFT CDF per policy (log x) with the pool's TTFT SLO as a vertical line. A request with no first
    token counts as infinitely late, so its policy's curve stays below 1."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    line_styles = ("-", "--", "-.", ":")
    for k, (name, report) in enumerate(bench.reports.items()):
        ttft = report.request_ttft_ms
        finite = np.sort(ttft[np.isfinite(ttft)])
        if len(finite) == 0:
            continue
        y = np.arange(1, len(finite) + 1) / len(ttft)
        ax.step(np.maximum(finite, 1e-3), y, where="post", ls=line_styles[k % len(line_styles)], label=name)
    slo = bench.fleet.pools[0].slo_ttft_ms
    ax.axvline(slo, color="k", ls="--", lw=1, label=f"SLO {slo:g} ms")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("TTFT, ms")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{bench.name}: TTFT CDF by policy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(bench: TraceBench, out_dir: Path) -> list[Path]:
    """``capacity-<trace>.png`` and ``ttft-cdf-<trace>.png`` under ``out_dir`` (created); none when no policy
    ran on the trace."""
    if not bench.reports:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        plot_capacity(bench, out_dir / f"capacity-{bench.name}.png"),
        plot_ttft_cdf(bench, out_dir / f"ttft-cdf-{bench.name}.png"),
    ]
