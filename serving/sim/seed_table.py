"""The seed article's P99 table, re-run on the simulator: colocated FCFS versus P/D disaggregation.

The article (``../shared/seeds/000_*``, claims only) reports P99 latency at ``batch_size=24`` for a 7B-class
model: colocated 158 / 423 / timeout ms and P/D ("Block optimised") 76 / 98 / 153 ms at QPS 20 / 24 / 30.
It says neither which latency, nor the cluster, nor the lengths. What this module fixes, and why:

- **Which latency.** The headline is **TTFT** (arrival to first token). At QPS 20 a 7–8B model on an A100
  cannot answer a chat request end to end in 76 ms (a 100-token answer alone takes > 1 s of decode
  steps), and a 76 ms *per-token* latency would be five times an A100's decode step at batch 24 (~15 ms);
  a prefill of a few hundred to a thousand tokens plus queueing is 50–200 ms. The article's own story
  (decoding holds the GPU and blocks later prefills, so the tail latency users see soars) is also a TTFT
  story. Per-request mean inter-token latency (ITL) and end-to-end (E2E) latency are reported beside it.
- **Workload.** Poisson arrivals at each QPS for ``duration_s``, with *common random numbers*: one
  unit-rate exponential gap sequence divided by the QPS, so a higher QPS replays the same requests (same
  lengths, same order) compressed in time; differences between QPS points come from the rate, not from
  sampling noise. Prompt/output lengths are resampled (seeded) from the bundled Azure 2023 conversation
  trace (mean 1,254 / 205 tokens, max 14,050 / 1,000) or fixed with ``fixed_lengths(isl, osl)``.
- **Cluster.** ``gpus`` single-GPU instances either way: ``gpus`` colocated (``mixed``) instances, routed
  least-loaded, scheduled FCFS inside each (vLLM's chunked prefill); versus ``prefill + decode = gpus``
  with the ``context-aware`` router. ``prefill=None`` sweeps every split and keeps one for all QPS points
  (a fixed cluster): the split failing at the fewest points, then with the lowest worst-case headline P99
  (tie-breakers in :func:`choose_split`).
  A point *fails* when any of its P99s is a timeout or its ITL P99 exceeds ``itl_bound_ms``: choosing by
  TTFT alone would reward starving decode, whose queue TTFT does not see (the first token is reported
  when the KV lands on the decode instance).
- **Batch size 24** is vLLM's ``max_num_seqs`` (``HardwareProfile.with_overrides(max_num_seqs=24)``) on every
  instance: a decode or mixed instance runs at most 24 sequences at once.
- **Timeout.** A request that has not completed ``drain_s`` after the last arrival counts as infinitely
  late; a P99 (or P50) above ``timeout_ms`` (default 30 s, a common client timeout) is reported as
  ``timeout``. So "timeout" means: more than 1 % of requests waited over 30 s or never finished.

Everything is seeded and deterministic (the simulator itself has no randomness).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from serving.sim.engine import Simulator
from serving.sim.fleet import FleetSpec, PoolSpec, RoleCounts
from serving.sim.hardware import get_profile
from serving.sim.instance import LatencyLike, ProfileLike
from serving.sim.latency import latency_model_for
from serving.sim.report import request_latencies_ms
from serving.workload.trace import Trace

METRICS: tuple[str, ...] = ("ttft", "itl", "e2e")
SETUPS: tuple[str, ...] = ("colocated", "pd")


@dataclass(frozen=True)
class ArticleClaim:
    """One column of the seed article's table (P99 ms at ``batch_size=24``); None = "timeout"."""

    qps: float
    colocated_p99_ms: float | None
    pd_p99_ms: float | None


# The article's "traditional" and "Block* optimised" rows.
ARTICLE_CLAIMS: tuple[ArticleClaim, ...] = (
    ArticleClaim(20.0, 158.0, 76.0),
    ArticleClaim(24.0, 423.0, 98.0),
    ArticleClaim(30.0, None, 153.0),
)


@dataclass(frozen=True)
class SeedTableConfig:
    """What one seed-table run simulates; defaults are the documented reproduction (module doc)."""

    profile: str = "llama3-8b/a100"
    max_num_seqs: int = 24  # the article's batch_size
    qps: tuple[float, ...] = (20.0, 24.0, 30.0)
    gpus: int = 6  # single-GPU instances in each setup
    prefill: int | None = None  # P/D prefill instances (decode = gpus - prefill); None = sweep, keep the best
    duration_s: float = 300.0  # arrivals span; ~6,000-9,000 requests, so ~60-90 lie above each P99
    drain_s: float = 60.0  # simulated after the last arrival; what is still running then never finished
    timeout_ms: float = 30_000.0  # a percentile above this reads "timeout"
    itl_bound_ms: float = 50.0  # split selection: decode "keeps up" when mean-ITL P99 <= this (the ITL SLO)
    pd_router: str = "context-aware"
    colocated_router: str = "least-loaded"
    long_context_prefill: int = 0  # prefill instances the context-aware router marks long-context
    high_memory_decode: int = 0  # decode instances it marks high-memory
    headline: str = "ttft"  # the metric the ratios and the split choice use
    seed: int = 0

    def problems(self) -> list[str]:
        """One message per broken rule, naming the field; empty when valid."""
        out: list[str] = []
        if self.max_num_seqs < 1:
            out.append(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if not self.qps:
            out.append("qps: give at least one rate")
        for q in self.qps:
            if not (math.isfinite(q) and q > 0):
                out.append(f"qps: every rate must be a finite number > 0, got {q}")
        if self.gpus < 2:
            out.append(f"gpus must be >= 2 (a P/D split needs one prefill and one decode), got {self.gpus}")
        if self.prefill is not None and not 1 <= self.prefill <= self.gpus - 1:
            out.append(f"prefill must lie in [1, gpus - 1 = {self.gpus - 1}], got {self.prefill}")
        for name in ("duration_s", "timeout_ms", "itl_bound_ms"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                out.append(f"{name} must be a finite number > 0, got {v}")
        if not (math.isfinite(self.drain_s) and self.drain_s >= 0):
            out.append(f"drain_s must be a finite number >= 0, got {self.drain_s}")
        if self.long_context_prefill < 0 or self.high_memory_decode < 0:
            out.append(
                "long_context_prefill and high_memory_decode must be >= 0, got "
                f"{self.long_context_prefill}, {self.high_memory_decode}"
            )
        if self.headline not in METRICS:
            out.append(f"headline must be one of {METRICS}, got {self.headline!r}")
        return out

    def splits(self) -> tuple[int, ...]:
        """Prefill counts to try: the one given, else every split."""
        return (self.prefill,) if self.prefill is not None else tuple(range(1, self.gpus))


@dataclass(frozen=True, eq=False)
class Lengths:
    """Where request lengths come from: an empirical pool resampled with replacement, or one fixed pair."""

    prompt_tokens: np.ndarray  # int64 [K]
    output_tokens: np.ndarray  # int64 [K]
    description: str

    def __post_init__(self) -> None:
        if len(self.prompt_tokens) == 0 or len(self.prompt_tokens) != len(self.output_tokens):
            raise ValueError(
                f"Lengths({self.description}): need equal, non-empty prompt and output arrays, got "
                f"{len(self.prompt_tokens)} and {len(self.output_tokens)}"
            )

    def summary(self) -> dict[str, Any]:
        return {
            "source": self.description,
            "prompt_mean_tokens": float(np.mean(self.prompt_tokens)),
            "output_mean_tokens": float(np.mean(self.output_tokens)),
            "prompt_max_tokens": int(np.max(self.prompt_tokens)),
            "output_max_tokens": int(np.max(self.output_tokens)),
        }


def fixed_lengths(prompt_tokens: int, output_tokens: int) -> Lengths:
    """Every request has ``prompt_tokens`` in and ``output_tokens`` out (fixed ISL/OSL)."""
    if prompt_tokens < 1 or output_tokens < 1:
        raise ValueError(f"fixed lengths must be >= 1 token, got isl={prompt_tokens}, osl={output_tokens}")
    return Lengths(
        np.array([prompt_tokens], dtype=np.int64),
        np.array([output_tokens], dtype=np.int64),
        f"fixed isl={prompt_tokens} osl={output_tokens}",
    )


def trace_lengths(path: Path) -> Lengths:
    """The empirical (prompt, output) pairs of a trace file, resampled together (their correlation kept)."""
    from serving.workload.readers import read_trace

    trace = read_trace(path)
    keep = ~trace.failed
    if not keep.any():
        raise ValueError(f"{path}: no completed request to take lengths from")
    return Lengths(
        np.maximum(trace.prompt_tokens[keep], 1),
        np.maximum(trace.output_tokens[keep], 1),
        f"resampled from {path}",
    )


def poisson_trace(qps: float, duration_s: float, lengths: Lengths, seed: int) -> Trace:
    """Poisson arrivals at ``qps`` over ``[0, duration_s)``, first arrival at 0; lengths resampled.

    Common random numbers: the unit-rate gaps and the length draws depend on ``seed`` only, so for one seed
    a higher ``qps`` is the same request sequence compressed in time (a prefix of it at the lower rate).
    """
    rng = np.random.default_rng(seed)
    n_max = int(qps * duration_s + 10.0 * math.sqrt(qps * duration_s) + 10)
    unit_gaps = rng.exponential(1.0, n_max)
    picks = rng.integers(0, len(lengths.prompt_tokens), n_max)
    arrival = np.concatenate([[0.0], np.cumsum(unit_gaps[1:])]) / qps
    n = int(np.searchsorted(arrival, duration_s, side="left"))
    if n == n_max:  # ~10 sigma of Poisson slack: never in practice; fail loudly rather than truncate
        raise RuntimeError(f"poisson_trace: drew too few arrivals for qps={qps}, duration_s={duration_s}")
    pick = picks[:n]
    return Trace.from_arrays(
        arrival[:n],
        lengths.prompt_tokens[pick],
        lengths.output_tokens[pick],
        source=f"poisson {qps:g} rps for {duration_s:g} s, seed {seed}; lengths {lengths.description}",
        format="synthetic",
    )


@dataclass(frozen=True)
class Quantile:
    """One latency percentile in ms; ``timeout`` when it exceeds the run's ``timeout_ms`` (then ``ms`` = inf)."""

    ms: float

    @property
    def timeout(self) -> bool:
        return math.isinf(self.ms)

    def to_json(self) -> float | str | None:
        if self.timeout:
            return "timeout"
        return None if math.isnan(self.ms) else round(self.ms, 3)


# Stands for "never finished" inside np.percentile (inf would make the interpolation nan).
_NEVER_MS = 1e15


def tail(values_ms: np.ndarray, q: float, timeout_ms: float) -> Quantile:
    """Percentile ``q`` (0-100) of per-request latencies; inf entries (unfinished) count as infinitely late.

    NaN entries are requests the metric does not apply to (a one-token answer has no ITL) and are skipped.
    Above ``timeout_ms`` the result is a timeout; with no applicable request it is NaN (unknown).
    """
    v = values_ms[~np.isnan(values_ms)]
    if len(v) == 0:
        return Quantile(math.nan)
    x = float(np.percentile(np.where(np.isinf(v), _NEVER_MS, v), q))
    return Quantile(math.inf if x > timeout_ms else x)


@dataclass(frozen=True)
class MetricTail:
    p50: Quantile
    p99: Quantile

    def to_json(self) -> dict[str, Any]:
        return {"p50_ms": self.p50.to_json(), "p99_ms": self.p99.to_json()}


@dataclass(frozen=True)
class SetupResult:
    """One setup (colocated or P/D) at one QPS."""

    setup: str  # "colocated" | "pd"
    qps: float
    prefill: int
    decode: int
    mixed: int
    requests: int
    completed: int
    metrics: dict[str, MetricTail]  # "ttft", "itl", "e2e"
    wall_s: float

    def failed(self, itl_bound_ms: float) -> bool:
        """A timeout in any metric, or decode not keeping up (ITL P99 above ``itl_bound_ms``)."""
        if any(m.p99.timeout for m in self.metrics.values()):
            return True
        itl = self.metrics["itl"].p99.ms
        return not math.isnan(itl) and itl > itl_bound_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "instances": {"prefill": self.prefill, "decode": self.decode, "mixed": self.mixed},
            "requests": self.requests,
            "completed": self.completed,
            "unfinished": self.requests - self.completed,
            **{f"{k}": m.to_json() for k, m in self.metrics.items()},
            "wall_s": round(self.wall_s, 3),
        }


@dataclass(frozen=True)
class Ratio:
    """colocated P99 / P/D P99 (how many times lower P/D is). ``kind``: exact, at_least, at_most, unknown."""

    value: float
    kind: str

    def text(self) -> str:
        if self.kind == "unknown":
            return "unknown"
        prefix = {"exact": "", "at_least": "> ", "at_most": "< "}[self.kind]
        return f"{prefix}{self.value:.2f}x"

    def to_json(self) -> dict[str, Any]:
        return {"value": None if math.isnan(self.value) else round(self.value, 4), "kind": self.kind}


def ratio(colocated: Quantile, pd: Quantile, timeout_ms: float) -> Ratio:
    """colocated / P/D; a timeout stands for "above ``timeout_ms``", so the ratio becomes a bound."""
    c, p = colocated.ms, pd.ms
    if math.isnan(c) or math.isnan(p) or (colocated.timeout and pd.timeout) or p <= 0:
        return Ratio(math.nan, "unknown")
    if colocated.timeout:
        return Ratio(timeout_ms / p, "at_least")
    if pd.timeout:
        return Ratio(c / timeout_ms, "at_most")
    return Ratio(c / p, "exact")


def claim_ratio(claim: ArticleClaim, timeout_ms: float) -> Ratio:
    def q(ms: float | None) -> Quantile:
        return Quantile(math.inf if ms is None else ms)

    return ratio(q(claim.colocated_p99_ms), q(claim.pd_p99_ms), timeout_ms)


@dataclass(frozen=True)
class SeedRow:
    qps: float
    colocated: SetupResult
    pd: SetupResult
    ratio: Ratio  # of the headline P99
    claim: ArticleClaim | None

    def to_json(self, timeout_ms: float) -> dict[str, Any]:
        claim: dict[str, Any] | None = None
        if self.claim is not None:
            claim = {
                "colocated_p99_ms": _claim_json(self.claim.colocated_p99_ms),
                "pd_p99_ms": _claim_json(self.claim.pd_p99_ms),
                "ratio": claim_ratio(self.claim, timeout_ms).to_json(),
            }
        return {
            "qps": self.qps,
            "colocated": self.colocated.to_json(),
            "pd": self.pd.to_json(),
            "ratio": self.ratio.to_json(),
            "article_claim": claim,
        }


@dataclass(frozen=True)
class SeedTable:
    config: SeedTableConfig
    lengths: dict[str, Any]
    rows: tuple[SeedRow, ...]
    chosen_prefill: int
    sweep: dict[int, tuple[SetupResult, ...]] = field(repr=False)  # prefill -> one result per QPS
    wall_s: float = math.nan

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "config": {
                "profile": c.profile,
                "max_num_seqs": c.max_num_seqs,
                "gpus": c.gpus,
                "duration_s": c.duration_s,
                "drain_s": c.drain_s,
                "timeout_ms": c.timeout_ms,
                "itl_bound_ms": c.itl_bound_ms,
                "pd_router": c.pd_router,
                "colocated_router": c.colocated_router,
                "long_context_prefill": c.long_context_prefill,
                "high_memory_decode": c.high_memory_decode,
                "headline": c.headline,
                "seed": c.seed,
                "qps": list(c.qps),
                "prefill_requested": c.prefill,
            },
            "lengths": self.lengths,
            "chosen_split": {"prefill": self.chosen_prefill, "decode": c.gpus - self.chosen_prefill},
            "rows": [r.to_json(c.timeout_ms) for r in self.rows],
            "split_sweep": {
                str(p): {f"{r.qps:g}": r.to_json() for r in results} for p, results in self.sweep.items()
            },
            "wall_s": round(self.wall_s, 3),
        }


def _pool(config: SeedTableConfig, prefill: int, decode: int, mixed: int) -> FleetSpec:
    none = RoleCounts(initial=0, max=0)

    def counts(n: int) -> RoleCounts:
        return RoleCounts(initial=n, min=n, max=n) if n else none

    pool = PoolSpec(
        profile=config.profile,
        router=config.colocated_router if mixed else config.pd_router,
        prefill=counts(prefill),
        decode=counts(decode),
        mixed=counts(mixed),
        long_context_prefill=min(config.long_context_prefill, prefill),
        high_memory_decode=min(config.high_memory_decode, decode),
    )
    return FleetSpec(pools=(pool,), gpu_budget=max(prefill + decode + mixed, 1) * 8)


def _models(config: SeedTableConfig) -> Callable[[str], tuple[ProfileLike, LatencyLike]]:
    profile = get_profile(config.profile).with_overrides(max_num_seqs=config.max_num_seqs)
    latency = latency_model_for(profile)

    def resolve(name: str) -> tuple[ProfileLike, LatencyLike]:
        if name != config.profile:
            raise ValueError(f"seed table: unexpected profile {name!r} (configured {config.profile!r})")
        return profile, latency

    return resolve


def run_setup(
    config: SeedTableConfig,
    trace: Trace,
    *,
    prefill: int = 0,
    decode: int = 0,
    mixed: int = 0,
    qps: float = math.nan,
    models: Callable[[str], tuple[ProfileLike, LatencyLike]] | None = None,
) -> SetupResult:
    """Simulate ``trace`` on a fixed set of warm instances; tails of TTFT, mean ITL and E2E in ms."""
    wall0 = time.perf_counter()
    fleet = _pool(config, prefill, decode, mixed)
    sim = Simulator(fleet, {"default": trace}, models=models or _models(config))
    end_s = float(trace.arrival_s[-1]) if len(trace) else 0.0
    sim.run_to_completion(end_s + config.drain_s, step_s=10.0)
    req = sim.req
    ttft, itl, e2e = request_latencies_ms(req.arrival_s, req.t_first_s, req.t_done_s, req.target_arr)
    done = req.completions > 0
    # An unfinished request is infinitely late for every metric (its ITL included: it is still waiting).
    ttft = np.where(np.isnan(ttft), np.inf, ttft)
    e2e = np.where(done, e2e, np.inf)
    itl = np.where(done, itl, np.inf)  # done one-token answers keep NaN: no ITL, skipped
    metrics = {
        name: MetricTail(tail(v, 50, config.timeout_ms), tail(v, 99, config.timeout_ms))
        for name, v in (("ttft", ttft), ("itl", itl), ("e2e", e2e))
    }
    return SetupResult(
        setup="colocated" if mixed else "pd",
        qps=qps,
        prefill=prefill,
        decode=decode,
        mixed=mixed,
        requests=req.n,
        completed=int(done.sum()),
        metrics=metrics,
        wall_s=time.perf_counter() - wall0,
    )


def choose_split(sweep: Mapping[int, Sequence[SetupResult]], headline: str, itl_bound_ms: float) -> int:
    """The prefill count failing at the fewest QPS points (see :meth:`SetupResult.failed`); then with the
    fewest headline timeouts; then the fewest timeouts in any metric; then the lowest worst-case finite
    headline P99; then the fewest prefill instances. An unknown (NaN) P99 counts as a timeout."""

    def key(p: int) -> tuple[int, int, int, float, int]:
        results = sweep[p]
        fails = sum(r.failed(itl_bound_ms) for r in results)
        p99s = [r.metrics[headline].p99.ms for r in results]
        lost = sum(not math.isfinite(x) for x in p99s)
        lost_any = sum(not math.isfinite(m.p99.ms) for r in results for m in r.metrics.values())
        worst = max((x for x in p99s if math.isfinite(x)), default=math.inf)
        return fails, lost, lost_any, worst, p

    return min(sweep, key=key)


def seed_table(
    config: SeedTableConfig,
    lengths: Lengths,
    *,
    progress: Callable[[str], None] | None = None,
) -> SeedTable:
    """Run both setups at every QPS (sweeping the P/D split unless ``config.prefill`` is set)."""
    problems = config.problems()
    if problems:
        raise ValueError("invalid seed-table config:\n  " + "\n  ".join(problems))
    wall0 = time.perf_counter()
    models = _models(config)
    traces = {q: poisson_trace(q, config.duration_s, lengths, config.seed) for q in config.qps}
    colocated: list[SetupResult] = []
    sweep: dict[int, list[SetupResult]] = {p: [] for p in config.splits()}
    for q in config.qps:
        if progress is not None:
            progress(f"QPS {q:g}: colocated x{config.gpus}, P/D splits {list(sweep)}")
        colocated.append(run_setup(config, traces[q], mixed=config.gpus, qps=q, models=models))
        for p in sweep:
            sweep[p].append(
                run_setup(config, traces[q], prefill=p, decode=config.gpus - p, qps=q, models=models)
            )
    frozen = {p: tuple(v) for p, v in sweep.items()}
    chosen = choose_split(frozen, config.headline, config.itl_bound_ms)
    claims = {c.qps: c for c in ARTICLE_CLAIMS}
    rows = tuple(
        SeedRow(
            qps=q,
            colocated=col,
            pd=pd,
            ratio=ratio(col.metrics[config.headline].p99, pd.metrics[config.headline].p99, config.timeout_ms),
            claim=claims.get(q),
        )
        for q, col, pd in zip(config.qps, colocated, frozen[chosen], strict=True)
    )
    return SeedTable(
        config=config,
        lengths=lengths.summary(),
        rows=rows,
        chosen_prefill=chosen,
        sweep=frozen,
        wall_s=time.perf_counter() - wall0,
    )


def _degrades_more_slowly(first: SeedRow, last: SeedRow, h: str) -> str:
    c0, c1 = first.colocated.metrics[h].p99.ms, last.colocated.metrics[h].p99.ms
    p0, p1 = first.pd.metrics[h].p99.ms, last.pd.metrics[h].p99.ms
    span = f"from QPS {first.qps:g} to {last.qps:g}"
    if any(math.isnan(x) for x in (c0, c1, p0, p1)):
        return "undetermined (a P99 is unknown)"
    if math.isinf(p0) or math.isinf(c0):
        return f"undetermined ({'P/D' if math.isinf(p0) else 'colocated'} already times out at QPS {first.qps:g})"
    if math.isinf(c1) and math.isinf(p1):
        return f"undetermined (both time out at QPS {last.qps:g})"
    if math.isinf(c1):
        return f"yes (colocated times out at QPS {last.qps:g}, P/D does not)"
    if math.isinf(p1):
        return f"no (P/D times out at QPS {last.qps:g}, colocated does not)"
    g_col, g_pd = c1 / c0, p1 / p0
    return f"{'yes' if g_pd < g_col else 'no'} (P99 x{g_col:.2f} colocated vs x{g_pd:.2f} P/D {span})"


def shape_verdict(table: SeedTable) -> str:
    """Does P/D have the lower headline P99 at every QPS, and does it degrade more slowly? Also names the
    QPS points where P/D is worse on the other metrics (a timeout is worse than any figure)."""
    h = table.config.headline
    qs = [r.qps for r in table.rows]
    lower = [r.qps for r in table.rows if r.ratio.kind in ("exact", "at_least") and r.ratio.value > 1.0]
    lower_txt = "at every QPS" if len(lower) == len(qs) else f"at QPS {lower or 'none'} of {qs}"
    slower = "n/a (one QPS point)" if len(qs) < 2 else _degrades_more_slowly(table.rows[0], table.rows[-1], h)
    holds = len(lower) == len(qs) and slower.startswith("yes")
    worse = []
    for m in METRICS:
        if m == h:
            continue
        pts = [r.qps for r in table.rows if r.pd.metrics[m].p99.ms > r.colocated.metrics[m].p99.ms]
        if pts:
            worse.append(f"{m.upper()} P99 at QPS {pts}")
    other = f"; but P/D is worse on {', '.join(worse)}" if worse else ""
    return (
        f"shape {'HOLDS' if holds else 'DOES NOT HOLD'}: P/D {h.upper()} P99 lower {lower_txt}; "
        f"degrades more slowly: {slower}{other}"
    )


def describe_sweep(table: SeedTable) -> Sequence[str]:
    """One line per split tried: its headline P99 per QPS and how many points failed."""
    h, bound = table.config.headline, table.config.itl_bound_ms
    lines = []
    for p, results in table.sweep.items():
        cells = ", ".join(
            f"{r.qps:g}: {_fmt(r.metrics[h].p99)}/{_fmt(r.metrics['itl'].p99)}" for r in results
        )
        fails = sum(r.failed(bound) for r in results)
        mark = " <- chosen" if p == table.chosen_prefill else ""
        lines.append(f"{p}P{table.config.gpus - p}D  {h}/itl P99 ms {cells}  (failing points: {fails}){mark}")
    return lines


def _fmt(q: Quantile) -> str:
    if q.timeout:
        return "timeout"
    return "unknown" if math.isnan(q.ms) else f"{q.ms:,.0f}"


def _claim_json(ms: float | None) -> float | str:
    return "timeout" if ms is None else ms
