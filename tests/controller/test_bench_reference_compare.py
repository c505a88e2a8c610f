"""bench/reference_compare.py: runs of bench/reference_table.sh side by side, nothing dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench import load_bench

cmp = load_bench("reference_compare")

HEAD = "| workload | policy | label | SLO attained | SLO after 600 s | GPU-s | wall s |\n|---|---|---|---|---|---|---|\n"


def _row(workload: str, slo: float, gpu: float, policy: str = "predictive") -> str:
    return f"| {workload} | {policy} |  | {slo:.2f}% | 100.00% | {gpu:,.0f} | 3 |\n"


def _run(d: Path, main: list[str], shapes: list[str]) -> Path:
    d.mkdir()
    (d / "main.txt").write_text(HEAD + "".join(main))
    (d / "shapes.txt").write_text(HEAD + "".join(shapes))
    return d


def test_rows_totals_and_a_missing_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _run(
        tmp_path / "a",
        [_row("code", 99.5, 20_000), _row("sine", 90.0, 100_000), _row("code", 90.0, 5, policy="reactive")],
        [_row("file:/x/s14_flash.csv", 72.0, 7_000)],
    )
    b = _run(tmp_path / "b", [_row("code", 99.0, 21_000)], [_row("file:/y/s14_flash.csv", 80.0, 7_700)])
    assert cmp.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| code | 99.50 / 20,000 | 99.00 / 21,000 | -0.50 | 1.050 |" in out  # not the reactive row
    assert "| sine-600 | 90.00 / 100,000 | missing | - | - |" in out  # shown, never dropped
    # a shape counts by the table it came from, whatever its name
    assert "| s14_flash | 72.00 / 7,000 | 80.00 / 7,700 | +8.00 | 1.100 |" in out
    assert "| **total reference GPU-s** | 120,000 | 21,000 | | 0.1750 |" in out
    assert "| **total shapes GPU-s** | 7,000 | 7,700 | | 1.1000 |" in out


def test_a_directory_without_tables_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cmp.main([str(empty)]) == 2
    assert str(empty) in capsys.readouterr().err
