"""The server's own view of a validation slice: vLLM's latency histograms over the slice, and their quantiles.

The controller never sees a client's TTFT: it reads the servers' histograms ``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds`` and ``vllm:e2e_request_latency_seconds`` (Prometheus ``histogram_quantile``
over bucket rates), and the simulator exports the same histograms under the same names. So besides the
client-side comparison, ``sim validate`` compares these: on the real side the server's buckets differenced over
the slice (one ``/metrics`` scrape before it, one after: ``BucketCounts.delta``), on the sim side the
simulator's buckets at the end of the replay of the same slice (they start at zero), and on both sides the
quantiles computed the same way, by ``serving.sim.samples.histogram_quantile`` (Prometheus' interpolation; the
very function the controller reads a real server's histograms with) on the same bucket bounds.
The bucket bounds are vLLM's defaults on both sides (``serving.sim.samples``); when they differ, ``compare_server``
says so per figure instead of comparing.

What a bucketed quantile can tell: inside one bucket it is a straight-line interpolation, so when both sides'
quantile lies in the same bucket the ratio says only how the two sides' shares of samples in that bucket differ,
not how their values do. vLLM's first ITL bucket is 0-10 ms and the tiny model's decode steps are 2-5 ms: most of
both sides' ITL samples fall in it. Each figure therefore carries the bucket its quantile fell in on each side
(``real_bucket_ms``, ``sim_bucket_ms``), and the means (``sum / count``, exact, no buckets) are compared too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from serving.pools.loadgen import MetricsSnapshot
from serving.sim.samples import (
    E2E_REQUEST_LATENCY_SECONDS,
    INTER_TOKEN_LATENCY_SECONDS,
    TIME_TO_FIRST_TOKEN_SECONDS,
    InstanceSamples,
    histogram_quantile,
)

# figure prefix -> histogram, in the order the tables show them
SERVER_HISTOGRAMS: dict[str, str] = {
    "ttft_ms": TIME_TO_FIRST_TOKEN_SECONDS,
    "itl_ms": INTER_TOKEN_LATENCY_SECONDS,
    "e2e_ms": E2E_REQUEST_LATENCY_SECONDS,
}
QUANTILES = (0.5, 0.9, 0.99)
# what compare_server puts side by side (the means are exact; the quantiles are bucketed)
SERVER_COMPARED = (
    ("ttft_ms", "p50"),
    ("ttft_ms", "p90"),
    ("itl_ms", "p50"),
    ("itl_ms", "p90"),
    ("ttft_ms", "mean"),
    ("itl_ms", "mean"),
    ("e2e_ms", "mean"),
)


@dataclass(frozen=True)
class BucketCounts:
    """One histogram (summed over its label sets): ``cumulative[b]`` observations <= ``bounds_s[b]``, the last
    entry (one more than the bounds) the +Inf bucket, i.e. the count; ``sum_s`` the sum of the observations."""

    bounds_s: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum_s: float

    def __post_init__(self) -> None:
        errors = []
        if len(self.cumulative) != len(self.bounds_s) + 1:
            errors.append(
                f"BucketCounts.cumulative: needs len(bounds_s) + 1 = {len(self.bounds_s) + 1} entries "
                f"(the last is +Inf), got {len(self.cumulative)}"
            )
        if any(b <= a for a, b in pairwise(self.bounds_s)):
            errors.append(f"BucketCounts.bounds_s: must be strictly increasing, got {self.bounds_s}")
        if any(not math.isfinite(b) for b in self.bounds_s):
            errors.append("BucketCounts.bounds_s: finite bounds only (+Inf is implied)")
        c = self.cumulative
        if any(x < 0 or not math.isfinite(x) for x in c) or any(b < a for a, b in pairwise(c)):
            errors.append(f"BucketCounts.cumulative: must be finite, >= 0 and non-decreasing, got {c}")
        if errors:
            raise ValueError("; ".join(errors))

    @property
    def count(self) -> float:
        return self.cumulative[-1]

    def delta(self, before: BucketCounts) -> BucketCounts:
        """What was observed between the scrape ``before`` and this one (same histogram, later scrape).

        Raises ValueError when the bounds differ or a bucket went down (the server restarted between them)."""
        if before.bounds_s != self.bounds_s:
            raise ValueError(
                f"BucketCounts.delta: bucket bounds differ between the scrapes: {before.bounds_s} vs {self.bounds_s}"
            )
        diff = tuple(a - b for a, b in zip(self.cumulative, before.cumulative, strict=True))
        if any(d < 0 for d in diff):
            raise ValueError("BucketCounts.delta: a bucket went down between the scrapes (a server restart?)")
        return BucketCounts(self.bounds_s, diff, self.sum_s - before.sum_s)

    def quantile(self, q: float) -> float:
        return histogram_quantile(q, self.bounds_s, self.cumulative)

    def to_json(self) -> dict[str, Any]:
        return {"bounds_s": list(self.bounds_s), "cumulative": list(self.cumulative), "sum_s": self.sum_s}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> BucketCounts:
        return cls(
            tuple(float(b) for b in doc["bounds_s"]),
            tuple(float(c) for c in doc["cumulative"]),
            float(doc["sum_s"]),
        )


def bucket_of(value: float, bounds_s: Sequence[float]) -> tuple[float, float] | None:
    """The bucket ``(lower, upper]`` (seconds) ``value`` lies in; the +Inf bucket's upper bound is inf."""
    if not math.isfinite(value):
        return None
    i = int(np.searchsorted(np.asarray(bounds_s, dtype=np.float64), value, side="left"))
    lo = 0.0 if i == 0 else float(bounds_s[i - 1])
    return lo, float(bounds_s[i]) if i < len(bounds_s) else math.inf


def from_snapshot(snapshot: MetricsSnapshot, name: str) -> BucketCounts | None:
    """Histogram ``name`` (e.g. ``vllm:time_to_first_token_seconds``) of one ``/metrics`` scrape, its series
    summed over every label but ``le`` (vLLM labels them by engine and model); None when it is not exported."""
    by_le: dict[float, float] = {}
    total_sum = 0.0
    found = False
    for (metric, labels), value in snapshot.values.items():
        if metric == f"{name}_bucket":
            le = dict(labels).get("le")
            if le is None:
                continue
            bound = float(le)
            by_le[bound] = by_le.get(bound, 0.0) + value
            found = True
        elif metric == f"{name}_sum":
            total_sum += value
    if not found or math.inf not in by_le:
        return None
    bounds = tuple(sorted(b for b in by_le if math.isfinite(b)))
    return BucketCounts(bounds, tuple(by_le[b] for b in (*bounds, math.inf)), total_sum)


def from_samples(samples: InstanceSamples, name: str, mask: np.ndarray | None = None) -> BucketCounts | None:
    """Histogram ``name`` of one simulator scrape, summed over its instances (those in ``mask`` if given)."""
    h = samples.histograms.get(name)
    if h is None:
        return None
    keep = np.ones(len(h.counts), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    cumulative = h.counts[keep].sum(axis=0) if len(h.counts) else np.zeros(len(h.bounds_s) + 1)
    return BucketCounts(tuple(h.bounds_s), tuple(float(c) for c in cumulative), float(h.sums[keep].sum()))


def summarize(hists: Mapping[str, BucketCounts | None]) -> dict[str, dict[str, float | None]]:
    """``{figure: {p50, p90, p99, mean, count}}`` in ms (figures as ``SERVER_HISTOGRAMS``' keys), the quantiles
    by ``histogram_quantile``, the mean exact (sum / count); None where the histogram is absent or empty."""
    out: dict[str, dict[str, float | None]] = {}
    for figure in SERVER_HISTOGRAMS:
        h = hists.get(figure)
        row: dict[str, float | None] = {f"p{round(100 * q)}": None for q in QUANTILES}
        row |= {"mean": None, "count": None if h is None else h.count}
        if h is not None and h.count > 0:
            row |= {f"p{round(100 * q)}": 1e3 * h.quantile(q) for q in QUANTILES}
            row["mean"] = 1e3 * h.sum_s / h.count
        out[figure] = row
    return out


def histograms_to_json(hists: Mapping[str, BucketCounts | None]) -> dict[str, Any]:
    return {figure: None if h is None else h.to_json() for figure, h in hists.items()}


def histograms_from_json(doc: dict[str, Any] | None) -> dict[str, BucketCounts | None]:
    """Inverse of ``histograms_to_json``; ``{}`` for None (a recording made before session 6 has none)."""
    if not isinstance(doc, dict):
        return {}
    return {figure: None if h is None else BucketCounts.from_json(h) for figure, h in doc.items()}


def compare_server(
    real: Mapping[str, BucketCounts | None],
    sim: Mapping[str, BucketCounts | None],
    real_means_ms: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """Sim/real of the server-side figures (``SERVER_COMPARED``): ``{"ttft_ms.p50": {real, sim, sim_over_real,
    real_bucket_ms, sim_bucket_ms, bounds_match}, ...}`` in ms. A side without the histogram (a recording from
    before session 6) gives nulls, never 0, except a mean given in ``real_means_ms`` (figure -> ms: such a
    recording's window means, ``server_metrics``); differing bucket bounds give ``bounds_match`` false and no
    ratio for the quantiles (the means stay comparable)."""
    real_sum, sim_sum = summarize(real), summarize(sim)
    for figure, mean in (real_means_ms or {}).items():
        if real.get(figure) is None and mean is not None and math.isfinite(mean):
            real_sum[figure]["mean"] = mean
    out: dict[str, Any] = {}
    for figure, stat in SERVER_COMPARED:
        r, s = real_sum[figure][stat], sim_sum[figure][stat]
        rh, sh = real.get(figure), sim.get(figure)
        match = None if rh is None or sh is None else rh.bounds_s == sh.bounds_s
        ratio = None
        if r is not None and s is not None and r > 0 and (stat == "mean" or match):
            ratio = s / r
        row: dict[str, Any] = {"real": r, "sim": s, "sim_over_real": ratio, "bounds_match": match}
        if stat != "mean":
            for side, h, v in (("real", rh, r), ("sim", sh, s)):
                b = None if h is None or v is None else bucket_of(v / 1e3, h.bounds_s)
                # [lower, upper] in ms; upper null for the +Inf bucket (JSON has no inf)
                row[f"{side}_bucket_ms"] = (
                    None if b is None else [1e3 * b[0], 1e3 * b[1] if math.isfinite(b[1]) else None]
                )
        out[f"{figure}.{stat}"] = row
    return out


def table_rows(compared: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """``compare_server``'s output as text rows ``(figure, real ms, sim ms, sim/real, buckets real | sim)`` for a
    table ('-' where unknown); the last column shows when a quantile is only as fine as its bucket."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    def bucket(b: list[float | None] | None) -> str:
        if b is None:
            return "-"
        return f"{b[0]:g}-{'inf' if b[1] is None else f'{b[1]:g}'}"

    rows = []
    for figure, row in compared.items():
        ratio = row["sim_over_real"]
        where = ""
        if "real_bucket_ms" in row:
            where = f"{bucket(row['real_bucket_ms'])} | {bucket(row['sim_bucket_ms'])}"
        if row["bounds_match"] is False:
            where += " (bounds differ)"
        rows.append(
            (figure, ms(row["real"]), ms(row["sim"]), "-" if ratio is None else f"{ratio:.2f}", where)
        )
    return rows
