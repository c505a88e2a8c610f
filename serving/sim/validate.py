"""Validate the simulator against real vLLM: replay one bounded trace slice on a real CPU server.

This module is the collection side. ``scale_slice`` cuts a trace into a slice the tiny CPU server can serve
(a few hundred requests, lengths clipped to the model's context, arrivals time-scaled to a target rate);
``run_real`` replays that slice against a real server with the open-loop load generator
(``serving.pools.loadgen``) and returns per-request ``RequestTimings``; ``validate`` does both around a
server it starts and stops itself and returns a JSON-ready document.

The sim side: ``simulate_slice`` replays the SAME slice (``scale_slice``'s output, same arrival times and
lengths) through the simulator with one ``mixed`` instance of profile ``cpu-tiny`` (``max_num_seqs`` as the
real server's; the latency model from ``profiles/cpu_tiny.json`` or another JSON of that shape), then
``compare(real_doc, sim_report.to_json())`` gives P50/P90 TTFT and per-request mean ITL as sim/real ratios.
TTFT is the sensitive one (queueing plus prefill plus the per-request overhead); ITL checks the decode-step
model. ``load_real`` reads a recorded real run back, so the sim side can be rerun without a server
(``bench/bench_vllm_cpu.py --validate --real-json FILE``).

Besides the client's percentiles a real run records every request's timings (``requests``) and the
server's own view over the replay window (``server_metrics``: mean queue, prefill and TTFT time from vLLM's
histograms), and, with ``iteration_details``, every engine step's engine-timed duration (``iterations``):
enough to tell engine time from what happens around it.

Two views (session 6): ``compare`` is the client's (what the load generator timed); ``compare_server`` is the
server's, what the controller reads: vLLM's TTFT / ITL / e2e histograms differenced over the slice
(``server_histograms``, scraped with ``settled_scrape`` before and after) against the simulator's exported
histograms after the replay, quantiles by the same ``histogram_quantile`` on the same buckets
(``serving.sim.server_view``). Recordings made before session 6 have no histograms: their server side is the
window means of ``server_metrics`` only.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from serving.pools.iterations import ITERATION_FLAG, parse_iterations
from serving.pools.loadgen import MetricsSnapshot, RequestTimings, run_replay, scrape
from serving.pools.local import InstanceConfig, LocalInstance, start_instance
from serving.pools.tinymodel import build_tiny_model, normal_token_ids
from serving.sim import server_view
from serving.sim.calibrate import CalibrationSpec
from serving.workload.trace import Trace

if TYPE_CHECKING:
    from collections.abc import Mapping

    from serving.sim.fleet import FleetSpec
    from serving.sim.replay import ReplayPolicy, ReplayView, ScaleCommand

COMPARED = (("ttft_ms", "p50"), ("ttft_ms", "p90"), ("itl_ms", "p50"), ("itl_ms", "p90"))


@dataclass(frozen=True)
class SliceSpec:
    """How a trace is cut down for the tiny CPU server.

    Defaults: 120 requests at 1 req/s (2 minutes of load), prompts <= 512 and outputs <= 32 tokens. Measured
    2026-11-29 on the shared 2-core box (load average ~12): 240 requests at 3 req/s with prompts <= 768 and
    outputs <= 64 overloaded the server (0.88 req/s served, TTFT p50 72 s), so the defaults sit well below
    that; on a quiet machine raise ``target_rps`` (capacity there is several times higher). Prompt + output
    stays within ``max_model_len`` (1024).
    """

    n_requests: int = 120
    start_index: int = 0
    target_rps: float = 1.0  # mean offered rate after time scaling; NaN/<=0 rejected
    max_prompt_tokens: int = 512
    max_output_tokens: int = 32
    max_model_len: int = 1024

    def __post_init__(self) -> None:
        errors = []
        if self.n_requests < 1:
            errors.append(f"SliceSpec.n_requests: must be >= 1, got {self.n_requests}")
        if self.start_index < 0:
            errors.append(f"SliceSpec.start_index: must be >= 0, got {self.start_index}")
        if not (self.target_rps > 0 and math.isfinite(self.target_rps)):
            errors.append(f"SliceSpec.target_rps: must be a positive number, got {self.target_rps}")
        if self.max_prompt_tokens < 1 or self.max_output_tokens < 1:
            errors.append("SliceSpec.max_prompt_tokens/max_output_tokens: must be >= 1")
        if self.max_prompt_tokens + self.max_output_tokens > self.max_model_len:
            errors.append(
                f"SliceSpec: max_prompt_tokens + max_output_tokens = "
                f"{self.max_prompt_tokens + self.max_output_tokens} exceeds max_model_len {self.max_model_len}"
            )
        if errors:
            raise ValueError("; ".join(errors))


def scale_slice(trace: Trace, spec: SliceSpec | None = None) -> Trace:
    """Rows ``[start_index, start_index + n_requests)`` of ``trace``: arrivals re-based to 0 and stretched or
    compressed so the mean offered rate is ``target_rps`` (burst shape kept), lengths clipped to [1, max].

    The result is what both the real server and the simulator replay.
    """
    spec = spec or SliceSpec()
    stop = min(spec.start_index + spec.n_requests, len(trace))
    if stop <= spec.start_index:
        raise ValueError(
            f"scale_slice: trace {trace.source or '<memory>'} has {len(trace)} rows, "
            f"start_index {spec.start_index} leaves none"
        )
    part = trace.take(slice(spec.start_index, stop))
    t = part.arrival_s - part.arrival_s[0]
    n = len(part)
    span = float(t[-1]) if n > 1 else 0.0
    # n requests at rate r span (n - 1) / r seconds; a zero-length span (all at once) stays all at once.
    factor = ((n - 1) / spec.target_rps) / span if span > 0 else 0.0
    return Trace.from_arrays(
        arrival_s=t * factor,
        prompt_tokens=np.clip(part.prompt_tokens, 1, spec.max_prompt_tokens),
        output_tokens=np.clip(part.output_tokens, 1, spec.max_output_tokens),
        priority=part.priority,
        source=f"{trace.source or '<memory>'} rows {spec.start_index}:{stop} scaled to {spec.target_rps} req/s",
        format="synthetic",
    )


def run_real(
    trace_slice: Trace,
    server: LocalInstance | str,
    *,
    model_dir: Path | None = None,
    seed: int = 0,
) -> RequestTimings:
    """Replay ``trace_slice`` (arrival times as given) against ``server`` (a ``LocalInstance`` or a base URL,
    which then needs ``model_dir`` for the prompt vocabulary) and return every request's timings."""
    if isinstance(server, LocalInstance):
        url, model_dir = server.url, model_dir or server.config.model_dir
    else:
        url = server.rstrip("/")
    if model_dir is None:
        raise ValueError("run_real: model_dir is required when server is a URL (prompts use its vocabulary)")
    return run_replay(url, trace_slice, normal_token_ids(model_dir), seed=seed)


def _server_counters(url: str, m: MetricsSnapshot | None = None) -> dict[str, float]:
    m = scrape(url) if m is None else m
    names = m.names()

    def pick(*candidates: str) -> float:
        return next((m.total(n) for n in candidates if n in names), math.nan)

    out = {
        "prompt_tokens": pick("vllm:prompt_tokens_total", "vllm:prompt_tokens"),
        "generation_tokens": pick("vllm:generation_tokens_total", "vllm:generation_tokens"),
        "preemptions": pick("vllm:num_preemptions_total", "vllm:num_preemptions"),
        "ttft_mean_ms": 1e3
        * pick("vllm:time_to_first_token_seconds_sum")
        / pick("vllm:time_to_first_token_seconds_count"),
        "itl_mean_ms": 1e3
        * pick("vllm:inter_token_latency_seconds_sum")
        / pick("vllm:inter_token_latency_seconds_count"),
    }
    # sums and counts of the server's own per-request histograms (differenced over the replay window)
    for key in SERVER_HISTOGRAMS:
        out[f"{key}_sum"] = pick(f"vllm:{key}_seconds_sum")
        out[f"{key}_count"] = pick(f"vllm:{key}_seconds_count")
    return out


# vLLM's per-request histograms: time from the API server's arrival stamp to the first token, time waiting
# in the engine's queue, time in prefill (first scheduled to first token), in decode, end to end.
SERVER_HISTOGRAMS = (
    "time_to_first_token",
    "request_queue_time",
    "request_prefill_time",
    "request_decode_time",
    "e2e_request_latency",
)


def _window_means_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean of each server histogram over the replay window, in ms (NaN when absent or empty)."""
    out: dict[str, float] = {}
    for key in SERVER_HISTOGRAMS:
        n = after[f"{key}_count"] - before[f"{key}_count"]
        total = after[f"{key}_sum"] - before[f"{key}_sum"]
        out[f"{key}_mean_ms"] = 1e3 * total / n if n > 0 else math.nan
    return out


def settled_scrape(
    url: str, expect_finished: float, *, timeout_s: float = 10.0, poll_s: float = 0.2
) -> tuple[MetricsSnapshot, bool]:
    """A ``/metrics`` scrape once the server's e2e histogram counts ``expect_finished`` requests (or after
    ``timeout_s``; the flag says which). vLLM records a step's stats after it hands the outputs to the
    requests' streams, so a scrape right after the last response can miss the last requests."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = scrape(url)
        done = m.total(f"{server_view.SERVER_HISTOGRAMS['e2e_ms']}_count")
        if math.isfinite(done) and done >= expect_finished:
            return m, True
        if time.monotonic() > deadline:
            return m, False
        time.sleep(poll_s)


def server_histogram_deltas(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, Any]:
    """The server's TTFT / ITL / e2e histograms over the window between two scrapes (``BucketCounts.to_json``
    per figure; null where the server does not export one)."""
    out: dict[str, server_view.BucketCounts | None] = {}
    for figure, name in server_view.SERVER_HISTOGRAMS.items():
        b, a = server_view.from_snapshot(before, name), server_view.from_snapshot(after, name)
        out[figure] = None if a is None else a if b is None else a.delta(b)
    return server_view.histograms_to_json(out)


def _iteration_summary(log_text: str) -> dict[str, Any]:
    """Engine-timed steps of the replay window: those with prompt tokens (prefill or mixed) and
    decode-only ones, count and p10/p50/p90/mean ms each, plus every step as rows."""
    its = parse_iterations(log_text)
    out: dict[str, Any] = {"steps": len(its)}
    with_prompt = its.ctx_requests > 0
    for name, sel in (("prefill_or_mixed", with_prompt), ("decode_only", ~with_prompt)):
        ms = its.elapsed_ms[sel]
        stats: dict[str, Any] = {"count": int(sel.sum())}
        if ms.size:
            stats |= {f"p{q}_ms": float(np.percentile(ms, q)) for q in (10, 50, 90)}
            stats["mean_ms"] = float(ms.mean())
        out[name] = stats
    out["rows"] = {
        "ctx_requests": its.ctx_requests.tolist(),
        "ctx_tokens": its.ctx_tokens.tolist(),
        "gen_requests": its.gen_requests.tolist(),
        "elapsed_ms": [round(float(x), 3) for x in its.elapsed_ms],
    }
    return out


def _request_rows(t: RequestTimings) -> dict[str, list[Any]]:
    """Every request's client-side timings (ms; None where not measured), aligned with the slice."""

    def ms(x: np.ndarray) -> list[float | None]:
        return [round(float(v) * 1e3, 3) if math.isfinite(float(v)) else None for v in x]

    return {
        "scheduled_ms": ms(t.scheduled_s),
        "sent_ms": ms(t.sent_s),
        "ttft_ms": ms(t.ttft_s),
        "itl_mean_ms": ms(t.itl_mean_s),
        "e2e_ms": ms(t.e2e_s),
        "prompt_tokens": t.prompt_tokens.tolist(),
        "output_tokens": t.output_tokens.tolist(),
        "completion_tokens": t.completion_tokens.tolist(),
    }


def _finite_or_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    return x


def validate(
    trace: Trace,
    *,
    work_dir: Path,
    spec: SliceSpec | None = None,
    max_num_seqs: int = 16,
    seed: int = 0,
    health_timeout_s: float = 300.0,
    iteration_details: bool = False,
    calibration: CalibrationSpec | None = None,
) -> dict[str, Any]:
    """Cut ``trace`` with ``spec``, start a mixed tiny-model server under ``work_dir``, replay the slice,
    stop the server, and return ``{"slice", "server", "real", "requests", "server_metrics"}`` plus
    ``iterations`` with ``iteration_details`` (the server then logs every engine step: a little more work in
    its API process) (JSON-ready; NaN → null).

    With ``calibration``, the server first runs ``serving.sim.calibrate.calibrate`` (step times and probes,
    rows under ``work_dir/calibration``; iteration details are then on) and the document gets its
    ``calibration`` (the fitted profile, its provenance and rows); the slice starts after the server is idle
    again and the same warm-up as without it.

    Example::

        doc = validate(read_trace("datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv"),
                       work_dir=Path("out/validate"))
        doc["real"]["ttft_ms"]["p90"]
    """
    spec = spec or SliceSpec()
    trace_slice = scale_slice(trace, spec)
    model_dir = build_tiny_model(work_dir / "tiny-llama", seed=0)
    iteration_details = iteration_details or calibration is not None  # the calibration's engine-timed rows
    config = InstanceConfig(
        model_dir=model_dir,
        max_num_seqs=max_num_seqs,
        max_model_len=spec.max_model_len,
        extra_args=(ITERATION_FLAG,) if iteration_details else (),
    )
    calibrated: dict[str, Any] | None = None
    with start_instance(config, work_dir / "logs") as server:
        ready_s = server.wait_healthy(health_timeout_s)
        finished_before = 0.0
        if calibration is not None:
            calibrated = _calibrate(server, model_dir, calibration, work_dir / "calibration")
            finished_before = scrape(server.url).total(f"{server_view.SERVER_HISTOGRAMS['e2e_ms']}_count")
        # Warm-up outside the measured slice: the first requests pay lazy initialisation.
        warm = run_real(scale_slice(trace, SliceSpec(n_requests=4, target_rps=4.0)), server, seed=seed + 1)
        scrape_before, settled_before = settled_scrape(server.url, finished_before + float(np.sum(warm.ok)))
        before = _server_counters(server.url, scrape_before)
        log_offset = server.log_path.stat().st_size
        timings = run_real(trace_slice, server, seed=seed)
        scrape_after, settled_after = settled_scrape(
            server.url, before["e2e_request_latency_count"] + float(np.sum(timings.ok))
        )
        after = _server_counters(server.url, scrape_after)
        with server.log_path.open("rb") as f:
            f.seek(log_offset)
            log_text = f.read().decode(errors="replace")
    server_metrics = {k: after[k] - before[k] for k in ("prompt_tokens", "generation_tokens", "preemptions")}
    server_metrics |= {
        "ttft_mean_ms_cumulative": after["ttft_mean_ms"],
        "itl_mean_ms_cumulative": after["itl_mean_ms"],
    }
    server_metrics |= _window_means_ms(before, after)
    server_metrics["scrapes_settled"] = settled_before and settled_after
    doc = {
        "slice": asdict(spec)
        | {
            "source": trace_slice.source,
            "requests": len(trace_slice),
            "duration_s": trace_slice.duration_s,
            "prompt_tokens_mean": float(np.mean(trace_slice.prompt_tokens)),
            "output_tokens_mean": float(np.mean(trace_slice.output_tokens)),
        },
        "server": {
            "profile": "cpu-tiny",
            "role": "mixed",
            "max_num_seqs": max_num_seqs,
            "dtype": config.dtype,
            "healthy_after_s": ready_s,
            "log": str(server.log_path),
        },
        "real": timings.summary(),
        "requests": _request_rows(timings),
        "server_metrics": server_metrics,
        # the server's own histograms over the slice (scrape after minus scrape before): the controller's view
        "server_histograms": server_histogram_deltas(scrape_before, scrape_after),
    }
    if iteration_details:
        doc["iterations"] = _iteration_summary(log_text)
    if calibrated is not None:
        doc["calibration"] = calibrated
    return dict(_finite_or_none(doc))


def _calibrate(
    server: LocalInstance, model_dir: Path, spec: CalibrationSpec, out_dir: Path
) -> dict[str, Any]:
    """``calibrate`` on the validation's server, the shipped profile as the document's base; warm-up first
    (the same unrecorded requests as ``bench_vllm_cpu.py``'s measurements)."""
    import json

    from serving.sim.calibrate import calibrate
    from serving.sim.cpu_tiny_measure import warm_up
    from serving.sim.latency import CPU_TINY_JSON

    vocab = normal_token_ids(model_dir)
    warm_up(server.url, vocab)
    return calibrate(server, vocab, spec, out_dir, base=json.loads(CPU_TINY_JSON.read_text()))


def load_real(path: Path) -> dict[str, Any]:
    """A recorded real run: ``validate``'s document, or a ``bench_vllm_cpu.py --validate-json`` document
    (its ``real`` field is ``validate``'s). Raises ValueError naming the file and the missing field."""
    import json

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read a recorded validation run: {exc}") from exc
    if isinstance(doc, dict) and isinstance(doc.get("real"), dict) and "slice" in doc["real"]:
        doc = doc["real"]
    for key in ("slice", "server", "real"):
        if not isinstance(doc, dict) or not isinstance(doc.get(key), dict):
            raise ValueError(f"{path}: field {key!r} missing: not a validate() document")
    for key in ("ttft_ms", "itl_ms"):
        if not isinstance(doc["real"].get(key), dict):
            raise ValueError(f"{path}: field 'real.{key}' missing")
    return dict(doc)


def spec_of(real_doc: dict[str, Any]) -> SliceSpec:
    """The ``SliceSpec`` a recorded run used (its ``slice`` field)."""
    names = SliceSpec.__dataclass_fields__
    return SliceSpec(**{k: v for k, v in real_doc["slice"].items() if k in names})


def check_same_slice(real_doc: dict[str, Any], trace_slice: Trace, where: str = "recorded run") -> None:
    """Raise ValueError when ``trace_slice`` is not the slice the recorded run replayed (count, mean lengths)."""
    sl = real_doc["slice"]
    mine = {
        "requests": len(trace_slice),
        "prompt_tokens_mean": float(np.mean(trace_slice.prompt_tokens)),
        "output_tokens_mean": float(np.mean(trace_slice.output_tokens)),
    }
    for key, value in mine.items():
        theirs = sl.get(key)
        if not isinstance(theirs, int | float) or not math.isclose(float(theirs), value, rel_tol=1e-9):
            raise ValueError(
                f"{where}: slice.{key} is {theirs}, but the trace cut the same way gives {value} "
                f"(a different trace file? the run's slice source: {sl.get('source')})"
            )


@dataclass(frozen=True)
class ClientOutside:
    """The client's TTFT beyond the simulator's (session 9): what a real client times outside vLLM's own TTFT
    (HTTP, rendering and tokenising before its stamp, the first chunk's detokenising and flush), less what the
    profile already places outside the stamp. Per request: ``const_ms + per_prompt_token_ms * prompt tokens +
    per_inflight_ms * (other requests in flight in the simulator when it arrives)``, plus, with ``residuals_ms``,
    one of them drawn per request (seeded by ``seed``): the lone rows' spread about the fit, so the term's
    distribution is the measured one, not its mean. Fitted by ``cpu_tiny_fit.fit_client_outside`` from
    ``--calibrate``'s outside rows; moves the client's TTFT only (the exported histograms, ITL and the replay
    itself are untouched)."""

    const_ms: float = 0.0
    per_prompt_token_ms: float = 0.0
    per_inflight_ms: float = 0.0
    residuals_ms: tuple[float, ...] = ()
    seed: int = 0

    def added_ms(self, prompt_tokens: np.ndarray, inflight: np.ndarray) -> np.ndarray:
        out = self.const_ms + self.per_prompt_token_ms * prompt_tokens + self.per_inflight_ms * inflight
        if self.residuals_ms:
            rng = np.random.default_rng(self.seed)
            out = out + rng.choice(
                np.asarray(self.residuals_ms, dtype=np.float64), size=np.shape(prompt_tokens)
            )
        return np.asarray(out, dtype=np.float64)


def client_ttft_with_outside(
    trace_slice: Trace, arrival_s: np.ndarray, ttft_ms: np.ndarray, itl_ms: np.ndarray, term: ClientOutside
) -> np.ndarray:
    """The simulator's per-request client TTFT plus ``term``: in-flight counts from the simulated timeline (a
    request is in flight from its arrival to its last token, ``ttft + itl * (tokens - 1)``); unfinished requests
    (NaN TTFT) stay NaN."""
    from serving.sim.cpu_tiny_measure import inflight_at_send

    tokens = np.asarray(trace_slice.output_tokens, dtype=np.float64)
    decode_ms = np.where(tokens > 1, np.nan_to_num(itl_ms) * (tokens - 1), 0.0)
    done = arrival_s + (ttft_ms + decode_ms) / 1e3
    inflight = inflight_at_send(arrival_s, np.where(np.isfinite(done), done, np.inf))
    prompt = np.asarray(trace_slice.prompt_tokens, dtype=np.float64)
    return np.asarray(ttft_ms + term.added_ms(prompt, inflight), dtype=np.float64)


def simulate_slice(
    trace_slice: Trace,
    *,
    max_num_seqs: int = 16,
    latency_json: Path | None = None,
    client_outside: ClientOutside | None = None,
) -> dict[str, Any]:
    """Replay ``trace_slice`` in the simulator on one mixed ``cpu-tiny`` instance with ``max_num_seqs``;
    the latency model from ``latency_json`` (``profiles/cpu_tiny.json``'s shape; default that file).
    Returns the ``ReplayReport.to_json()`` document; with ``client_outside`` its client TTFT (``ttft_ms``,
    ``request_ttft_ms``) holds that term (``client_ttft_with_outside``) and ``ttft_ms_in_sim`` the replay's own."""
    from serving.sim.fleet import single_pool
    from serving.sim.hardware import get_profile
    from serving.sim.latency import CPU_TINY_JSON, load_linear_profile
    from serving.sim.replay import PolicyOptions, make_policy, replay

    profile = get_profile("cpu-tiny").with_overrides(max_num_seqs=max_num_seqs)
    model = load_linear_profile(profile, latency_json or CPU_TINY_JSON)
    policy = _KeepLastView(make_policy("fixed", PolicyOptions(mixed=1)))
    report = replay(
        single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
        {"default": trace_slice},
        policy,
        models=lambda _name: (profile, model),
    )
    doc = dict(report.to_json())
    ttft = np.asarray(report.request_ttft_ms, dtype=np.float64)
    if client_outside is not None:
        from serving.sim.report import percentiles

        ttft = client_ttft_with_outside(
            trace_slice, np.asarray(report.arrival_s), ttft, np.asarray(report.request_itl_ms), client_outside
        )
        doc["ttft_ms_in_sim"], doc["ttft_ms"] = doc["ttft_ms"], percentiles(ttft)
        doc["client_outside"] = asdict(client_outside)
    doc["request_ttft_ms"] = [round(float(x), 3) for x in ttft]  # slice order
    if policy.view is not None:
        # the simulator's exported histograms once the slice has drained (they start at zero: no warm-up)
        final = policy.view.scrape()
        doc["server_histograms"] = server_view.histograms_to_json(
            {f: server_view.from_samples(final, name) for f, name in server_view.SERVER_HISTOGRAMS.items()}
        )
    return doc


class _KeepLastView:
    """A replay policy that delegates to ``inner`` and keeps the last tick's view, whose ``scrape`` then reads
    the simulator as the replay left it (one scrape after the replay; none during it, so nothing changes)."""

    def __init__(self, inner: ReplayPolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.view: ReplayView | None = None

    def reset(self, fleet: FleetSpec, traces: Mapping[str, Trace]) -> None:
        self.inner.reset(fleet, traces)

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]:
        self.view = view
        return self.inner.on_tick(now_s, view)


def compare(real: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """Sim/real ratios of P50/P90 TTFT and ITL. ``real`` is ``validate(...)["real"]`` (or a
    ``RequestTimings.summary()``), ``sim`` a ``ReplayReport.to_json()``; both carry ``{ttft_ms, itl_ms}`` →
    ``{p50, p90, p99}`` in ms. A missing or null figure gives a null ratio, never 0."""
    out: dict[str, Any] = {}
    for metric, q in COMPARED:
        r = (real.get(metric) or {}).get(q)
        s = (sim.get(metric) or {}).get(q)
        ratio = None
        if isinstance(r, int | float) and isinstance(s, int | float) and r > 0 and math.isfinite(s):
            ratio = float(s) / float(r)
        out[f"{metric}.{q}"] = {"real": r, "sim": s, "sim_over_real": ratio}
    return out


CALIBRATED = "calibrated"  # the key of the profile fitted on the validation's own server (``--calibrate``)
# the calibrated profile with the client-side term fitted from the same calibration's outside rows (session 9),
# and the same with the s8w overhead share fitted from them too (the term then holds the rest)
CALIBRATED_OUTSIDE = "calibrated+outside"
CALIBRATED_OUTSIDE_SHARE = "calibrated+outside+share"
# the term with the lone rows' residuals drawn per request (the measured spread, not only its typical value)
CALIBRATED_OUTSIDE_SAMPLED = "calibrated+outside-sampled"
# the term fitted by least squares (the rows' mean outside, tail included) instead of least absolute deviations
CALIBRATED_OUTSIDE_MEAN = "calibrated+outside-mean"


def outside_variants(calibration: dict[str, Any]) -> dict[str, Any] | None:
    """From a recorded calibration with outside rows (``calibration["outside"]["csv"]``): the fit
    (``cpu_tiny_fit.fit_client_outside``, least absolute deviations; the least-squares one as ``mean_fit``), the
    overhead share it implies at the lone rows' mean prompt, and per variant key the profile (the calibrated one;
    with the share set for ``CALIBRATED_OUTSIDE_SHARE``) and its ``ClientOutside``. None when the recording has
    no outside rows (session 8's)."""
    from serving.sim.cpu_tiny_fit import OUTSIDE_TERMS, fit_client_outside, overhead_outside_share
    from serving.sim.cpu_tiny_measure import parse_outside

    text = (calibration.get("outside") or {}).get("csv")
    if not isinstance(text, str):
        return None
    rows = parse_outside(text, "the recorded calibration's outside rows")
    fit = fit_client_outside(rows)
    mean_fit = fit_client_outside(rows, loss="mean")
    profile = calibration["profile"]
    overhead = float((profile.get("overheads") or {}).get("request_overhead_ms", 0.0))
    lone_prompt = float(np.mean(rows["prompt_tokens_mean"][rows["kind"] == "lone"]))
    share = overhead_outside_share(fit, overhead, lone_prompt)
    term = ClientOutside(fit["const_ms"], fit["per_prompt_token_ms"], fit["per_inflight_ms"])
    shared = dict(profile) | {"overheads": dict(profile.get("overheads") or {})}
    shared["overheads"]["request_overhead_outside_fraction"] = share
    return {
        "fit": fit | {"request_overhead_outside_fraction": share, "mean_fit": mean_fit},
        CALIBRATED_OUTSIDE: (profile, term),
        # the share's part of the overhead already lies outside the sim's stamp: the term adds the rest
        CALIBRATED_OUTSIDE_SHARE: (
            shared,
            ClientOutside(**(asdict(term) | {"const_ms": term.const_ms - share * overhead})),
        ),
        CALIBRATED_OUTSIDE_SAMPLED: (profile, replace(term, residuals_ms=tuple(fit["lone_residuals_ms"]))),
        CALIBRATED_OUTSIDE_MEAN: (profile, ClientOutside(*(mean_fit[k] for k in OUTSIDE_TERMS))),
    }


def validate_against_sim(
    trace: Trace,
    *,
    work_dir: Path,
    spec: SliceSpec | None = None,
    max_num_seqs: int = 16,
    real_json: Path | None = None,
    profile_jsons: list[Path] | None = None,
    iteration_details: bool = False,
    calibration: CalibrationSpec | None = None,
    overheads: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Real vs simulated on one slice of ``trace``: the real side is a replay on a server this starts
    (``validate``, with ``calibration`` measured on it first) or, with ``real_json``, a recorded run (no server;
    its slice and ``max_num_seqs`` are used and the slice is checked to be the same); then the simulator on that
    slice once per latency JSON in ``profile_jsons`` (default ``profiles/cpu_tiny.json``), and, when the real
    run carries a ``calibration`` (fresh or recorded), once more with its fitted profile under the key
    ``CALIBRATED``. Returns ``{"real", "sim", "compare", "compare_server", "within_goal"}``, the per-profile
    parts keyed by the JSON's path (relative to the repository when inside it) or ``CALIBRATED``.

    Example::

        doc = validate_against_sim(read_trace(path), work_dir=Path("out/v"), real_json=Path("run.json"))
        doc["compare"]["serving/sim/profiles/cpu_tiny.json"]["ttft_ms.p50"]["sim_over_real"]
    """
    import json
    import tempfile

    from serving.sim.latency import CPU_TINY_JSON

    if real_json is not None:
        if calibration is not None:
            raise ValueError("validate: --calibrate measures on a real server; it cannot go with --real-json")
        real = load_real(real_json)
        spec = spec_of(real)
        max_num_seqs = int(real["server"]["max_num_seqs"])
        trace_slice = scale_slice(trace, spec)
        check_same_slice(real, trace_slice, where=str(real_json))
    else:
        spec = spec or SliceSpec()
        trace_slice = scale_slice(trace, spec)
        real = validate(
            trace,
            work_dir=work_dir,
            spec=spec,
            max_num_seqs=max_num_seqs,
            iteration_details=iteration_details,
            calibration=calibration,
        )
    root = Path(__file__).resolve().parents[2]
    profiles: dict[str, Path] = {}
    for path in profile_jsons or [CPU_TINY_JSON]:
        resolved = Path(path).resolve()
        profiles[str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)] = Path(path)
    # a recording from before session 6 has no histograms, only the server's window means of TTFT and e2e
    metrics = real.get("server_metrics") or {}
    recorded_means = {
        "ttft_ms": metrics.get("time_to_first_token_mean_ms"),
        "e2e_ms": metrics.get("e2e_request_latency_mean_ms"),
    }
    sims: dict[str, Any] = {}
    comparisons: dict[str, Any] = {}
    server_comparisons: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        fitted = (real.get("calibration") or {}).get("profile")
        terms: dict[str, ClientOutside] = {}
        outside_fit = None
        if isinstance(fitted, dict):
            profiles[CALIBRATED] = Path(tmp) / "cpu_tiny_calibrated.json"
            profiles[CALIBRATED].write_text(json.dumps(fitted))
            variants = outside_variants(real["calibration"])
            if variants is not None:
                outside_fit = variants.pop("fit")
                for key, (prof, term) in variants.items():
                    profiles[key] = Path(tmp) / f"cpu_tiny_{key.replace('+', '_')}.json"
                    profiles[key].write_text(json.dumps(prof))
                    terms[key] = term
        if overheads:  # every profile's overheads with these set (e.g. the outside shares), as a variant
            for i, key in enumerate(list(profiles)):
                doc = json.loads(profiles[key].read_text())
                doc["overheads"] = dict(doc.get("overheads") or {}) | overheads
                profiles[key] = Path(tmp) / f"cpu_tiny_variant_{i}.json"
                profiles[key].write_text(json.dumps(doc))
        for key, path in profiles.items():
            sims[key] = simulate_slice(
                trace_slice, max_num_seqs=max_num_seqs, latency_json=path, client_outside=terms.get(key)
            )
            comparisons[key] = compare(real["real"], sims[key])
            server_comparisons[key] = server_view.compare_server(
                server_view.histograms_from_json(real.get("server_histograms")),
                server_view.histograms_from_json(sims[key].get("server_histograms")),
                real_means_ms=recorded_means,
            )
    return {
        "real": real,
        "sim": sims,
        "compare": comparisons,
        "compare_server": server_comparisons,
        "server_view_recorded": isinstance(real.get("server_histograms"), dict),
        "client_outside_fit": outside_fit,
        "within_goal": {
            key: {"client": within_goal(comparisons[key]), "server": within_goal(server_comparisons[key])}
            for key in profiles
        },
    }


def side_by_side(doc: dict[str, Any]) -> list[tuple[str, str, Any, list[tuple[float | None, bool]]]]:
    """``validate_against_sim``'s document as rows ``(view, figure, real ms, [(sim/real, within the goal) per
    profile, in ``within_goal``'s order])`` for the P50/P90 TTFT and ITL of both views."""
    keys = list(doc["within_goal"])
    rows = []
    for view, part in (("client", "compare"), ("server", "compare_server")):
        for metric, q in COMPARED:
            figure = f"{metric}.{q}"
            cells = [(doc[part][k].get(figure) or {}).get("sim_over_real") for k in keys]
            real = (doc[part][keys[0]].get(figure) or {}).get("real")
            rows.append((view, figure, real, [(r, meets_goal(r, figure)) for r in cells]))
    return rows


def tolerance(figure: str) -> float:
    """The goal's tolerance for a figure (issue 3): 10 % at P50 (and for means), 20 % at P90."""
    return 0.2 if figure.endswith("p90") else 0.1


def meets_goal(sim_over_real: float | None, figure: str) -> bool:
    """Within the goal's tolerance of the real figure (an unknown ratio does not meet it)."""
    return sim_over_real is not None and abs(sim_over_real - 1.0) <= tolerance(figure)


def within_goal(compared: dict[str, Any]) -> dict[str, Any]:
    """Of the P50/P90 TTFT and ITL figures of a ``compare`` / ``compare_server`` result: ``{"met": n, "of": 4,
    "outside": [figures]}``."""
    figures = [f"{m}.{q}" for m, q in COMPARED]
    outside = [f for f in figures if not meets_goal((compared.get(f) or {}).get("sim_over_real"), f)]
    return {"met": len(figures) - len(outside), "of": len(figures), "outside": outside}


def ttft_by_arrival_state(
    real_doc: dict[str, Any], idle_split_s: float = 1.0, sim_ttft_ms: list[float] | None = None
) -> dict[str, Any]:
    """Real TTFT (client) grouped by what the server was doing when the request was sent: ``busy`` (another
    request in flight), ``idle_short`` (idle for less than ``idle_split_s`` since the last response ended),
    ``idle_long`` (longer, or nothing before). Each group: ``{"n", "p50", "p90"}`` in ms (None when empty).
    Needs the per-request ``requests`` rows of a recorded run (``validate`` writes them); ``{}`` without.

    Tells a per-request cost (all groups alike) from queueing (``busy`` high) and from costs of waking an
    idle server (``idle_long`` high). With ``sim_ttft_ms`` (a ``simulate_slice`` document's
    ``request_ttft_ms``, same order), each group also gets ``sim_p50``: the simulator's median for the same
    requests.
    """
    rows = real_doc.get("requests")
    if not isinstance(rows, dict):
        return {}

    def arr(key: str) -> np.ndarray:
        return np.array([math.nan if v is None else float(v) for v in rows[key]], dtype=np.float64)

    sent, ttft, e2e = arr("sent_ms"), arr("ttft_ms"), arr("e2e_ms")
    done = sent + e2e
    groups: dict[str, list[int]] = {"busy": [], "idle_short": [], "idle_long": []}
    for i in range(len(sent)):
        if not math.isfinite(ttft[i]):
            continue
        others = np.arange(len(sent)) != i
        if np.any(others & (sent < sent[i]) & (done > sent[i])):
            groups["busy"].append(i)
            continue
        ended = others & (done <= sent[i])
        idle_ms = sent[i] - float(np.max(done[ended])) if np.any(ended) else math.inf
        groups["idle_short" if idle_ms < idle_split_s * 1e3 else "idle_long"].append(i)
    out: dict[str, Any] = {}
    for name, idx in groups.items():
        v = ttft[idx]
        out[name] = {
            "n": int(v.size),
            "p50": float(np.percentile(v, 50)) if v.size else None,
            "p90": float(np.percentile(v, 90)) if v.size else None,
        }
        if sim_ttft_ms is not None:
            sim = np.asarray(sim_ttft_ms, dtype=np.float64)[idx]
            out[name]["sim_p50"] = float(np.median(sim)) if sim.size else None
    return out
