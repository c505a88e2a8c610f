"""Unseen-trace variants: realistic traces the project was not built on, written as real users have them.

Each variant is built from the bundled traces (rate-scaled, sliced, gapped, shifted to a later day) or from
the workload generator (hours-long traces, several models, failures), then written in one of the three
formats with the byte-level quirks real files carry: a UTF-8 BOM, CRLF line ends, extra columns, rows out
of order within a second, duplicate timestamps, integer-second BurstGPT timestamps, a trailing partial line.

``expect`` says what the readers do with it: ``ok`` (read in full; ``requests`` rows), or ``error`` (a
``TraceError`` naming the line). Generated files go to a directory the caller names (keep them out of git).

Example: ``for v in build_variants(Path("/tmp/unseen"), long=False): print(v.name, v.path)``
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from serving.workload import formats as F
from serving.workload.readers import read_trace
from serving.workload.synthetic import LengthDist, SyntheticParams, generate
from serving.workload.trace import Trace
from serving.workload.writers import write_trace

_REPO = Path(__file__).resolve().parents[2]
CODE_TRACE = Path("datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv")
CONV_TRACE = Path("datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv")
MOONCAKE_TRACE = Path("datasets/mooncake/synthetic_trace.jsonl")
LATER_DAY = pd.Timestamp("2024-05-14 08:00:00.0084000")  # an Azure-2024-like week day, after 18:50 2023
BURSTGPT_MODELS = ("ChatGPT", "GPT-4")


@dataclass(frozen=True)
class Variant:
    """One generated trace file and what reading it must give."""

    name: str
    fmt: str
    path: Path
    description: str
    expect: str  # "ok" or "error"
    requests: int  # rows a reader must return (expect == "ok"); 0 for errors
    long: bool = False  # hours-long: the slow entry points are run on a shorter prefix or skipped
    error_line: int | None = None  # expect == "error": the line the TraceError must name


def bundled(path: Path) -> Path:
    """A bundled dataset file, in this checkout or in ../shared beside it."""
    for root in (_REPO, _REPO.parent / "shared"):
        if (root / path).exists():
            return root / path
    raise FileNotFoundError(f"bundled trace {path} not found under {_REPO} nor {_REPO.parent / 'shared'}")


# ---- trace transformations (pure: Trace in, Trace out) --------------------------------------------


def thin(trace: Trace, keep: float, seed: int) -> Trace:
    """Rate × ``keep`` (< 1) by keeping each request with probability ``keep``; the burst shape stays."""
    rng = np.random.default_rng(seed)
    return _rebased(trace.take(np.flatnonzero(rng.random(len(trace)) < keep)))


def superpose(trace: Trace, copies: int, jitter_s: float, seed: int) -> Trace:
    """Rate × ``copies``: the trace laid over itself, each copy's times jittered by U(0, jitter_s) and its
    lengths resampled from the trace, so bursts stay where they were but ``copies`` times taller."""
    rng = np.random.default_rng(seed)
    n = len(trace)
    parts = []
    for c in range(copies):
        pick = np.arange(n) if c == 0 else rng.integers(0, n, n)
        t = trace.arrival_s + (0.0 if c == 0 else rng.uniform(0.0, jitter_s, n))
        parts.append((t, trace.prompt_tokens[pick], trace.output_tokens[pick]))
    t_all = np.concatenate([p[0] for p in parts])
    order = np.argsort(t_all, kind="stable")
    out = Trace.from_arrays(
        t_all[order],
        np.concatenate([p[1] for p in parts])[order],
        np.concatenate([p[2] for p in parts])[order],
    )
    return _rebased(replace(out, start_time=trace.start_time))


def _rebased(trace: Trace) -> Trace:
    """Times from the first remaining arrival (0.0), ``start_time`` moved with it."""
    t0 = float(trace.arrival_s[0])
    start = None if trace.start_time is None else pd.Timestamp(trace.start_time) + pd.Timedelta(seconds=t0)
    return replace(trace, arrival_s=trace.arrival_s - t0, start_time=start)


def busiest_second(trace: Trace, window_s: float = 10.0) -> float:
    """The start of the busiest ``window_s`` (arrival count), on whole seconds."""
    counts = np.bincount(trace.arrival_s.astype(np.int64))
    k = max(1, int(window_s))
    sums = np.convolve(counts, np.ones(k, dtype=np.int64), mode="valid")
    return float(np.argmax(sums))


def from_mid_burst(trace: Trace) -> Trace:
    """The trace from the start of its busiest 10 s on: a replay with no history before a burst."""
    return _rebased(trace.window(busiest_second(trace), np.inf))


def with_idle_gap(trace: Trace, gap_s: float) -> Trace:
    """Nothing arrives for ``gap_s`` seconds in the middle of the trace (later arrivals shifted)."""
    mid = float(trace.arrival_s[len(trace) // 2])
    shifted = np.where(trace.arrival_s >= mid, trace.arrival_s + gap_s, trace.arrival_s)
    return replace(trace, arrival_s=shifted)


def at_start(trace: Trace, start: pd.Timestamp) -> Trace:
    return replace(trace, start_time=start)


# ---- byte-level quirks of real files -------------------------------------------------------------


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def _write_lines(
    path: Path, lines: list[bytes], eol: bytes = b"\n", bom: bool = False, final: bool = True
) -> None:
    body = eol.join(lines) + (eol if final else b"")
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body)


def locally_shuffled(lines: list[bytes], times: np.ndarray, max_back_s: float) -> list[bytes]:
    """Swap each data row with its successor where they arrived less than ``max_back_s`` apart (every
    other pair), as logs written at completion rather than arrival are."""
    out = list(lines)
    i = 1
    while i < len(out) - 1:
        if times[i] - times[i - 1] < max_back_s:  # data row i-1 of times is line i
            out[i], out[i + 1] = out[i + 1], out[i]
            i += 2
        i += 1
    return out


def late_first_row(lines: list[bytes], times: np.ndarray, late_s: float) -> list[bytes]:
    """Put first the first row that arrived more than ``late_s`` after the trace start."""
    k = int(np.argmax(times - times[0] > late_s)) + 1  # its line index (the header is 0)
    return [lines[0], lines[k], *lines[1:k], *lines[k + 1 :]]


def with_duplicates(lines: list[bytes], every: int) -> list[bytes]:
    """Every ``every``-th data row appears twice (same timestamp, same lengths): a logged retry."""
    out = [lines[0]]
    for i, line in enumerate(lines[1:], start=1):
        out.append(line)
        if i % every == 0:
            out.append(line)
    return out


def with_extra_column(lines: list[bytes], name: bytes, value: Callable[[int], bytes]) -> list[bytes]:
    return [lines[0] + b"," + name] + [line + b"," + value(i) for i, line in enumerate(lines[1:])]


# ---- the variants ---------------------------------------------------------------------------------


def _synthetic_hours(duration_s: float, rate_rps: float, diurnal: float, seed: int) -> Trace:
    params = SyntheticParams(
        duration_s=duration_s,
        rate_rps=rate_rps,
        burst_multiplier=3.0,
        calm_mean_s=300.0,
        burst_mean_s=30.0,
        diurnal_amplitude=diurnal,
        diurnal_period_s=86_400.0,
        diurnal_phase_s=-6 * 3600.0,  # the trough at night, the peak in the afternoon
        prompt=LengthDist(median_tokens=900.0, sigma=1.0, max_tokens=16_384),
        output=LengthDist(median_tokens=120.0, sigma=1.0, max_tokens=2048),
        failure_prob=0.02,
        model_names=BURSTGPT_MODELS,
        model_weights=(0.8, 0.2),
        grid_s=0.1 if duration_s <= 7200 else 0.5,
    )
    return generate(params, seed=seed)


def _burstgpt_integer_seconds(trace: Trace, path: Path, crlf: bool) -> int:
    """BurstGPT v1 as released: integer-second timestamps (many duplicates), starting after 0."""
    write_trace(replace(trace, arrival_s=np.floor(trace.arrival_s) + 5.0), path, F.BURSTGPT)
    if crlf:
        _write_lines(path, _lines(path), eol=b"\r\n")
    return len(trace)


def build_variants(out_dir: Path, *, long: bool = True, seed: int = 0) -> list[Variant]:
    """Write every variant under ``out_dir`` and describe each; ``long=False`` skips the hours-long ones."""
    out_dir.mkdir(parents=True, exist_ok=True)
    code = read_trace(bundled(CODE_TRACE))
    conv = read_trace(bundled(CONV_TRACE))
    moon = read_trace(bundled(MOONCAKE_TRACE))
    vs: list[Variant] = []

    def add(name: str, fmt: str, description: str, **kw: object) -> Path:
        ext = "jsonl" if fmt == F.MOONCAKE else "csv"
        path = out_dir / f"{name}.{ext}"
        vs.append(Variant(name, fmt, path, description, **kw))  # type: ignore[arg-type]
        return path

    # Azure 2023/2024 CSV ---------------------------------------------------------------------------
    later = at_start(code, LATER_DAY)
    write_trace(later, add("azure_code_later_day", F.AZURE, "code trace on a 2024 day, CRLF", expect="ok",
                           requests=len(code)), F.AZURE)  # fmt: skip
    p = add("azure_conv_bom_lf", F.AZURE, "conv trace, UTF-8 BOM, LF", expect="ok", requests=len(conv))
    write_trace(conv, p, F.AZURE)
    _write_lines(p, _lines(p), bom=True)
    mid = from_mid_burst(code)
    write_trace(mid, add("azure_code_mid_burst", F.AZURE, "code trace from its busiest 10 s on (no history)",
                         expect="ok", requests=len(mid)), F.AZURE)  # fmt: skip
    quarter = thin(code, 0.25, seed)
    write_trace(quarter, add("azure_code_x0.25", F.AZURE, "code trace thinned to 1/4 of its rate",
                             expect="ok", requests=len(quarter)), F.AZURE)  # fmt: skip
    four = superpose(code, 4, 1.0, seed)
    write_trace(four, add("azure_code_x4", F.AZURE, "code trace ×4 (4 jittered copies, bursts 4× taller)",
                          expect="ok", requests=len(four)), F.AZURE)  # fmt: skip
    gap = with_idle_gap(code, 1800.0)
    write_trace(gap, add("azure_code_idle_30min", F.AZURE, "code trace with 30 min of nothing in the middle",
                         expect="ok", requests=len(gap)), F.AZURE)  # fmt: skip
    p = add("azure_conv_tz_offset", F.AZURE, "conv trace, timestamps with +00:00", expect="ok",
            requests=len(conv))  # fmt: skip
    write_trace(conv, p, F.AZURE)
    lines = _lines(p)
    _write_lines(p, [lines[0]] + [_tz_suffixed(line) for line in lines[1:]])
    p = add("azure_code_unsorted_dups", F.AZURE, "code trace, rows < 1 s apart swapped, every 50th row twice",
            expect="ok", requests=len(code) + len(code) // 50)  # fmt: skip
    write_trace(code, p, F.AZURE)
    _write_lines(p, with_duplicates(locally_shuffled(_lines(p), code.arrival_s, 0.9), 50))
    p = add("azure_conv_unsorted_far", F.AZURE, "conv trace whose first row arrived 60 s later (refused; read "
            "with --max-reorder-s inf)", expect="error", requests=len(conv), error_line=3)  # fmt: skip
    write_trace(conv, p, F.AZURE)
    _write_lines(p, late_first_row(_lines(p), conv.arrival_s, 60.0))
    p = add("azure_conv_extra_column", F.AZURE, "conv trace with an extra Region column", expect="ok",
            requests=len(conv))  # fmt: skip
    write_trace(conv, p, F.AZURE)
    _write_lines(p, with_extra_column(_lines(p), b"Region", lambda i: b"westus2" if i % 3 else b"eastus"))
    p = add("azure_code_partial_last_line", F.AZURE, "code trace cut mid-line (no final newline)",
            expect="error", requests=0, error_line=len(code) + 1)  # fmt: skip
    write_trace(code, p, F.AZURE)
    data = p.read_bytes().rstrip(b"\r\n")
    p.write_bytes(data[: data.rfind(b",")])  # the last row loses its GeneratedTokens field

    # BurstGPT CSV ----------------------------------------------------------------------------------
    synth = _synthetic_hours(1800.0, 5.0, 0.0, seed)
    n = _burstgpt_integer_seconds(synth, add("burstgpt_30min_int_seconds_crlf", F.BURSTGPT,
                                             "30 min at 5 req/s, 2 models, 2 % failed, integer seconds, CRLF",
                                             expect="ok", requests=len(synth)), crlf=True)  # fmt: skip
    assert n == len(synth)
    p = add("burstgpt_code_x4_float_bom", F.BURSTGPT, "code ×4 as BurstGPT, float seconds, BOM", expect="ok",
            requests=len(four))  # fmt: skip
    write_trace(four, p, F.BURSTGPT)
    _write_lines(p, _lines(p), bom=True)

    # Mooncake JSONL --------------------------------------------------------------------------------
    moon_mid = from_mid_burst(moon)
    write_trace(moon_mid, add("mooncake_mid_burst", F.MOONCAKE, "Mooncake synthetic from its busiest 10 s on",
                              expect="ok", requests=len(moon_mid)), F.MOONCAKE)  # fmt: skip
    p = add("mooncake_conv_crlf_extra_field", F.MOONCAKE, "conv as Mooncake JSONL, CRLF, extra field",
            expect="ok", requests=len(conv))  # fmt: skip
    conv_blocks = replace(conv, extra={"prefix_blocks": ((conv.prompt_tokens + 511) // 512).astype(np.int32)})
    write_trace(conv_blocks, p, F.MOONCAKE)
    _write_lines(p, [line[:-1] + b', "session": 1}' for line in _lines(p)], eol=b"\r\n")
    p = add("mooncake_partial_last_line", F.MOONCAKE, "Mooncake synthetic cut mid-line", expect="error",
            requests=0, error_line=len(moon))  # fmt: skip
    write_trace(moon, p, F.MOONCAKE)
    data = p.read_bytes().rstrip(b"\n")
    p.write_bytes(data[: len(data) - 40])

    if long:
        two_h = _synthetic_hours(7200.0, 30.0, 0.0, seed + 1)
        write_trace(two_h, add("burstgpt_2h_30rps", F.BURSTGPT, "2 h at 30 req/s, 2 models, 2 % failed",
                               expect="ok", requests=len(two_h), long=True), F.BURSTGPT)  # fmt: skip
        day = at_start(_synthetic_hours(86_400.0, 3.0, 0.6, seed + 2), LATER_DAY.normalize())
        write_trace(day, add("azure_day_3rps", F.AZURE, "a day at 3 req/s with a diurnal cycle (±60 %)",
                             expect="ok", requests=len(day), long=True), F.AZURE)  # fmt: skip
    return vs


def _tz_suffixed(line: bytes) -> bytes:
    stamp, rest = line.split(b",", 1)
    return stamp + b"+00:00," + rest


# ---- hostile variants: edge cases real traffic and real files produce ------------------------------------

MAX_CONTEXT_PROBE_TOKENS = 200_000  # beyond every shipped profile's context window
# beyond one instance's KV cache on every GPU profile (llama3-8b/a100: 434,512 tokens)
MAX_KV_PROBE_TOKENS = 2_000_000


def _steady(duration_s: float, rate_rps: float, seed: int) -> Trace:
    params = SyntheticParams(
        duration_s=duration_s,
        rate_rps=rate_rps,
        burst_multiplier=1.0,
        prompt=LengthDist(median_tokens=900.0, sigma=1.0, max_tokens=16_384),
        output=LengthDist(median_tokens=120.0, sigma=1.0, max_tokens=2048),
        grid_s=0.5 if duration_s > 7200 else 0.1,
    )
    return generate(params, seed=seed)


def flash_crowd(base: Trace, at_s: float, factor: float, hold_s: float, seed: int) -> Trace:
    """``base`` with its rate × ``factor`` from ``at_s`` (a step within one second) for ``hold_s`` seconds:
    extra requests, lengths resampled from ``base``, uniform in the window."""
    rng = np.random.default_rng(seed)
    n = len(base)
    rate = n / max(base.duration_s, 1.0)
    extra = rng.poisson((factor - 1.0) * rate * hold_s)
    pick = rng.integers(0, n, extra)
    t = np.concatenate([base.arrival_s, at_s + rng.uniform(0.0, hold_s, extra)])
    order = np.argsort(t, kind="stable")
    prompt = np.concatenate([base.prompt_tokens, base.prompt_tokens[pick]])[order]
    output = np.concatenate([base.output_tokens, base.output_tokens[pick]])[order]
    return replace(Trace.from_arrays(t[order], prompt, output), start_time=base.start_time)


def silence_between(first: Trace, second: Trace, gap_s: float) -> Trace:
    """``first``, then nothing for ``gap_s`` seconds, then ``second``."""
    t = np.concatenate([first.arrival_s, first.duration_s + gap_s + second.arrival_s - second.arrival_s[0]])
    return replace(
        Trace.from_arrays(
            t,
            np.concatenate([first.prompt_tokens, second.prompt_tokens]),
            np.concatenate([first.output_tokens, second.output_tokens]),
        ),
        start_time=first.start_time,
    )


def _azure_rows(trace: Trace, stamp: Callable[[pd.Timestamp], str]) -> list[bytes]:
    start = pd.Timestamp(trace.start_time if trace.start_time is not None else "2023-11-16 18:00:00")
    times = start + pd.to_timedelta(np.round(trace.arrival_s * 1e7) * 100, unit="ns")
    rows = [b"TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [
        f"{stamp(t)},{p},{o}".encode()
        for t, p, o in zip(times, trace.prompt_tokens.tolist(), trace.output_tokens.tolist(), strict=True)
    ]
    return rows


def build_hostile_variants(out_dir: Path, *, long: bool = True, seed: int = 0) -> list[Variant]:
    """Edge cases of traffic and of files (issues 3, 4, 5): silences, a flash crowd, a compressed day,
    prompts past the context window, prompts past one instance's KV cache, 0/1-token outputs, one timestamp for every row, timestamps in other
    zones and spellings, trailing garbage, a header-only file, a gzip'd file, missing columns/fields, and
    (``long``) 10 h at 1 req/s. ``expect`` is what the readers must do; what the simulator does with the
    accepted ones (e.g. prompts past the context window) is the entry points' business."""
    out_dir.mkdir(parents=True, exist_ok=True)
    code = read_trace(bundled(CODE_TRACE))
    moon = read_trace(bundled(MOONCAKE_TRACE))
    vs: list[Variant] = []

    def add(name: str, fmt: str, description: str, ext: str | None = None, **kw: object) -> Path:
        path = out_dir / f"{name}.{ext or ('jsonl' if fmt == F.MOONCAKE else 'csv')}"
        vs.append(Variant(name, fmt, path, description, **kw))  # type: ignore[arg-type]
        return path

    ten = code.window(0.0, 600.0)
    silent = silence_between(ten, code.window(600.0, 1200.0), 3600.0)
    write_trace(silent, add("hostile_silence_1h", F.AZURE, "10 min of code, 1 h of nothing, 10 min more",
                            expect="ok", requests=len(silent)), F.AZURE)  # fmt: skip
    quiet = _steady(900.0, 2.0, seed)
    crowd = flash_crowd(quiet, 300.0, 20.0, 60.0, seed)
    write_trace(crowd, add("hostile_flash_crowd_x20", F.AZURE, "2 req/s, then ×20 within one second for 60 s",
                           expect="ok", requests=len(crowd)), F.AZURE)  # fmt: skip
    day = _synthetic_hours(1800.0, 4.0, 0.0, seed + 3)
    params = SyntheticParams(duration_s=1800.0, rate_rps=4.0, burst_multiplier=1.0, diurnal_amplitude=0.8,
                             diurnal_period_s=1800.0, diurnal_phase_s=-450.0, grid_s=0.1)  # fmt: skip
    day = generate(params, seed=seed + 3)
    write_trace(day, add("hostile_day_in_30min", F.AZURE, "a diurnal day (±80 %) compressed into 30 min",
                         expect="ok", requests=len(day)), F.AZURE)  # fmt: skip
    over = ten.take(slice(None))
    prompts = over.prompt_tokens.copy()
    prompts[::50] = MAX_CONTEXT_PROBE_TOKENS
    over = replace(over, prompt_tokens=prompts)
    write_trace(over, add("hostile_prompt_over_context", F.AZURE, f"10 min of code, every 50th prompt "
                          f"{MAX_CONTEXT_PROBE_TOKENS:,} tokens (past the context window)", expect="ok",
                          requests=len(over)), F.AZURE)  # fmt: skip
    huge = ten.take(slice(None))
    prompts = huge.prompt_tokens.copy()
    prompts[1::300] = MAX_KV_PROBE_TOKENS
    huge = replace(huge, prompt_tokens=prompts)
    write_trace(huge, add("hostile_prompt_over_kv", F.AZURE, f"10 min of code, every 300th prompt (from the "
                          f"2nd) {MAX_KV_PROBE_TOKENS:,} tokens (past one instance's KV cache)", expect="ok",
                          requests=len(huge)), F.AZURE)  # fmt: skip
    tiny = replace(ten, output_tokens=(np.arange(len(ten)) % 2).astype(ten.output_tokens.dtype))
    write_trace(tiny, add("hostile_output_0_or_1", F.AZURE, "10 min of code, outputs of 0 and 1 token",
                          expect="ok", requests=len(tiny)), F.AZURE)  # fmt: skip
    p = add("hostile_one_timestamp", F.AZURE, "500 requests, all on the same timestamp (duration 0)",
            expect="ok", requests=500)  # fmt: skip
    _write_lines(p, [b"TIMESTAMP,ContextTokens,GeneratedTokens"]
                 + [f"2023-11-16 18:00:00.0000000,{800 + i},{50 + i % 7}".encode() for i in range(500)])  # fmt: skip
    p = add("hostile_single_request", F.AZURE, "one request", expect="ok", requests=1)
    _write_lines(p, [b"TIMESTAMP,ContextTokens,GeneratedTokens", b"2023-11-16 18:00:00.0000000,1000,100"])
    # timestamps as other exporters write them --------------------------------------------------------
    p = add("hostile_iso_T_Z", F.AZURE, "ISO 8601 with T and Z (UTC)", expect="ok", requests=len(ten))
    _write_lines(p, _azure_rows(ten, lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"))
    p = add("hostile_offset_0530", F.AZURE, "local times at +05:30", expect="ok", requests=len(ten))
    _write_lines(p, _azure_rows(ten, lambda t: (t + pd.Timedelta(hours=5.5)).strftime("%Y-%m-%d %H:%M:%S.%f")
                                + "+05:30"))  # fmt: skip
    dst = replace(
        ten, start_time=pd.Timestamp("2024-03-31 00:55:00")
    )  # Europe/Berlin: +01:00 -> +02:00 at 01:00
    p = add("hostile_dst_change", F.AZURE, "Berlin local times across the spring DST change (+01:00, +02:00)",
            expect="ok", requests=len(ten))  # fmt: skip
    _write_lines(p, _azure_rows(dst, lambda t: t.tz_localize("UTC").tz_convert("Europe/Berlin").isoformat()))
    p = add("hostile_whole_seconds", F.AZURE, "timestamps without a fraction (whole seconds, duplicates)",
            expect="ok", requests=len(ten))  # fmt: skip
    _write_lines(p, _azure_rows(ten, lambda t: t.strftime("%Y-%m-%d %H:%M:%S")))
    p = add("hostile_mooncake_seconds", F.MOONCAKE, "Mooncake with timestamps in seconds instead of ms",
            expect="ok", requests=len(moon))  # fmt: skip
    write_trace(moon, p, F.MOONCAKE)
    _write_lines(p, [_ms_to_s(line) for line in _lines(p)])
    # broken files --------------------------------------------------------------------------------------
    p = add("hostile_trailing_garbage", F.AZURE, "code (10 min) then a summary line an export tool added",
            expect="error", requests=0, error_line=len(ten) + 2)  # fmt: skip
    write_trace(ten, p, F.AZURE)
    _write_lines(p, [*_lines(p), b"", b"# exported 2023-11-17 by trace-tool; rows: 0"])
    p = add("hostile_header_only", F.AZURE, "a header and no rows", expect="error", requests=0)
    _write_lines(p, [b"TIMESTAMP,ContextTokens,GeneratedTokens"])
    p = add("hostile_gzip", F.AZURE, "code (10 min) gzip'd, as downloaded", ext="csv.gz", expect="error",
            requests=0)  # fmt: skip
    write_trace(ten, out_dir / "hostile_gzip.plain.csv", F.AZURE)
    import gzip

    p.write_bytes(gzip.compress((out_dir / "hostile_gzip.plain.csv").read_bytes(), mtime=0))
    (out_dir / "hostile_gzip.plain.csv").unlink()
    p = add("hostile_missing_column", F.AZURE, "Azure CSV without GeneratedTokens", expect="error",
            requests=0, error_line=1)  # fmt: skip
    write_trace(ten, p, F.AZURE)
    _write_lines(p, [line.rsplit(b",", 1)[0] for line in _lines(p)])
    p = add("hostile_burstgpt_no_total", F.BURSTGPT, "BurstGPT CSV without Total tokens", expect="error",
            requests=0, error_line=1)  # fmt: skip
    write_trace(ten, p, F.BURSTGPT)
    lines = _lines(p)
    k = lines[0].split(b",").index(b"Total tokens")
    _write_lines(p, [b",".join(c for i, c in enumerate(line.split(b",")) if i != k) for line in lines])
    p = add("hostile_mooncake_missing_field", F.MOONCAKE, "Mooncake, line 7 without output_length",
            expect="error", requests=0, error_line=7)  # fmt: skip
    write_trace(moon, p, F.MOONCAKE)
    lines = _lines(p)
    lines[6] = lines[6].replace(b', "output_length"', b', "output_len"')
    _write_lines(p, lines)
    if long:
        ten_h = at_start(_steady(36_000.0, 1.0, seed + 4), LATER_DAY.normalize())
        write_trace(ten_h, add("hostile_10h_1rps", F.AZURE, "10 h at 1 req/s", expect="ok",
                               requests=len(ten_h), long=True), F.AZURE)  # fmt: skip
    return vs


def _ms_to_s(line: bytes) -> bytes:
    head, rest = line.split(b",", 1)
    key, value = head.split(b":", 1)
    return key + b": " + repr(float(value) / 1000.0).encode() + b"," + rest


# ---- traffic shapes and exports the sets above lack (session 9) ------------------------------------------

CONTEXT_TOKENS = 131_072  # llama3-8b/a100's max_model_len: prompt + output of the heavy-tailed variant fit it


def piecewise_poisson(
    pieces: list[tuple[float, float]], lengths: Trace, seed: int, start: pd.Timestamp | None = None
) -> Trace:
    """Poisson arrivals at rate r for d seconds for each (d, r) of ``pieces``, one after the other (r = 0:
    silence); prompt and output lengths drawn with replacement from ``lengths``."""
    rng = np.random.default_rng(seed)
    times, t0 = [], 0.0
    for duration_s, rate_rps in pieces:
        n = rng.poisson(rate_rps * duration_s)
        times.append(t0 + np.sort(rng.uniform(0.0, duration_s, n)))
        t0 += duration_s
    t = np.concatenate(times)
    pick = rng.integers(0, len(lengths), len(t))
    out = Trace.from_arrays(t, lengths.prompt_tokens[pick], lengths.output_tokens[pick])
    return _rebased(replace(out, start_time=start if start is not None else lengths.start_time))


def periodic_bursts(
    duration_s: float, base_rps: float, period_s: float, burst_s: float, factor: float
) -> list[tuple[float, float]]:
    """Pieces for ``base_rps`` with a burst of ``factor`` × base for ``burst_s`` at the start of every period."""
    pieces: list[tuple[float, float]] = []
    t = 0.0
    while t < duration_s:
        on = min(burst_s, duration_s - t)
        pieces += [(on, base_rps * factor), (min(period_s - burst_s, duration_s - t - on), base_rps)]
        t += period_s
    return [(d, r) for d, r in pieces if d > 0]


def pareto_prompts(trace: Trace, alpha: float, scale: float, context: int, seed: int) -> Trace:
    """Prompts Pareto(``alpha``) × ``scale`` (heavy-tailed), each capped so that prompt + output <= ``context``."""
    rng = np.random.default_rng(seed)
    raw = scale * (1.0 + rng.pareto(alpha, len(trace)))
    prompt = np.minimum(np.rint(raw), context - trace.output_tokens).astype(np.int64)
    return replace(trace, prompt_tokens=np.maximum(prompt, 1))


def _utf16(path: Path) -> None:
    path.write_bytes(path.read_bytes().decode("utf-8").encode("utf-16"))  # with its BOM, as Excel writes


def build_shape_variants(out_dir: Path, *, long: bool = True, seed: int = 0) -> list[Variant]:
    """Traffic shapes and file exports that ``build_variants`` and ``build_hostile_variants`` lack: very high
    rates, Pareto prompts up to the context, outputs all 0, ×10 steps up and down, periodic bursts at
    periods no bundled trace has, on/off traffic with long silences, a first minute that is the peak, hours at
    a low rate; and exports: ISO times with offsets and 3-digit fractions, BurstGPT with epoch seconds, epoch
    ms, Mooncake with epoch ms and epoch µs, UTF-16, lower-case headers, quoted fields, epoch seconds in an
    Azure TIMESTAMP, absurd times. Lengths are drawn from the bundled Azure traces."""
    out_dir.mkdir(parents=True, exist_ok=True)
    code = read_trace(bundled(CODE_TRACE))
    conv = read_trace(bundled(CONV_TRACE))
    vs: list[Variant] = []

    def add(name: str, fmt: str, description: str, trace: Trace | None = None, **kw: object) -> Path:
        path = out_dir / f"{name}.{'jsonl' if fmt == F.MOONCAKE else 'csv'}"
        kw.setdefault("requests", 0 if trace is None else len(trace))
        vs.append(Variant(name, fmt, path, description, **kw))  # type: ignore[arg-type]
        if trace is not None:
            write_trace(trace, path, fmt)
        return path

    # traffic shapes ----------------------------------------------------------------------------------
    high = piecewise_poisson([(120.0, 20.0), (60.0, 1000.0), (120.0, 20.0)], conv, seed)
    add(
        "shape_1000rps_1min",
        F.AZURE,
        "2 min at 20 req/s, 1 min at 1,000 req/s, 2 min at 20 (conv lengths)",
        high,
        expect="ok",
        long=True,
    )  # fmt: skip  (long: 65k requests, the entry points' longer timeout)
    steady = piecewise_poisson([(600.0, 3.0)], conv, seed + 1)
    add("shape_pareto_prompts", F.AZURE, f"10 min at 3 req/s, prompts Pareto(1.1) × 300 up to the "
        f"{CONTEXT_TOKENS:,}-token context", pareto_prompts(steady, 1.1, 300.0, CONTEXT_TOKENS, seed),
        expect="ok")  # fmt: skip
    ten = code.window(0.0, 600.0)
    add("shape_outputs_all_0", F.AZURE, "10 min of code, every output 0 tokens",
        replace(ten, output_tokens=np.zeros(len(ten), dtype=ten.output_tokens.dtype)), expect="ok")  # fmt: skip
    add("shape_step_x10_up_down", F.AZURE, "5 min at 2 req/s, 5 min at 20, 5 min at 2 (steps ×10 and ÷10)",
        piecewise_poisson([(300.0, 2.0), (300.0, 20.0), (300.0, 2.0)], code, seed + 2), expect="ok")  # fmt: skip
    add("shape_bursts_every_37s", F.AZURE, "15 min at 3 req/s, ×6 for 5 s every 37 s",
        piecewise_poisson(periodic_bursts(900.0, 3.0, 37.0, 5.0, 6.0), code, seed + 3), expect="ok")  # fmt: skip
    add("shape_bursts_every_7min", F.AZURE, "30 min at 2 req/s, ×8 for 40 s every 420 s",
        piecewise_poisson(periodic_bursts(1800.0, 2.0, 420.0, 40.0, 8.0), code, seed + 4), expect="ok")  # fmt: skip
    add("shape_on_off_20min", F.AZURE, "3 × (2 min at 8 req/s, 20 min of nothing), then 2 min on",
        piecewise_poisson([(120.0, 8.0), (1200.0, 0.0)] * 3 + [(120.0, 8.0)], conv, seed + 5), expect="ok")  # fmt: skip
    add("shape_first_minute_peak", F.AZURE, "1 min at 30 req/s, then 10 min at 3 req/s",
        piecewise_poisson([(60.0, 30.0), (600.0, 3.0)], code, seed + 6), expect="ok")  # fmt: skip
    if long:
        add("shape_6h_0.2rps", F.AZURE, "6 h at 0.2 req/s (hours at a low rate)",
            piecewise_poisson([(21_600.0, 0.2)], conv, seed + 7), expect="ok", long=True)  # fmt: skip

    # exports as other tools write them -----------------------------------------------------------------
    p = add("export_azure_iso_ms_offsets", F.AZURE, "ISO 8601 with T, 3-digit fractions, +05:30 and Z mixed",
            requests=len(ten), expect="ok")  # fmt: skip
    _write_lines(p, _azure_rows(ten, lambda t: (t + pd.Timedelta(hours=5.5)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
                                + "+05:30" if t.second % 2 else t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"))  # fmt: skip
    epoch0 = 1_700_157_600.0  # 2023-11-16 18:00:00 UTC
    add("export_burstgpt_epoch_s", F.BURSTGPT, "BurstGPT with epoch-second timestamps (float)",
        replace(ten, arrival_s=ten.arrival_s + epoch0), expect="ok")  # fmt: skip
    add("export_burstgpt_epoch_ms", F.BURSTGPT, "BurstGPT with epoch-millisecond timestamps (read as seconds: "
        "warned)", replace(ten, arrival_s=np.round((ten.arrival_s + epoch0) * 1000.0)), expect="ok")  # fmt: skip
    p = add("export_mooncake_epoch_ms", F.MOONCAKE, "Mooncake with epoch-millisecond timestamps",
            replace(ten, arrival_s=ten.arrival_s + epoch0), expect="ok")  # fmt: skip
    p = add("export_mooncake_epoch_us", F.MOONCAKE, "Mooncake with epoch-microsecond timestamps (read as ms: "
            "warned)", replace(ten, arrival_s=(ten.arrival_s + epoch0) * 1000.0), expect="ok")  # fmt: skip
    p = add("export_azure_utf16", F.AZURE, "10 min of code saved as UTF-16 with a BOM (refused)", ten,
            expect="error", requests=0, error_line=1)  # fmt: skip
    _utf16(p)
    p = add("export_azure_lowercase_header", F.AZURE, "header timestamp,contexttokens,generatedtokens (refused)",
            ten, expect="error", requests=0, error_line=1)  # fmt: skip
    lines = _lines(p)
    _write_lines(p, [lines[0].lower(), *lines[1:]])
    p = add("export_azure_quoted", F.AZURE, "every field in double quotes (refused)", ten, expect="error",
            requests=0, error_line=2)  # fmt: skip
    _write_lines(p, [lines[0]] + [b",".join(b'"' + c + b'"' for c in line.split(b",")) for line in lines[1:]])
    p = add("export_azure_epoch_seconds", F.AZURE, "Azure header, TIMESTAMP in epoch seconds (refused)",
            expect="error", error_line=2)  # fmt: skip
    _write_lines(p, [b"TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"{epoch0 + t:.3f},{pr},{o}".encode()
        for t, pr, o in zip(ten.arrival_s.tolist(), ten.prompt_tokens.tolist(), ten.output_tokens.tolist(), strict=True)
    ])  # fmt: skip
    p = add("export_mooncake_absurd_time", F.MOONCAKE, "Mooncake whose last timestamp is 1e300 (refused)",
            expect="error", error_line=3)  # fmt: skip
    _write_lines(p, [b'{"timestamp": 0, "input_length": 100, "output_length": 10}',
                     b'{"timestamp": 1000, "input_length": 100, "output_length": 10}',
                     b'{"timestamp": 1e300, "input_length": 100, "output_length": 10}'])  # fmt: skip
    return vs
