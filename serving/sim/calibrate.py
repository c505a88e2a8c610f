"""A cpu-tiny profile of today's machine, measured on the validation's own server just before its slice.

Why (docs/BENCHMARKS.md, S6V): the real server's speed moves 2.5-3x between days and beyond the goal's tolerance
within an hour, so a profile fitted on another day compares the machine's day, not the model's form. ``pdscale sim
validate --calibrate`` therefore measures, on the same server and immediately before the slice, the short
versions of ``bench/bench_vllm_cpu.py``'s step times and probes (``serving.sim.cpu_tiny_measure``, the same
code), fits a profile from them with ``--refit``'s fits (``serving.sim.cpu_tiny_fit.fit_profile``), never from
the slice, and the sim side then runs with it beside the shipped profile.

``calibrate(server, vocab, spec, out_dir)`` does the measuring and fitting and returns a JSON-ready document:
the fitted ``profile`` (``profiles/cpu_tiny.json``'s shape), its ``provenance`` (times, load, row counts, the
spec) and the raw rows as CSV text (``csv``), so ``refit_recorded`` can redo the fit from a recording alone.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from serving.pools.iterations import ITERATION_FLAG
from serving.pools.loadgen import scrape
from serving.pools.local import LocalInstance
from serving.sim.cpu_tiny_fit import CalibrationError, fit_profile
from serving.sim.cpu_tiny_measure import (
    decode_rows,
    outside_rows,
    prefill_rows,
    probe_rows,
    read_measurements,
    read_probes,
    write_csv,
    write_outside_csv,
    write_probe_csv,
)

# Seeds of the calibration's prompts, far from each other and from the slice's: the validation server caches
# prefixes, and a prompt repeated between two measurements would prefill from the cache.
STEP_SEED = 1_000_000
PROBE_SEED = 100_000
SHORT_PROBE_SEED = 500_000
OUTSIDE_SEED = 700_000
SHORT_STREAM_TOKENS = 32  # the short-stream probe design (bench_vllm_cpu.py --probe-background-tokens 32)
CSV_NAMES = {"steps": "steps.csv", "probes": "probes.csv", "probes_short": "probes_short_streams.csv"}
# the client's TTFT against the server's own (optional: session 8's recordings have none)
OUTSIDE_CSV = "outside.csv"


@dataclass(frozen=True)
class CalibrationSpec:
    """How much of ``bench_vllm_cpu.py``'s measurement a calibration repeats (defaults: ~1.5-2 min on the shared
    2-core box). Step times: every prefill length ``prefill_reps`` times (``--refit``'s request overhead pairs
    them), every decode context with ``decode_batches`` streams ``decode_reps`` times; probes: ``probe_rounds``
    rounds of admissions among long streams, ``short_probe_rounds`` among loops of short requests (the two
    designs of the age-keyed admission fit), ``idle_reps`` rounds of idle gaps (wake-up; >= 1); ``outside_reps``
    rounds of streamed requests alone and in closed loops, the client's TTFT against the server's own histogram
    for the same requests (``cpu_tiny_measure.outside_rows``; 0 = none, as session 8's calibration)."""

    prefill_reps: int = 3
    decode_reps: int = 1
    decode_batches: tuple[int, ...] = (1, 4, 16)
    probe_rounds: int = 3
    short_probe_rounds: int = 3
    idle_reps: int = 1
    outside_reps: int = 2

    def __post_init__(self) -> None:
        errors = [
            f"CalibrationSpec.{name}: must be >= 1, got {getattr(self, name)}"
            for name in ("prefill_reps", "decode_reps", "probe_rounds", "short_probe_rounds", "idle_reps")
            if getattr(self, name) < 1
        ]
        if self.outside_reps < 0:
            errors.append(f"CalibrationSpec.outside_reps: must be >= 0, got {self.outside_reps}")
        if not self.decode_batches or min(self.decode_batches) < 1:
            errors.append(f"CalibrationSpec.decode_batches: must be >= 1 each, got {self.decode_batches}")
        if errors:
            raise ValueError("; ".join(errors))


def calibrate(
    server: LocalInstance, vocab: np.ndarray, spec: CalibrationSpec, out_dir: Path, base: dict[str, Any]
) -> dict[str, Any]:
    """Measure on ``server`` (it must log its engine steps: ``ITERATION_FLAG``), write the rows under
    ``out_dir`` and fit: ``{"profile", "provenance", "fits", "csv"}`` (``profile`` = ``base`` with the fitted
    coefficients, overheads and source). Raises ``CalibrationError`` naming what the fit lacked, and leaves the
    server idle (no request running or waiting) when it returns."""
    if ITERATION_FLAG not in server.config.extra_args:
        raise CalibrationError(
            f"calibration: the server at {server.url} does not log its engine steps ({ITERATION_FLAG}): the "
            "request overhead and the decode stalls are fitted from engine-timed rows"
        )
    limit = server.config.max_num_seqs
    if limit is not None and max(spec.decode_batches) > limit:
        raise CalibrationError(
            f"calibration: decode batches {spec.decode_batches} exceed the server's max_num_seqs "
            f"{limit} (the batch would not decode together)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    started, t0, load0 = datetime.now(UTC), time.monotonic(), os.getloadavg()[0]
    steps = prefill_rows(server, vocab, spec.prefill_reps, STEP_SEED)
    steps += decode_rows(server, vocab, spec.decode_reps, STEP_SEED, spec.decode_batches)
    t_steps = time.monotonic() - t0
    probes = probe_rows(server, vocab, spec.probe_rounds, PROBE_SEED, spec.idle_reps)
    short = probe_rows(server, vocab, spec.short_probe_rounds, SHORT_PROBE_SEED, 0, SHORT_STREAM_TOKENS)
    wait_idle(server.url)
    outside = outside_rows(server.url, vocab, spec.outside_reps, OUTSIDE_SEED) if spec.outside_reps else []
    elapsed = time.monotonic() - t0
    load = f"{load0:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    paths = {k: out_dir / name for k, name in CSV_NAMES.items()}
    command = "serving.sim.calibrate.calibrate (pdscale sim validate --calibrate), " + json.dumps(
        asdict(spec)
    )
    note = "on the validation server itself, just before its slice"
    write_csv(steps, paths["steps"], command, load)
    write_probe_csv(probes, paths["probes"], command, load, note)
    write_probe_csv(short, paths["probes_short"], command + " short streams", load, note)
    doc = refit_csv({k: p.read_text() for k, p in paths.items()}, base)
    if outside:
        write_outside_csv(outside, out_dir / OUTSIDE_CSV, command + " outside", load, note)
        # the rows only: ``validate_against_sim`` fits the client-side term from them (``fit_client_outside``)
        doc["outside"] = {"csv": (out_dir / OUTSIDE_CSV).read_text()}
    doc["provenance"] = {
        "spec": asdict(spec),
        "started": started.isoformat(timespec="seconds"),
        "step_times_s": round(t_steps, 1),
        "elapsed_s": round(elapsed, 1),
        "load_1min": load,
        "rows": {
            "steps": len(steps),
            "probes": len(probes),
            "probes_short": len(short),
            "outside": len(outside),
        },
        "files": {k: str(p) for k, p in paths.items()},
        "fitted_on": "step times and probes on this server before the slice; never on the slice",
    }
    return doc


def refit_csv(texts: dict[str, str], base: dict[str, Any]) -> dict[str, Any]:
    """The fit of a calibration from its CSV texts (``CSV_NAMES`` keys): ``{"profile", "fits", "csv"}``."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = {k: Path(tmp) / name for k, name in CSV_NAMES.items()}
        for k, p in paths.items():
            p.write_text(texts[k])
        result = fit_profile(
            read_measurements(paths["steps"]),
            read_probes(paths["probes"]),
            read_probes(paths["probes_short"]),
            base=base,
            csv_path=Path(CSV_NAMES["steps"]),
            probes_path=Path(CSV_NAMES["probes"]),
            probes_short_path=Path(CSV_NAMES["probes_short"]),
        )
    return {"profile": result["profile"], "fits": _json_ready(_fit_summary(result)), "csv": dict(texts)}


def refit_recorded(calibration: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """``refit_csv`` on a recorded calibration's rows (``validate``'s ``calibration`` field)."""
    texts = calibration.get("csv")
    if not isinstance(texts, dict) or set(texts) != set(CSV_NAMES):
        raise CalibrationError(f"recorded calibration: field 'csv' must hold {sorted(CSV_NAMES)}")
    return refit_csv(texts, base)


def _fit_summary(result: dict[str, Any]) -> dict[str, Any]:
    step, overhead, stalls = result["step_fit"], result["request_overhead"], result["stalls"]
    out: dict[str, Any] = {
        "step_rel_err_p50": step["rel_err_p50"],
        "step_rel_err_p90": step["rel_err_p90"],
        "step_configurations": step["n_samples"],
        "request_overhead_pairs": overhead["n_pairs"],
        "decode_steps": stalls["n_steps"],
        "decode_stalled": stalls["n_stalled"],
    }
    admission, wake = result.get("admission"), result.get("wake_up")
    if admission is not None and wake is not None:
        out |= {
            "admit_rows": admission["n_rows"],
            "admission_max_miss_ms": admission["max_abs_err_ms"],
            "admission_engine_step_p50_ms": admission["engine_step_p50_ms"],
            "idle_rows": wake["n_rows"],
            "idle_ttft_by_gap_ms": wake["per_gap_ms"],
        }
    return out


def _json_ready(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_ready(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_ready(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        return float(x) if math.isfinite(float(x)) else None
    return x


def wait_idle(url: str, timeout_s: float = 30.0, poll_s: float = 0.2) -> None:
    """Until the server reports no request running or waiting (a probe's cancelled background streams are
    aborted asynchronously), then one more poll period; raises ``CalibrationError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = scrape(url)
        busy = m.total("vllm:num_requests_running") + m.total("vllm:num_requests_waiting")
        if busy == 0:
            time.sleep(poll_s)
            return
        if time.monotonic() > deadline:
            raise CalibrationError(f"calibration: {url} still has {busy:g} requests after {timeout_s:g} s")
        time.sleep(poll_s)
