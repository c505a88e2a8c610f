"""bench/bench_decisions.py: a role's planned counts as they change, and the reasons that bear on it."""

from __future__ import annotations

from controller.policy import ScalingPlan
from tests.support.bench import load_bench

bench_decisions = load_bench("bench_decisions")
changes, role_reasons = bench_decisions.changes, bench_decisions.role_reasons


def _plan(decode: int, standby: int, prefill: int = 1, reasons: tuple[str, ...] = ()) -> ScalingPlan:
    return ScalingPlan(
        pool="default",
        prefill=prefill,
        decode=decode,
        standby_prefill=0,
        standby_decode=standby,
        buffer_seqs=0,
        degrade=False,
        reasons=reasons,
    )


def test_changes_keeps_the_first_tick_and_each_change_of_the_role() -> None:
    decisions = [
        (1.0, _plan(1, 0)),
        (2.0, _plan(1, 0, prefill=3)),  # prefill moved, decode did not
        (3.0, _plan(1, 1)),
        (4.0, _plan(2, 1)),
        (5.0, _plan(2, 1)),
    ]
    assert changes(decisions, "decode") == [(1.0, 1, 0), (3.0, 1, 1), (4.0, 2, 1)]
    assert changes(decisions, "prefill") == [(1.0, 1, 0), (2.0, 3, 0), (3.0, 1, 0)]


def test_role_reasons_are_the_load_line_and_those_naming_the_role() -> None:
    plan = _plan(
        1, 0, reasons=("load: prompt 1 tok/s", "prefill: standby 0", "decode: standby 1", "buffer: x")
    )
    assert role_reasons(plan, "decode") == ["load: prompt 1 tok/s", "decode: standby 1"]
