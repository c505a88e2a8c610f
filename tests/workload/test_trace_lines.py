"""Each row of a trace read from a file knows its line, so a message about a request can name it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving.workload.readers import read_trace
from serving.workload.trace import Trace, concat_traces

AZURE = [
    "TIMESTAMP,ContextTokens,GeneratedTokens",
    "2023-11-16 18:00:00.0000000,100,10",
    "2023-11-16 18:00:01.0000000,200,20",
    "2023-11-16 18:00:00.5000000,300,30",  # half a second back: re-sorted before the row above
    "2023-11-16 18:00:03.0000000,400,40",
]
MOONCAKE = [
    '{"timestamp": 0, "input_length": 100, "output_length": 10}',
    '{"timestamp": 2000, "input_length": 200, "output_length": 20}',
    '{"timestamp": 4000, "input_length": 300, "output_length": 30}',
]


@pytest.mark.parametrize("chunk_rows", [1, 2, 1000])
def test_rows_keep_their_own_line_through_reordering_and_chunks(tmp_path: Path, chunk_rows: int) -> None:
    path = tmp_path / "a.csv"
    path.write_text("\n".join(AZURE) + "\n")
    with pytest.warns(UserWarning, match="re-sorted"):
        trace = read_trace(path, chunk_rows=chunk_rows)
    assert trace.prompt_tokens.tolist() == [100, 300, 200, 400]
    assert trace.line is not None and trace.line.tolist() == [2, 4, 3, 5]
    assert trace.where(1) == f"{path}:4"


def test_jsonl_lines_count_from_one_and_selections_keep_them(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(MOONCAKE) + "\n")
    trace = read_trace(path)
    assert trace.line is not None and trace.line.tolist() == [1, 2, 3]
    later = trace.window(1.0, 10.0)
    assert later.line is not None and later.line.tolist() == [2, 3]
    assert trace.take(np.array([2])).where(0) == f"{path}:3"


def test_a_trace_built_in_memory_has_no_lines_and_says_which_request() -> None:
    mem = Trace.from_arrays(np.array([0.0, 1.0]), np.array([1, 2]), np.array([1, 1]), source="mem")
    assert mem.line is None and mem.where(1) == "mem request 1 (arrival order)"


def test_concatenation_keeps_lines_only_when_every_part_has_them(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("\n".join([*AZURE[:3], AZURE[4]]) + "\n")
    read = read_trace(path)
    mem = Trace.from_arrays(np.array([5.0]), np.array([1]), np.array([1]))
    both = concat_traces([read, read.window(2.0, 10.0)])
    assert both.line is not None and both.line.tolist() == [2, 3, 4, 4]
    assert concat_traces([read, mem]).line is None


def test_a_line_column_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Trace\.line has 1 rows, arrival_s has 2"):
        Trace(
            arrival_s=np.zeros(2), prompt_tokens=np.ones(2, dtype=np.int64), output_tokens=np.ones(2, dtype=np.int64),
            priority=np.ones(2, dtype=np.int8), model=np.full(2, -1, dtype=np.int16), failed=np.zeros(2, dtype=bool),
            line=np.array([2]),
        )  # fmt: skip
