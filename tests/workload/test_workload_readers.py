"""Readers on the bundled traces, the BurstGPT fixture, detection, malformed input and chunking."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.workload.errors import TraceError, TraceWarning
from serving.workload.readers import detect_format, iter_trace_chunks, read_trace
from serving.workload.trace import concat_traces

ROOT = Path(__file__).resolve().parents[2]
CODE = ROOT / "datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv"
CONV = ROOT / "datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv"
MOONCAKE = ROOT / "datasets/mooncake/synthetic_trace.jsonl"
BURSTGPT = Path(__file__).parent / "data/burstgpt_sample.csv"

AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZ_ROWS = [
    "2023-11-16 18:17:03.1234567,4808,10",
    "2023-11-16 18:17:04.0000001,3180,8",
    "2023-11-16 18:17:05.5000000,110,27",
]
BG_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def write(tmp_path: Path, name: str, lines: list[str], eol: str = "\r\n") -> Path:
    p = tmp_path / name
    p.write_bytes((eol.join(lines) + eol).encode())
    return p


def test_azure_code_bundled() -> None:
    t = read_trace(CODE)
    assert len(t) == 6118 and t.format == "azure"
    assert t.arrival_s[0] == 0.0 and np.all(np.diff(t.arrival_s) >= 0)
    assert t.start_time == pd.Timestamp("2023-11-16 18:17:03.9799600")
    assert (t.prompt_tokens[0], t.output_tokens[0]) == (4808, 10)
    assert (t.prompt_tokens[-1], t.output_tokens[-1]) == (2326, 9)
    assert t.arrival_s[-1] == pytest.approx(1976.008646, abs=1e-9)
    assert not t.failed.any() and (t.model == -1).all()


def test_azure_conv_bundled() -> None:
    t = read_trace(CONV)
    assert len(t) == 11997
    assert t.arrival_s[-1] == pytest.approx(2053.230434, abs=1e-9)


def test_mooncake_bundled() -> None:
    t = read_trace(MOONCAKE)
    assert len(t) == 3993 and t.format == "mooncake" and t.start_time is None
    assert (t.prompt_tokens[0], t.output_tokens[0]) == (40160, 6)
    assert (t.prompt_tokens[-1], t.output_tokens[-1]) == (18440, 83)
    assert t.arrival_s[-1] == pytest.approx(1022.025)
    assert t.extra["prefix_blocks"].mean() == pytest.approx(30.52266, abs=1e-4)


def test_azure_keeps_seven_fractional_digits_and_lf_endings(tmp_path: Path) -> None:
    t = read_trace(write(tmp_path, "a.csv", [AZ_HEADER, *AZ_ROWS], eol="\n"))
    assert t.start_time == pd.Timestamp("2023-11-16 18:17:03.1234567")
    assert t.arrival_s[1] == pytest.approx(0.8765434, abs=1e-12)
    assert t.arrival_s[2] == pytest.approx(2.3765433, abs=1e-12)


def test_azure_2024_variant_with_time_zone(tmp_path: Path) -> None:
    rows = ["2024-05-10 00:00:00.009930+00:00,374,44", "2024-05-10 00:00:00.014238+00:00,396,109"]
    t = read_trace(write(tmp_path, "a24.csv", [AZ_HEADER, *rows]))
    assert t.start_time == pd.Timestamp("2024-05-10 00:00:00.009930", tz="UTC")
    assert t.arrival_s[1] == pytest.approx(0.004308, abs=1e-12)


def test_burstgpt_fixture_keeps_failed_rows_and_maps_models() -> None:
    t = read_trace(BURSTGPT)
    assert len(t) == 8 and t.format == "burstgpt" and t.start_time is None
    assert t.model_names == ("ChatGPT", "GPT-4")
    assert [t.model_names[c] for c in t.model] == [
        "ChatGPT",
        "ChatGPT",
        "GPT-4",
        "ChatGPT",
        "GPT-4",
        "ChatGPT",
        "GPT-4",
        "ChatGPT",
    ]
    assert t.failed.tolist() == [False, False, False, True, False, False, True, False]
    assert t.output_tokens[3] == 0 and t.prompt_tokens[3] == 1360
    assert t.arrival_s.tolist() == [0.0, 40.0, 113.0, 138.0, 205.0, 206.5, 206.5, 300.25]
    assert t.extra["log_type"].tolist() == [0, 0, 0, 0, 1, 1, 1, 0]


@pytest.mark.parametrize(("path", "fmt"), [(CODE, "azure"), (MOONCAKE, "mooncake"), (BURSTGPT, "burstgpt")])
def test_detect_format(path: Path, fmt: str) -> None:
    assert detect_format(path) == fmt


def test_forced_format_overrides_and_mismatch_is_named(tmp_path: Path) -> None:
    weird = tmp_path / "trace.txt"
    weird.write_bytes(CODE.read_bytes()[:2000].rsplit(b"\r\n", 1)[0] + b"\r\n")
    assert len(read_trace(weird, fmt="azure")) > 0
    with pytest.raises(TraceError, match=r":1: header does not match the 'burstgpt' format"):
        read_trace(weird, fmt="burstgpt")
    with pytest.raises(TraceError, match=r"line 1 .*|bad JSON"):
        read_trace(weird, fmt="mooncake")
    with pytest.raises(ValueError, match=r"unknown trace format 'csv'.*--format"):
        read_trace(weird, fmt="csv")


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "empty file"),
        (b"\r\n\r\n", "empty file"),
        ((AZ_HEADER + "\r\n").encode(), "header but no data rows"),
        (b"a,b,c\r\n1,2,3\r\n", r":1: unknown trace format.*azure.*mooncake.*burstgpt.*--format"),
    ],
    ids=["zero-bytes", "blank-only", "header-only", "unknown-header"],
)
def test_empty_and_unknown_files(tmp_path: Path, content: bytes, match: str) -> None:
    p = tmp_path / "f.csv"
    p.write_bytes(content)
    with pytest.raises(TraceError, match=match):
        read_trace(p)


def test_missing_file_is_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "nope.csv")


AZ_BAD = [
    ("2023-11-16 18:17:04.0000001,31x80,8", "not a number (column ContextTokens = '31x80')"),
    ("2023-11-16 18:17:04.0000001,3180,-8", "negative token count (column GeneratedTokens = '-8')"),
    ("2023-11-16 18:17:04.0000001,3180.5,8", "not a whole number (column ContextTokens = '3180.5')"),
    ("2023-11-16 25:17:04.0000001,3180,8", "unparsable time"),
    (
        "yesterday,3180,8",
        "unparsable time (expected YYYY-MM-DD HH:MM:SS.fffffff) (column TIMESTAMP = 'yesterday')",
    ),
    ("2023-11-16 18:17:04.0000001,3180,8,9", "wrong column count: expected 3 fields"),
    ("2023-11-16 18:17:04.0000001,3180", "wrong column count: expected 3 fields"),
    ("2023-11-16 18:17:04.0000001,,8", "missing value (column ContextTokens = '')"),
    ("", "blank line"),
    (
        "2023-11-16 18:17:01.0000000,3180,8",
        "arrival goes back 4.5 s before an earlier row, more than max_reorder_s = 1 s (column TIMESTAMP = ",
    ),
]


@pytest.mark.parametrize(("bad", "message"), AZ_BAD, ids=[m.split(" (")[0][:30] for _, m in AZ_BAD])
@pytest.mark.parametrize("eol", ["\r\n", "\n"], ids=["crlf", "lf"])
@pytest.mark.parametrize("chunk_rows", [1, 2, 1000])
def test_azure_malformed_row_names_file_and_line(
    tmp_path: Path, bad: str, message: str, eol: str, chunk_rows: int
) -> None:
    p = write(tmp_path, "bad.csv", [AZ_HEADER, AZ_ROWS[0], AZ_ROWS[1], AZ_ROWS[2], bad, AZ_ROWS[2]], eol)
    with pytest.raises(TraceError) as info:
        read_trace(p, chunk_rows=chunk_rows)
    assert str(info.value).startswith(f"{p}:5: ")
    assert message in str(info.value)
    assert info.value.line == 5


def test_first_bad_line_wins_over_later_tokenizer_error(tmp_path: Path) -> None:
    lines = [AZ_HEADER, AZ_ROWS[0], "2023-11-16 18:17:04.0000001,-1,8", "2023-11-16 18:17:05,1,2,3,4"]
    with pytest.raises(TraceError, match=r"bad\.csv:3: negative token count"):
        read_trace(write(tmp_path, "bad.csv", lines), chunk_rows=10)


BG_BAD = [
    ("x,ChatGPT,1,2,3,API log", "unparsable time: not a number of seconds (column Timestamp = 'x')"),
    ("-4,ChatGPT,1,2,3,API log", "negative time (column Timestamp = '-4')"),
    ("400,,1,2,3,API log", "missing value (column Model = '')"),
    ("400,GPT-4,1,2,3,Chat log", "unknown log type"),
    ("400,GPT-4,one,2,3,API log", "not a number (column Request tokens = 'one')"),
    ("400,GPT-4,1,2,3", "wrong column count: expected 6 fields"),
]


@pytest.mark.parametrize(("bad", "message"), BG_BAD, ids=[m.split(" (")[0][:30] for _, m in BG_BAD])
def test_burstgpt_malformed_rows(tmp_path: Path, bad: str, message: str) -> None:
    good = BURSTGPT.read_text().splitlines()
    p = write(tmp_path, "bg.csv", [*good[:4], bad, *good[4:]], "\n")
    with pytest.raises(TraceError) as info:
        read_trace(p)
    assert str(info.value).startswith(f"{p}:5: ") and message in str(info.value)


def test_burstgpt_total_mismatch_warns_and_keeps(tmp_path: Path) -> None:
    p = write(tmp_path, "bg.csv", [BG_HEADER, "1,ChatGPT,10,5,15,API log", "2,ChatGPT,10,5,99,API log"], "\n")
    with pytest.warns(TraceWarning, match=r"bg\.csv:3: 1 rows have Total tokens"):
        t = read_trace(p)
    assert len(t) == 2


MC_GOOD = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]}'
MC_BAD = [
    ('{"timestamp": 5, "input_length": 10, "output_length": 2', "bad JSON"),
    (
        '{"timestamp": 5, "input_length": "ten", "output_length": 2}',
        'not a number (field input_length = "ten")',
    ),
    ('{"timestamp": 5, "input_length": 10}', "missing field 'output_length'"),
    ('{"timestamp": 5, "input_length": -1, "output_length": 2}', "negative value (field input_length = -1)"),
    ('{"timestamp": 5, "input_length": 1.5, "output_length": 2}', "not a whole number"),
    ("[5, 10, 2]", "expected a JSON object"),
    ("", "blank line"),
    ('{"timestamp": -2000, "input_length": 10, "output_length": 2}', "negative value"),
]


@pytest.mark.parametrize(("bad", "message"), MC_BAD, ids=[m.split(" (")[0][:30] for _, m in MC_BAD])
@pytest.mark.parametrize("chunk_rows", [1, 3, 100])
def test_mooncake_malformed_lines(tmp_path: Path, bad: str, message: str, chunk_rows: int) -> None:
    p = write(tmp_path, "m.jsonl", [MC_GOOD, MC_GOOD, MC_GOOD, bad, MC_GOOD], "\n")
    with pytest.raises(TraceError) as info:
        read_trace(p, chunk_rows=chunk_rows)
    assert str(info.value).startswith(f"{p}:4: ") and message in str(info.value)


def test_mooncake_hash_ids_optional_and_trailing_blank_lines_ok(tmp_path: Path) -> None:
    lines = [MC_GOOD, '{"timestamp": 1500, "input_length": 7, "output_length": 1}', "", ""]
    t = read_trace(write(tmp_path, "m.jsonl", lines, "\n"), chunk_rows=1)
    assert t.extra["prefix_blocks"].tolist() == [2, -1]
    assert t.arrival_s.tolist() == [0.0, 1.5]


def test_trailing_blank_lines_ok_in_csv(tmp_path: Path) -> None:
    assert len(read_trace(write(tmp_path, "a.csv", [AZ_HEADER, *AZ_ROWS, "", ""]), chunk_rows=2)) == 3


def test_reorder_within_tolerance_is_sorted_and_warned(tmp_path: Path) -> None:
    rows = [AZ_ROWS[0], AZ_ROWS[2], "2023-11-16 18:17:04.9000000,1,1", "2023-11-16 18:17:06.0000000,2,2"]
    p = write(tmp_path, "r.csv", [AZ_HEADER, *rows])
    for chunk_rows in (1, 2, 10):
        with pytest.warns(TraceWarning, match=r"r\.csv:4: 1 rows arrived up to 0\.6 s"):
            t = read_trace(p, chunk_rows=chunk_rows)
        assert t.prompt_tokens.tolist() == [4808, 1, 110, 2]
    with pytest.raises(TraceError, match=r"r\.csv:4: arrival goes back 0\.6 s.*max_reorder_s = 0\.5"):
        read_trace(p, max_reorder_s=0.5)


def test_first_arrival_is_earliest_even_if_not_first_row(tmp_path: Path) -> None:
    rows = ["2023-11-16 18:17:03.5000000,1,1", "2023-11-16 18:17:03.0000000,2,2", "2023-11-16 18:17:09,3,3"]
    with pytest.warns(TraceWarning):
        t = read_trace(write(tmp_path, "r.csv", [AZ_HEADER, *rows]), chunk_rows=1)
    assert t.arrival_s.tolist() == [0.0, 0.5, 6.0]
    assert t.start_time == pd.Timestamp("2023-11-16 18:17:03")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chunk_rows=st.integers(min_value=300, max_value=7000), which=st.sampled_from([CODE, MOONCAKE, BURSTGPT])
)
def test_chunked_equals_whole(chunk_rows: int, which: Path) -> None:
    whole = read_trace(which)
    chunks = list(iter_trace_chunks(which, chunk_rows=chunk_rows))
    assert sum(len(c) for c in chunks) == len(whole)
    joined = concat_traces(chunks)
    for name in ("arrival_s", "prompt_tokens", "output_tokens", "model", "failed"):
        assert np.array_equal(getattr(joined, name), getattr(whole, name)), name
    assert joined.model_names == whole.model_names and joined.start_time == whole.start_time


@settings(max_examples=30, deadline=None)
@given(
    times=st.lists(st.integers(min_value=0, max_value=20_000), min_size=1, max_size=60),
    chunk_rows=st.integers(min_value=1, max_value=70),
)
def test_reordering_matches_a_stable_sort(times: list[int], chunk_rows: int) -> None:
    """Any input within the tolerance reads back as the stable sort of its rows; beyond it, an error."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        lines = [
            f'{{"timestamp": {ms}, "input_length": {i}, "output_length": 0}}' for i, ms in enumerate(times)
        ]
        p = write(Path(d), "m.jsonl", lines, "\n")
        arr = np.asarray(times, dtype=np.float64)
        back = np.maximum.accumulate(arr) - arr
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            if (back > 1000).any():
                line = int(np.argmax(back > 1000)) + 1
                with pytest.raises(TraceError, match=rf"m\.jsonl:{line}: arrival goes back"):
                    read_trace(p, chunk_rows=chunk_rows)
                return
            t = read_trace(p, chunk_rows=chunk_rows)
        order = np.argsort(arr, kind="stable")
        assert t.prompt_tokens.tolist() == order.tolist()
        assert np.allclose(t.arrival_s, (arr[order] - arr.min()) / 1000.0)


@settings(max_examples=20, deadline=None)
@given(chunk_rows=st.integers(min_value=1, max_value=9))
def test_small_chunks_equal_whole_on_burstgpt_fixture(chunk_rows: int) -> None:
    whole = read_trace(BURSTGPT)
    joined = concat_traces(list(iter_trace_chunks(BURSTGPT, chunk_rows=chunk_rows)))
    assert np.array_equal(joined.arrival_s, whole.arrival_s)
    assert np.array_equal(joined.model, whole.model) and joined.model_names == whole.model_names
    assert np.array_equal(joined.failed, whole.failed)


def test_fast_path_hands_over_mid_file_with_exact_lines(tmp_path: Path) -> None:
    """Blocks parsed by pyarrow, then the exact pandas path from the block that holds a problem."""
    data = CODE.read_bytes()
    tail_blank = tmp_path / "blank_tail.csv"
    tail_blank.write_bytes(data + b"\r\n\r\n")
    whole = read_trace(CODE)
    mixed = read_trace(tail_blank, chunk_rows=2000)
    assert np.array_equal(mixed.arrival_s, whole.arrival_s)
    assert np.array_equal(mixed.prompt_tokens, whole.prompt_tokens)
    lines = data.split(b"\r\n")
    lines[6000] = lines[6000] + b",7"
    late = tmp_path / "late.csv"
    late.write_bytes(b"\r\n".join(lines))
    with pytest.raises(TraceError, match=r"late\.csv:6001: wrong column count: expected 3 fields"):
        read_trace(late, chunk_rows=2000)


def test_fast_path_error_after_several_blocks_joined_into_one_chunk(tmp_path: Path) -> None:
    from serving.workload.synthetic import SyntheticParams, generate
    from serving.workload.writers import write_trace

    src = write_trace(
        generate(SyntheticParams(duration_s=1500, rate_rps=60), seed=2), tmp_path / "g.csv", "azure"
    )
    good = read_trace(src, chunk_rows=100_000)
    assert len(good) > 85_000
    lines = src.read_bytes().split(b"\r\n")
    lines[85_000] = lines[85_000].replace(b",", b",-", 1)
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"\r\n".join(lines))
    with pytest.raises(TraceError, match=r"bad\.csv:85001: negative token count \(column ContextTokens"):
        read_trace(bad, chunk_rows=100_000)
    chunks = list(iter_trace_chunks(src, chunk_rows=100_000))
    assert len(chunks) <= 2 and np.array_equal(concat_traces(chunks).arrival_s, good.arrival_s)
