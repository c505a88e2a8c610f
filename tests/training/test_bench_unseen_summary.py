"""bench/bench_unseen.py's evaluate summary: the best *baseline* is never one of our own forecasters (the raw
network, or the network inside the online combination), and both of ours are quoted against it."""

from __future__ import annotations

from tests.support.bench import load_bench

bench_unseen = load_bench("bench_unseen")


def _doc(**maes: float) -> dict[str, object]:
    return {
        "scored_points": 100,
        "models": {m: {"mae": v, "points": 100} for m, v in maes.items()},
        "burst": {"onsets": 2, "recall": 0.5},
    }


def test_the_combined_forecaster_is_not_the_best_baseline() -> None:
    problem, summary = bench_unseen.eval_summary(_doc(learned=12.0, combined=9.0, ewma=10.0, holt=11.0))
    assert problem == ""
    assert "best baseline ewma 10.00" in summary
    assert "learned MAE 12.00 (×1.20)" in summary
    assert "combined 9.00 (×0.90)" in summary


def test_a_document_without_the_combination_still_reads() -> None:
    _, summary = bench_unseen.eval_summary(_doc(learned=8.0, last_value=10.0))
    assert "learned MAE 8.00 (×0.80) vs best baseline last_value 10.00" in summary
    assert "combined" not in summary
