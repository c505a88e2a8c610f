"""Validate the simulator against real vLLM: replay one bounded trace slice on a real CPU server.

This module is the collection side. ``scale_slice`` cuts a trace into a slice the tiny CPU server can serve
(a few hundred requests, lengths clipped to the model's context, arrivals time-scaled to a target rate);
``run_real`` replays that slice against a real server with the open-loop load generator
(``serving.pools.loadgen``) and returns per-request ``RequestTimings``; ``validate`` does both around a
server it starts and stops itself and returns a JSON-ready document.

What to compare (wired by the lead once the engine lands): replay the SAME slice (``scale_slice``'s output,
same arrival times and lengths) through the simulator with one ``mixed`` instance of profile ``cpu-tiny``
(``max_num_seqs`` as the real server's), then ``compare(real_doc, sim_report.to_json())``: P50/P90 TTFT and
per-request mean ITL, as sim/real ratios. TTFT is the sensitive one (it is queueing plus prefill, so it
amplifies any error in prefill cost near saturation); ITL checks the decode-step model. The real figures
include HTTP and detokenisation (a few ms per request on this box), which the simulator does not model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serving.pools.loadgen import RequestTimings, run_replay, scrape
from serving.pools.local import InstanceConfig, LocalInstance, start_instance
from serving.pools.tinymodel import build_tiny_model, normal_token_ids
from serving.workload.trace import Trace

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


def _server_counters(url: str) -> dict[str, float]:
    m = scrape(url)
    names = m.names()

    def pick(*candidates: str) -> float:
        return next((m.total(n) for n in candidates if n in names), math.nan)

    return {
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
) -> dict[str, Any]:
    """Cut ``trace`` with ``spec``, start a mixed tiny-model server under ``work_dir``, replay the slice,
    stop the server, and return ``{"slice", "server", "real", "server_metrics"}`` (JSON-ready; NaN → null).

    Example::

        doc = validate(read_trace("datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv"),
                       work_dir=Path("out/validate"))
        doc["real"]["ttft_ms"]["p90"]
    """
    spec = spec or SliceSpec()
    trace_slice = scale_slice(trace, spec)
    model_dir = build_tiny_model(work_dir / "tiny-llama", seed=0)
    config = InstanceConfig(model_dir=model_dir, max_num_seqs=max_num_seqs, max_model_len=spec.max_model_len)
    with start_instance(config, work_dir / "logs") as server:
        ready_s = server.wait_healthy(health_timeout_s)
        # Warm-up outside the measured slice: the first requests pay lazy initialisation.
        run_real(scale_slice(trace, SliceSpec(n_requests=4, target_rps=4.0)), server, seed=seed + 1)
        before = _server_counters(server.url)
        timings = run_real(trace_slice, server, seed=seed)
        after = _server_counters(server.url)
    server_metrics = {k: after[k] - before[k] for k in ("prompt_tokens", "generation_tokens", "preemptions")}
    server_metrics |= {
        "ttft_mean_ms_cumulative": after["ttft_mean_ms"],
        "itl_mean_ms_cumulative": after["itl_mean_ms"],
    }
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
        "server_metrics": server_metrics,
    }
    return dict(_finite_or_none(doc))


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
