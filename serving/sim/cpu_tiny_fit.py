"""Fit the ``cpu-tiny`` profile from the rows ``serving.sim.cpu_tiny_measure`` measures, never from a slice.

The fitting half of ``bench/bench_vllm_cpu.py --refit`` (moved here in session 8 so ``pdscale sim validate
--calibrate`` fits with the same code): the request overhead from paired client / engine-timed prefill rows, the
linear step model on the client-timed per-configuration medians, the admission delay (by the running streams'
count and age) and the wake-up cost from the probes, the seeded decode stalls from the engine-timed decode
steps. ``fit_profile`` does all of it on columns (``read_measurements`` / ``read_probes``) and returns the
profile document (``profiles/cpu_tiny.json``'s shape); ``write_profile`` writes one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from serving.sim.cpu_tiny_measure import (
    ADMISSION_YOUNG_TOKENS,
    BACKGROUND_CONTEXT_AT_PROBE,
    IDLE_FACTOR_COLUMNS,
    OUTSIDE_COLUMNS,
    PROBES_CSV,
    PROBES_SHORT_CSV,
    ROOT,
)

BASES = {"client": ("prefill", "decode"), "engine": ("engine_prefill", "engine_decode")}


def request_overhead(data: dict[str, np.ndarray]) -> dict[str, Any]:
    """``fit_request_overhead`` on the (client ``prefill``, engine ``engine_prefill``) pairs of the same
    requests: the n-th client row of (prefill_tokens, rep) with the n-th engine row of the same key."""
    from serving.sim.latency import fit_request_overhead

    rows: dict[tuple[float, float], dict[str, list[float]]] = {}
    for kind, p, rep, ms in zip(
        data["kind"], data["prefill_tokens"], data["rep"], data["iteration_ms"], strict=True
    ):
        if kind in ("prefill", "engine_prefill"):
            rows.setdefault((float(p), float(rep)), {"prefill": [], "engine_prefill": []})[str(kind)].append(
                float(ms)
            )
    client: list[float] = []
    engine: list[float] = []
    config: list[str] = []
    for (p, _), pair in rows.items():
        for c, e in zip(pair["prefill"], pair["engine_prefill"], strict=False):
            client.append(c)
            engine.append(e)
            config.append(f"prefill-{p:.0f}")
    return fit_request_overhead(client, engine, config)


def bunched_decode_rows(data: dict[str, np.ndarray]) -> np.ndarray:
    """Client-timed decode rows whose per-token period is under half the engine's own median step of the same
    configuration: the API server delivered that batch's tokens in a burst (the client saw them all at once),
    so the row says nothing about the step period (the simulator's first-token delivery term,
    ``fit_first_token_delivery``, models the bursts). True where a row is one of those."""
    out = np.zeros(len(data["kind"]), dtype=bool)
    engine: dict[str, float] = {}
    for config in set(data["config"].tolist()):
        if config.startswith("engine-decode-"):
            rows = data["config"] == config
            engine[config.removeprefix("engine-")] = float(np.nanmedian(data["iteration_ms"][rows]))
    for i, (kind, config) in enumerate(zip(data["kind"], data["config"], strict=True)):
        step = engine.get(str(config))
        if kind == "decode" and step is not None and data["iteration_ms"][i] < 0.5 * step:
            out[i] = True
    return out


def per_config(
    data: dict[str, np.ndarray], basis: str = "client", q: float = 0.5, request_overhead_ms: float = 0.0
) -> dict[str, np.ndarray]:
    """Per-configuration ``q``-quantiles (0.5 = medians) of ``iteration_ms`` for the kinds of ``basis``
    (other columns: medians), ``request_overhead_ms`` taken out of the client-timed prefill rows. Mixed
    steps are never fitted."""
    kinds = BASES[basis]
    keys = ("prefill_tokens", "prefill_context_tokens", "decode_batch", "decode_context_tokens")
    bunched = bunched_decode_rows(data) if basis == "client" else np.zeros(len(data["kind"]), dtype=bool)
    groups: dict[str, list[int]] = {}
    for i, (kind, config) in enumerate(zip(data["kind"], data["config"], strict=True)):
        if kind in kinds and not bunched[i]:
            groups.setdefault(str(config), []).append(i)
    out = {c: np.array([float(np.nanmedian(data[c][idx])) for idx in groups.values()]) for c in keys}
    out["iteration_ms"] = np.array(
        [float(np.nanquantile(data["iteration_ms"][idx], q)) for idx in groups.values()]
    )
    if basis == "client" and request_overhead_ms:
        one_request = (out["prefill_tokens"] > 0) & (out["decode_batch"] == 0)
        out["iteration_ms"] = np.where(
            one_request, out["iteration_ms"] - request_overhead_ms, out["iteration_ms"]
        )
    return out


def fit(
    data: dict[str, np.ndarray], basis: str = "client", q: float = 0.5, request_overhead_ms: float = 0.0
) -> dict[str, Any]:
    """``fit_linear_profile`` on per-configuration quantiles (client prefill rows less the request overhead)."""
    from serving.sim.latency import fit_linear_profile

    result: dict[str, Any] = fit_linear_profile(per_config(data, basis, q, request_overhead_ms))
    return result


def write_profile(
    result: dict[str, Any],
    overhead: dict[str, Any],
    n_rows: int,
    json_path: Path,
    csv_path: Path,
    probe_terms: tuple[dict[str, Any], dict[str, Any], int] | None = None,
    probes_path: Path = PROBES_CSV,
    probes_short_path: Path = PROBES_SHORT_CSV,
    stalls: dict[str, Any] | None = None,
) -> None:
    """Overwrite ``coefficients``, ``overheads`` and ``source`` in ``json_path`` (other fields are kept):
    ``profile_document`` on the file's current content."""
    base = json.loads(json_path.read_text()) if json_path.exists() else {}
    doc = profile_document(
        base, result, overhead, n_rows, csv_path, probe_terms, probes_path, probes_short_path, stalls
    )
    json_path.write_text(json.dumps(doc, indent=2) + "\n")


def profile_document(
    base: dict[str, Any],
    result: dict[str, Any],
    overhead: dict[str, Any],
    n_rows: int,
    csv_path: Path,
    probe_terms: tuple[dict[str, Any], dict[str, Any], int] | None = None,
    probes_path: Path = PROBES_CSV,
    probes_short_path: Path = PROBES_SHORT_CSV,
    stalls: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``base`` (a profile document; not changed) with ``coefficients``, ``overheads`` and ``source`` from the
    fits: ``result`` (``fit``), ``overhead`` (``request_overhead``), ``probe_terms`` ((``fit_admission_delay``
    or its by-age merge, ``fit_wake_up``, probe rows); None = those terms 0), ``stalls`` (``stall_fit``)."""

    def shown(path: Path) -> Path:
        return path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path

    doc = dict(base)
    doc["coefficients"] = result["coefficients"]
    doc["overheads"] = {"request_overhead_ms": overhead["request_overhead_ms"]}
    doc.pop("status", None)
    source = (
        f"bench/bench_vllm_cpu.py --refit on {shown(csv_path)} ({n_rows} rows). overheads.request_overhead_ms: median "
        f"over {overhead['n_configs']} prefill configurations of the median (client - engine-timed) time of "
        f"the same concurrency-1 request ({overhead['n_pairs']} pairs; p10 {overhead['diff_p10_ms']:.1f} ms, "
        f"p90 {overhead['diff_p90_ms']:.1f} ms). coefficients: fit_linear_profile on the per-configuration "
        f"medians of the client-timed rows (prefill rows less the request overhead; decode rows: ms per token "
        f"while the batch decodes), {result['n_samples']} configurations, relative error p50 "
        f"{result['rel_err_p50']:.1%}, p90 {result['rel_err_p90']:.1%}, max {result['rel_err_max']:.1%}"
    )
    if probe_terms is not None:
        admission, wake, n_probes = probe_terms
        doc["overheads"] |= {
            "admission_busy_ms": round(admission["admission_busy_ms"], 4),
            "admission_ms_per_running_seq": round(admission["admission_ms_per_running_seq"], 4),
            "wake_up_ms": round(wake["wake_up_ms"], 4),
            "idle_after_s": wake["idle_after_s"],
        }
        if admission.get("by_age"):
            doc["overheads"] |= {
                "admission_young_busy_ms": round(admission["admission_young_busy_ms"], 4),
                "admission_ms_per_young_seq": round(admission["admission_ms_per_young_seq"], 4),
                "admission_young_tokens": ADMISSION_YOUNG_TOKENS,
            }
            source += (
                f". admission_busy_ms, admission_ms_per_running_seq, admission_young_busy_ms, "
                f"admission_ms_per_young_seq: fit_admission_by_age on the {admission['n_rows']} admit rows of "
                f"{shown(probes_path)} (long streams: young = 0) and {shown(probes_short_path)} (loops of short "
                f"requests: every stream young) together, young = under {ADMISSION_YOUNG_TOKENS} output tokens; "
                f"per (running, young) group the median (client TTFT - the TTFT modelled without the terms) less "
                f"that median at 0 running (max miss {admission['max_abs_err_ms']:.1f} ms)"
            )
        else:
            source += (
                f". admission_busy_ms / admission_ms_per_running_seq: fit_admission_delay on the "
                f"{admission['n_rows']} admit rows of {shown(probes_path)} ({n_probes} probe rows): per running "
                "count 1-8 the median (client TTFT - the TTFT modelled without the term) less that median at 0 "
                f"running, fitted busy + per_seq*running (max miss {admission['max_abs_err_ms']:.1f} ms)"
            )
        source += (
            f". wake_up_ms: fit_wake_up on the {wake['n_rows']} idle rows of {shown(probes_path)}, median TTFT "
            f"after gaps >= {wake['idle_after_s']:g} s less shorter gaps, median over prompt lengths"
        )
    delivery = probe_terms[1].get("delivery") if probe_terms is not None else None
    if delivery is not None and delivery.get("write"):
        doc["overheads"]["first_token_deferred_fraction"] = round(
            delivery["first_token_deferred_fraction"], 4
        )
        source += (
            f". first_token_deferred_fraction: fit_first_token_delivery on the {delivery['n_rows']} multi-token "
            "rows of the --probe-idle-factors CSV, serving/sim/profiles/cpu_tiny_idle_factors.csv by default (deferred: TTFT over the 1-token median of the same prompt by "
            f"more than half the remaining decode at {delivery['decode_step_ms']:.2f} ms/step)"
        )
    if stalls is not None:
        doc["overheads"] |= {
            "decode_stall_fraction": round(stalls["decode_stall_fraction"], 6),
            "decode_stall_ms": round(stalls["decode_stall_ms"], 4),
            "decode_stall_seed": 0,
        }
        source += (
            f". decode_stall_fraction / decode_stall_ms: fit_decode_stalls on the {stalls['n_steps']} engine-timed "
            f"decode steps of the CSV ({stalls['n_stalled']} above {stalls['threshold']:g}x their configuration's "
            "median; the stall = their median excess)"
        )
    doc["source"] = source
    return doc


def _modelled_probe_ttft_ms(
    probes: dict[str, np.ndarray], coefficients: dict[str, float], request_overhead_ms: float
) -> np.ndarray:
    """Per ``admit`` row: the TTFT the simulator gives the probe without an admission term."""
    admit = probes["kind"] == "admit"
    running = probes["running"][admit]
    prompt = probes["prompt_tokens"][admit]
    a, b, c, d = (
        coefficients["a_ms"],
        coefficients["b_ms_per_prefill_token"],
        coefficients["c_ms_per_decode_seq"],
        coefficients["d_ms_per_decode_context_token"],
    )
    decode = running * (c + d * BACKGROUND_CONTEXT_AT_PROBE)
    wait = np.where(running > 0, (a + decode) / 2.0, 0.0)
    return np.asarray(request_overhead_ms + wait + a + b * prompt + decode, dtype=np.float64)


def age_fit(
    long: dict[str, np.ndarray],
    short: dict[str, np.ndarray],
    coefficients: dict[str, float],
    request_overhead_ms: float,
) -> dict[str, Any]:
    """``fit_admission_by_age`` on both probe designs together: the long-stream rows (``--probe``; their
    streams are old, young = 0) and the short-stream rows (``--probe-background-tokens 32``; every stream is
    young, young = running)."""
    from serving.sim.latency import fit_admission_by_age

    parts = []
    for probes, young_all in ((long, False), (short, True)):
        admit = probes["kind"] == "admit"
        running = probes["running"][admit]
        parts.append(
            (
                running,
                running if young_all else np.zeros_like(running),
                probes["client_ttft_ms"][admit],
                _modelled_probe_ttft_ms(probes, coefficients, request_overhead_ms),
            )
        )
    cols = [np.concatenate([p[i] for p in parts]) for i in range(4)]
    return fit_admission_by_age(*cols)


def probe_fits(
    probes: dict[str, np.ndarray], coefficients: dict[str, float], request_overhead_ms: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``fit_admission_delay``, ``fit_wake_up``) on the probe rows. Admission: every ``admit`` row, its
    client TTFT against what the simulator models for it without the term (``request_overhead_ms``, half a
    decode step of ``running`` sequences, the step prefilling it with them; ``coefficients`` = the
    client-timed fit). So the term takes whatever a request arriving among running streams pays beyond the
    step model: the API server's slower hand-off and first token, and the slower (stalled) engine step itself
    (engine-timed, printed for that split). Wake-up: ``idle`` rows, client TTFT less ``request_overhead_ms``
    (it cancels in the difference), split at ``DEFAULT_IDLE_AFTER_S``."""
    from serving.sim.latency import DEFAULT_IDLE_AFTER_S, fit_admission_delay, fit_wake_up

    admit = probes["kind"] == "admit"
    running = probes["running"][admit]
    modelled = _modelled_probe_ttft_ms(probes, coefficients, request_overhead_ms)
    admission = fit_admission_delay(running, probes["client_ttft_ms"][admit], modelled)
    engine = probes["engine_step_ms"][admit]
    admission["engine_step_p50_ms"] = {
        int(n): float(np.nanmedian(engine[running == n])) for n in sorted(set(running.tolist()))
    }
    idle = probes["kind"] == "idle"
    wake = fit_wake_up(
        probes["idle_gap_s"][idle],
        probes["client_ttft_ms"][idle] - request_overhead_ms,
        probes["prompt_tokens"][idle],
        DEFAULT_IDLE_AFTER_S,
    )
    return admission, wake


def stall_fit(data: dict[str, np.ndarray]) -> dict[str, Any]:
    """``fit_decode_stalls`` on the engine-timed decode rows (``engine_decode``: every step while a batch of B
    decodes, grouped by configuration)."""
    from serving.sim.latency import fit_decode_stalls

    rows = data["kind"] == "engine_decode"
    return fit_decode_stalls(data["iteration_ms"][rows], data["config"][rows])


def read_idle_factors(path: Path) -> dict[str, np.ndarray]:
    """The ``--probe-idle-factors`` CSV as numeric columns (comment lines skipped). Errors name the file and line."""
    with path.open() as f:
        lines = [(i + 1, line) for i, line in enumerate(f) if line.strip() and not line.startswith("#")]
    if not lines or tuple(lines[0][1].strip().split(",")) != IDLE_FACTOR_COLUMNS:
        raise ValueError(f"{path}: header is not {list(IDLE_FACTOR_COLUMNS)}")
    cols: dict[str, list[float]] = {c: [] for c in IDLE_FACTOR_COLUMNS}
    for lineno, line in lines[1:]:
        values = line.strip().split(",")
        if len(values) != len(IDLE_FACTOR_COLUMNS):
            raise ValueError(f"{path}:{lineno}: {len(values)} fields, expected {len(IDLE_FACTOR_COLUMNS)}")
        try:
            for c, v in zip(IDLE_FACTOR_COLUMNS, values, strict=True):
                cols[c].append(float(v))
        except ValueError:
            raise ValueError(f"{path}:{lineno}: a field is not a number: {line.strip()!r}") from None
    return {c: np.asarray(v) for c, v in cols.items()}


def delivery_fit(path: Path, coefficients: dict[str, float]) -> dict[str, Any]:
    """``fit_first_token_delivery`` on the idle-factor rows, the remaining decode time priced with the fitted
    client step at batch 1 (context: the rows' median prompt)."""
    from serving.sim.latency import fit_first_token_delivery

    rows = read_idle_factors(path)
    step = (
        coefficients["a_ms"]
        + coefficients["c_ms_per_decode_seq"]
        + coefficients["d_ms_per_decode_context_token"] * float(np.median(rows["prompt_tokens"]))
    )
    fit = fit_first_token_delivery(rows["max_tokens"], rows["prompt_tokens"], rows["client_ttft_ms"], step)
    return fit | {"decode_step_ms": step}


class CalibrationError(ValueError):
    """The measured rows cannot give a profile; the message names what is missing and the likely cause."""


def check_rows(data: dict[str, np.ndarray], probes: dict[str, np.ndarray] | None) -> None:
    """Raise ``CalibrationError`` listing every kind of row a fit needs and did not get."""
    from serving.sim.latency import DEFAULT_IDLE_AFTER_S

    problems = []
    kinds = data["kind"]
    for kind, why in (
        ("prefill", "client-timed prefill requests"),
        ("decode", "client-timed decode batches"),
        (
            "engine_prefill",
            "engine-timed prefill steps (does the server log --enable-logging-iteration-details?)",
        ),
        (
            "engine_decode",
            "engine-timed decode steps (does the server log --enable-logging-iteration-details?)",
        ),
    ):
        if not np.any(kinds == kind):
            problems.append(f"no {kind!r} rows: {why}")
    if probes is not None:
        admit = probes["kind"] == "admit"
        running = probes["running"][admit]
        if not np.any(running == 0):
            problems.append("no admit probe at 0 running streams (the admission baseline)")
        if not np.any(running > 0):
            problems.append(
                "no admit probe kept with streams running (a probe counts only if every background stream still "
                "streams after its answer: streams that end early, or failed requests, leave none)"
            )
        gaps = probes["idle_gap_s"][probes["kind"] == "idle"]
        if not (np.any(gaps < DEFAULT_IDLE_AFTER_S) and np.any(gaps >= DEFAULT_IDLE_AFTER_S)):
            problems.append(
                f"idle probes need gaps below and at or above {DEFAULT_IDLE_AFTER_S:g} s (wake-up fit)"
            )
    if problems:
        raise CalibrationError("cannot fit a cpu-tiny profile: " + "; ".join(problems))


def fit_profile(
    data: dict[str, np.ndarray],
    probes: dict[str, np.ndarray] | None,
    probes_short: dict[str, np.ndarray] | None = None,
    *,
    base: dict[str, Any],
    csv_path: Path,
    probes_path: Path = PROBES_CSV,
    probes_short_path: Path = PROBES_SHORT_CSV,
    idle_factors_path: Path | None = None,
    deferred_first_tokens: bool = False,
) -> dict[str, Any]:
    """Every fit of ``--refit`` on step-time columns ``data`` (``read_measurements``) and probe columns
    ``probes`` (``read_probes``; None: admission and wake-up 0) and ``probes_short`` (the short-stream design:
    the admission is then fitted by age on both), the deferred first tokens from ``idle_factors_path`` when
    given (written only with ``deferred_first_tokens``). The ``*_path`` arguments only name the files in the
    profile's ``source``. Returns ``{"profile": document in base's shape, "step_fit", "request_overhead",
    "stalls", "admission", "wake_up"}``; raises ``CalibrationError`` naming the missing rows."""
    check_rows(data, probes)
    overhead = request_overhead(data)
    ro = overhead["request_overhead_ms"]
    stalls = stall_fit(data)
    step = fit(data, "client", 0.5, ro)
    out: dict[str, Any] = {"step_fit": step, "request_overhead": overhead, "stalls": stalls}
    probe_terms = None
    if probes is not None:
        admission, wake = probe_fits(probes, step["coefficients"], ro)
        if probes_short is not None:
            admission = admission | age_fit(probes, probes_short, step["coefficients"], ro) | {"by_age": True}
        if idle_factors_path is not None:
            delivery = delivery_fit(idle_factors_path, step["coefficients"])
            wake = wake | {"delivery": delivery | {"write": deferred_first_tokens}}
        probe_terms = (admission, wake, len(probes["kind"]))
        out |= {"admission": admission, "wake_up": wake}
    out["profile"] = profile_document(
        base,
        step,
        overhead,
        len(data["iteration_ms"]),
        csv_path,
        probe_terms,
        probes_path,
        probes_short_path,
        stalls,
    )
    return out


# The client's TTFT outside vLLM's own histogram (session 9): fitted from ``cpu_tiny_measure.outside_rows``.
OUTSIDE_TERMS = ("const_ms", "per_prompt_token_ms", "per_inflight_ms")


def fit_client_outside(rows: dict[str, np.ndarray], loss: str = "median") -> dict[str, Any]:
    """The client's TTFT less the server's own for the same requests, ``outside = const + per_prompt_token *
    prompt + per_inflight * (others in flight at send)``, non-negative, on the rows' means (a linear term's mean is
    the term at the means). ``loss="median"``: least absolute deviations, each row weighted by the square root of
    its request count (the typical outside: single requests here scatter from ~15 to ~400 ms, and a least-squares
    constant would carry that tail into every request); ``"mean"``: least squares, weighted by the count. Returns
    the three ``OUTSIDE_TERMS`` and ``loss``, ``n_rows``, ``n_requests``, the rows' median outside alone and loaded
    (ms), the fit's largest miss of a row (ms) and every lone row's residual (``lone_residuals_ms``, measured -
    fitted: the spread the sampled variant draws). Raises ``CalibrationError`` when there are no lone rows or no
    loaded ones (the constant and the load term cannot be told apart) or a row is not finite."""
    if loss not in ("median", "mean"):
        raise ValueError(f"fit_client_outside: loss must be 'median' or 'mean', got {loss!r}")
    from scipy.optimize import nnls

    kind = np.asarray(rows["kind"])
    cols = {c: np.asarray(rows[c], dtype=np.float64) for c in OUTSIDE_COLUMNS_NUMERIC}
    missing = [k for k in ("lone", "load") if not np.any(kind == k)]
    if missing:
        raise CalibrationError(f"client outside fit: no {' and no '.join(missing)} rows")
    if not all(np.all(np.isfinite(v)) for v in cols.values()):
        raise CalibrationError("client outside fit: a row holds a non-finite value (a failed scrape pair?)")
    outside = cols["client_ttft_mean_ms"] - cols["server_ttft_mean_ms"]
    design = np.column_stack([np.ones_like(outside), cols["prompt_tokens_mean"], cols["inflight_mean"]])
    w = np.sqrt(np.maximum(cols["requests"], 1.0))
    coef = (
        _least_absolute(design, outside, w) if loss == "median" else nnls(design * w[:, None], outside * w)[0]
    )
    miss = design @ coef - outside
    return {
        **{name: float(v) for name, v in zip(OUTSIDE_TERMS, coef, strict=True)},
        "loss": loss,
        "n_rows": int(outside.size),
        "n_requests": int(np.sum(cols["requests"])),
        "lone_outside_median_ms": float(np.median(outside[kind == "lone"])),
        "load_outside_median_ms": float(np.median(outside[kind == "load"])),
        "max_abs_miss_ms": float(np.max(np.abs(miss))),
        # measured - fitted of every lone request (one request per row): the spread the sampled variant draws
        "lone_residuals_ms": [round(float(-x), 4) for x in miss[kind == "lone"]],
    }


def _least_absolute(design: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``argmin_{beta >= 0} sum w |design @ beta - y|`` as a linear program (beta, then u, v >= 0 with
    ``design @ beta + u - v = y``)."""
    from scipy.optimize import linprog

    n, k = design.shape
    cost = np.concatenate([np.zeros(k), w, w])
    eq = np.hstack([design, np.eye(n), -np.eye(n)])
    res = linprog(cost, A_eq=eq, b_eq=y, bounds=[(0, None)] * (k + 2 * n), method="highs")
    if not res.success:
        raise CalibrationError(
            f"client outside fit: the least-absolute-deviation program failed: {res.message}"
        )
    return np.asarray(res.x[:k], dtype=np.float64)


OUTSIDE_COLUMNS_NUMERIC = tuple(c for c in OUTSIDE_COLUMNS if c not in ("kind", "rep"))


def overhead_outside_share(
    outside_fit: dict[str, Any], request_overhead_ms: float, prompt_tokens: float
) -> float:
    """The s8w share ``request_overhead_outside_fraction`` the outside fit implies: the lone outside term at
    ``prompt_tokens`` (const + per-token part) over the profile's request overhead, clipped to [0, 1] (0 for no
    overhead)."""
    if request_overhead_ms <= 0:
        return 0.0
    lone = outside_fit["const_ms"] + outside_fit["per_prompt_token_ms"] * prompt_tokens
    return float(min(max(lone / request_overhead_ms, 0.0), 1.0))
