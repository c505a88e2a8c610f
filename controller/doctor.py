"""``pdscale doctor``: checks of a live deployment, each with a verdict and a fix.

Every check is a pure ``judge_*`` function over data fetched beforehand (Prometheus answers, access
reviews, a checkpoint header), so it is tested with tables; the thin I/O around it is ``PromHttp`` (the
Prometheus HTTP API), ``KubeClientProbe`` (the official Kubernetes client), ``RouterHttp`` and
``read_checkpoint_header`` (the safetensors header, read without torch: the controller's import path
stays free of it). ``run_doctor`` fetches, judges and returns the list of ``Check``.

Verdicts: ``ok``, ``warn`` (a sign worth a look), ``fail`` (the controller will misbehave or cannot act),
``skip`` (the input was not given; the detail says how to run it). A check whose input could not be
fetched fails and says why; the others still run.

Thresholds are named constants below, each with where its value comes from. They are starting points
for an operator, not measurements of this project: tune them against your own fleet.
"""

from __future__ import annotations

import json
import math
import re
import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import yaml

from controller.config import ControllerConfig, PoolConfig
from controller.settings import LabelMap
from controller.sources.prometheus import (
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    RangeSeries,
    identify,
    query_range_chunked,
)
from forecaster.features import DEFAULT_SCHEMA, POOL_SCHEMA, FeatureError, FeatureSchema
from forecaster.lengths import length_range_of
from serving.sim import samples as names
from serving.sim.samples import histogram_quantile

Verdict = Literal["ok", "warn", "fail", "skip"]
VERDICTS: tuple[Verdict, ...] = ("ok", "warn", "fail", "skip")

# -- thresholds ----------------------------------------------------------------------------------

# The controller differences counters between two scrapes of one tick apart: with a scrape interval longer
# than the tick, some ticks see no new sample and read a rate of zero over a tick, the next one a double
# rate. Up to one tick is exact; up to two ticks the load is jittery (warn); beyond, fail.
SCRAPE_WARN_TICKS = 1.0
SCRAPE_FAIL_TICKS = 2.0
# Instant queries are evaluated at the controller's clock. Skew of half a tick shifts every read by a
# sample at a 1-s scrape; five ticks of skew make the controller act on data that old (or on the future,
# which Prometheus answers with the last sample): fail.
SKEW_WARN_TICKS = 0.5
SKEW_FAIL_TICKS = 5.0
SKEW_FLOOR_S = 0.25  # below this the HTTP round trip's own uncertainty dominates
# vLLM preempts a running sequence when it cannot allocate a KV block; at >= 95 % use a few new long
# sequences exhaust the cache. "Pinned": at or above that level for half the window or more.
KV_PINNED_USAGE = 0.95
KV_PINNED_FRACTION = 0.5
# A prefill instance with a queue (waiting >= 1) should run at the profile's saturation throughput (the
# capacity model's packing at an SLO no queue can reach). Under half of it is more than the profile's error
# on the Vidur data (docs/BENCHMARKS.md, the latency model's fit) and points at the engine configuration.
PREFILL_TPS_MIN_FRACTION = 0.5
MIN_SATURATED_STEPS = 5  # fewer saturated steps in the window than this: not judged (too little evidence)
# A tick spends most of its time waiting on Prometheus and the API server; the loop sleeps until the next
# tick boundary. p99 over half the tick leaves no margin for a slow scrape; over the tick, ticks overrun.
TICK_P99_WARN_FRACTION = 0.5
TICK_P99_FAIL_FRACTION = 1.0
# Routing imbalance: the pool's TTFT p90 over its SLO while one prefill/mixed instance is nearly idle
# (running + waiting under half a request on average) and another has a queue (waiting >= 1 on average).
IDLE_LOAD = 0.5
QUEUED_LOAD = 1.0
DEFAULT_WINDOW_S = 900.0  # 15 min: long enough to average a few bursts, short enough to be "now"
RANGE_POINTS = 240  # steps of a failure-sign range query (the step is window / this, at least 1 s)


class DoctorError(RuntimeError):
    """A fetch failed (Prometheus, Kubernetes, the router); the message says what was asked of whom."""


@dataclass(frozen=True)
class Check:
    """One verdict. ``subject`` is the pool (or job, namespace) it concerns; empty for global checks."""

    name: str
    verdict: Verdict
    detail: str
    fix: str = ""
    subject: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"Check.verdict must be one of {VERDICTS}, got {self.verdict!r}")

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def exit_code(checks: Iterable[Check], *, strict: bool = False) -> int:
    """1 when a check failed (or, with ``strict``, warned); 0 otherwise."""
    bad = {"fail", "warn"} if strict else {"fail"}
    return 1 if any(c.verdict in bad for c in checks) else 0


def parse_duration_s(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``1h``, ``1h30m``, ``500ms`` → seconds; an error names the text."""
    s = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        value = float(s)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", s)
        if not parts or "".join(n + u for n, u in parts) != s:
            raise ValueError(f"{text!r} is not a duration (examples: 30s, 15m, 1h30m)")
        scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
        value = sum(float(n) * scale[u] for n, u in parts)
    if not value > 0:
        raise ValueError(f"duration {text!r} must be positive")
    return value


# -- metric inventory ----------------------------------------------------------------------------

# canonical metric -> PromQL regex on __name__ (either spelling; histograms by their _count series)
INVENTORY: dict[str, str] = {
    **GAUGES,
    **COUNTERS,
    **{m: r.removesuffix("_bucket") + "_count" for m, r in HISTOGRAMS.items()},
}
# vLLM's names before V1 (0.6-0.9) for what the controller reads under the new names: the doctor says so
# when an instance exports only the old one (the controller does not read it).
LEGACY: dict[str, tuple[str, str]] = {
    names.KV_CACHE_USAGE_PERC: ("vllm:gpu_cache_usage_perc", "vllm[:_]gpu_cache_usage_perc"),
    names.INTER_TOKEN_LATENCY_SECONDS: (
        "vllm:time_per_output_token_seconds",
        "vllm[:_]time_per_output_token_seconds_count",
    ),
}
_ALL_ROLES = ("prefill", "decode", "mixed")
# what each role must export for the controller to see its load (the rest is optional)
REQUIRED_BY_ROLE: dict[str, tuple[str, ...]] = {
    "prefill": (names.NUM_REQUESTS_RUNNING, names.NUM_REQUESTS_WAITING, names.PROMPT_TOKENS_TOTAL),
    "decode": (
        names.NUM_REQUESTS_RUNNING,
        names.NUM_REQUESTS_WAITING,
        names.KV_CACHE_USAGE_PERC,
        names.GENERATION_TOKENS_TOTAL,
    ),
    "mixed": (
        names.NUM_REQUESTS_RUNNING,
        names.NUM_REQUESTS_WAITING,
        names.KV_CACHE_USAGE_PERC,
        names.PROMPT_TOKENS_TOTAL,
        names.GENERATION_TOKENS_TOTAL,
    ),
}
REQUIRED_BY_POOL = (names.TIME_TO_FIRST_TOKEN_SECONDS,)  # some instance of the pool must export it
# forecaster channel -> (metric it is computed from, roles that must carry it)
CHANNEL_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "arrival_rps": (names.ROUTER_REQUESTS_TOTAL, ("prefill", "mixed")),
    "prompt_tps": (names.PROMPT_TOKENS_TOTAL, ("prefill", "mixed")),
    "gen_tps": (names.GENERATION_TOKENS_TOTAL, _ALL_ROLES),
    "running": (names.NUM_REQUESTS_RUNNING, _ALL_ROLES),
    "waiting": (names.NUM_REQUESTS_WAITING, _ALL_ROLES),
    "kv_usage": (names.KV_CACHE_USAGE_PERC, ("decode", "mixed")),
    "ttft_p50_s": (names.TIME_TO_FIRST_TOKEN_SECONDS, _ALL_ROLES),
    "ttft_p90_s": (names.TIME_TO_FIRST_TOKEN_SECONDS, _ALL_ROLES),
    "itl_p50_s": (names.INTER_TOKEN_LATENCY_SECONDS, _ALL_ROLES),
    "itl_p90_s": (names.INTER_TOKEN_LATENCY_SECONDS, _ALL_ROLES),
}


@dataclass(frozen=True)
class Member:
    """One instance as its series' labels say (``LabelMap`` semantics, as the controller reads them)."""

    pool: str
    role: str
    instance: str


@dataclass(frozen=True)
class Inventory:
    """Which vLLM metrics exist for whom, from one instant query per metric."""

    present: Mapping[str, frozenset[Member]]  # canonical metric -> instances exporting it
    unmapped: Mapping[str, tuple[int, str]]  # canonical metric -> (series that did not map, one reason)
    spellings: Mapping[str, frozenset[str]]  # canonical metric -> series names seen
    jobs: frozenset[str]  # scrape jobs carrying vLLM series

    def members(self, pool: str) -> frozenset[Member]:
        return frozenset(m for who in self.present.values() for m in who if m.pool == pool)

    def pools(self) -> tuple[str, ...]:
        return tuple(sorted({m.pool for who in self.present.values() for m in who}))


def build_inventory(rows_by_metric: Mapping[str, Sequence[Mapping[str, Any]]], labels: LabelMap) -> Inventory:
    """Pure: instant-query rows (``{"metric": {labels}, ...}``) per canonical metric → ``Inventory``."""
    present: dict[str, frozenset[Member]] = {}
    unmapped: dict[str, tuple[int, str]] = {}
    spellings: dict[str, frozenset[str]] = {}
    jobs: set[str] = set()
    for metric, rows in rows_by_metric.items():
        who: set[Member] = set()
        seen: set[str] = set()
        bad, reason = 0, ""
        for row in rows:
            lab = {str(k): str(v) for k, v in row.get("metric", {}).items()}
            seen.add(lab.get("__name__", "?"))
            if lab.get("job") and metric != names.ROUTER_REQUESTS_TOTAL:
                jobs.add(lab["job"])
            ident = identify(lab, labels)
            if isinstance(ident, str):
                bad += 1
                reason = reason or f"{ident} (e.g. {_short(lab)})"
                continue
            who.add(Member(ident.pool, ident.role, ident.instance))
        present[metric] = frozenset(who)
        spellings[metric] = frozenset(seen)
        if bad:
            unmapped[metric] = (bad, reason)
    return Inventory(present, unmapped, spellings, frozenset(jobs))


def _short(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(labels.items()) if k != "__name__") + "}"


# -- judges (pure) -------------------------------------------------------------------------------


def judge_reachable(url: str, version: str | None, error: str | None) -> Check:
    if error is not None:
        return Check(
            "prometheus reachable",
            "fail",
            f"{url}: {error}",
            "check --prometheus (scheme, host, port), the network path from here and any bearer token; "
            "the controller keeps the current scale while Prometheus is down",
        )
    return Check("prometheus reachable", "ok", f"{url} answers (Prometheus {version or 'version unknown'})")


def scrape_intervals(config_yaml: str) -> tuple[float, dict[str, float]]:
    """Pure: (global scrape_interval, job -> its scrape_interval) from Prometheus' ``/status/config`` YAML.

    Prometheus' defaults apply where a value is absent: global 1m, a job inherits the global one.
    """
    doc = yaml.safe_load(config_yaml) or {}
    if not isinstance(doc, dict):
        raise ValueError("the configuration is not a YAML mapping")
    glob = doc.get("global") or {}
    global_s = parse_duration_s(str(glob.get("scrape_interval", "1m")))
    jobs: dict[str, float] = {}
    for job in doc.get("scrape_configs") or []:
        name = str(job.get("job_name", "?"))
        jobs[name] = parse_duration_s(str(job["scrape_interval"])) if "scrape_interval" in job else global_s
    return global_s, jobs


def judge_scrape_interval(intervals: Mapping[str, float], vllm_jobs: Iterable[str], tick_s: float) -> Check:
    """Judge the scrape interval of the jobs carrying vLLM series (every job when none carries any yet)."""
    wanted = sorted(set(vllm_jobs) & set(intervals))
    judged = wanted or sorted(intervals)
    basis = "jobs with vLLM series" if wanted else "every job (no vLLM series found yet)"
    if not judged:
        return Check(
            "scrape interval",
            "fail",
            "Prometheus has no scrape job",
            "add a scrape job for the vLLM pods (docs/DEPLOY.md, monitoring/prometheus-scrape.yaml)",
        )
    worst = max(judged, key=lambda j: intervals[j])
    worst_s = intervals[worst]
    listing = ", ".join(f"{j}={intervals[j]:g}s" for j in judged)
    detail = f"{basis}: {listing}; control tick {tick_s:g} s"
    fix = (
        f"set scrape_interval of job {worst!r} to the tick ({tick_s:g}s) or less, or raise the controller's "
        f"tick_s to at least {worst_s:g}"
    )
    if worst_s > SCRAPE_FAIL_TICKS * tick_s:
        return Check(
            "scrape interval", "fail", detail + f": {worst} scrapes every {worst_s / tick_s:.3g} ticks", fix
        )
    if worst_s > SCRAPE_WARN_TICKS * tick_s:
        return Check("scrape interval", "warn", detail + ": some ticks see no new sample", fix)
    return Check("scrape interval", "ok", detail)


def judge_clock_skew(prom_time_s: float, before_s: float, after_s: float, tick_s: float) -> Check:
    """Prometheus' ``time()`` vs the local clock read before and after the query (round trip excluded)."""
    mid = 0.5 * (before_s + after_s)
    slack = 0.5 * max(0.0, after_s - before_s)
    skew = prom_time_s - mid
    excess = max(0.0, abs(skew) - slack)
    detail = (
        f"Prometheus' clock is {skew:+.3f} s from this machine's (round trip {after_s - before_s:.3f} s); "
        f"tick {tick_s:g} s"
    )
    fix = (
        "run NTP/chrony on the Prometheus host and the controller's nodes; the controller evaluates its "
        "queries at its own clock, so skew reads stale (or future) samples"
    )
    if excess > max(SKEW_FAIL_TICKS * tick_s, SKEW_FLOOR_S):
        return Check("clock skew", "fail", detail, fix)
    if excess > max(SKEW_WARN_TICKS * tick_s, SKEW_FLOOR_S):
        return Check("clock skew", "warn", detail, fix)
    return Check("clock skew", "ok", detail)


def judge_labels(inventory: Inventory, labels: LabelMap) -> Check:
    """Series whose labels do not say which instance/pool/role they are (the controller cannot use them)."""
    conflicts = sorted(m for m, s in inventory.spellings.items() if len(s) > 1)
    note = f"; several spellings of {', '.join(conflicts)} (the canonical one wins)" if conflicts else ""
    if inventory.unmapped:
        items = "; ".join(f"{m}: {n} series, {why}" for m, (n, why) in sorted(inventory.unmapped.items()))
        return Check(
            "series labels",
            "warn",
            f"series the controller ignores: {items}{note}",
            f"label every vLLM target with {labels.instance!r}, {labels.pool!r} (or vLLM's "
            f"{labels.pool_fallback!r}) and {labels.role!r} (relabel_configs), or point source.instance_label / "
            "pool_label / role_label in the controller config at the labels you have",
        )
    n = sum(len(who) for who in inventory.present.values())
    return Check(
        "series labels",
        "ok",
        f"every vLLM series maps to an instance, pool and role ({n} instance-metrics; node = "
        f"{'label ' + repr(labels.node) if labels.node else 'the instance'}){note}",
    )


def judge_pool_metrics(pool: str, inventory: Inventory, labels: LabelMap) -> Check:
    """Every instance of ``pool`` exports what its role needs (either spelling)."""
    members = inventory.members(pool)
    name = "vllm metrics"
    if not members:
        found = ", ".join(inventory.pools()) or "none"
        return Check(
            name,
            "fail",
            f"no vLLM series labelled {labels.pool}={pool!r} (or {labels.pool_fallback}={pool!r}); pools "
            f"found: {found}",
            "check that Prometheus scrapes the pool's pods (`up` per target), that their series carry the pool "
            f"label ({labels.pool!r}, or vLLM's --served-model-name as {labels.pool_fallback!r}), and that the "
            "pool's name in the controller config matches",
            pool,
        )
    missing: list[str] = []
    instances = sorted({(m.role, m.instance) for m in members})
    legacy = False
    for role, inst in instances:
        me = Member(pool, role, inst)
        lacks = [metric for metric in REQUIRED_BY_ROLE[role] if me not in inventory.present.get(metric, ())]
        for i, metric in enumerate(lacks):
            old = LEGACY.get(metric, ("", ""))[0]
            if me in inventory.present.get(old, ()):
                lacks[i] = f"{metric} (exports the older {old})"
                legacy = True
        if lacks:
            missing.append(f"{role} {inst} lacks {', '.join(lacks)}")
    for metric in REQUIRED_BY_POOL:
        if not any(m.pool == pool for m in inventory.present.get(metric, ())):
            missing.append(f"no instance exports {metric}")
    by_role = {r: sum(1 for role, _ in instances if role == r) for r in _ALL_ROLES}
    shape = ", ".join(f"{n} {r}" for r, n in by_role.items() if n)
    optional = [
        m
        for m in (names.ROUTER_REQUESTS_TOTAL, names.NUM_PREEMPTIONS_TOTAL, names.INTER_TOKEN_LATENCY_SECONDS)
        if not any(x.pool == pool for x in inventory.present.get(m, ()))
    ]
    opt = f"; optional metrics absent: {', '.join(optional)}" if optional else ""
    if missing:
        fix = "those channels read as unknown (never zero): check the scrape's metric_relabel_configs"
        if legacy:
            fix += (
                "; a pre-V1 vLLM exports the older names: upgrade vLLM, or add a Prometheus recording rule "
                "naming the old series as the new (e.g. record: vllm:kv_cache_usage_perc, expr: "
                "vllm:gpu_cache_usage_perc)"
            )
        return Check(name, "warn", f"{shape}; " + "; ".join(missing) + opt, fix, pool)
    return Check(name, "ok", f"{shape}; every required metric present{opt}", "", pool)


def available_channels(pool: str, inventory: Inventory) -> set[str]:
    """Forecaster channels whose source metric some instance of the right role in ``pool`` exports."""
    out = set()
    for channel, (metric, roles) in CHANNEL_SOURCES.items():
        if any(m.pool == pool and m.role in roles for m in inventory.present.get(metric, ())):
            out.add(channel)
    return out


def trained_channel_names(normalizer: Mapping[str, Any]) -> tuple[str, ...]:
    """Channels whose normalisation was fitted, decided as the controller decides it when loading."""
    from controller.forecasting import trained_channels

    return trained_channels(normalizer["channels"], normalizer["mean"], normalizer["std"])


def judge_checkpoint(
    path: Path,
    doc: Mapping[str, Any] | None,
    error: str | None,
    available: Mapping[str, set[str]] | None,
    tick_s: float,
    *,
    is_default: bool,
) -> Check:
    """The checkpoint's metadata against the controller's feature schema and the metrics available.

    ``available``: pool -> channels its metrics provide (None: Prometheus could not be read).
    """
    name = "forecaster checkpoint"
    if doc is None:
        verdict: Verdict = "warn" if is_default else "fail"
        return Check(
            name,
            verdict,
            f"{path}: {error}; the controller falls back to the Holt baseline",
            "point forecaster_checkpoint at a file written by `pdscale train-forecaster` (or reinstall pdscale "
            "for the shipped one)",
        )
    try:
        schema = FeatureSchema.from_dict(doc["schema"])
        trained = trained_channel_names(doc["normalizer"])
    except (FeatureError, KeyError, TypeError, ValueError) as err:
        return Check(name, "fail", f"{path}: invalid metadata: {err}", "retrain or re-export the checkpoint")
    try:
        lengths = length_range_of(doc.get("meta"))
    except FeatureError as err:
        return Check(
            name,
            "fail",
            f"{path}: invalid metadata: {err}",
            f"record the range again (`python -m training.length_range {path} --write`) or retrain",
        )
    # v2 (pool descriptors) and v3 (level-relative inputs) add inputs the forecaster computes itself
    computed_only = replace(schema, version=DEFAULT_SCHEMA.version, descriptors=(), level_halflife_s=0.0)
    diffs = [] if schema == POOL_SCHEMA or computed_only == DEFAULT_SCHEMA else DEFAULT_SCHEMA.diff(schema)
    ident = f"{path.name} {doc.get('model_version', '?')} (horizon {doc.get('horizon_s', '?')} s)"
    if diffs:
        return Check(
            name,
            "fail",
            f"{ident}: feature schema differs from this controller's (controller → checkpoint): "
            + "; ".join(diffs),
            "retrain with this pdscale version (`pdscale train-forecaster`), or run the pdscale version that "
            "wrote it (its code_version: " + json.dumps(doc.get("code_version", {})) + ")",
        )
    notes: list[str] = []
    verdict = "ok"
    fix = ""
    if schema.step_s != tick_s:
        verdict = "warn"
        notes.append(f"trained at one step per {schema.step_s:g} s but the tick is {tick_s:g} s")
        fix = f"set tick_s to {schema.step_s:g} or retrain at step {tick_s:g} s"
    if available is not None:
        gaps = {
            pool: sorted(c for c in trained if c not in chans) for pool, chans in sorted(available.items())
        }
        gaps = {p: g for p, g in gaps.items() if g}
        if gaps:
            verdict = "warn"
            listing = "; ".join(
                f"{p}: {', '.join(f'{c} (needs {CHANNEL_SOURCES[c][0]})' for c in g)}"
                for p, g in gaps.items()
            )
            notes.append(f"trained channels the metrics cannot feed (masked, forecasts degrade): {listing}")
            fix = (fix + "; " if fix else "") + (
                "export the missing metrics (the router's pdscale:router_requests_total needs the pdscale "
                "router in front of the pool), or retrain on the channels you have"
            )
    detail = f"{ident}: schema v{schema.version} matches; trained on {', '.join(trained) or 'no channel'}"
    if lengths is not None:
        detail += (
            f"; length guard: prompts {lengths.prompt[0]:,.0f}-{lengths.prompt[1]:,.0f}, outputs"
            f" {lengths.output[0]:,.0f}-{lengths.output[1]:,.0f} tokens per request"
        )
    else:
        detail += "; no training length range (the length guard is off for it)"
    return Check(name, verdict, detail + ("; " + "; ".join(notes) if notes else ""), fix)


def judge_rbac(namespace: str, answers: Mapping[str, bool | str], *, leases_namespace: str | None) -> Check:
    """``answers``: 'verb resource' -> allowed (or an error text) from SelfSubjectAccessReviews."""
    errors = {k: v for k, v in answers.items() if isinstance(v, str)}
    denied = sorted(k for k, v in answers.items() if v is False)
    where = f"namespace {namespace!r}" + (
        f", leases in {leases_namespace!r}" if leases_namespace and leases_namespace != namespace else ""
    )
    if errors:
        first = next(iter(errors.items()))
        return Check(
            "rbac",
            "fail",
            f"{where}: access review failed ({first[0]}: {first[1]})",
            "check the kubeconfig/context (or the pod's service account) and that the API server is reachable",
        )
    if denied:
        return Check(
            "rbac",
            "fail",
            f"{where}: denied: {', '.join(denied)}",
            "apply the controller's Role and RoleBinding (`pdscale manifests`, 20-controller.yaml): apps "
            "deployments get/list/watch, deployments/scale get/patch, coordination.k8s.io leases "
            "get/create/update; with the router drain marking pods, core pods list/patch "
            "(`pdscale manifests --router-drain`, or set actuator.router_admin.mark_pods: false)",
        )
    return Check("rbac", "ok", f"{where}: allowed: {', '.join(sorted(answers))}")


def judge_deployments(pool: str, namespace: str, found: Sequence[tuple[str, str, str]]) -> Check:
    """``found``: (name, role, tier) of Deployments labelled ``pdscale.io/pool=<pool>``."""
    active = {role for _, role, tier in found if tier == "active"}
    need = ("prefill", "decode")
    lacking = [r for r in need if r not in active]
    listing = ", ".join(f"{n} ({r}/{t})" for n, r, t in sorted(found)) or "none"
    if lacking:
        return Check(
            "deployments",
            "fail",
            f"{namespace}: Deployments of pool {pool!r}: {listing}; no active {', '.join(lacking)} Deployment",
            "label each role's Deployment pdscale.io/pool, pdscale.io/role and pdscale.io/tier=active "
            "(`pdscale manifests` renders them); the actuator refuses a pool without both roles",
            pool,
        )
    return Check("deployments", "ok", f"{namespace}: {listing}", "", pool)


def judge_kv_pressure(pool: str, pinned: Mapping[str, float], preempted: Mapping[str, float]) -> Check:
    """``pinned``: decode/mixed instance -> fraction of the window with KV usage >= KV_PINNED_USAGE (NaN =
    no sample); ``preempted``: instance -> preemptions over the window."""
    name = "decode kv pressure"
    if not pinned:
        return Check(name, "skip", "no decode or mixed instance with a KV usage series", "", pool)
    hot = sorted(i for i, f in pinned.items() if math.isfinite(f) and f >= KV_PINNED_FRACTION)
    hot_preempting = [i for i in hot if preempted.get(i, 0.0) > 0]
    fix = (
        "lower vLLM's --max-num-seqs on the decode instances (fewer sequences share the cache) and add decode "
        "capacity (raise min_decode / max_decode, or lower the policy's scale_down_delay_s)"
    )

    def fmt(i: str) -> str:
        return f"{i} {pinned[i]:.0%} of the window >= {KV_PINNED_USAGE:g}, {preempted.get(i, 0.0):.0f} preemptions"

    if hot_preempting:
        return Check(name, "fail", "; ".join(fmt(i) for i in hot_preempting), fix, pool)
    if hot:
        return Check(name, "warn", "; ".join(fmt(i) for i in hot) + " (no preemptions yet)", fix, pool)
    worst = max(pinned, key=lambda i: pinned[i] if math.isfinite(pinned[i]) else -1.0)
    return Check(name, "ok", f"{len(pinned)} instance(s); highest: {fmt(worst)}", "", pool)


def judge_prefill_throughput(
    pool: str, saturated_tps: Mapping[str, tuple[float, int]], expected_tps: float | None, why_not: str = ""
) -> Check:
    """``saturated_tps``: prefill instance -> (mean prompt tokens/s over the steps it had a queue, those
    steps); ``expected_tps``: the profile's saturation throughput at the pool's mean prompt (None: unknown)."""
    name = "prefill throughput"
    if expected_tps is None:
        return Check(name, "skip", why_not or "expected throughput unknown", "", pool)
    if not saturated_tps:
        return Check(name, "skip", "no prefill instance in the window", "", pool)
    judged = {i: v for i, v in saturated_tps.items() if v[1] >= MIN_SATURATED_STEPS and math.isfinite(v[0])}
    if not judged:
        return Check(
            name,
            "ok",
            f"no prefill instance had a queue for {MIN_SATURATED_STEPS}+ steps: nothing to judge",
            "",
            pool,
        )
    slow = sorted(i for i, (tps, _) in judged.items() if tps < PREFILL_TPS_MIN_FRACTION * expected_tps)
    listing = "; ".join(
        f"{i} {judged[i][0]:.0f} tok/s over {judged[i][1]} queued steps" for i in sorted(judged)
    )
    detail = f"{listing}; profile saturation {expected_tps:.0f} tok/s"
    if slow:
        return Check(
            name,
            "warn",
            f"under {PREFILL_TPS_MIN_FRACTION:.0%} of the profile while queued: {detail}",
            "check the attention backend vLLM chose (its start-up log: FLASH_ATTN / FLASHINFER, not a fallback), "
            "--max-num-batched-tokens (the chunk size: too small a chunk starves prefill) and that the pool's "
            "profile in the controller config is the hardware it runs on",
            pool,
        )
    return Check(name, "ok", detail, "", pool)


def judge_tick_latency(p99_by_instance: Mapping[str, float], tick_s: float) -> Check:
    """``p99_by_instance``: controller replica -> p99 of ``pdscale_controller_tick_seconds`` over the window."""
    name = "controller tick latency"
    if not p99_by_instance:
        return Check(
            name,
            "skip",
            "no pdscale_controller_tick_seconds series in Prometheus",
            "scrape the controller's /metrics (its --metrics-port, 9100 in the manifests) to judge this",
        )
    finite = {i: v for i, v in p99_by_instance.items() if math.isfinite(v)}
    if not finite:
        return Check(name, "ok", "the controller ran no tick in the window (follower or idle)")
    worst = max(finite, key=lambda i: finite[i])
    detail = (
        ", ".join(f"{i} p99 {v * 1e3:.0f} ms" for i, v in sorted(finite.items())) + f"; tick {tick_s:g} s"
    )
    fix = (
        "a tick waits on Prometheus and the API server: check their latency (source.timeout_s bounds the "
        "scrape), the number of series per query, and the controller's CPU limit; or raise tick_s"
    )
    if finite[worst] > TICK_P99_FAIL_FRACTION * tick_s:
        return Check(name, "fail", detail + ": ticks overrun", fix)
    if finite[worst] > TICK_P99_WARN_FRACTION * tick_s:
        return Check(name, "warn", detail, fix)
    return Check(name, "ok", detail)


def judge_ttft_imbalance(
    pool: str, ttft_p90_s: float, slo_ttft_ms: float, load: Mapping[str, tuple[float, float]]
) -> Check:
    """``load``: prefill/mixed instance -> (mean running, mean waiting) over the window."""
    name = "tail ttft vs idle capacity"
    if not math.isfinite(ttft_p90_s):
        return Check(name, "skip", "no TTFT observations in the window", "", pool)
    p90_ms = ttft_p90_s * 1e3
    head = f"TTFT p90 {p90_ms:.0f} ms (SLO {slo_ttft_ms:g} ms)"
    if p90_ms <= slo_ttft_ms:
        return Check(name, "ok", head, "", pool)
    idle = sorted(i for i, (r, w) in load.items() if r + w < IDLE_LOAD)
    queued = sorted(i for i, (_, w) in load.items() if w >= QUEUED_LOAD)
    if idle and queued:
        return Check(
            name,
            "warn",
            f"{head} while {', '.join(idle)} sat idle and {', '.join(queued)} had a queue",
            "routing imbalance: check the router's policy (least-loaded or context-aware, not round-robin on "
            "unequal prompts), that every instance is registered with it (/admin/backends), and stale node "
            "scores (node_score_ttl_s)",
            pool,
        )
    return Check(
        name,
        "warn",
        f"{head} with no idle prefill capacity: the pool is short of capacity, not unbalanced",
        "read the controller's decisions (audit log, pdscale_controller_degraded): max_prefill reached, "
        "GPU budget, or a forecaster lagging the load",
        pool,
    )


def judge_router(url: str, status: int | None, body: Mapping[str, Any] | None, error: str | None) -> Check:
    name = "router"
    if error is not None or status is None:
        return Check(name, "fail", f"{url}/health: {error}", "check the router's URL and that it runs")
    healthy = (body or {}).get("healthy", {})
    detail = f"{url}/health: HTTP {status}, healthy backends {json.dumps(healthy)}"
    if status != 200:
        return Check(
            name,
            "fail",
            detail,
            "the router has no healthy mixed backend nor a healthy prefill+decode pair: check the vLLM pods "
            "and their registration (POST /admin/backends)",
        )
    return Check(name, "ok", detail)


# -- fetching (thin I/O) -------------------------------------------------------------------------


class PromApi(Protocol):
    """What the doctor asks of Prometheus (``PromHttp`` is the real one)."""

    url: str

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any: ...


class PromHttp:
    """The Prometheus HTTP API over httpx; ``get`` returns the answer's ``data`` or raises ``DoctorError``."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        bearer_token: str | None = None,
        ca_file: str | None = None,
        insecure: bool = False,
    ) -> None:
        import httpx

        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}
        verify: bool | str = False if insecure else (ca_file or True)
        self._client = httpx.Client(base_url=self.url, headers=headers, verify=verify, timeout=timeout_s)

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        import httpx

        try:
            resp = self._client.get(f"/api/v1/{path}", params=dict(params or {}))
        except httpx.HTTPError as err:
            raise DoctorError(f"GET {self.url}/api/v1/{path}: {type(err).__name__}: {err}") from err
        try:
            body = resp.json()
        except ValueError as err:
            raise DoctorError(f"GET {self.url}/api/v1/{path}: HTTP {resp.status_code}, not JSON") from err
        if resp.status_code != 200 or body.get("status") != "success":
            raise DoctorError(
                f"GET {self.url}/api/v1/{path}: HTTP {resp.status_code}: {body.get('errorType')}: {body.get('error')}"
            )
        return body.get("data")

    def close(self) -> None:
        self._client.close()


def _vector(prom: PromApi, promql: str) -> list[dict[str, Any]]:
    data = prom.get("query", {"query": promql})
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise DoctorError(f"query {promql!r}: expected a vector, got {str(data)[:200]}")
    result: list[dict[str, Any]] = data["result"]
    return result


def _range(prom: PromApi, promql: str, start_s: float, end_s: float, step_s: float) -> list[RangeSeries]:
    def call(q: str, params: dict[str, str], span: object) -> Any:
        data = prom.get("query_range", {"query": q, **params})
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise DoctorError(f"range query {q!r}: expected a matrix, got {str(data)[:200]}")
        return data["result"]

    return query_range_chunked(call, promql, start_s=start_s, end_s=end_s, step_s=step_s)


def _either(regex: str, build: Callable[[str], str]) -> str:
    """``build`` applied to each spelling of a ``vllm[:_]x`` regex, joined with ``or`` (colon wins): a
    function over both at once would fail on two series with one label set."""
    colon, underscore = regex.replace("[:_]", ":"), regex.replace("[:_]", "_")
    return f"({build(colon)}) or ({build(underscore)})"


def _sel(regex: str, extra: str = "") -> str:
    return "{" + f'__name__=~"{regex}"' + (f",{extra}" if extra else "") + "}"


INVENTORY_LOOKBACK_SCRAPES = 3  # a series counts as exported if it had a sample in this many tick intervals
INVENTORY_MIN_LOOKBACK_S = 5.0


def _series(prom: PromApi, selector: str, start_s: float, end_s: float) -> list[dict[str, Any]]:
    """The series API's label sets for ``selector`` in [start_s, end_s], as instant-query rows
    (``{"metric": labels}``); ``DoctorError`` when the API is missing or answers something else."""
    data = prom.get("series", {"match[]": selector, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}"})
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise DoctorError(f"series {selector!r}: expected a list of label sets, got {str(data)[:200]}")
    return [{"metric": row} for row in data]


def fetch_inventory(
    prom: PromApi, labels: LabelMap, end_s: float | None = None, lookback_s: float = INVENTORY_MIN_LOOKBACK_S
) -> Inventory:
    """Which instances export which vLLM metric: the series that had a sample in the last ``lookback_s``
    before ``end_s`` (the series API), so one failed scrape, whose stale markers end every series of the
    target at once, does not read as a metric nobody exports. Without ``end_s``, or where the series API
    is missing or answers otherwise (some Prometheus-compatible stores), one instant query per metric."""
    selectors = {metric: _sel(regex) for metric, regex in INVENTORY.items()}
    selectors.update({old: _sel(regex) for old, regex in LEGACY.values()})
    if end_s is not None:
        try:
            start_s = end_s - lookback_s
            return build_inventory(
                {m: _series(prom, sel, start_s, end_s) for m, sel in selectors.items()}, labels
            )
        except DoctorError:
            pass  # the instant queries below
    return build_inventory({m: _vector(prom, sel) for m, sel in selectors.items()}, labels)


def _by_member(rows: Iterable[Mapping[str, Any]], labels: LabelMap) -> dict[Member, float]:
    out: dict[Member, float] = {}
    for row in rows:
        lab = {str(k): str(v) for k, v in row.get("metric", {}).items()}
        ident = identify(lab, labels)
        if isinstance(ident, str):
            continue
        out[Member(ident.pool, ident.role, ident.instance)] = float(row["value"][1])
    return out


def _range_by_member(series: Iterable[RangeSeries], labels: LabelMap) -> dict[Member, np.ndarray]:
    out: dict[Member, np.ndarray] = {}
    for s in series:
        ident = identify({str(k): str(v) for k, v in s.labels.items()}, labels)
        if not isinstance(ident, str):
            out[Member(ident.pool, ident.role, ident.instance)] = s.values
    return out


@dataclass(frozen=True)
class Window:
    """The failure-sign window: ``[end_s - window_s, end_s]`` on a grid of ``step_s``; rates over
    ``rate_s`` (at least four scrapes, so a rate always has two samples)."""

    end_s: float
    window_s: float
    scrape_s: float

    @property
    def step_s(self) -> float:
        return max(1.0, self.window_s / RANGE_POINTS, self.scrape_s)

    @property
    def rate_s(self) -> float:
        return max(4.0 * self.scrape_s, 2.0 * self.step_s)

    @property
    def start_s(self) -> float:
        return self.end_s - self.window_s

    def promql(self, seconds: float) -> str:
        return f"{max(1, round(seconds * 1000))}ms"


def _per_member(
    prom: PromApi, labels: LabelMap, regex: str, fn: str, rng: str, sel: str = ""
) -> dict[Member, float]:
    """Instant ``fn(selector[rng])`` of either spelling of ``regex``, per instance."""
    rows = _vector(prom, _either(regex, lambda r: f"{fn}({_sel(r, sel)}[{rng}])"))
    return _by_member(rows, labels)


def _series_per_member(
    prom: PromApi, labels: LabelMap, w: Window, regex: str, sel: str, fn: str = ""
) -> dict[Member, np.ndarray]:
    """Range query of either spelling of ``regex`` (raw, or ``fn(selector[rate_s])``) over the window."""

    def build(r: str) -> str:
        return f"{fn}({_sel(r, sel)}[{w.promql(w.rate_s)}])" if fn else _sel(r, sel)

    return _range_by_member(_range(prom, _either(regex, build), w.start_s, w.end_s, w.step_s), labels)


def fetch_kv_pressure(
    prom: PromApi, labels: LabelMap, w: Window
) -> tuple[dict[Member, float], dict[Member, float]]:
    """Per decode/mixed instance: fraction of the window at KV usage >= KV_PINNED_USAGE; preemptions."""
    sel = f'{labels.role}!="prefill"'
    pinned: dict[Member, float] = {}
    for member, values in _series_per_member(prom, labels, w, GAUGES[names.KV_CACHE_USAGE_PERC], sel).items():
        seen = np.isfinite(values)
        pinned[member] = float(np.mean(values[seen] >= KV_PINNED_USAGE)) if seen.any() else math.nan
    rng = w.promql(w.window_s)
    preempted = _per_member(prom, labels, COUNTERS[names.NUM_PREEMPTIONS_TOTAL], "increase", rng, sel)
    return pinned, preempted


def fetch_prefill_saturation(prom: PromApi, labels: LabelMap, w: Window) -> dict[Member, tuple[float, int]]:
    """Per prefill instance: mean prompt tokens/s over the steps with a queue, and how many steps."""
    sel = f'{labels.role}="prefill"'
    waiting = _series_per_member(prom, labels, w, GAUGES[names.NUM_REQUESTS_WAITING], sel)
    tps = _series_per_member(prom, labels, w, COUNTERS[names.PROMPT_TOKENS_TOTAL], sel, "rate")
    out: dict[Member, tuple[float, int]] = {}
    for member, queue in waiting.items():
        rate = tps.get(member)
        if rate is None:
            continue
        busy = (queue >= 1.0) & np.isfinite(rate)
        n = int(busy.sum())
        out[member] = (float(rate[busy].mean()) if n else math.nan, n)
    return out


def fetch_mean_prompt_tokens(prom: PromApi, labels: LabelMap, w: Window) -> dict[str, float]:
    """Pool -> mean prompt tokens per request over the window (prompt tokens / routed requests, both on
    prefill and mixed instances); vLLM's request_prompt_tokens histogram where the router counter is absent."""
    rng, sel = w.promql(w.window_s), f'{labels.role}!="decode"'

    def pooled(regex: str) -> dict[str, float]:
        return _pool_sums(_per_member(prom, labels, regex, "increase", rng, sel))

    tokens = pooled(COUNTERS[names.PROMPT_TOKENS_TOTAL])
    requests = pooled(COUNTERS[names.ROUTER_REQUESTS_TOTAL])
    hist_sum = pooled("vllm[:_]request_prompt_tokens_sum")
    hist_n = pooled("vllm[:_]request_prompt_tokens_count")
    out: dict[str, float] = {}
    for pool in set(tokens) | set(hist_n):
        if requests.get(pool, 0.0) > 0 and pool in tokens:
            out[pool] = tokens[pool] / requests[pool]
        elif hist_n.get(pool, 0.0) > 0 and pool in hist_sum:
            out[pool] = hist_sum[pool] / hist_n[pool]
    return out


def _pool_sums(values: Mapping[Member, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m, v in values.items():
        if math.isfinite(v):
            out[m.pool] = out.get(m.pool, 0.0) + v
    return out


def fetch_ttft_and_load(
    prom: PromApi, labels: LabelMap, w: Window
) -> tuple[dict[str, float], dict[Member, tuple[float, float]]]:
    """Pool -> TTFT p90 over the window (its instances' bucket increases summed, as the controller does);
    prefill/mixed instance -> (mean running, mean waiting), NaN where a series is missing."""
    rng = w.promql(w.window_s)
    rows = _vector(
        prom, _either(HISTOGRAMS[names.TIME_TO_FIRST_TOKEN_SECONDS], lambda r: f"increase({_sel(r)}[{rng}])")
    )
    buckets: dict[str, dict[float, float]] = {}
    for row in rows:
        lab = {str(k): str(v) for k, v in row.get("metric", {}).items()}
        ident = identify(lab, labels)
        if isinstance(ident, str) or "le" not in lab:
            continue
        per = buckets.setdefault(ident.pool, {})
        le = float(lab["le"])
        per[le] = per.get(le, 0.0) + float(row["value"][1])
    p90: dict[str, float] = {}
    for pool, per in buckets.items():
        bounds = sorted(b for b in per if math.isfinite(b))
        counts = np.maximum.accumulate(np.array([per[b] for b in bounds] + [per.get(math.inf, 0.0)]))
        p90[pool] = histogram_quantile(0.9, tuple(bounds), counts) if bounds else math.nan
    sel = f'{labels.role}!="decode"'
    running = _per_member(prom, labels, GAUGES[names.NUM_REQUESTS_RUNNING], "avg_over_time", rng, sel)
    waiting = _per_member(prom, labels, GAUGES[names.NUM_REQUESTS_WAITING], "avg_over_time", rng, sel)
    load = {m: (running.get(m, math.nan), waiting.get(m, math.nan)) for m in set(running) | set(waiting)}
    return p90, load


def fetch_tick_p99(prom: PromApi, w: Window) -> dict[str, float]:
    rng = w.promql(w.window_s)
    rows = _vector(
        prom,
        f"histogram_quantile(0.99, sum by (job, instance, le) "
        f'(rate({{__name__=~"pdscale_controller_tick_seconds_bucket"}}[{rng}])))',
    )
    return {
        f"{r['metric'].get('job', '?')}/{r['metric'].get('instance', '?')}": float(r["value"][1])
        for r in rows
    }


def expected_prefill_tps(profile_name: str, mean_prompt_tokens: float) -> float:
    """Saturation prompt tokens/s of one prefill instance of ``profile_name``: the capacity model's best
    packing at an SLO no queue reaches (utilisation → 1), so no second copy of the math lives here."""
    from serving.sim.capacity import prefill_capacity
    from serving.sim.hardware import get_profile
    from serving.sim.latency import latency_model_for

    profile = get_profile(profile_name)
    cap = prefill_capacity(
        profile, latency_model_for(profile), 1e12, mean_prompt_tokens, include_kv_transfer=False
    )
    return cap.tokens_per_s


def read_checkpoint_header(path: Path) -> dict[str, Any]:
    """The pdscale metadata document of a safetensors checkpoint, read from its JSON header (no torch)."""
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if not 0 < n <= 100_000_000:
            raise ValueError(f"header length {n} is not plausible (not a safetensors file?)")
        raw = fh.read(n)
    if len(raw) != n:
        raise ValueError("truncated safetensors header")
    header = json.loads(raw)
    meta = (header.get("__metadata__") or {}).get("pdscale")
    if meta is None:
        raise ValueError("safetensors file without pdscale metadata (not a forecaster checkpoint)")
    doc = json.loads(meta)
    if not isinstance(doc, dict) or doc.get("format") != "pdscale-forecaster":
        raise ValueError("metadata 'format' is not 'pdscale-forecaster'")
    return doc


class KubeProbe(Protocol):
    """What the doctor asks of Kubernetes (``KubeClientProbe`` is the real one)."""

    def can(self, namespace: str, verb: str, group: str, resource: str, subresource: str = "") -> bool: ...

    def deployments(self, namespace: str, pool: str) -> list[tuple[str, str, str]]: ...


class KubeClientProbe:
    """SelfSubjectAccessReviews and Deployment listing through the official client's ``ApiClient``."""

    def __init__(self, api_client: Any, *, request_timeout_s: float = 5.0) -> None:
        from kubernetes import client as k8s

        self._k8s = k8s
        self._auth = k8s.AuthorizationV1Api(api_client)
        self._apps = k8s.AppsV1Api(api_client)
        self._timeout_s = request_timeout_s

    def can(self, namespace: str, verb: str, group: str, resource: str, subresource: str = "") -> bool:
        k8s = self._k8s
        review = k8s.V1SelfSubjectAccessReview(
            spec=k8s.V1SelfSubjectAccessReviewSpec(
                resource_attributes=k8s.V1ResourceAttributes(
                    namespace=namespace,
                    verb=verb,
                    group=group,
                    resource=resource,
                    subresource=subresource or None,
                )
            )
        )
        out = self._auth.create_self_subject_access_review(review, _request_timeout=self._timeout_s)
        return out.status is not None and bool(out.status.allowed)

    def deployments(self, namespace: str, pool: str) -> list[tuple[str, str, str]]:
        from controller.actuators.kubernetes import LABEL_POOL, LABEL_ROLE, LABEL_TIER

        listing = self._apps.list_namespaced_deployment(
            namespace, label_selector=f"{LABEL_POOL}={pool}", _request_timeout=self._timeout_s
        )
        out = []
        for item in listing.items:
            meta = item.metadata
            lab = (meta.labels if meta is not None else None) or {}
            if meta is not None and LABEL_ROLE in lab:
                out.append((str(meta.name), str(lab[LABEL_ROLE]), str(lab.get(LABEL_TIER, "active"))))
        return out


# (verb, group, resource, subresource) the controller needs; leases only with leader election
RBAC_DEPLOYMENTS: tuple[tuple[str, str, str, str], ...] = (
    ("list", "apps", "deployments", ""),
    ("get", "apps", "deployments", "scale"),
    ("patch", "apps", "deployments", "scale"),
)
# with the router drain marking pods (actuator.router_admin.mark_pods): the pods it drained get a deletion cost
RBAC_PODS: tuple[tuple[str, str, str, str], ...] = (
    ("list", "", "pods", ""),
    ("patch", "", "pods", ""),
)
RBAC_LEASES: tuple[tuple[str, str, str, str], ...] = (
    ("get", "coordination.k8s.io", "leases", ""),
    ("create", "coordination.k8s.io", "leases", ""),
    ("update", "coordination.k8s.io", "leases", ""),
)


def fetch_rbac(
    kube: KubeProbe, namespace: str, leases_namespace: str | None, *, pods: bool = False
) -> dict[str, bool | str]:
    """SelfSubjectAccessReviews of what the controller needs (``pods``: the router drain's pod marking)."""
    wanted = [(namespace, r) for r in RBAC_DEPLOYMENTS]
    if pods:
        wanted += [(namespace, r) for r in RBAC_PODS]
    if leases_namespace is not None:
        wanted += [(leases_namespace, r) for r in RBAC_LEASES]
    out: dict[str, bool | str] = {}
    for ns, (verb, group, resource, sub) in wanted:
        key = f"{verb} {resource}{'/' + sub if sub else ''}"
        try:
            out[key] = kube.can(ns, verb, group, resource, sub)
        except Exception as err:  # any client failure is this check's verdict, never a crash of the doctor
            out[key] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return out


class RouterProbe(Protocol):
    url: str

    def health(self) -> tuple[int, dict[str, Any]]: ...


class RouterHttp:
    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def health(self) -> tuple[int, dict[str, Any]]:
        import httpx

        resp = httpx.get(f"{self.url}/health", timeout=self.timeout_s)
        try:
            body = resp.json()
        except ValueError:
            body = {}
        return resp.status_code, body if isinstance(body, dict) else {}


# -- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DoctorInputs:
    """What to check. ``pools`` None: every pool found in the metrics, with default SLOs and no profile
    (the prefill throughput check needs a profile, so it is skipped for them)."""

    tick_s: float = 1.0
    pools: tuple[PoolConfig, ...] | None = None
    labels: LabelMap = field(default_factory=LabelMap)
    checkpoint: Path | None = None  # None: the shipped one
    window_s: float = DEFAULT_WINDOW_S
    namespace: str = "default"
    leases_namespace: str | None = "default"  # None: leader election not used, leases not checked
    pods: bool = (
        False  # the router drain marks pods (actuator.router_admin.mark_pods): pods list/patch checked
    )

    def __post_init__(self) -> None:
        for name in ("tick_s", "window_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"DoctorInputs.{name} must be a positive number of seconds, got {value!r}")

    @classmethod
    def build(
        cls,
        cfg: ControllerConfig | None,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        tick_s: float | None = None,
        checkpoint: Path | None = None,
        namespace: str | None = None,
        leases: bool = True,
    ) -> DoctorInputs:
        """From a controller config (or none), each argument given overriding the config's value."""
        ns = namespace or (cfg.actuator.namespace if cfg is not None else "default")
        if cfg is None:
            return cls(
                tick_s=tick_s or 1.0,
                checkpoint=checkpoint,
                window_s=window_s,
                namespace=ns,
                leases_namespace=ns if leases else None,
            )
        src = cfg.source
        return cls(
            tick_s=tick_s or cfg.tick_s,
            pools=tuple(cfg.pools),
            labels=LabelMap(instance=src.instance_label, pool=src.pool_label, role=src.role_label),
            checkpoint=checkpoint or cfg.forecaster_checkpoint,
            window_s=window_s,
            namespace=ns,
            leases_namespace=ns if leases else None,
            pods=cfg.actuator.router_admin is not None and cfg.actuator.router_admin.mark_pods,
        )


def _default_checkpoint() -> Path:
    from controller.forecasting import DEFAULT_CHECKPOINT

    return DEFAULT_CHECKPOINT


def run_doctor(
    inputs: DoctorInputs,
    *,
    prom: PromApi | None,
    kube: KubeProbe | None = None,
    router: RouterProbe | None = None,
    clock: Callable[[], float] = time.time,
    kube_hint: str = "",
) -> list[Check]:
    """Every check, in a stable order. ``prom`` None or unreachable: the metric checks are skipped."""
    checks: list[Check] = []
    inventory: Inventory | None = None
    window: Window | None = None
    pools: tuple[PoolConfig, ...] = inputs.pools or ()
    if prom is None:
        checks.append(
            Check("prometheus reachable", "skip", "no --prometheus URL given", "pass --prometheus URL")
        )
    else:
        inventory, window = _prometheus_checks(inputs, prom, clock, checks)
        if inventory is not None and inputs.pools is None:
            pools = tuple(PoolConfig(name=p) for p in inventory.pools())
    checks.append(_checkpoint_check(inputs, inventory, pools))
    if inventory is not None and prom is not None and window is not None:
        checks.extend(_failure_signs(inputs, prom, pools, window))
    checks.extend(_kube_checks(inputs, kube, pools, kube_hint))
    if router is None:
        checks.append(
            Check("router", "skip", "no --router URL given", "pass --router URL to check its /health")
        )
    else:
        try:
            status, body = router.health()
            checks.append(judge_router(router.url, status, body, None))
        except Exception as err:  # the router's verdict, not the doctor's crash
            checks.append(judge_router(router.url, None, None, f"{type(err).__name__}: {err}"))
    return checks


def _prometheus_checks(
    inputs: DoctorInputs, prom: PromApi, clock: Callable[[], float], checks: list[Check]
) -> tuple[Inventory | None, Window]:
    """Reachability, inventory, scrape interval, clock skew, labels, per-pool metrics; and the failure-sign
    window, ending at Prometheus' own time (so local skew does not shift it) at the vLLM jobs' interval."""
    window = Window(end_s=clock(), window_s=inputs.window_s, scrape_s=inputs.tick_s)
    try:
        info = prom.get("status/buildinfo")
        checks.append(judge_reachable(prom.url, str((info or {}).get("version", "")), None))
    except DoctorError as err:
        checks.append(judge_reachable(prom.url, None, str(err)))
        return None, window
    try:
        lookback_s = max(INVENTORY_LOOKBACK_SCRAPES * inputs.tick_s, INVENTORY_MIN_LOOKBACK_S)
        inventory = fetch_inventory(prom, inputs.labels, window.end_s, lookback_s)
    except DoctorError as err:
        checks.append(Check("vllm metrics", "fail", str(err), "check the Prometheus query API"))
        return None, window
    try:
        config = prom.get("status/config")
        _, intervals = scrape_intervals(str((config or {}).get("yaml", "")))
        checks.append(judge_scrape_interval(intervals, inventory.jobs, inputs.tick_s))
        judged = [intervals[j] for j in inventory.jobs if j in intervals]
        window = replace(window, scrape_s=max(judged, default=inputs.tick_s))
    except (DoctorError, ValueError, yaml.YAMLError) as err:  # Thanos, Mimir & co. have no status/config
        checks.append(
            Check(
                "scrape interval",
                "warn",
                f"cannot read Prometheus' configuration: {err}",
                f"check by hand that the vLLM pods are scraped every {inputs.tick_s:g}s or faster",
            )
        )
    try:
        before = clock()
        data = prom.get("query", {"query": "time()"})
        after = clock()
        prom_now_s = float(data["result"][1])
        checks.append(judge_clock_skew(prom_now_s, before, after, inputs.tick_s))
        window = replace(window, end_s=prom_now_s)
    except (DoctorError, KeyError, IndexError, TypeError, ValueError) as err:
        checks.append(Check("clock skew", "fail", f"cannot read Prometheus' time(): {err}", ""))
    checks.append(judge_labels(inventory, inputs.labels))
    for pool in (
        inputs.pools if inputs.pools is not None else tuple(PoolConfig(name=p) for p in inventory.pools())
    ):
        checks.append(judge_pool_metrics(pool.name, inventory, inputs.labels))
    return inventory, window


def _checkpoint_check(
    inputs: DoctorInputs, inventory: Inventory | None, pools: Sequence[PoolConfig]
) -> Check:
    path = inputs.checkpoint or _default_checkpoint()
    try:
        doc: dict[str, Any] | None = read_checkpoint_header(path)
        error = None
    except (OSError, ValueError) as err:
        doc, error = None, f"{type(err).__name__}: {err}"
    # pools without any series already fail their metrics check: not repeated here
    available = (
        {p.name: available_channels(p.name, inventory) for p in pools if inventory.members(p.name)}
        if inventory is not None
        else None
    )
    return judge_checkpoint(path, doc, error, available, inputs.tick_s, is_default=inputs.checkpoint is None)


def _failure_signs(
    inputs: DoctorInputs, prom: PromApi, pools: Sequence[PoolConfig], w: Window
) -> list[Check]:
    out: list[Check] = []

    def guarded(name: str, pool: str, fn: Callable[[], Check]) -> Check:
        try:
            return fn()
        except DoctorError as err:
            return Check(name, "fail", f"query failed: {err}", "check the Prometheus query API", pool)
        except (KeyError, ValueError) as err:  # an unknown profile, a load the capacity model cannot size
            return Check(name, "fail", f"{type(err).__name__}: {err}", "check the pool's profile", pool)

    try:
        pinned, preempted = fetch_kv_pressure(prom, inputs.labels, w)
        saturation = fetch_prefill_saturation(prom, inputs.labels, w)
        prompt_mean = fetch_mean_prompt_tokens(prom, inputs.labels, w)
        ttft, load = fetch_ttft_and_load(prom, inputs.labels, w)
        tick = fetch_tick_p99(prom, w)
    except DoctorError as err:
        return [Check("failure signs", "fail", f"query failed: {err}", "check the Prometheus query API")]
    for pool in pools:
        p = pool.name
        out.append(
            judge_kv_pressure(
                p,
                {m.instance: f for m, f in pinned.items() if m.pool == p},
                {m.instance: v for m, v in preempted.items() if m.pool == p},
            )
        )
        out.append(
            guarded("prefill throughput", p, partial(_prefill_check, pool, saturation, prompt_mean, inputs))
        )
        out.append(
            judge_ttft_imbalance(
                p,
                ttft.get(p, math.nan),
                pool.slo_ttft_ms,
                {m.instance: v for m, v in load.items() if m.pool == p},
            )
        )
    out.append(judge_tick_latency(tick, inputs.tick_s))
    return out


def _prefill_check(
    pool: PoolConfig,
    saturation: Mapping[Member, tuple[float, int]],
    prompt_mean: Mapping[str, float],
    inputs: DoctorInputs,
) -> Check:
    mine = {m.instance: v for m, v in saturation.items() if m.pool == pool.name}
    if inputs.pools is None:
        return judge_prefill_throughput(
            pool.name, mine, None, "pool not in a --config: its hardware profile is unknown"
        )
    mean = prompt_mean.get(pool.name)
    if mean is None or not mean > 0:
        return judge_prefill_throughput(
            pool.name,
            mine,
            None,
            "mean prompt length unknown (needs pdscale:router_requests_total or vllm:request_prompt_tokens)",
        )
    return judge_prefill_throughput(pool.name, mine, expected_prefill_tps(pool.profile, mean))


def _kube_checks(
    inputs: DoctorInputs, kube: KubeProbe | None, pools: Sequence[PoolConfig], hint: str
) -> list[Check]:
    if kube is None:
        how = hint or "pass --kubeconfig FILE (or --in-cluster inside the cluster)"
        return [Check("rbac", "skip", "no kubeconfig given", how)]
    out = [
        judge_rbac(
            inputs.namespace,
            fetch_rbac(kube, inputs.namespace, inputs.leases_namespace, pods=inputs.pods),
            leases_namespace=inputs.leases_namespace,
        )
    ]
    for pool in pools:
        try:
            found = kube.deployments(inputs.namespace, pool.name)
        except Exception as err:  # the check's verdict, never the doctor's crash
            out.append(
                Check(
                    "deployments",
                    "fail",
                    f"cannot list Deployments: {type(err).__name__}: {err}",
                    "",
                    pool.name,
                )
            )
            continue
        out.append(judge_deployments(pool.name, inputs.namespace, found))
    return out
