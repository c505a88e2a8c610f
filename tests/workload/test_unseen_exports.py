"""Trace files as other tools export them (bench/bench_unseen.py --set shapes): UTF-16, headers in quotes or in
another case, quoted fields, epoch numbers where a date-time or relative time belongs, times in a finer unit than
the format's, times no trace can span; and every shape variant reads as documented."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.workload.errors import TraceError, TraceWarning
from serving.workload.readers import read_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
ROWS = ["2023-11-16 18:00:00.0000000,100,10", "2023-11-16 18:00:00.5000000,200,20"]
EPOCH_S = 1_700_157_600.0  # 2023-11-16 18:00:00 UTC


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _read_warned(path: Path) -> tuple[list[str], int]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceWarning)
        n = len(read_trace(path))
    return [str(w.message) for w in caught if issubclass(w.category, TraceWarning)], n


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_a_utf16_or_utf32_file_is_refused_naming_the_encoding_and_iconv(
    tmp_path: Path, encoding: str
) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes("\n".join([AZURE_HEADER, *ROWS, ""]).encode(encoding))
    with pytest.raises(TraceError, match=r"t\.csv:1: is encoded as UTF-(16|32)") as e:
        read_trace(path)
    assert "iconv -f UTF-16 -t UTF-8" in str(e.value)


@pytest.mark.parametrize(
    ("header", "renamed"),
    [
        ("timestamp,contexttokens,generatedtokens", "'timestamp' -> 'TIMESTAMP'"),
        ("TIMESTAMP,contextTokens,GeneratedTokens", "'contextTokens' -> 'ContextTokens'"),
        (BURSTGPT_HEADER.lower(), "'request tokens' -> 'Request tokens'"),
    ],
)
def test_a_header_in_another_case_names_the_renames(tmp_path: Path, header: str, renamed: str) -> None:
    path = _write(tmp_path / "t.csv", [header, "2023-11-16 18:00:00,1,2"])
    with pytest.raises(
        TraceError, match=r":1: the header names the '(azure|burstgpt)' columns in another case"
    ) as e:
        read_trace(path)
    assert renamed in str(e.value)


def test_a_quoted_header_is_refused_saying_quotes_are_not_read(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", ['"TIMESTAMP","ContextTokens","GeneratedTokens"', *ROWS])
    with pytest.raises(TraceError, match=r":1: the header names the 'azure' columns in double quotes"):
        read_trace(path)


@pytest.mark.parametrize(
    ("lines", "column"),
    [
        ([AZURE_HEADER, '"2023-11-16 18:00:00.0000000",100,10'], "TIMESTAMP"),
        ([AZURE_HEADER, ROWS[0], '2023-11-16 18:00:01.0000000,"100",10'], "ContextTokens"),
        ([BURSTGPT_HEADER, '5,ChatGPT,472,18,490,"API log"'], "Log Type"),
    ],
)
def test_a_quoted_field_names_its_line_and_column(tmp_path: Path, lines: list[str], column: str) -> None:
    """(A quoted BurstGPT Model is read as the model's name, quotes included: names are free text.)"""
    path = _write(tmp_path / "t.csv", lines)
    with pytest.raises(TraceError, match=rf":{len(lines)}: quoted field: .*\(column {column} = '\"") as e:
        read_trace(path)
    assert "sed" in str(e.value)


@pytest.mark.parametrize("stamp", ["1700157600", "1700157600.25", "1700157600000"])
def test_epoch_numbers_in_an_azure_timestamp_are_refused_saying_so(tmp_path: Path, stamp: str) -> None:
    path = _write(tmp_path / "t.csv", [AZURE_HEADER, ROWS[0], f"{stamp},100,10"])
    with pytest.raises(TraceError, match=r":3: unparsable time: a number \(epoch seconds\?\)"):
        read_trace(path)


def _mooncake(path: Path, stamps: list[float]) -> Path:
    return _write(
        path, [json.dumps({"timestamp": t, "input_length": 10, "output_length": 2}) for t in stamps]
    )


def _burstgpt(path: Path, stamps: list[float]) -> Path:
    return _write(path, [BURSTGPT_HEADER] + [f"{t!r},ChatGPT,10,2,12,API log" for t in stamps])


def test_mooncake_epoch_microseconds_are_read_as_written_with_a_warning(tmp_path: Path) -> None:
    told, n = _read_warned(_mooncake(tmp_path / "t.jsonl", [(EPOCH_S + i) * 1e6 for i in range(5)]))
    assert n == 5 and len(told) == 1 and "look like epoch microseconds" in told[0], told
    assert "divide by 1000" in told[0]


def test_burstgpt_epoch_milliseconds_are_read_as_written_with_a_warning(tmp_path: Path) -> None:
    told, n = _read_warned(_burstgpt(tmp_path / "t.csv", [(EPOCH_S + i) * 1e3 for i in range(5)]))
    assert n == 5 and len(told) == 1 and "looks like epoch milliseconds" in told[0], told


@settings(max_examples=25, deadline=None)
@given(
    offset=st.floats(0.0, EPOCH_S * 1.2),
    gaps=st.lists(st.floats(0.0, 3600.0), min_size=1, max_size=20),
)
def test_times_in_the_formats_own_unit_from_any_epoch_read_without_a_warning(
    tmp_path_factory: pytest.TempPathFactory, offset: float, gaps: list[float]
) -> None:
    """Relative or epoch times in the format's unit (BurstGPT s, Mooncake ms) read as times from the first row,
    with no unit warning."""
    tmp = tmp_path_factory.mktemp("epoch")
    rel = np.concatenate(([0.0], np.cumsum(gaps)))
    for path, stamps, scale in (
        (tmp / "b.csv", offset + rel, 1.0),
        (tmp / "m.jsonl", (offset + rel) * 1000.0, 1000.0),
    ):
        writer = _burstgpt if scale == 1.0 else _mooncake
        with warnings.catch_warnings():
            warnings.simplefilter("error", TraceWarning)
            t = read_trace(writer(path, [float(x) for x in stamps]))
        np.testing.assert_allclose(t.arrival_s, (stamps - stamps[0]) / scale, atol=1e-3 + 1e-12 * offset)


@pytest.mark.parametrize("fmt", ["mooncake", "burstgpt"])
def test_times_no_trace_can_span_are_refused_at_their_line(tmp_path: Path, fmt: str) -> None:
    """1e300 ms (or s) after the first row: once a hang (reactive replay) or 'minlength must not be negative'."""
    stamps = [0.0, 1000.0, 1e300, 1e300]
    path = (
        _mooncake(tmp_path / "t.jsonl", stamps)
        if fmt == "mooncake"
        else _burstgpt(tmp_path / "t.csv", stamps)
    )
    line = 3 if fmt == "mooncake" else 4  # BurstGPT: the header is line 1
    with pytest.raises(TraceError, match=rf":{line}: arrival .* s after the first row's, more than 1e\+09 s"):
        read_trace(path)


def test_a_span_just_inside_the_limit_reads(tmp_path: Path) -> None:
    from serving.workload.readers import MAX_SPAN_S

    t = read_trace(_burstgpt(tmp_path / "t.csv", [0.0, MAX_SPAN_S - 1.0]))
    assert t.duration_s == MAX_SPAN_S - 1.0


def test_replay_refuses_a_trace_no_trace_can_span_with_the_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from training.pdscale_cli import app

    path = _mooncake(tmp_path / "t.jsonl", [0.0, 1000.0, 1e300])
    result = CliRunner().invoke(app, ["replay", "--trace", str(path), "--policy", "static-peak"])
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2, text
    assert "t.jsonl:3: arrival" in text and "Traceback" not in text


def test_every_shape_variant_reads_as_documented(tmp_path: Path) -> None:
    from serving.workload.variants import build_shape_variants

    variants = build_shape_variants(tmp_path, long=False)
    assert len({v.name for v in variants}) == len(variants) == 18
    warned = {"export_burstgpt_epoch_ms", "export_mooncake_epoch_us"}
    for v in variants:
        if v.expect == "error":
            with pytest.raises(TraceError, match=rf":{v.error_line}: "):
                read_trace(v.path)
            continue
        told, n = _read_warned(v.path)
        assert n == v.requests, v.name
        assert bool(told) == (v.name in warned), (v.name, told)
    same = [read_trace(tmp_path / f"export_{n}") for n in ("burstgpt_epoch_s.csv", "mooncake_epoch_ms.jsonl")]
    np.testing.assert_allclose(same[0].arrival_s, same[1].arrival_s, atol=1e-3)
    iso = read_trace(tmp_path / "export_azure_iso_ms_offsets.csv")
    np.testing.assert_allclose(
        iso.arrival_s, same[0].arrival_s, atol=2e-3
    )  # 3-digit fractions, offsets undone
