"""Per-node training series from a Prometheus server's history (range queries, chunked).

What it reads, per node (the node is the value of ``node_label`` on each series):

| channel | from | how |
|---|---|---|
| ``arrival_rps`` | ``pdscale:router_requests_total``, not decode | increase per step / step (vLLM has no arrivals counter) |
| ``prompt_tps`` | ``vllm:prompt_tokens_total``, not decode | increase per step / step |
| ``gen_tps`` | ``vllm:generation_tokens_total`` | increase per step / step |
| ``running`` | ``vllm:num_requests_running``, not prefill | sum over the node's series |
| ``waiting`` | ``vllm:num_requests_waiting``, not decode | sum over the node's series |
| ``kv_usage`` | ``vllm:kv_cache_usage_perc`` (older vLLM: ``gpu_cache_usage_perc``), not prefill | mean over the node's series |
| ``ttft_p50_s`` ... ``itl_p90_s`` | ``..._seconds_bucket`` histograms | ``histogram_quantile`` over ``rate[4 steps]`` |

Each channel counts the roles the controller counts (``controller.sources.prometheus.channel_queries`` and
``PoolLoad``), so a model trained here sees what the controller will feed it: "not decode" / "not prefill" are
matchers on ``role_label`` (default ``role``). A series without that label is a mixed instance and counts
everywhere. Without them a P/D node would count each prompt twice (the decode server counts it too), add the
decode servers' waiting requests (already prefilled, waiting for a slot) to the prefill queue and a prefill
server's running requests (prefilling) to the sequences decoding.

Both spellings of vLLM names are read (``vllm:x`` from Prometheus 3 or text-format scrapes, ``vllm_x`` from
Prometheus 2 scraping OpenMetrics): ``{__name__=~"vllm[:_]x"}``. Where a node has both, the spelling with
more samples wins (never both: that would double-count). Counters are differenced per series in numpy
(resets handled: a drop means the counter restarted, so its new value is the increase). A step with no
sample is NaN (unknown), never zero.

Prometheus refuses more than 11,000 points per series in one query, so long ranges are read in chunks
of ``max_points`` steps.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import numpy as np

from controller.sources.prometheus import query_range_chunked as _chunked
from forecaster.types import CHANNELS, MetricFrame

MAX_POINTS_PER_QUERY = 10_000  # Prometheus' limit is 11,000; stay clear of off-by-one at the edges
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w|y)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


def parse_duration_s(text: str) -> float:
    """``"7d"`` → 604800.0; ``"90s"``, ``"1.5h"``, ``"500ms"``; a bare number is seconds."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise ValueError(f"cannot read {text!r} as a duration: use e.g. 90s, 30m, 6h, 7d")
    value = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    if value <= 0:
        raise ValueError(f"duration {text!r} must be > 0")
    return value


class RangeQuerier(Protocol):
    """The one call this module needs from a Prometheus client (``PrometheusConnect`` fits)."""

    def custom_query_range(
        self,
        query: str,
        start_time: datetime,
        end_time: datetime,
        step: str,
        params: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class ChannelQuery:
    """How one channel is read: a PromQL expression and how per-series values combine per node."""

    channel: str
    promql: str
    kind: str  # "counter" (difference per series, then sum), "gauge_sum", "gauge_mean", "direct"


def _name_re(name: str, *matchers: str) -> str:
    return "{" + ",".join([f'__name__=~"vllm[:_]{name}"', *matchers]) + "}"


def default_queries(node_label: str, step_s: float, role_label: str = "role") -> tuple[ChannelQuery, ...]:
    """The channel queries listed in this module's docstring, grouped by ``node_label``; roles by ``role_label``."""
    window = f"{max(4.0 * step_s, 4.0):g}s"
    not_decode = f'{role_label}!="decode"'
    not_prefill = f'{role_label}!="prefill"'

    def quantile(q: float, hist: str) -> str:
        return (
            f"histogram_quantile({q}, sum by ({node_label}, le) "
            f'(rate({{__name__=~"vllm[:_]{hist}_bucket"}}[{window}])))'
        )

    return (
        ChannelQuery(
            "arrival_rps", f'{{__name__=~"pdscale[:_]router_requests_total",{not_decode}}}', "counter"
        ),
        ChannelQuery("prompt_tps", _name_re("prompt_tokens_total", not_decode), "counter"),
        ChannelQuery("gen_tps", _name_re("generation_tokens_total"), "counter"),
        ChannelQuery("running", _name_re("num_requests_running", not_prefill), "gauge_sum"),
        ChannelQuery("waiting", _name_re("num_requests_waiting", not_decode), "gauge_sum"),
        ChannelQuery("kv_usage", _name_re("(kv|gpu)_cache_usage_perc", not_prefill), "gauge_mean"),
        ChannelQuery("ttft_p50_s", quantile(0.5, "time_to_first_token_seconds"), "direct"),
        ChannelQuery("ttft_p90_s", quantile(0.9, "time_to_first_token_seconds"), "direct"),
        ChannelQuery("itl_p50_s", quantile(0.5, "inter_token_latency_seconds"), "direct"),
        ChannelQuery("itl_p90_s", quantile(0.9, "inter_token_latency_seconds"), "direct"),
    )


@dataclass(frozen=True, eq=False)
class RawSeries:
    """One returned series on the query grid: ``values[k]`` at ``start_s + k * step_s``, NaN = no sample."""

    labels: Mapping[str, str]
    values: np.ndarray


def query_range_chunked(
    client: RangeQuerier,
    promql: str,
    *,
    start_s: float,
    end_s: float,
    step_s: float,
    timeout_s: float = 60.0,
    max_points: int = MAX_POINTS_PER_QUERY,
) -> list[RawSeries]:
    """Run a range query over [start_s, end_s] in chunks of at most ``max_points`` steps; merge by labels.

    The chunking is the controller's (``controller.sources.prometheus.query_range_chunked``); this adapter only
    turns a ``custom_query_range`` client into its one-chunk call and adds the server-side timeout.
    """

    def call(query: str, params: dict[str, str], span: tuple[datetime, datetime]) -> Any:
        return client.custom_query_range(
            query,
            start_time=span[0],
            end_time=span[1],
            step=params["step"],
            params={**params, "timeout": f"{timeout_s:g}s"},
        )

    series = _chunked(call, promql, start_s=start_s, end_s=end_s, step_s=step_s, max_points=max_points)
    return [RawSeries(labels=s.labels, values=s.values) for s in series]


def counter_increase(values: np.ndarray) -> np.ndarray:
    """Increase of a cumulative counter per step (``[T]`` → ``[T]``, first step NaN; a drop is a reset)."""
    out = np.full(values.shape, np.nan)
    if len(values) < 2:
        return out
    diff = np.diff(values)
    out[1:] = np.where(diff < 0, values[1:], diff)
    return out


def _node_of(labels: Mapping[str, str], node_label: str) -> str | None:
    return labels.get(node_label)


def combine_per_node(
    series: Sequence[RawSeries], query: ChannelQuery, node_label: str, step_s: float
) -> dict[str, np.ndarray]:
    """Per-node channel values from the raw series of one query (see the module docstring)."""
    by_node: dict[str, dict[str, list[np.ndarray]]] = {}
    for s in series:
        node = _node_of(s.labels, node_label)
        if node is None:
            continue
        spelling = s.labels.get("__name__", "")
        spelling = "colon" if ":" in spelling else "underscore"
        vals = counter_increase(s.values) / step_s if query.kind == "counter" else s.values
        by_node.setdefault(node, {}).setdefault(spelling, []).append(vals)
    out: dict[str, np.ndarray] = {}
    for node, spellings in by_node.items():
        # One spelling per node: the one with more observed samples (both would double-count).
        best = max(spellings.values(), key=lambda group: sum(int(np.isfinite(g).sum()) for g in group))
        stack = np.vstack(best)
        seen = np.isfinite(stack).any(axis=0)
        combined = np.nansum(stack, axis=0)
        if query.kind == "gauge_mean":
            combined = combined / np.maximum(1, np.isfinite(stack).sum(axis=0))
        out[node] = np.where(seen, combined, np.nan)
    return out


def load_prometheus_history(
    client: RangeQuerier,
    *,
    end_s: float,
    range_s: float,
    step_s: float = 1.0,
    node_label: str = "node",
    role_label: str = "role",
    timeout_s: float = 60.0,
    max_points: int = MAX_POINTS_PER_QUERY,
    queries: Sequence[ChannelQuery] | None = None,
    progress: Callable[[str], None] | None = None,
) -> MetricFrame:
    """Every node's channels (``forecaster.types.CHANNELS``) over (end_s − range_s, end_s], one step apart.

    ``end_s`` is passed in (the caller reads the clock). Nodes are those with at least one series under
    any query; a channel a node lacks is all-NaN (unknown).
    """
    start_s = float(np.floor(end_s - range_s + step_s))
    n_steps = int(np.floor((end_s - start_s) / step_s + 1e-9)) + 1
    per_channel: dict[str, dict[str, np.ndarray]] = {}
    for q in queries if queries is not None else default_queries(node_label, step_s, role_label):
        if q.channel not in CHANNELS:
            raise ValueError(f"query for unknown channel {q.channel!r}; channels are {CHANNELS}")
        if progress is not None:
            progress(f"{q.channel}: {q.promql}")
        raw = query_range_chunked(
            client,
            q.promql,
            start_s=start_s,
            end_s=end_s,
            step_s=step_s,
            timeout_s=timeout_s,
            max_points=max_points,
        )
        per_channel[q.channel] = combine_per_node(raw, q, node_label, step_s)
    nodes = tuple(sorted({n for chan in per_channel.values() for n in chan}))
    values = np.full((len(nodes), len(CHANNELS), n_steps), np.nan)
    for c, channel in enumerate(CHANNELS):
        for n, node in enumerate(nodes):
            got = per_channel.get(channel, {}).get(node)
            if got is not None:
                values[n, c, :] = got
    return MetricFrame(
        node_ids=nodes,
        metrics=CHANNELS,
        times_s=start_s + step_s * np.arange(n_steps, dtype=np.float64),
        values=values,
    )


def connect(url: str, timeout_s: float = 60.0) -> RangeQuerier:
    """A ``PrometheusConnect`` client for ``url`` (imported here: the library pulls in ``requests``)."""
    from prometheus_api_client import PrometheusConnect

    client: RangeQuerier = PrometheusConnect(url=url, disable_ssl=True, timeout=int(np.ceil(timeout_s)))
    return client
