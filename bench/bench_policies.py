"""Every scaling policy side by side on the same traces: SLO attainment, GPU-seconds, ratios to oracle/static.

Workloads (all replayed through the simulator, llama3-8b/a100, one P/D pool):

* ``code``: the bundled Azure 2023 code trace (bursty), TTFT 1 s / ITL 50 ms;
* ``conv``: the bundled Azure 2023 conversation trace (smooth), TTFT 1 s / ITL 50 ms;
* ``sine``: a synthetic sinusoid 1 <-> 24 req/s (period ``--sine-period-s``), ISL ~8000 / OSL ~1000,
  TTFT 3 s / ITL 35 ms (the issue's second goal);
* ``mmpp``: a synthetic Markov-modulated bursty trace (serving.workload.synthetic, 6x bursts of ~20 s);
* ``ramp``: a linear rise 2 -> 24 req/s over ``--ramp-s`` (default 1200 s) between 300 s flat at each end,
  Poisson arrivals, the sinusoid's lengths and SLOs (a morning rise, not a cycle);
* ``mmpp-diurnal``: 4x bursts of ~30 s riding a 1800-s diurnal wave (amplitude 0.7), 3600 s (bursts on a rise).

Held out (never used to choose a default; run them with ``--workloads mmpp-holdout,mooncake``; ``mmpp@SEED`` and
``mmpp-holdout@SEED`` regenerate either MMPP trace with another seed, for unseen traffic of the same kind):

* ``mmpp-holdout``: another seed, 4x bursts of ~45 s every ~300 s, other length distributions, 1800 s;
* ``mooncake``: the bundled Mooncake FAST'25 trace (Poisson arrivals, ~15k-token prompts), TTFT 5 s / ITL 50 ms.

The "SLO after" column counts only requests arriving after ``--warmup-s`` (600 s): every policy that
does not know the future starts blind, and on a short trace the first burst alone can cost several points.

The predictive policy runs with a pinned forecaster (``--forecaster holt``, the fallback the product ships
until the learned checkpoint lands) so before/after rows compare policy logic, not forecasters; pass
``--forecaster default`` for whatever ``controller.forecasting`` loads, or ``--checkpoint [NAME=]PATH`` (repeatable)
for one predictive row per learned checkpoint, labelled NAME (shipped vs candidate side by side in one run);
``--combination off,all,arrivals`` replays each such row with the learned forecaster outside the online
forecast combination, inside it, and inside it for arrivals only (``controller.forecasting.with_combination``). ``--params k=v,...`` overrides
``PolicyConfig`` fields of the predictive policy (e.g. ``--params standby_decode=2,buffer_multiplier=2``).

``--forecast-stats`` prints, after each predictive row, what the forecaster told the policy tick by tick against
what then arrived (per pool, the realised next-horizon totals read from the loop's own channels): the p90's
coverage and bias (p90 total / realised total) and how jumpy it is (mean |Δ log1p p90| per tick, and the ticks
it rose by more than 25 %), for arrivals and for each token channel (``ForecastRecorder``, ``forecast_stats``).

``--decompose`` prints, after each predictive row, its GPU-seconds stage by stage and role by role (read back
from the plans' reasons) beside the oracle's, and the measured decode concurrency against Little's law.

``oracle@slo`` is the oracle with the least headroom h (bisection over [0, 3], at most 8 replays) at which it
meets ``--slo-target`` (default 0.99): an SLO-matched reference, since the plain oracle (the issue's fluid floor,
no headroom) misses the SLO on bursty traces. Its row names h; every row shows GPU-s / oracle@slo beside / oracle.

``--time-split F`` adds two columns: SLO attainment of the requests arriving after fraction F of the trace, and
the GPU-s held from that time on (nothing is fitted, so this tells whether the late part behaves like the early).

The figures are deterministic (seeded traces, virtual clock); only the wall seconds depend on the machine.

Run: .venv/bin/python bench/bench_policies.py [--workloads code,conv,sine,mmpp] [--policies ...]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import controller.replay_policies  # noqa: F401  (registers reactive, predictive, oracle, dynamo-like)
from controller.config import PolicyConfig
from controller.policy import ScalingPlan
from controller.replay_policies import PredictivePolicy, default_forecaster, oracle_needs
from forecaster.baselines import Holt
from forecaster.types import CHANNELS, ForecastBatch, Forecaster
from serving.sim.engine import HOLDS_GPU
from serving.sim.fleet import FleetSpec
from serving.sim.hardware import get_profile
from serving.sim.replay import PolicyOptions, ReplayPolicy, make_policy, replay
from serving.sim.report import ReplayReport
from serving.sim.router import GatewayPolicy
from serving.workload.named import (  # noqa: F401  (re-exported: the bench scripts import them from here)
    SINE_OUTPUT,
    SINE_PROMPT,
    ramp_trace,
    workload,
)
from serving.workload.named import azure_path as _azure  # noqa: F401
from serving.workload.trace import Trace

if TYPE_CHECKING:
    from controller.forecasting import CombinationMode

POLICIES = ("oracle", "oracle@slo", "static-peak", "reactive", "dynamo-like", "predictive")
ORACLE_SLO_MAX_H = 3.0
CHURN_FEW = 10  # a cold start released having served fewer requests than this was churn
ORACLE_SLO_REPLAYS = 8


def row_trace(name: str, args: argparse.Namespace) -> tuple[Trace, FleetSpec]:
    """One workload as the scripts' ``--duration-s``, ``--sine-period-s`` and ``--ramp-s`` say (bench_policies.py,
    bench_misses.py): a ``--duration-s`` run replays the first seconds of the full run's trace."""
    return workload(name, args.duration_s, args.sine_period_s, args.ramp_s, prefix=True)


def _parse_params(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        parsed: Any = value
        for kind in (int, float):
            try:
                parsed = kind(value)
                break
            except ValueError:
                continue
        out[key.strip()] = parsed
    return out


def make(
    name: str,
    forecaster: str,
    params: dict[str, Any],
    checkpoint: Path | None = None,
    combination: CombinationMode | None = None,
    wrap: Callable[[Forecaster], Forecaster] | None = None,
) -> ReplayPolicy:
    """A policy by name; the predictive one with the Holt baseline (``forecaster`` "holt"), the shipped
    checkpoint ("default"), or the learned checkpoint at ``checkpoint`` (which wins over ``forecaster``).
    ``combination``: the learned forecaster inside the online combination ("all": every target,
    "arrivals": arrivals only) or not ("off"); None = what ``load_default_forecaster`` does by default.
    ``wrap``: applied to every forecaster the predictive policy builds (``ForecastRecorder`` for
    ``--forecast-stats``)."""
    if name == "predictive":
        cfg = PolicyConfig(**params)
        if checkpoint is not None or (forecaster == "default" and combination is not None):
            from controller.forecasting import load_default_forecaster

            path = checkpoint
            mode = combination

            def learned() -> Forecaster:
                f = (
                    load_default_forecaster(path)
                    if mode is None
                    else load_default_forecaster(path, combination=mode)
                )
                return wrap(f) if wrap else f

            return PredictivePolicy(cfg, forecaster=learned)
        if forecaster == "holt":

            def holt() -> Forecaster:
                return wrap(Holt()) if wrap else Holt()

            return PredictivePolicy(cfg, forecaster=holt)
        if wrap is not None:

            def default() -> Forecaster:
                return wrap(default_forecaster())

            return PredictivePolicy(cfg, forecaster=default)
        return PredictivePolicy(cfg)
    return make_policy(name, PolicyOptions())


# (name, the target's input channel column in forecaster.types.CHANNELS, ForecastBatch p90 field)
FORECAST_TARGETS = (
    ("arrivals", CHANNELS.index("arrival_rps"), "arrivals_p90"),
    ("prompt tokens", CHANNELS.index("prompt_tps"), "prompt_tokens_p90"),
    ("gen tokens", CHANNELS.index("gen_tps"), "gen_tokens_p90"),
)
JUMP_UP = 1.25  # a tick whose p90 rose by more than this factor counts as an up-move


class ForecastRecorder:
    """A forecaster that passes every step through and keeps, per tick, ``now_s``, the input rates of the
    forecast targets' channels (``FORECAST_TARGETS``' columns: arrivals, prompt and generation tokens per second, as the loop
    measured them) and the p90 totals it returned (``FORECAST_TARGETS``), for ``forecast_stats``."""

    def __init__(self, inner: Forecaster, sink: list[tuple[float, np.ndarray, np.ndarray]]) -> None:
        self.inner = inner
        self.name = inner.name
        self.horizon_s = inner.horizon_s
        self.sink = sink

    def reset(self, node_ids: Sequence[str]) -> None:
        self.inner.reset(node_ids)

    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        batch = self.inner.step(x, mask, now_s=now_s)
        inputs = np.where(np.asarray(mask, dtype=bool), np.asarray(x, dtype=np.float64), np.nan)
        p90 = np.stack([np.asarray(getattr(batch, f), dtype=np.float64) for _, _, f in FORECAST_TARGETS], -1)
        self.sink.append((float(now_s), inputs[:, [c for _, c, _ in FORECAST_TARGETS]], p90))
        return batch


def realised_totals(times_s: np.ndarray, rates: np.ndarray, horizon_s: float) -> np.ndarray:
    """Per tick ``i``, the total that arrived over ``(t_i, t_i + horizon_s]``: each later tick ``j``'s rates
    cover ``(t_{j-1}, t_j]``, so the total is ``sum(rate_j × (t_j - t_{j-1}))`` over the ticks with
    ``t_i < t_j <= t_i + horizon_s`` (``rates``: ``[T, ...]``). NaN where the horizon runs past the last tick
    or covers an unknown rate."""
    t = np.asarray(times_s, dtype=np.float64)
    r = np.asarray(rates, dtype=np.float64)
    out = np.full(r.shape, np.nan)
    if len(t) < 2:
        return out
    inc = np.zeros(r.shape)
    inc[1:] = r[1:] * np.diff(t).reshape((-1,) + (1,) * (r.ndim - 1))
    bad = ~np.isfinite(inc)
    bad[0] = False
    cs = np.cumsum(np.where(bad, 0.0, inc), axis=0)
    cb = np.cumsum(bad, axis=0)
    end = np.searchsorted(t, t + horizon_s + 1e-9, side="right") - 1  # last tick within the horizon
    ok = t + horizon_s <= t[-1] + 1e-9
    idx = np.flatnonzero(ok)
    out[idx] = cs[end[idx]] - cs[idx]
    out[idx] = np.where(cb[end[idx]] - cb[idx] > 0, np.nan, out[idx])
    return out


def forecast_stats(
    records: Sequence[tuple[float, np.ndarray, np.ndarray]], horizon_s: float
) -> dict[str, dict[str, float]]:
    """Per target (``FORECAST_TARGETS``), over every pool and tick where the p90 and the realised total
    (``realised_totals``) are both known: ``coverage`` (share of realised totals <= p90), ``bias`` (sum of
    p90 / sum of realised), ``jump`` (mean |Δ log1p p90| between consecutive ticks) and ``up_moves`` (ticks
    whose p90 rose more than ``JUMP_UP``-fold, counting only p90s of at least 1). Rows must keep one pool
    order (the controller's tracks); an empty record gives NaNs."""
    out: dict[str, dict[str, float]] = {}
    if not records:
        nan = {"coverage": math.nan, "bias": math.nan, "jump": math.nan, "up_moves": math.nan, "n": 0.0}
        return {name: dict(nan) for name, _, _ in FORECAST_TARGETS}
    times = np.array([r[0] for r in records])
    inputs = np.stack([r[1] for r in records])  # [T, N, K]
    p90 = np.stack([r[2] for r in records])  # [T, N, K]
    real = realised_totals(times, inputs, horizon_s)
    for k, (name, _, _) in enumerate(FORECAST_TARGETS):
        f, y = p90[..., k], real[..., k]
        ok = np.isfinite(f) & np.isfinite(y)
        with np.errstate(invalid="ignore", divide="ignore"):
            d = np.diff(np.log1p(np.maximum(f, 0.0)), axis=0)
            both = ok[1:] & ok[:-1]
            rose = (f[1:] > JUMP_UP * f[:-1]) & (f[1:] >= 1.0) & both
            out[name] = {
                "coverage": float(np.mean(y[ok] <= f[ok])) if ok.any() else math.nan,
                "bias": float(f[ok].sum() / y[ok].sum()) if ok.any() and y[ok].sum() > 0 else math.nan,
                "jump": float(np.mean(np.abs(d[both]))) if both.any() else math.nan,
                "up_moves": float(rose.sum()),
                "n": float(ok.sum()),
            }
    return out


def print_forecast_stats(workload: str, label: str, stats: dict[str, dict[str, float]]) -> None:
    print(f"{workload} {label}: the forecaster's p90 in the loop against what arrived next")
    print("| target | ticks | p90 coverage | p90 / realised | mean abs Δ log1p p90 | up-moves > 25 % |")
    print("|---|---|---|---|---|---|")
    for name, s in stats.items():
        print(
            f"| {name} | {s['n']:.0f} | {s['coverage']:.3f} | {s['bias']:.2f} | {s['jump']:.3f} | "
            f"{s['up_moves']:.0f} |"
        )


def unguarded(
    wrap: Callable[[Forecaster], Forecaster] | None,
) -> Callable[[Forecaster], Forecaster]:
    """``wrap`` (or nothing) after switching off the learned forecaster's length guard (``--length-guard off``)."""
    from controller.forecasting import without_length_guard

    def off(f: Forecaster) -> Forecaster:
        without_length_guard(f)
        return wrap(f) if wrap else f

    return off


def checkpoint_runs(paths: list[str]) -> list[tuple[str, Path | None]]:
    """(row label, checkpoint) per ``--checkpoint`` value (``[NAME=]PATH``; the label defaults to the file's
    stem); one unlabelled run with no checkpoint when none is given. A missing file is an error naming it (the
    controller would silently fall back to Holt, and the row would not measure the checkpoint it names)."""
    if not paths:
        return [("", None)]
    out: list[tuple[str, Path | None]] = []
    for text in paths:
        label, sep, path_text = text.partition("=")
        path = Path(path_text if sep else text)
        if not path.is_file():
            raise FileNotFoundError(f"--checkpoint {text!r}: no file at {path}")
        out.append((label if sep else path.stem, path))
    return out


def scored(rep: ReplayReport, fleet: FleetSpec, after_s: float) -> float:
    """SLO attainment of the requests a row is scored on: all of them, or those arriving from ``after_s``."""
    return rep.slo_attainment if after_s <= 0 else attainment_after(rep, fleet, after_s)


def gpu_seconds_after(rep: ReplayReport, fleet: FleetSpec, after_s: float) -> float:
    """GPU-seconds held from ``after_s`` on, from the replay's per-tick timeline (instances holding GPUs)."""
    if rep.timeline is None:
        return float("nan")
    t, held = rep.timeline.t_s, rep.timeline.holding_gpu.astype(np.float64)
    dt = np.diff(t, append=t[-1])
    gpus = get_profile(fleet.pools[0].profile).gpus
    return float((held * dt)[t >= after_s].sum() * gpus)


def oracle_at_slo(
    trace: Trace, fleet: FleetSpec, target: float, after_s: float = 0.0, gateway: GatewayPolicy | None = None
) -> tuple[float | None, ReplayReport]:
    """The least oracle headroom h in [0, ORACLE_SLO_MAX_H] whose replay meets ``target`` (bisection, at most
    ORACLE_SLO_REPLAYS replays, to within the last bracket) and its report; (None, the h = max report) when
    even the most headroom misses the target."""
    from controller.replay_policies import OraclePolicy

    def attempt(h: float) -> ReplayReport:
        return run("oracle@slo", trace, fleet, OraclePolicy(headroom=h), gateway)

    hi, best = ORACLE_SLO_MAX_H, attempt(ORACLE_SLO_MAX_H)
    if scored(best, fleet, after_s) < target:
        return None, best
    lo_rep = attempt(0.0)
    if scored(lo_rep, fleet, after_s) >= target:
        return 0.0, lo_rep
    lo = 0.0
    for _ in range(ORACLE_SLO_REPLAYS - 2):
        mid = (lo + hi) / 2
        rep = attempt(mid)
        if scored(rep, fleet, after_s) >= target:
            hi, best = mid, rep
        else:
            lo = mid
    return hi, best


def run(
    name: str, trace: Trace, fleet: FleetSpec, policy: ReplayPolicy, gateway: GatewayPolicy | None = None
) -> ReplayReport:
    pool = fleet.pools[0]
    fleet = replace(fleet, pools=(pool,))
    return replay(fleet, {pool.name: trace}, policy, gateway=gateway)


def attainment_after(rep: ReplayReport, fleet: FleetSpec, after_s: float) -> float:
    """SLO attainment of the requests arriving at or after ``after_s`` (NaN when there are none): what a
    policy does once it has seen some traffic, since every policy without the future starts blind."""
    pool = fleet.pools[0]
    arrival = np.asarray(rep.arrival_s)
    ttft, itl = np.asarray(rep.request_ttft_ms), np.asarray(rep.request_itl_ms)
    met = (ttft <= pool.slo_ttft_ms) & (itl <= pool.slo_itl_ms)
    late = arrival >= after_s
    return float(met[late].mean()) if late.any() else float("nan")


def format_after(attainment: float, after_s: float) -> str:
    """The "SLO after" cell: a percentage, or a dash saying why there is none (no arrival from ``after_s``)."""
    if math.isnan(attainment):
        return f"— (trace shorter than {after_s:.0f} s)"
    return f"{attainment:.2%}"


def decide_cost(ticks: int = 600) -> None:
    """Time one ``decide`` call per 1-s tick for one pool whose burst reserve remembers a full hour (the
    state at its largest), printing median / p99 / max ms (a reserve recomputation every 5th tick)."""
    import math
    import statistics

    from controller.policy import PolicyContext, PoolCapacity, PoolObservation, PoolState, decide

    cap = PoolCapacity(prefill_tps=10_000.0, decode_seqs=64.0, decode_tps=2_000.0, gpus_per_instance=1)
    cfg = PolicyConfig()
    rng = np.random.default_rng(0)
    state, times = PoolState(), []
    warm = int(cfg.burst_window_s + cfg.provision_lead_s)
    for t in range(warm + ticks):
        rps = float(rng.poisson(10.0 * (1 + 5 * (t % 300 < 20))))
        o = PoolObservation(
            pool="p", now_s=float(t), replicas={"prefill": 4, "decode": 4}, active={"prefill": 4, "decode": 4},
            standby={"prefill": 0, "decode": 0}, provisioning={"prefill": 0, "decode": 0}, arrival_rps=rps,
            prompt_tps=rps * 1000.0, gen_tps=rps * 200.0, running_seqs=rps * 10.0, waiting_requests=0.0,
            oldest_wait_s=math.nan, kv_usage=0.5, mean_prompt_tokens=1000.0, mean_output_tokens=200.0,
        )  # fmt: skip
        t0 = time.perf_counter()
        _, state = decide(PolicyContext(o, cap, cfg, 1000.0, 50.0), state)
        if t >= warm:
            times.append((time.perf_counter() - t0) * 1000.0)
    times.sort()
    print(
        f"decide, one pool, {len(state.need_blocks)} need blocks remembered: median"
        f" {statistics.median(times):.3f} ms, p99 {times[int(0.99 * len(times))]:.3f} ms, max {times[-1]:.3f} ms"
    )


_NEED = re.compile(
    r"need: prefill ([\d.]+), decode ([\d.]+) instances \(concurrency \d+: running (\d+), Little (\S+)\)"
)
_TREND = re.compile(r"load × ([\d.]+) by the time")
_HEADROOM = re.compile(r"headroom \d+%: prefill (\d+), decode (\d+)")
_BUFFER = re.compile(r"buffer: \d+ seqs reserved → decode (\d+)")
_RESERVE = re.compile(r"burst reserve .*→ (\d+), decode .*→ (\d+)$")
_PROMOTED = re.compile(r"standby promoted .*: \+(\d+) prefill, \+(\d+) decode")
_RATIO = re.compile(r"^P:D ratio .*: (prefill|decode) \d+ → (\d+)")
STAGES = (
    "capacity",
    "trend",
    "headroom",
    "buffer",
    "burst reserve",
    "alert",
    "P:D ratio",
    "hysteresis",
    "standby",
)


def stage_walk(plan: ScalingPlan) -> list[tuple[str, list[int]]]:
    """The plan's (stage, [prefill, decode] target after it) in the order its reasons give them: ``capacity``
    (ceil(need)) at the need line, then trend, headroom, buffer, burst reserve, alert and P:D ratio as they
    appear. The final target's difference from the last entry is the hysteresis stage (not listed)."""
    steps: list[tuple[str, list[int]]] = []
    cur = [0, 0]
    need = [0.0, 0.0]
    for why in plan.reasons:
        if m := _NEED.search(why):
            need = [float(m[1]), float(m[2])]
            cur = [math.ceil(need[0] - 1e-9), math.ceil(need[1] - 1e-9)]
            steps.append(("capacity", cur))
            continue
        new: tuple[str, list[int]] | None = None
        if m := _TREND.search(why):
            f = float(m[1])
            new = ("trend", [math.ceil(need[0] * f - 1e-9), math.ceil(need[1] * f - 1e-9)])
        elif m := _HEADROOM.search(why):
            new = ("headroom", [int(m[1]), int(m[2])])
        elif m := _BUFFER.search(why):
            new = ("buffer", [cur[0], int(m[1])])
        elif m := _RESERVE.search(why):
            new = ("burst reserve", [max(cur[0], int(m[1])), max(cur[1], int(m[2]))])
        elif m := _PROMOTED.search(why):
            new = ("alert", [cur[0] + int(m[1]), cur[1] + int(m[2])])
        elif m := _RATIO.search(why):
            i = 0 if m[1] == "prefill" else 1
            new = ("P:D ratio", [int(m[2]) if j == i else cur[j] for j in (0, 1)])
        if new is not None:
            steps.append(new)
            cur = new[1]
    return steps


def decompose(decisions: list[tuple[float, ScalingPlan]], gpus: int) -> dict[str, Any]:
    """GPU-seconds per stage and role, read back from each plan's reasons (``stage_walk``): what each stage
    added to the target over the previous one (capacity = ceil(need), hysteresis = final − wanted, standby =
    warm standby held), each tick weighted by the time to the next decision. Also the measured decode
    concurrency against Little's law (arrival rate × mean output / per-sequence rate), time-weighted."""
    added = {(st, r): 0.0 for st in STAGES for r in ("prefill", "decode")}
    running_s = little_s = 0.0
    for k, (t, plan) in enumerate(decisions):
        dt = (decisions[k + 1][0] - t) if k + 1 < len(decisions) else 1.0
        for why in plan.reasons:
            if (m := _NEED.search(why)) and m[4] != "nan":
                running_s += float(m[3]) * dt
                little_s += float(m[4]) * dt
        cur = [0, 0]
        for stage, new in stage_walk(plan):
            base = [0, 0] if stage == "capacity" else cur  # the need line sets the target afresh
            for i, r in enumerate(("prefill", "decode")):
                added[stage, r] += (new[i] - base[i]) * gpus * dt
            cur = new
        final = [plan.prefill, plan.decode]
        for i, r in enumerate(("prefill", "decode")):
            added["hysteresis", r] += (final[i] - cur[i]) * gpus * dt
            added["standby", r] += plan.standby(r) * gpus * dt
    return {"added": added, "running_over_little": running_s / little_s if little_s > 0 else math.nan}


class ChurnProbe:
    """Wraps a replay policy to keep a reference to the simulator it drives (through the view's bound scrape
    method; read-only), so the cold starts can be counted after the replay: instances started after t = 0,
    and how many requests each was routed before it was released."""

    def __init__(self, inner: ReplayPolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.sim: Any = None
        self.by_state: dict[tuple[str, str], float] = {}  # (role, state) -> GPU-seconds, sampled per tick
        self.seen: dict[int, set[str]] = {}  # instance index -> the lifecycle states it was seen in
        self._last_s = math.nan

    def reset(self, fleet: FleetSpec, traces: Any) -> None:
        self.inner.reset(fleet, traces)
        self.sim, self.by_state, self.seen, self._last_s = None, {}, {}, math.nan

    def on_tick(self, now_s: float, view: Any) -> Any:
        if self.sim is None:
            self.sim = getattr(view.scrape, "__self__", None)
        self._tally(now_s)
        return self.inner.on_tick(now_s, view)

    def _tally(self, now_s: float) -> None:
        """Add the GPU-seconds since the last tick to each (role, lifecycle state), as held at that tick
        (active instances split by whether they held a request: 'active' or 'active idle')."""
        if self.sim is not None and math.isfinite(self._last_s):
            dt = now_s - self._last_s
            for i in self.sim.instances:
                self.seen.setdefault(i.index, set()).add(i.state)
                if i.state in HOLDS_GPU:
                    state = "active idle" if i.state == "active" and i.empty else i.state
                    key = (i.role, state)
                    self.by_state[key] = self.by_state.get(key, 0.0) + i.gpus * dt
        self._last_s = now_s

    def cancelled(self) -> dict[str, int]:
        """Per role, cold starts released before they were ever seen ready (active or standby): started and
        cancelled, GPU-seconds for nothing."""
        if self.sim is None:
            return {}
        out: dict[str, int] = {}
        for i in self.sim.instances:
            states = self.seen.get(i.index, set())
            if i.t_alloc_s > 0 and math.isfinite(i.t_release_s) and not states & {"active", "standby"}:
                out[i.role] = out.get(i.role, 0) + 1
        return out

    def cold_starts(self, few: int) -> tuple[int, int, int]:
        """(cold starts, those released having served no request, those released having served < few)."""
        if self.sim is None:
            return 0, 0, 0
        cold = [i for i in self.sim.instances if i.t_alloc_s > 0]
        gone = [i for i in cold if math.isfinite(i.t_release_s)]
        return (
            len(cold),
            sum(1 for i in gone if i.router_requests_total == 0),
            sum(1 for i in gone if i.router_requests_total < few),
        )


def oracle_by_role(trace: Trace, fleet: FleetSpec) -> tuple[float, float]:
    """The oracle's instance-seconds per role (prefill, decode): its per-second need held over one cold
    start ahead, floored at 1, as OraclePolicy sets it (GPUs per instance not applied)."""
    pool = fleet.pools[0]
    lead = int(get_profile(pool.profile).cold_start_s)
    out = []
    for need in oracle_needs(pool, trace, 5.0):
        padded = np.concatenate([need, np.full(lead + 1, -np.inf)])
        held = sliding_window_view(padded, lead + 1)[: len(need)].max(axis=1)
        out.append(float(np.maximum(held, 1.0).sum()))
    return out[0], out[1]


def print_decomposition(
    wl: str, trace: Trace, fleet: FleetSpec, policy: ReplayPolicy, probe: ChurnProbe | None = None
) -> None:
    """Where the predictive policy's GPU-seconds go, stage by stage and role by role, against the oracle."""
    assert isinstance(policy, PredictivePolicy)
    gpus = get_profile(fleet.pools[0].profile).gpus
    d = decompose(policy.decisions, gpus)
    o_p, o_d = oracle_by_role(trace, fleet)
    print(f"\n{wl}: GPU-s added per stage (predictive plan, read from its reasons)")
    print("| stage | prefill | decode |")
    print("|---|---|---|")
    for st in STAGES:
        print(f"| {st} | {d['added'][st, 'prefill']:,.0f} | {d['added'][st, 'decode']:,.0f} |")
    tot = [sum(d["added"][st, r] for st in STAGES) for r in ("prefill", "decode")]
    print(f"| **total planned** | {tot[0]:,.0f} | {tot[1]:,.0f} |")
    print(f"| oracle (need held one cold start) | {o_p * gpus:,.0f} | {o_d * gpus:,.0f} |")
    print(f"measured decode running / Little's law (time-weighted): {d['running_over_little']:.2f}")
    if probe is not None:
        states = sorted({s for _, s in probe.by_state}, key=lambda s: (s not in HOLDS_GPU, s))
        cells = [
            f"{s} {probe.by_state.get(('prefill', s), 0.0):,.0f} / {probe.by_state.get(('decode', s), 0.0):,.0f}"
            for s in states
        ]
        print(f"GPU-s by lifecycle state, prefill / decode (sampled per tick): {'; '.join(cells)}")
        n, zero, few = probe.cold_starts(CHURN_FEW)
        print(
            f"cold starts: {n}; released having served no request: {zero}, fewer than {CHURN_FEW}: {few}"
            " (started for a burst that was over before they served)"
        )
        gone = probe.cancelled()
        print(f"cancelled before ready, prefill / decode: {gone.get('prefill', 0)} / {gone.get('decode', 0)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="code,conv,sine,mmpp")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="replay only the first DURATION_S s (of the very trace a full run replays: see workload())",
    )
    ap.add_argument("--sine-period-s", type=float, default=600.0)
    ap.add_argument("--ramp-s", type=float, default=1200.0, help="the ramp workload's rise, seconds")
    ap.add_argument("--forecaster", choices=("holt", "default"), default="holt")
    ap.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="predictive runs with this learned checkpoint, its rows labelled NAME (default: the file's stem);"
        " repeat it to run several checkpoints side by side (the other policies run once)",
    )
    ap.add_argument(
        "--combination",
        default="default",
        help="the learned forecaster inside the online forecast combination (forecaster.combination): off, all"
        " (every target), arrivals (arrivals only), or a list such as off,all,arrivals (each predictive row"
        " replayed each way, side by side); default = the controller's default",
    )
    ap.add_argument("--params", default="", help="PolicyConfig overrides for predictive: k=v,k=v")
    ap.add_argument(
        "--length-guard",
        choices=("on", "off"),
        default="on",
        help="the learned forecaster's length guard (forecaster.lengths; ControllerConfig.forecaster_length_guard)",
    )
    ap.add_argument("--label", default="", help="a label printed in each row (e.g. before/after)")
    ap.add_argument(
        "--warmup-s", type=float, default=600.0, help="the 'SLO after' column counts arrivals from here on"
    )
    ap.add_argument("--decide-cost", action="store_true", help="only time decide() with an hour of state")
    ap.add_argument(
        "--slo-target", type=float, default=0.99, help="the SLO attainment oracle@slo must reach (0..1)"
    )
    ap.add_argument(
        "--time-split",
        type=float,
        default=None,
        metavar="F",
        help="also score only the requests arriving after fraction F (0..1) of each trace, and the GPU-s then",
    )
    ap.add_argument(
        "--decompose", action="store_true", help="after each predictive row, its GPU-s stage by stage"
    )
    ap.add_argument(
        "--forecast-stats",
        action="store_true",
        help="after each predictive row, its forecaster's p90 coverage, bias and jumps against what arrived",
    )
    ap.add_argument(
        "--gateway-queue",
        default="off",
        help="the simulator's gateway queue: off, on, or off,on (each policy replayed both ways, side by side;"
        " the label column says which)",
    )
    ap.add_argument(
        "--gateway-max-waiting", type=int, default=5, help="with --gateway-queue on (see pdscale replay)"
    )
    args = ap.parse_args()
    if args.decide_cost:
        decide_cost()
        return
    params = _parse_params(args.params)
    try:
        checkpoints = checkpoint_runs(args.checkpoint)
    except FileNotFoundError as exc:
        ap.error(str(exc))
    combos: list[tuple[str, CombinationMode | None]] = []
    for c in args.combination.split(","):
        if c not in ("off", "all", "arrivals", "default"):
            ap.error(f"--combination: expected off, all, arrivals (or a list of them) or default, got {c!r}")
        combos.append((c, None if c == "default" else cast("CombinationMode", c)))
    gateways: list[tuple[str, GatewayPolicy | None]] = []
    for g in args.gateway_queue.split(","):
        if g not in ("on", "off"):
            ap.error(f"--gateway-queue: expected on, off or off,on, got {args.gateway_queue!r}")
        gateways.append((g, GatewayPolicy(max_waiting=args.gateway_max_waiting) if g == "on" else None))
    if not 0.0 < args.slo_target <= 1.0:
        ap.error(f"--slo-target must be in (0, 1], got {args.slo_target}")
    if args.time_split is not None and not 0.0 <= args.time_split < 1.0:
        ap.error(f"--time-split must be in [0, 1), got {args.time_split}")
    split = (
        ""
        if args.time_split is None
        else f" SLO after {args.time_split:g} | GPU-s after {args.time_split:g} |"
    )
    print(
        f"| workload | policy | label | SLO attained | SLO after {args.warmup_s:.0f} s |{split} GPU-s | / oracle |"
        " / oracle@slo | / static-peak | TTFT p99 ms | ITL p99 ms | wall s |"
    )
    print(
        "|---|---|---|---|---|" + "---|---|" * (args.time_split is not None) + "---|---|---|---|---|---|---|"
    )
    for wl in args.workloads.split(","):
        trace, fleet = row_trace(wl, args)
        split_s = 0.0 if args.time_split is None else args.time_split * float(trace.arrival_s[-1])
        results: dict[tuple[str, str], ReplayReport] = {}
        runs = [
            (p, g, ck, cb)
            for p in args.policies.split(",")
            for g in gateways
            for ck in (checkpoints if p == "predictive" else [("", None)])
            for cb in (combos if p == "predictive" else [("default", None)])
        ]
        for pol, (gw_name, gateway), (ck_name, ck_path), (cb_name, combination) in runs:
            label = args.label if len(gateways) == 1 else f"{args.label} gw {gw_name}".strip()
            label = f"{label} {ck_name}".strip()
            if pol == "predictive" and cb_name != "default":
                label = f"{label} comb {cb_name}".strip()
            t0 = time.perf_counter()
            name = pol
            if pol == "oracle@slo":
                h, rep = oracle_at_slo(trace, fleet, args.slo_target, gateway=gateway)
                name = (
                    f"oracle@slo (h={h:.3f})"
                    if h is not None
                    else f"oracle@slo (unreachable at h={ORACLE_SLO_MAX_H:g})"
                )
            else:
                records: list[tuple[float, np.ndarray, np.ndarray]] = []

                def recorder(
                    f: Forecaster, sink: list[tuple[float, np.ndarray, np.ndarray]] = records
                ) -> Forecaster:
                    return ForecastRecorder(f, sink)

                wrap: Callable[[Forecaster], Forecaster] | None = (
                    recorder if args.forecast_stats and pol == "predictive" else None
                )
                if args.length_guard == "off" and pol == "predictive":
                    wrap = unguarded(wrap)
                policy = make(pol, args.forecaster, params, ck_path, combination, wrap)
                probe = ChurnProbe(policy)
                rep = run(wl, trace, fleet, probe if args.decompose else policy, gateway)
            results.setdefault((pol, gw_name), rep)
            wall = time.perf_counter() - t0
            ratios = []
            for ref in ("oracle", "oracle@slo", "static-peak"):
                base = results.get((ref, gw_name))
                ratios.append(f"{rep.gpu_seconds / base.gpu_seconds:.2f}" if base else "-")
            late = ""
            if args.time_split is not None:
                late = f" {attainment_after(rep, fleet, split_s):.2%} | {gpu_seconds_after(rep, fleet, split_s):,.0f} |"
            print(
                f"| {wl} | {name} | {label} | {rep.slo_attainment:.2%} | "
                f"{format_after(attainment_after(rep, fleet, args.warmup_s), args.warmup_s)} |{late} {rep.gpu_seconds:,.0f} | "
                f"{' | '.join(ratios)} | {rep.ttft_ms['p99']:,.0f} | {rep.itl_ms['p99']:,.1f} | {wall:.0f} |",
                flush=True,
            )
            if args.decompose and pol == "predictive":
                print_decomposition(wl, trace, fleet, policy, probe)
            if args.forecast_stats and pol == "predictive":
                horizon = getattr(getattr(policy, "forecaster", None), "horizon_s", 5.0)
                print_forecast_stats(wl, label, forecast_stats(records, float(horizon)))


if __name__ == "__main__":
    main()
