"""Readers on the quirks of traces the project has never seen: BOM, CRLF, extra columns, out-of-order and
duplicate rows, a last line cut short, and every generated unseen variant (serving/workload/variants.py)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from serving.workload.errors import TraceError, TraceWarning
from serving.workload.readers import iter_trace_chunks, read_trace
from serving.workload.variants import build_variants

AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZ_ROWS = [
    "2024-05-14 08:00:00.0084000,4808,10",
    "2024-05-14 08:00:00.5000000,3180,8",
    "2024-05-14 08:00:00.5000000,110,27",  # a duplicate timestamp
    "2024-05-14 08:00:02.2500000,7,1",
]
BG_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
BG_ROWS = [
    "5,ChatGPT,472,18,490,Conversation log",
    "5,GPT-4,1087,0,1087,API log",  # failed: 0 response tokens
    "6,ChatGPT,300,20,320,Conversation log",
]
MC_ROWS = [
    '{"timestamp": 0, "input_length": 40, "output_length": 6, "hash_ids": [0]}',
    '{"timestamp": 0, "input_length": 36, "output_length": 4, "hash_ids": [1]}',
    '{"timestamp": 1500, "input_length": 12, "output_length": 9, "hash_ids": [2]}',
]


def write(
    tmp: Path, name: str, lines: list[str], eol: str = "\n", bom: bool = False, final: bool = True
) -> Path:
    p = tmp / name
    p.write_bytes((b"\xef\xbb\xbf" if bom else b"") + (eol.join(lines) + (eol if final else "")).encode())
    return p


@pytest.mark.parametrize("bom", [False, True], ids=["no-bom", "bom"])
@pytest.mark.parametrize("eol", ["\n", "\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize(
    ("name", "lines", "prompts"),
    [
        ("a.csv", [AZ_HEADER, *AZ_ROWS], [4808, 3180, 110, 7]),
        ("b.csv", [BG_HEADER, *BG_ROWS], [472, 1087, 300]),
        ("m.jsonl", MC_ROWS, [40, 36, 12]),
    ],
    ids=["azure", "burstgpt", "mooncake"],
)
def test_bom_and_line_ends_read_the_same(
    tmp_path: Path, bom: bool, eol: str, name: str, lines: list[str], prompts: list[int]
) -> None:
    t = read_trace(write(tmp_path, name, lines, eol, bom))
    assert t.prompt_tokens.tolist() == prompts
    assert t.arrival_s[0] == 0.0 and bool(np.all(np.diff(t.arrival_s) >= 0))


def test_duplicate_timestamps_are_kept(tmp_path: Path) -> None:
    t = read_trace(write(tmp_path, "a.csv", [AZ_HEADER, *AZ_ROWS]))
    assert t.arrival_s.tolist() == pytest.approx([0.0, 0.4916, 0.4916, 2.2416])
    b = read_trace(write(tmp_path, "b.csv", [BG_HEADER, *BG_ROWS]))
    assert b.arrival_s.tolist() == [0.0, 0.0, 1.0] and b.failed.tolist() == [False, True, False]


def test_utc_offset_timestamps(tmp_path: Path) -> None:
    rows = [r.replace(",", "+00:00,", 1) for r in AZ_ROWS]
    t = read_trace(write(tmp_path, "a.csv", [AZ_HEADER, *rows]))
    assert t.arrival_s[-1] == pytest.approx(2.2416) and str(t.start_time).endswith("+00:00")


@pytest.mark.parametrize("chunk_rows", [1, 1000])
def test_extra_csv_columns_are_ignored_with_a_warning(tmp_path: Path, chunk_rows: int) -> None:
    az = [f"{AZ_HEADER},Region", *[f"{r},westus" for r in AZ_ROWS]]
    with pytest.warns(TraceWarning, match=r"a\.csv:1: columns \['Region'\] are not part of the format"):
        t = read_trace(write(tmp_path, "a.csv", az), chunk_rows=chunk_rows)
    assert t.prompt_tokens.tolist() == [4808, 3180, 110, 7]
    bg = [f"Status,{BG_HEADER}", *[f"200,{r}" for r in BG_ROWS]]
    with pytest.warns(TraceWarning, match=r"columns \['Status'\]"):
        b = read_trace(write(tmp_path, "b.csv", bg), chunk_rows=chunk_rows)
    assert b.prompt_tokens.tolist() == [472, 1087, 300] and b.model_names == ("ChatGPT", "GPT-4")


def test_bad_row_in_a_file_with_extra_columns_names_line_and_column(tmp_path: Path) -> None:
    az = [f"{AZ_HEADER},Region", f"{AZ_ROWS[0]},westus", "2024-05-14 08:00:01.0000000,12x,3,westus"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        with pytest.raises(TraceError, match=r"a\.csv:3: not a number \(column ContextTokens = '12x'\)"):
            read_trace(write(tmp_path, "a.csv", az))


def test_missing_or_repeated_column_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        TraceError, match=r":1: header does not match the 'azure' format: missing columns \[\]"
    ):
        read_trace(write(tmp_path, "a.csv", [f"{AZ_HEADER},ContextTokens", f"{AZ_ROWS[0]},1"]), fmt="azure")
    with pytest.raises(TraceError, match=r":1: the header looks like the 'azure' format but lacks column\(s\) "
                       r"\['GeneratedTokens'\]"):  # fmt: skip
        read_trace(write(tmp_path, "b.csv", ["TIMESTAMP,ContextTokens", "2024-05-14 08:00:00,1"]))


def test_rows_far_out_of_order_name_the_line_and_the_way_out(tmp_path: Path) -> None:
    rows = ["2024-05-14 08:01:00.0000000,1,1", *AZ_ROWS]
    p = write(tmp_path, "a.csv", [AZ_HEADER, *rows])
    with pytest.raises(TraceError, match=r"a\.csv:3: arrival goes back 59.9916 s.*--max-reorder-s inf"):
        read_trace(p)
    with pytest.warns(TraceWarning, match=r"4 rows arrived up to 59.9916 s before an earlier row"):
        t = read_trace(p, max_reorder_s=math.inf, chunk_rows=2)
    assert t.prompt_tokens.tolist() == [4808, 3180, 110, 7, 1]
    with pytest.warns(TraceWarning):
        assert len(list(iter_trace_chunks(p, max_reorder_s=math.inf, chunk_rows=1))) == 1  # held to the end
    with pytest.raises(ValueError, match="max_reorder_s must be a number >= 0"):
        read_trace(p, max_reorder_s=math.nan)


@pytest.mark.parametrize(
    ("name", "lines", "line"),
    [
        ("a.csv", [AZ_HEADER, *AZ_ROWS, "2024-05-14 08:00:03.1,48"], 6),
        ("b.csv", [BG_HEADER, *BG_ROWS, "7,ChatGPT,12,4,16,Conversat"], 5),
        ("m.jsonl", [*MC_ROWS, '{"timestamp": 1600, "input_len'], 4),
    ],
    ids=["azure", "burstgpt", "mooncake"],
)
@pytest.mark.parametrize("chunk_rows", [1, 1000])
def test_last_line_cut_short_is_an_error_naming_it(
    tmp_path: Path, name: str, lines: list[str], line: int, chunk_rows: int
) -> None:
    p = write(tmp_path, name, lines, final=False)
    with pytest.raises(
        TraceError, match=rf"{name}:{line}: .*this last line has no line end: the file looks "
    ):
        read_trace(p, chunk_rows=chunk_rows)
    ok = write(tmp_path, "ok-" + name, lines[:-1], final=False)  # a complete last line without a line end
    assert len(read_trace(ok, chunk_rows=chunk_rows)) == len(lines) - 1 - (name != "m.jsonl")


def test_every_generated_variant_reads_as_documented(tmp_path: Path) -> None:
    variants = build_variants(tmp_path, long=False)
    assert len({v.fmt for v in variants}) == 3
    for v in variants:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            if v.expect == "error":
                with pytest.raises(TraceError, match=rf":{v.error_line}: "):
                    read_trace(v.path)
                continue
            t = read_trace(v.path)
        assert len(t) == v.requests, v.name
        assert t.format == v.fmt and t.arrival_s[0] == 0.0 and bool(np.all(np.diff(t.arrival_s) >= 0)), v.name
    far = next(v for v in variants if v.name == "azure_conv_unsorted_far")
    with pytest.warns(TraceWarning):
        assert len(read_trace(far.path, max_reorder_s=math.inf)) == far.requests
