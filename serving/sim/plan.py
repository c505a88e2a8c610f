"""Capacity planning (``pdscale plan``): how many prefill and decode instances, and GPUs, a load needs.

Every number comes from :func:`serving.sim.capacity.instances_needed` (the model the controller sizes with);
this module only chooses the load to size for, compares profiles, prices them, and checks a plan by replay.

- **Each pool is rounded up on its own.** With prefill share p = prompt load / one instance's prompt tokens/s
  and decode share d likewise, the plan is ⌈p⌉ prefill + ⌈d⌉ decode. A single ceil over the sum, ⌈p + d⌉
  (the seed's sizing), is smaller whenever the fractional parts of p and d add up to at most 1; then every
  split of ⌈p + d⌉ instances leaves one pool below its share, so that pool is starved (queues grow without
  bound). :attr:`ProfilePlan.single_ceil_total` and :attr:`ProfilePlan.starved_by_single_ceil` show it.
- **Trace sizing.** From a trace, loads are read off sliding ``window_s`` windows (starting at whole seconds,
  full windows only): prefill is sized for the window at a given rank of *prompt tokens*, decode for the
  window at that rank of *generated tokens* (each with that window's rate and mean lengths, as
  ``static-peak`` does), for the peak window, the p99 and p90 windows, and the whole-trace mean.
- **Checking by replay.** :func:`verify_plan` replays a trace with the ``fixed`` policy at the planned counts
  and at one instance fewer in each pool; "meets" is the simulator's SLO attainment (per request: completed,
  TTFT within the TTFT SLO, mean ITL within the ITL SLO) of at least ``min_attainment``; ``meets_p90`` is
  what the model sizes for (P90 TTFT and mean ITL within the SLOs). Findings (docs/BENCHMARKS.md): decode
  minus one fails in every case tried; prefill minus one still meets for pools of 4+ instances, because the
  per-instance M/D/1 model assumes Poisson arrivals while a router's split is smoother (the model is within
  1-4 % for a single instance).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from serving.sim.capacity import CapacityError, InstancesNeeded, instances_needed
from serving.sim.hardware import HardwareProfile, get_profile
from serving.sim.latency import LatencyModel, latency_model_for
from serving.workload.trace import Trace

DEFAULT_HEADROOM = 0.3
DEFAULT_WINDOW_S = 60.0
DEFAULT_MIN_ATTAINMENT = 0.99
# Levels a trace is sized at: name -> quantile of the window loads (1.0 = the peak window), None = the mean.
TRACE_LEVELS: tuple[tuple[str, float | None], ...] = (
    ("peak", 1.0),
    ("p99", 0.99),
    ("p90", 0.9),
    ("mean", None),
)


class PlanError(ValueError):
    """A plan that cannot be made: bad input, or an SLO no instance of a profile can meet (the message says which)."""


@dataclass(frozen=True)
class LoadPoint:
    """A steady load: request rate and mean lengths (what one pool is sized for)."""

    rate_rps: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    label: str = "given"  # "given", or the trace window it was read from ("peak window at t=120 s")

    @property
    def prompt_tps(self) -> float:
        return self.rate_rps * self.mean_prompt_tokens

    @property
    def generation_tps(self) -> float:
        return self.rate_rps * self.mean_output_tokens


@dataclass(frozen=True)
class Sizing:
    """The load each pool is sized for: prefill by prompt tokens, decode by generated tokens (may differ)."""

    name: str  # "given", "peak", "p99", "p90", "mean"
    prefill_load: LoadPoint
    decode_load: LoadPoint

    @staticmethod
    def steady(load: LoadPoint, name: str = "given") -> Sizing:
        return Sizing(name, load, load)


@dataclass(frozen=True)
class ProfilePlan:
    """One profile's answer for one sizing. ``prefill_need``/``decode_need`` are the capacity model's output
    for the prefill and decode loads (the same object for a steady load)."""

    profile: HardwareProfile
    prefill_need: InstancesNeeded
    decode_need: InstancesNeeded
    price_usd_per_gpu_hour: float = math.nan  # NaN: no price given

    @property
    def prefill(self) -> int:
        return self.prefill_need.prefill

    @property
    def decode(self) -> int:
        return self.decode_need.decode

    @property
    def instances(self) -> int:
        return self.prefill + self.decode

    @property
    def gpus(self) -> int:
        return self.instances * self.profile.gpus

    @property
    def prefill_share(self) -> float:
        """Prefill instances needed as a real number (load with headroom / one instance's capacity)."""
        n = self.prefill_need
        return n.prefill_load_tps / n.prefill_capacity.tokens_per_s if n.prefill_load_tps > 0 else 0.0

    @property
    def decode_share(self) -> float:
        n = self.decode_need
        return n.decode_load_tps / n.decode_capacity.tokens_per_s if n.decode_load_tps > 0 else 0.0

    @property
    def single_ceil_total(self) -> int:
        """⌈prefill share + decode share⌉: the seed's one ceil over the sum (instances)."""
        return math.ceil(self.prefill_share + self.decode_share - 1e-9)

    @property
    def starved_by_single_ceil(self) -> bool:
        """True when ⌈p + d⌉ < ⌈p⌉ + ⌈d⌉: no split of the single-ceil total covers both pools' shares."""
        return self.single_ceil_total < self.instances

    @property
    def pd_ratio(self) -> float:
        """Prefill : decode instances as one number (P / D); NaN when no decode instance is needed."""
        return self.prefill / self.decode if self.decode else math.nan

    @property
    def cost_usd_per_hour(self) -> float:
        """GPUs × price; NaN when the profile has no price."""
        return self.gpus * self.price_usd_per_gpu_hour

    def to_json(self) -> dict[str, object]:
        pre, dec = self.prefill_need.prefill_capacity, self.decode_need.decode_capacity
        return _clean(
            {
                "profile": self.profile.name,
                "gpus_per_instance": self.profile.gpus,
                "prefill": self.prefill,
                "decode": self.decode,
                "gpus": self.gpus,
                "pd_ratio": self.pd_ratio,
                "prefill_share": self.prefill_share,
                "decode_share": self.decode_share,
                "single_ceil_total": self.single_ceil_total,
                "starved_by_single_ceil": self.starved_by_single_ceil,
                "mixed": _mixed(self),
                "price_usd_per_gpu_hour": self.price_usd_per_gpu_hour,
                "cost_usd_per_hour": self.cost_usd_per_hour,
                "explain": {
                    "prefill_tokens_per_s_per_instance": pre.tokens_per_s,
                    "prefill_utilisation": pre.utilisation,
                    "prefill_prompts_per_iteration": pre.prompts_per_iteration,
                    "prefill_iteration_ms": pre.iteration_ms,
                    "prefill_min_ttft_ms": pre.min_ttft_ms,
                    "prefill_load_tps": self.prefill_need.prefill_load_tps,
                    "decode_max_batch": dec.max_batch,
                    "decode_limited_by": dec.limited_by,
                    "decode_step_ms": dec.step_ms,
                    "decode_kv_max_batch": dec.kv_max_batch,
                    "decode_tokens_per_s_per_instance": dec.tokens_per_s,
                    "decode_load_tps": self.decode_need.decode_load_tps,
                },
            }
        )


def _mixed(p: ProfilePlan) -> int:
    """Colocated instances for the same loads (the capacity model's lower bound, see ``InstancesNeeded.mixed``)."""
    if p.prefill_need is p.decode_need:
        return p.prefill_need.mixed
    return math.ceil(p.prefill_share + p.decode_share - 1e-9)


@dataclass(frozen=True)
class Plan:
    """Plans for one sizing, one :class:`ProfilePlan` per profile in the order given (the first is the answer)."""

    sizing: Sizing
    slo_ttft_ms: float
    slo_itl_ms: float
    headroom: float
    profiles: tuple[ProfilePlan, ...]

    @property
    def first(self) -> ProfilePlan:
        return self.profiles[0]

    def to_json(self) -> dict[str, object]:
        first = self.first
        return _clean(
            {
                "prefill": first.prefill,
                "decode": first.decode,
                "gpus": first.gpus,
                "profile": first.profile.name,
                "sizing": self.sizing.name,
                "prefill_load": _load_json(self.sizing.prefill_load),
                "decode_load": _load_json(self.sizing.decode_load),
                "slo_ttft_ms": self.slo_ttft_ms,
                "slo_itl_ms": self.slo_itl_ms,
                "headroom": self.headroom,
                "profiles": {p.profile.name: p.to_json() for p in self.profiles},
            }
        )


def _load_json(load: LoadPoint) -> dict[str, object]:
    return {
        "label": load.label,
        "rate_rps": load.rate_rps,
        "mean_prompt_tokens": load.mean_prompt_tokens,
        "mean_output_tokens": load.mean_output_tokens,
    }


def _clean(d: dict[str, object]) -> dict[str, object]:
    """JSON-safe: NaN and infinities become None (nested dicts too)."""
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[k] = None
        elif isinstance(v, dict):
            out[k] = _clean(v)
        else:
            out[k] = v
    return out


def parse_prices(items: Sequence[str]) -> dict[str, float]:
    """``["llama3-8b/h100=4.1", ...]`` -> ``{"llama3-8b/h100": 4.1}`` (USD per GPU-hour); errors name the item."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        if not sep or not name:
            raise PlanError(f"--price {item!r}: expected PROFILE=USD_PER_GPU_HOUR, e.g. llama3-8b/a100=1.8")
        try:
            price = float(value)
        except ValueError:
            raise PlanError(f"--price {item!r}: {value!r} is not a number") from None
        if not (math.isfinite(price) and price >= 0):
            raise PlanError(f"--price {item!r}: the price must be a finite number >= 0")
        out[name] = price
    return out


def plan_capacity(
    profiles: Sequence[str | HardwareProfile],
    sizing: Sizing | LoadPoint,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    *,
    headroom: float = DEFAULT_HEADROOM,
    prices: Mapping[str, float] | None = None,
) -> Plan:
    """Size both pools for ``sizing`` on each profile, rounding each pool up on its own, with ``headroom``.

    Example: ``plan_capacity(["llama3-8b/a100"], LoadPoint(20, 1024, 256), 500, 30).first.prefill``  # 4
    """
    if not profiles:
        raise PlanError("give at least one profile")
    prices = dict(prices or {})
    if isinstance(sizing, LoadPoint):
        sizing = Sizing.steady(sizing)
    resolved = [get_profile(p) if isinstance(p, str) else p for p in profiles]
    unknown = sorted(set(prices) - {p.name for p in resolved})
    if unknown:
        raise PlanError(f"--price given for {unknown}, which are not among the planned profiles")
    out = []
    for profile in resolved:
        model = latency_model_for(profile)
        pre = _need(profile, model, sizing.prefill_load, sizing.name, slo_ttft_ms, slo_itl_ms, headroom)
        dec = (
            pre
            if sizing.decode_load == sizing.prefill_load
            else _need(profile, model, sizing.decode_load, sizing.name, slo_ttft_ms, slo_itl_ms, headroom)
        )
        out.append(ProfilePlan(profile, pre, dec, prices.get(profile.name, math.nan)))
    return Plan(sizing, slo_ttft_ms, slo_itl_ms, headroom, tuple(out))


@dataclass(frozen=True)
class WindowLoads:
    """Per-window loads of a trace (sliding windows starting at whole seconds)."""

    t_start_s: np.ndarray  # float64
    window_s: float
    count: np.ndarray  # requests per window
    prompt_sum: np.ndarray  # prompt tokens per window
    output_sum: np.ndarray  # generated tokens per window

    def load(self, i: int, label: str) -> LoadPoint:
        n = max(float(self.count[i]), 1.0)
        return LoadPoint(
            float(self.count[i]) / self.window_s,
            float(self.prompt_sum[i]) / n,
            float(self.output_sum[i]) / n,
            f"{label} window at t={self.t_start_s[i]:.0f} s",
        )


def _need(
    profile: HardwareProfile,
    model: LatencyModel,
    load: LoadPoint,
    sizing: str,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    headroom: float,
) -> InstancesNeeded:
    try:
        return instances_needed(
            profile, model, load.rate_rps, load.mean_prompt_tokens, load.mean_output_tokens,
            slo_ttft_ms, slo_itl_ms, headroom=headroom,
        )  # fmt: skip
    except CapacityError as exc:
        raise PlanError(f"{sizing} sizing: {exc}") from exc


def window_loads(trace: Trace, window_s: float = DEFAULT_WINDOW_S) -> WindowLoads:
    """Every full ``window_s`` window of ``trace`` (one window, the whole trace, when it is shorter).

    Lengths count as at least one token, as the simulator serves them. O(n + seconds), vectorised.
    """
    if not (math.isfinite(window_s) and window_s >= 1):
        raise PlanError(f"window_s must be a finite number >= 1, got {window_s!r}")
    if len(trace) == 0:
        raise PlanError(f"trace {trace.source or '(in memory)'} has no requests: nothing to size")
    sec = np.floor(trace.arrival_s - trace.arrival_s[0]).astype(np.int64)
    n_sec = int(sec[-1]) + 1
    w = round(window_s)
    prompt = np.maximum(trace.prompt_tokens, 1).astype(np.float64)
    output = np.maximum(trace.output_tokens, 1).astype(np.float64)
    n_win = max(n_sec - w + 1, 1)
    width = min(w, n_sec)

    def sums(weights: np.ndarray | None) -> np.ndarray:
        c = np.concatenate([[0.0], np.cumsum(np.bincount(sec, weights=weights, minlength=n_sec))])
        out: np.ndarray = c[np.arange(n_win) + width] - c[:n_win]
        return out

    return WindowLoads(
        np.arange(n_win, dtype=np.float64), float(width), sums(None), sums(prompt), sums(output)
    )


def trace_sizings(trace: Trace, window_s: float = DEFAULT_WINDOW_S) -> tuple[Sizing, ...]:
    """The peak, p99, p90 window sizings and the whole-trace mean (see the module docstring)."""
    wl = window_loads(trace, window_s)
    out = []
    for name, q in TRACE_LEVELS:
        if q is None:
            dur = max(float(trace.arrival_s[-1] - trace.arrival_s[0]), 1.0)
            mean = LoadPoint(
                len(trace) / dur,
                float(np.maximum(trace.prompt_tokens, 1).mean()),
                float(np.maximum(trace.output_tokens, 1).mean()),
                f"whole trace ({dur:.0f} s)",
            )
            out.append(Sizing.steady(mean, name))
            continue
        out.append(
            Sizing(name, wl.load(_rank(wl.prompt_sum, q), name), wl.load(_rank(wl.output_sum, q), name))
        )
    return tuple(out)


def _rank(values: np.ndarray, q: float) -> int:
    """Index of the window whose value is the ``q`` quantile (nearest rank, the peak at q = 1)."""
    order = np.argsort(values, kind="stable")
    k = min(max(math.ceil(q * len(values)) - 1, 0), len(values) - 1)
    return int(order[k])


# -- checking a plan by replay --------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplayCheck:
    """One fixed-capacity replay of a trace."""

    prefill: int
    decode: int
    slo_attainment: float
    ttft_p90_ms: float
    itl_mean_ms: float  # mean over completed requests of each request's mean ITL
    unfinished: int
    meets: bool  # slo_attainment >= min_attainment
    meets_p90: (
        bool  # P90 TTFT <= TTFT SLO, mean ITL <= ITL SLO, nothing unfinished (what the model sizes for)
    )


@dataclass(frozen=True)
class Verification:
    """The plan's counts replayed, and one fewer instance in each pool (None where that pool has one)."""

    planned: ReplayCheck
    one_fewer_prefill: ReplayCheck | None
    one_fewer_decode: ReplayCheck | None
    min_attainment: float
    notes: tuple[str, ...] = field(default=())

    @property
    def tight(self) -> bool:
        """The plan meets, and each pool minus one does not (a pool of one counts as tight)."""
        fewer = [c for c in (self.one_fewer_prefill, self.one_fewer_decode) if c is not None]
        return self.planned.meets and not any(c.meets for c in fewer)


def replay_check(
    profile: str,
    trace: Trace,
    prefill: int,
    decode: int,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    *,
    min_attainment: float = DEFAULT_MIN_ATTAINMENT,
    drain_limit_s: float = 600.0,
) -> ReplayCheck:
    """Replay ``trace`` on ``prefill`` + ``decode`` fixed instances of ``profile`` and score it."""
    from serving.sim.fleet import single_pool
    from serving.sim.replay import PolicyOptions, make_policy, replay

    fleet = single_pool(
        profile=profile, prefill=prefill, decode=decode, slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms
    )
    policy = make_policy("fixed", PolicyOptions(prefill=prefill, decode=decode))
    report = replay(fleet, {"default": trace}, policy, drain_limit_s=drain_limit_s)
    itl = report.request_itl_ms[np.isfinite(report.request_itl_ms)]
    itl_mean_ms = float(itl.mean()) if len(itl) else math.nan
    ttft_p90_ms = report.ttft_ms["p90"]
    return ReplayCheck(
        prefill,
        decode,
        report.slo_attainment,
        ttft_p90_ms,
        itl_mean_ms,
        report.unfinished,
        bool(report.slo_attainment >= min_attainment),
        bool(ttft_p90_ms <= slo_ttft_ms and not itl_mean_ms > slo_itl_ms and report.unfinished == 0),
    )


def verify_plan(
    plan: ProfilePlan,
    trace: Trace,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    *,
    min_attainment: float = DEFAULT_MIN_ATTAINMENT,
) -> Verification:
    """Replay ``trace`` at the plan's counts and at one instance fewer per pool (the other pool as planned)."""
    name = plan.profile.name

    def check(p: int, d: int) -> ReplayCheck:
        return replay_check(name, trace, p, d, slo_ttft_ms, slo_itl_ms, min_attainment=min_attainment)

    notes = []
    if plan.prefill <= 1:
        notes.append("prefill pool has one instance: one fewer is no pool, not replayed")
    if plan.decode <= 1:
        notes.append("decode pool has one instance: one fewer is no pool, not replayed")
    return Verification(
        planned=check(plan.prefill, plan.decode),
        one_fewer_prefill=check(plan.prefill - 1, plan.decode) if plan.prefill > 1 else None,
        one_fewer_decode=check(plan.prefill, plan.decode - 1) if plan.decode > 1 else None,
        min_attainment=min_attainment,
        notes=tuple(notes),
    )


def poisson_trace(
    rate_rps: float, prompt_tokens: int, output_tokens: int, duration_s: float = 120.0, *, seed: int = 0
) -> Trace:
    """A steady Poisson trace with fixed lengths (what ``--verify`` replays when no trace is given)."""
    if not (math.isfinite(rate_rps) and rate_rps > 0 and math.isfinite(duration_s) and duration_s > 0):
        raise PlanError(
            f"a Poisson trace needs rate_rps > 0 and duration_s > 0, got {rate_rps!r}, {duration_s!r}"
        )
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate_rps * duration_s))
    arrival = np.sort(rng.uniform(0.0, duration_s, n))  # n uniform points = a Poisson process given its count
    if n:
        arrival -= arrival[0]
    return Trace.from_arrays(
        arrival, np.full(n, prompt_tokens), np.full(n, output_tokens), source=f"poisson({rate_rps} req/s)"
    )
