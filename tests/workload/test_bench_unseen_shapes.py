"""bench/bench_unseen_shapes.py: every unseen shape set replayed side by side, with a summary per baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.bench import load_bench

bench = load_bench("bench_unseen_shapes")


def test_one_set_replays_and_summarises(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.json"
    assert (
        bench.main(
            ["--sets", "s14k", "--policies", "static-peak", "--out", str(tmp_path), "--json", str(out)]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["set"] == "s14k" and row["shape"] == "s14k_osl_ramp"
    for slo, gpu_s in row["figures"].values():
        assert 0.0 <= slo <= 100.0 and gpu_s > 0
    printed = capsys.readouterr().out
    assert "| s14k | s14k_osl_ramp |" in printed and "| static-peak | 1 |" in printed
    assert (tmp_path / "s14k" / "s14k_osl_ramp.csv").exists()


def test_an_unknown_set_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--sets", "s14k,s99", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "s99" in capsys.readouterr().err
