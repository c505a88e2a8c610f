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
  ``static-peak`` does), for the peak window, the p99 and p90 windows, and the whole-trace mean. The peak
  sizing is also at least the trace's burst floor (``serving.sim.capacity.burst_floor``: a burst shorter than
  the window cleared within the TTFT SLO), as ``static-peak`` is, so the two agree on a burst.
- **Checking by replay.** :func:`verify_plan` replays a trace with the ``fixed`` policy at the planned counts
  and at one instance fewer in each pool; "meets" is the simulator's SLO attainment (per request: completed,
  TTFT within the TTFT SLO, mean ITL within the ITL SLO) of at least ``min_attainment``; ``meets_p90`` is
  what the model sizes for (P90 TTFT and mean ITL within the SLOs). Findings (docs/BENCHMARKS.md): decode
  minus one fails in every case tried; prefill minus one still meets for pools of 4+ instances, because the
  per-instance M/D/1 model assumes Poisson arrivals while a router's split is smoother (the model is within
  1-4 % for a single instance).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from serving.pools.local import (
    DEFAULT_DECODE_MIN_SHARE,
    DEFAULT_PREFILL_SHARE,
    MIXED_NODE_DEFAULT_TOTAL,
    mixed_node_share_problems,
)
from serving.sim.capacity import (
    CapacityError,
    InstancesNeeded,
    burst_floor,
    derived_busy_slowdown,
    instances_needed,
)
from serving.sim.fleet import FleetSpec, PoolSpec, single_pool
from serving.sim.hardware import HardwareProfile, get_profile
from serving.sim.interference import mean_slowdown
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
    """The load each pool is sized for: prefill by prompt tokens, decode by generated tokens (may differ).

    ``bursts``: the trace whose bursts shorter than ``window_s`` each pool must also clear
    (``serving.sim.capacity.burst_floor``, as ``static-peak`` sizes); set on the peak sizing of a trace only.
    """

    name: str  # "given", "peak", "p99", "p90", "mean"
    prefill_load: LoadPoint
    decode_load: LoadPoint
    bursts: Trace | None = field(default=None, repr=False, compare=False)
    window_s: float = DEFAULT_WINDOW_S

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
    burst_floor: tuple[int, int] = (0, 0)  # (prefill, decode) the sizing's bursts need (Sizing.bursts)

    @property
    def prefill(self) -> int:
        return max(self.prefill_need.prefill, self.burst_floor[0])

    @property
    def decode(self) -> int:
        return max(self.decode_need.decode, self.burst_floor[1])

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
        return self.single_ceil_total < self.prefill_need.prefill + self.decode_need.decode

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
                "burst_floor": {"prefill": self.burst_floor[0], "decode": self.burst_floor[1]},
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
        burst = (0, 0)
        if sizing.bursts is not None and len(sizing.bursts):
            b = sizing.bursts
            burst = burst_floor(b.arrival_s, b.prompt_tokens, b.output_tokens, pre.prefill_capacity,
                                dec.decode_capacity, slo_ttft_ms, window_s=sizing.window_s)  # fmt: skip
        out.append(ProfilePlan(profile, pre, dec, prices.get(profile.name, math.nan), burst))
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
        peak = trace if q == 1.0 else None  # the peak sizing also clears the trace's bursts
        loads = wl.load(_rank(wl.prompt_sum, q), name), wl.load(_rank(wl.output_sum, q), name)
        out.append(Sizing(name, *loads, bursts=peak, window_s=window_s))
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


# -- placement: dedicated nodes or PD-mixed nodes (issue 8) ---------------------------------------------
PLACEMENTS: tuple[str, ...] = ("dedicated", "mixed-node")
PLACEMENT_MODES: tuple[str, ...] = (*PLACEMENTS, "compare")
DEFAULT_PREFILL_MEM_FRAC = DEFAULT_PREFILL_SHARE  # the seed's split, as the launcher and manifests use it
DEFAULT_MIXED_NODE_TOTAL = MIXED_NODE_DEFAULT_TOTAL  # decode's default share is this minus prefill's
# None: derived from the latency model's operator timings (serving/sim/interference.py), as the simulator does
DEFAULT_MIXED_NODE_SLOWDOWN: float | None = PoolSpec.mixed_node_slowdown


@dataclass(frozen=True)
class NodePartition:
    """How a PD-mixed node's GPU memory is split: each instance is vLLM with its own
    ``--gpu-memory-utilization`` (its own copy of the weights and activation reserve, so the two KV caches
    add up to less than one dedicated instance's), and decode steps ``slowdown`` x slower while the node's
    prefill instance works (None: derived from the operator timings, ``serving.sim.interference``). The shares follow the launcher's rules (``mixed_node_share_problems``: at most
    0.95 together, decode at least ``decode_min_mem_frac``)."""

    prefill_mem_frac: float = DEFAULT_PREFILL_MEM_FRAC
    decode_mem_frac: float = DEFAULT_MIXED_NODE_TOTAL - DEFAULT_PREFILL_MEM_FRAC
    slowdown: float | None = DEFAULT_MIXED_NODE_SLOWDOWN
    decode_min_mem_frac: float = DEFAULT_DECODE_MIN_SHARE

    def __post_init__(self) -> None:
        problems = mixed_node_share_problems(
            self.prefill_mem_frac,
            self.decode_mem_frac,
            self.decode_min_mem_frac,
            names=("--prefill-mem-frac", "--decode-mem-frac", "--decode-min-mem-frac"),
        )
        if self.slowdown is not None and not (math.isfinite(self.slowdown) and self.slowdown >= 1.0):
            problems.append(f"--mixed-node-slowdown: must be >= 1, got {self.slowdown}")
        if problems:
            raise PlanError("; ".join(problems))

    def profiles(self, profile: HardwareProfile) -> tuple[HardwareProfile, HardwareProfile]:
        """(prefill, decode) instance profiles: ``profile`` at each instance's memory share."""
        out = []
        for role, frac in (("prefill", self.prefill_mem_frac), ("decode", self.decode_mem_frac)):
            if profile.kv_cache_gib is not None:  # a fixed KV pool (vLLM on CPU): the share is of that pool
                over: dict[str, float] = {"kv_cache_gib": profile.kv_cache_gib * frac}
            else:
                over = {"gpu_memory_utilization": frac}
            try:
                out.append(profile.with_overrides(**over))
            except ValueError as exc:
                flag = f"--{role}-mem-frac"
                raise PlanError(f"{flag} {frac:g}: the {role} instance of {profile.name} {exc}") from exc
        return out[0], out[1]


@dataclass(frozen=True)
class MixedNodePlan:
    """Nodes each hosting one prefill and one decode instance, sized by the same capacity model on the
    partitioned profiles. Decode is sized for ``slo_itl_ms / effective_slowdown``: its steps run ``slowdown``
    times slower while the node's prefill instance works, which it does ``prefill_busy`` of the time at the
    planned load (the M/D/1 utilisation spread over the nodes), so the mean step stretches by
    ``1 + (slowdown - 1) x prefill_busy``. The replay measures the real effect."""

    profile: HardwareProfile
    partition: NodePartition
    prefill_need: InstancesNeeded
    decode_need: InstancesNeeded
    nodes: int
    prefill_busy: float  # fraction of time a node's prefill instance works at the planned load
    busy_slowdown: float  # decode step stretch while the prefill works: the partition's, or derived

    @property
    def prefill(self) -> int:
        return self.prefill_need.prefill

    @property
    def decode(self) -> int:
        return self.decode_need.decode

    @property
    def effective_slowdown(self) -> float:
        return mean_slowdown(self.busy_slowdown, self.prefill_busy)

    @property
    def gpus(self) -> int:
        return self.nodes * self.profile.gpus

    def kv_tokens(self) -> tuple[int, int]:
        """KV tokens of the node's (prefill, decode) instance."""
        pre, dec = self.partition.profiles(self.profile)
        return pre.kv_capacity_tokens, dec.kv_capacity_tokens

    def to_json(self) -> dict[str, object]:
        kv_pre, kv_dec = self.kv_tokens()
        return _clean(
            {
                "placement": "mixed-node",
                "profile": self.profile.name,
                "nodes": self.nodes,
                "gpus": self.gpus,
                "prefill_needed": self.prefill,
                "decode_needed": self.decode,
                "prefill_mem_frac": self.partition.prefill_mem_frac,
                "decode_mem_frac": self.partition.decode_mem_frac,
                "mixed_node_slowdown": self.busy_slowdown,
                "mixed_node_slowdown_derived": self.partition.slowdown is None,
                "prefill_busy": self.prefill_busy,
                "effective_slowdown": self.effective_slowdown,
                "prefill_kv_tokens": kv_pre,
                "decode_kv_tokens": kv_dec,
                "dedicated_kv_tokens": self.profile.kv_capacity_tokens,
                "decode_max_batch": self.decode_need.decode_capacity.max_batch,
                "decode_limited_by": self.decode_need.decode_capacity.limited_by,
            }
        )


MAX_MIXED_NODES = 4096


def plan_mixed_node(
    profile: str | HardwareProfile,
    sizing: Sizing | LoadPoint,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    *,
    headroom: float = DEFAULT_HEADROOM,
    partition: NodePartition | None = None,
) -> MixedNodePlan:
    """Size PD-mixed nodes for ``sizing``: the fewest nodes N whose prefill instances carry the prompt load
    and whose decode instances, slowed by their prefill neighbours' busy share at N nodes, carry the
    generation load (more nodes spread the prefill work thinner, so N is found by counting up). Example::

    plan_mixed_node("llama3-8b/a100", LoadPoint(20, 1024, 256), 500, 30).nodes
    """
    base = get_profile(profile) if isinstance(profile, str) else profile
    part = partition or NodePartition()
    if isinstance(sizing, LoadPoint):
        sizing = Sizing.steady(sizing)
    pre_profile, dec_profile = part.profiles(base)
    model = latency_model_for(base)
    pre = _need(pre_profile, model, sizing.prefill_load, sizing.name, slo_ttft_ms, slo_itl_ms, headroom)
    cap = pre.prefill_capacity
    busy_total = (
        pre.prefill_load_tps / cap.tokens_per_s * cap.utilisation if pre.prefill_load_tps > 0 else 0.0
    )
    slowdown = part.slowdown
    # derived at the operating point: a full decode batch beside a packed prefill iteration
    if slowdown is None:
        dl = sizing.decode_load
        slowdown = derived_busy_slowdown(
            dec_profile,
            model,
            slo_itl_ms,
            dl.mean_prompt_tokens + dl.mean_output_tokens / 2.0,
            cap.prompts_per_iteration,
            sizing.prefill_load.mean_prompt_tokens,
        )
    last: PlanError | None = None
    for nodes in range(max(pre.prefill, 1), MAX_MIXED_NODES + 1):
        busy = min(busy_total / nodes, 1.0)
        eff = mean_slowdown(slowdown, busy)
        try:
            dec = _need(
                dec_profile, model, sizing.decode_load, sizing.name, slo_ttft_ms, slo_itl_ms / eff, headroom
            )
        except PlanError as exc:
            last = exc
            continue
        if dec.decode <= nodes:
            return MixedNodePlan(base, part, pre, dec, nodes, busy, slowdown)
    reason = f": {last}" if last is not None else ""
    raise PlanError(
        f"mixed-node: no node count up to {MAX_MIXED_NODES} meets the ITL SLO with decode steps slowed "
        f"x{slowdown:.3g} while the node's prefill works{reason}"
    )


@dataclass(frozen=True)
class PlacementCheck:
    """One placement's planned capacity replayed with the ``fixed`` policy."""

    placement: str
    prefill: int
    decode: int
    nodes: int
    gpus: int
    slo_attainment: float
    gpu_seconds: float
    ttft_p90_ms: float
    itl_mean_ms: float
    unfinished: int
    meets: bool  # slo_attainment >= min_attainment

    def to_json(self) -> dict[str, object]:
        return _clean(dict(vars(self)))


@dataclass(frozen=True)
class PlacementComparison:
    """Both placements replayed on the same trace, and which one wins and why (:func:`choose_placement`)."""

    dedicated: PlacementCheck
    mixed_node: PlacementCheck
    winner: str
    reason: str
    min_attainment: float
    planned_nodes: int  # the capacity model's mixed-node count (mixed_node.nodes may be more: searched)
    mixed_node_tried: tuple[tuple[int, float], ...] = ()  # (nodes, attainment) of every mixed-node replay

    def to_json(self) -> dict[str, object]:
        return {
            "winner": self.winner,
            "reason": self.reason,
            "min_attainment": self.min_attainment,
            "dedicated": self.dedicated.to_json(),
            "mixed-node": self.mixed_node.to_json(),
            "mixed_node_planned_nodes": self.planned_nodes,
            "mixed_node_tried": [{"nodes": n, "slo_attainment": a} for n, a in self.mixed_node_tried],
        }


def choose_placement(
    dedicated: PlacementCheck, mixed: PlacementCheck, min_attainment: float
) -> tuple[str, str]:
    """(winner, reason). Only a placement that meets the SLO (attainment >= ``min_attainment``) can win on
    GPUs: if both meet, fewer GPUs wins (then higher attainment, then dedicated, which has no interference
    to go wrong); if one meets, it wins; if neither does, the higher attainment wins and the reason says so."""

    def att(c: PlacementCheck) -> str:
        return f"attainment {c.slo_attainment:.4f}"

    d, m = dedicated, mixed
    if d.meets and m.meets:
        if m.gpus != d.gpus:
            win, lose = (m, d) if m.gpus < d.gpus else (d, m)
            return win.placement, (
                f"both meet the SLO (>= {min_attainment:g}); {win.placement} needs {win.gpus} GPUs against "
                f"{lose.gpus} for {lose.placement} ({att(win)} vs {att(lose)})"
            )
        if m.slo_attainment > d.slo_attainment:
            return (
                m.placement,
                f"both meet with {d.gpus} GPUs; mixed-node has the higher {att(m)} vs {att(d)}",
            )
        return d.placement, (
            f"both meet with {d.gpus} GPUs and mixed-node is no better ({att(m)} vs {att(d)}): dedicated "
            "nodes avoid the co-location interference"
        )
    if d.meets != m.meets:
        win, lose = (d, m) if d.meets else (m, d)
        return win.placement, (
            f"only {win.placement} meets the SLO (>= {min_attainment:g}): {att(win)} with {win.gpus} GPUs; "
            f"{lose.placement} reaches {att(lose)} with {lose.gpus} GPUs"
        )
    win, lose = (m, d) if m.slo_attainment > d.slo_attainment else (d, m)
    return win.placement, (
        f"neither meets the SLO (>= {min_attainment:g}); {win.placement} comes closer: {att(win)} with "
        f"{win.gpus} GPUs vs {att(lose)} with {lose.gpus} GPUs for {lose.placement}"
    )


def placement_fleet(
    placement: str,
    profile: str | HardwareProfile,
    prefill: int,
    decode: int,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    *,
    partition: NodePartition | None = None,
) -> tuple[FleetSpec, HardwareProfile]:
    """The one-pool fleet (pool ``default``) and the hardware profile the simulator should run ``placement``
    with. Mixed-node: the simulator splits one KV pool by ``prefill_mem_frac``; the pool is set to the sum
    of the two instances' KV caches under vLLM's memory accounting and the fraction to prefill's part, so each
    instance gets exactly its own KV tokens (up to block rounding)."""

    if placement not in PLACEMENTS:
        raise PlanError(f"--placement {placement!r}: expected one of {PLACEMENTS}")
    base = get_profile(profile) if isinstance(profile, str) else profile
    fleet = single_pool(
        profile=base.name, prefill=prefill, decode=decode, slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms
    )
    if placement == "dedicated":
        return fleet, base
    part = partition or NodePartition()
    pre_p, dec_p = part.profiles(base)
    kv_pre, kv_dec = pre_p.kv_pool_bytes_per_gpu, dec_p.kv_pool_bytes_per_gpu
    pool = dataclasses.replace(
        fleet.pools[0],
        placement="mixed-node",
        prefill_mem_frac=kv_pre / (kv_pre + kv_dec),
        mixed_node_slowdown=part.slowdown,
    )
    return dataclasses.replace(fleet, pools=(pool,)), base.with_overrides(
        kv_cache_gib=(kv_pre + kv_dec) / (1 << 30)
    )


def replay_placement(
    placement: str,
    profile: str | HardwareProfile,
    trace: Trace,
    prefill: int,
    decode: int,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    *,
    partition: NodePartition | None = None,
    min_attainment: float = DEFAULT_MIN_ATTAINMENT,
    drain_limit_s: float = 600.0,
) -> PlacementCheck:
    """Replay ``trace`` on fixed capacity in ``placement`` (mixed-node: ``max(prefill, decode)`` nodes, see
    :func:`placement_fleet`) with the ``fixed`` policy, and score it."""
    from serving.sim.replay import PolicyOptions, make_policy, replay

    base = get_profile(profile) if isinstance(profile, str) else profile
    fleet, sim_profile = placement_fleet(
        placement, base, prefill, decode, slo_ttft_ms, slo_itl_ms, partition=partition
    )
    nodes = max(prefill, decode) if placement == "mixed-node" else prefill + decode
    latency = latency_model_for(base)

    def models(name: str) -> tuple[HardwareProfile, LatencyModel]:
        if name != base.name:
            raise PlanError(f"replay asked for profile {name!r}, planned {base.name!r}")
        return sim_profile, latency

    policy = make_policy("fixed", PolicyOptions(prefill=prefill, decode=decode))
    report = replay(fleet, {"default": trace}, policy, drain_limit_s=drain_limit_s, models=models)
    itl = report.request_itl_ms[np.isfinite(report.request_itl_ms)]
    return PlacementCheck(
        placement=placement,
        prefill=prefill,
        decode=decode,
        nodes=nodes,
        gpus=nodes * base.gpus,
        slo_attainment=report.slo_attainment,
        gpu_seconds=report.gpu_seconds,
        ttft_p90_ms=report.ttft_ms["p90"],
        itl_mean_ms=float(itl.mean()) if len(itl) else math.nan,
        unfinished=report.unfinished,
        meets=bool(report.slo_attainment >= min_attainment),
    )


def compare_placements(
    dedicated: ProfilePlan,
    mixed: MixedNodePlan,
    trace: Trace,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    *,
    min_attainment: float = DEFAULT_MIN_ATTAINMENT,
    search: bool = True,
) -> PlacementComparison:
    """Replay the dedicated plan (P + D nodes) and the mixed-node plan (N nodes of one prefill + one decode)
    on ``trace`` with the ``fixed`` policy, and choose (:func:`choose_placement`).

    With ``search``, when the mixed-node plan misses the SLO, one node more is replayed at a time while
    mixed-node would use no more GPUs than dedicated: the interference model is an assumption, so the
    measured node count, not the planned one, is what competes.
    """
    d = replay_placement(
        "dedicated", dedicated.profile, trace, dedicated.prefill, dedicated.decode, slo_ttft_ms, slo_itl_ms,
        min_attainment=min_attainment,
    )  # fmt: skip

    def mixed_at(nodes: int) -> PlacementCheck:
        return replay_placement(
            "mixed-node", mixed.profile, trace, nodes, nodes, slo_ttft_ms, slo_itl_ms,
            partition=mixed.partition, min_attainment=min_attainment,
        )  # fmt: skip

    m = mixed_at(mixed.nodes)
    tried = [(m.nodes, m.slo_attainment)]
    while search and not m.meets and (m.nodes + 1) * mixed.profile.gpus <= d.gpus:
        m = mixed_at(m.nodes + 1)
        tried.append((m.nodes, m.slo_attainment))
    winner, reason = choose_placement(d, m, min_attainment)
    if m.nodes != mixed.nodes:
        reason += (
            f" (the capacity model planned {mixed.nodes} mixed nodes; replays tried {mixed.nodes}..{m.nodes})"
        )
    return PlacementComparison(d, m, winner, reason, min_attainment, mixed.nodes, tuple(tried))
