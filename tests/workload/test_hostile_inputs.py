"""Edge-case traces real users bring (bench/bench_unseen.py --set hostile): compressed files, missing
columns, Mooncake timestamps in seconds, other time zones, one timestamp for every row, and prompts past
the profile's context window in a replay."""

from __future__ import annotations

import gzip
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.fleet import single_pool
from serving.sim.replay import OverContextWarning, PolicyOptions, make_policy, replay
from serving.workload.errors import TraceError, TraceWarning
from serving.workload.readers import read_trace
from serving.workload.trace import Trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
ROWS = [
    "2023-11-16 18:00:00.0000000,100,10",
    "2023-11-16 18:00:00.5000000,200,20",
    "2023-11-16 18:00:02.2500000,300,30",
]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("pack", "word", "tool"),
    [(gzip.compress, "gzip-compressed", "gunzip -k"), (lambda b: b"BZh91AY&SY" + b, "bzip2", "bunzip2")],
)
@pytest.mark.parametrize("fmt", [None, "azure"])
def test_compressed_file_is_refused_with_how_to_decompress(
    tmp_path: Path, pack: object, word: str, tool: str, fmt: str | None
) -> None:
    path = tmp_path / "trace.csv.gz"
    path.write_bytes(pack("\n".join([AZURE_HEADER, *ROWS]).encode()))  # type: ignore[operator]
    with pytest.raises(TraceError, match=word) as e:
        read_trace(path, fmt)
    assert str(path) in str(e.value) and tool in str(e.value)


@pytest.mark.parametrize(
    ("header", "missing"),
    [
        ("TIMESTAMP,ContextTokens", "GeneratedTokens"),
        ("Timestamp,Model,Request tokens,Response tokens,Log Type", "Total tokens"),
    ],
)
def test_known_header_with_a_missing_column_names_it(tmp_path: Path, header: str, missing: str) -> None:
    path = _write(tmp_path / "t.csv", [header, "1,2"])
    with pytest.raises(TraceError, match=rf":1: the header looks like .* lacks column\(s\) \['{missing}'\]"):
        read_trace(path)


def test_unrelated_header_is_still_unknown_format(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", ["time,tokens", "1,2"])
    with pytest.raises(TraceError, match="unknown trace format"):
        read_trace(path)


def test_trailing_garbage_after_a_blank_line_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", [AZURE_HEADER, *ROWS, "", "# exported by trace-tool"])
    with pytest.raises(TraceError, match=r"t\.csv:5: blank line, then more text on line 6: '# exported by"):
        read_trace(path)


def test_mooncake_trailing_garbage_after_a_blank_line_names_both_lines(tmp_path: Path) -> None:
    path = _mooncake(tmp_path / "m.jsonl", [0.0, 5.0])
    path.write_text(path.read_text() + "\n\nEOF\n")
    with pytest.raises(TraceError, match=r"m\.jsonl:3: blank line, then more text on line 5: 'EOF'"):
        read_trace(path)


def test_every_row_on_one_timestamp_reads_with_duration_zero(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", [AZURE_HEADER] + ["2023-11-16 18:00:00.0000000,100,1"] * 50)
    trace = read_trace(path)
    assert len(trace) == 50 and trace.duration_s == 0.0


def _mooncake(path: Path, times: list[float]) -> Path:
    lines = [f'{{"timestamp": {t!r}, "input_length": 100, "output_length": 5}}' for t in times]
    return _write(path, lines)


def test_mooncake_timestamps_in_seconds_are_read_as_written_with_a_warning(tmp_path: Path) -> None:
    path = _mooncake(tmp_path / "s.jsonl", [i * 0.25 for i in range(400)])  # 100 s at 4 req/s, in seconds
    with pytest.warns(TraceWarning, match=r"400 records within 0\.09975 s .* multiply them by 1000"):
        trace = read_trace(path)
    assert len(trace) == 400 and trace.duration_s == pytest.approx(0.09975)


@settings(max_examples=25, deadline=None)
@given(rate=st.floats(0.5, 900.0), n=st.integers(100, 300))
def test_mooncake_in_milliseconds_below_1000_rps_gives_no_warning(rate: float, n: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = _mooncake(Path(d) / "ms.jsonl", [round(i * 1000.0 / rate, 3) for i in range(n)])
        with warnings.catch_warnings():
            warnings.simplefilter("error", TraceWarning)
            trace = read_trace(path)
    assert len(trace) == n


@settings(max_examples=25, deadline=None)
@given(offset_min=st.integers(-12 * 60, 14 * 60).map(lambda m: m - m % 15))
def test_local_times_with_any_utc_offset_read_as_the_same_utc_trace(offset_min: int) -> None:
    import tempfile

    base = pd.Timestamp("2024-03-31 00:59:59.5")
    arrivals = [0.0, 0.25, 0.25, 1.0, 3600.5]
    sign = "+" if offset_min >= 0 else "-"
    zone = f"{sign}{abs(offset_min) // 60:02d}:{abs(offset_min) % 60:02d}"
    with tempfile.TemporaryDirectory() as d:
        lines = [AZURE_HEADER]
        for i, a in enumerate(arrivals):
            local = base + pd.Timedelta(seconds=a) + pd.Timedelta(minutes=offset_min)
            lines.append(f"{local.strftime('%Y-%m-%dT%H:%M:%S.%f')}{zone},{100 + i},{10 + i}")
        trace = read_trace(_write(Path(d) / "tz.csv", lines))
    np.testing.assert_allclose(trace.arrival_s, arrivals)
    assert trace.start_time is not None and pd.Timestamp(trace.start_time) == base.tz_localize("UTC")


def test_replay_counts_prompts_past_max_model_len_and_serves_them() -> None:
    trace = Trace.from_arrays(
        np.array([0.0, 0.5, 1.0, 2.0]),
        np.array([100, 2000, 100, 900]),  # cpu-tiny: max_model_len 1024; 2000 + 8 and 900 + 200 are past it
        np.array([8, 8, 8, 200]),
        source="t.csv",
    )
    with pytest.warns(
        OverContextWarning, match=r"t\.csv .*2 of 4 requests .*max_model_len = 1,024 .*request 1"
    ):
        report = replay(
            single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
            {"default": trace},
            make_policy("fixed", PolicyOptions(mixed=1)),
        )
    doc = report.to_json()
    assert doc["over_context"] == 2
    assert doc["requests"] == doc["completed"] == 4 and doc["unfinished"] == 0
    from training.policy_bench import policy_figures

    assert policy_figures(report, None).to_json()["over_context"] == 2  # pdscale bench's JSON


def test_replay_within_max_model_len_reports_zero_and_no_warning() -> None:
    trace = Trace.from_arrays(np.array([0.0, 1.0]), np.array([100, 200]), np.array([8, 8]), source="t.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error", OverContextWarning)
        report = replay(
            single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
            {"default": trace},
            make_policy("fixed", PolicyOptions(mixed=1)),
        )
    assert report.to_json()["over_context"] == 0


@pytest.mark.parametrize("split", ["shared", "static"])
def test_fleet_replay_sums_over_context_over_its_pools(split: str) -> None:
    from serving.sim.fleet import FleetSpec
    from serving.sim.fleet_file import replay_fleet

    one = single_pool(profile="cpu-tiny", mixed=1, max_per_role=2).pools[0]
    spec = FleetSpec(pools=(replace(one, name="a"), replace(one, name="b")), gpu_budget=4)
    traces = {
        "a": Trace.from_arrays(np.array([0.0, 1.0]), np.array([2000, 100]), np.array([8, 8]), source="a.csv"),
        "b": Trace.from_arrays(np.array([0.0]), np.array([1500]), np.array([8]), source="b.csv"),
    }
    with pytest.warns(OverContextWarning):
        doc = replay_fleet(spec, traces, "static-peak", split=split).to_json()
    assert doc["over_context"] == 2 and doc["requests"] == doc["completed"] == 3


@pytest.mark.parametrize("score_from", ["+0", "70%"])
def test_evaluate_refuses_a_trace_spanning_zero_seconds_saying_so(score_from: str) -> None:
    from training.evaluate import EvaluationError, parse_score_from

    trace = Trace.from_arrays(np.zeros(3), np.full(3, 100), np.full(3, 8), source="one.csv")
    with pytest.raises(EvaluationError, match=r"one\.csv spans 0 s \(3 request\(s\), all on one timestamp\)"):
        parse_score_from(score_from, trace)


def test_fit_refuses_a_trace_spanning_zero_seconds(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from training.cli import app

    path = _write(tmp_path / "one.csv", [AZURE_HEADER] + ["2023-11-16 18:00:00.0000000,100,1"] * 3)
    result = CliRunner().invoke(
        app, ["fit", "--trace", str(path), "--out", str(tmp_path / "out"), "--epochs", "1"]
    )
    text = " ".join(result.output.replace("│", " ").split())  # rich wraps the message in a box
    assert result.exit_code == 2, text
    assert "3 request(s), all on one timestamp (the trace spans 0 s)" in text
    assert not (tmp_path / "out" / "forecaster.safetensors").exists()


def test_every_hostile_variant_reads_as_documented(tmp_path: Path) -> None:
    from serving.workload.variants import build_hostile_variants

    variants = build_hostile_variants(tmp_path, long=False)
    assert len(variants) == 19 and len({v.name for v in variants}) == 19
    for v in variants:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TraceWarning)
            if v.expect == "error":
                where = rf":{v.error_line}: " if v.error_line is not None else r"\.(csv|gz|jsonl): "
                with pytest.raises(TraceError, match=where):
                    read_trace(v.path)
                continue
            t = read_trace(v.path)
        assert len(t) == v.requests, v.name
        assert t.arrival_s[0] == 0.0 and bool(np.all(np.diff(t.arrival_s) >= 0)), v.name
        told = [str(w.message) for w in caught if issubclass(w.category, TraceWarning)]
        assert bool(told) == (v.name == "hostile_mooncake_seconds"), (v.name, told)
    zones = [read_trace(tmp_path / f"hostile_{n}.csv") for n in ("iso_T_Z", "offset_0530", "whole_seconds")]
    np.testing.assert_allclose(zones[0].arrival_s, zones[1].arrival_s)
    assert zones[0].start_time == zones[1].start_time
    assert (
        np.abs(zones[2].arrival_s - zones[0].arrival_s).max() < 1.0
    )  # whole seconds: truncated, not shifted
