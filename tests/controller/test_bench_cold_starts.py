"""bench/bench_cold_starts.py: each cold start's asking stage, its target's life and how it ended."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from controller.policy import ScalingPlan
from tests.support.bench import load_bench

bench = load_bench("bench_cold_starts")

NEED = "need: prefill {p}, decode {d} instances (concurrency 10: running 5, Little 6)"


def _plan(prefill: int, decode: int, standby_decode: int = 0, reasons: tuple[str, ...] = ()) -> ScalingPlan:
    return ScalingPlan(
        pool="default",
        prefill=prefill,
        decode=decode,
        standby_prefill=0,
        standby_decode=standby_decode,
        buffer_seqs=0,
        degrade=False,
        reasons=reasons,
    )


@dataclass
class _Inst:
    index: int
    role: str
    t_alloc_s: float
    t_release_s: float
    router_requests_total: int


REASONS = (
    NEED.format(p="1.50", d="0.40"),
    "headroom 30%: prefill 3, decode 1",
    "burst reserve (q0.90 of 120-s rises over 50 blocks): prefill +2.00 (peak 3.00) → 5, decode +0.10 (peak 1.00) → 1",
)


def test_asked_by_is_the_first_stage_reaching_the_slot() -> None:
    plan = _plan(6, 1, standby_decode=1, reasons=REASONS)
    assert [bench.asked_by(plan, "prefill", s) for s in (1, 2, 3, 4, 5, 6)] == [
        "capacity", "capacity", "headroom", "burst reserve", "burst reserve", "hysteresis",
    ]  # fmt: skip
    assert bench.asked_by(plan, "decode", 2) == "standby"  # above the active target: the warm standby
    queued = _plan(2, 1, reasons=("queue: 30 waiting → +900 tok/s to clear in 120 s", *REASONS[:1]))
    assert bench.asked_by(queued, "prefill", 2) == "capacity+queue"


def test_binding_is_the_last_stage_that_moved_the_role() -> None:
    assert bench.binding(_plan(5, 1, reasons=REASONS), "prefill") == "burst reserve"
    assert bench.binding(_plan(3, 1, reasons=REASONS[:2]), "prefill") == "headroom"
    assert bench.binding(_plan(4, 1, reasons=REASONS[:2]), "prefill") == "hysteresis"


def test_a_standby_flap_is_a_cancelled_standby_cold_start_with_its_target_life() -> None:
    # decode standby 0 → 1 at t=2, back to 0 at t=3: the instance started at t=2 was never ready
    decisions = [(float(t), _plan(1, 1, standby_decode=int(t == 2), reasons=REASONS)) for t in range(1, 6)]
    rows = bench.cold_starts(decisions, [_Inst(7, "decode", 2.0, 3.0, 0)], {7: {"provisioning", "gone"}})
    assert [(r.asked_by, r.slot, r.held_s, r.end) for r in rows] == [("standby", 2, 1.0, "cancelled")]
    ready = bench.cold_starts(decisions, [_Inst(7, "decode", 2.0, 3.0, 0)], {7: {"provisioning", "active"}})
    assert ready[0].end == "idle"
    up = bench.cold_starts(decisions, [_Inst(7, "decode", 2.0, math.nan, 4)], {7: {"active"}})
    assert (up[0].end, up[0].served) == ("up", 4)


@given(st.lists(st.integers(0, 4), min_size=2, max_size=30))
def test_target_life_ends_at_the_first_tick_below_the_slot(targets: list[int]) -> None:
    decisions = [(float(t), _plan(1, n, reasons=REASONS)) for t, n in enumerate(targets)]
    rows = bench.cold_starts(decisions, [_Inst(0, "decode", 0.5, math.nan, 0)], {})
    # started at tick 0's decision; its slot is its rank among the starts of that tick over no earlier target
    assert rows[0].slot == 1
    below = [t for t, n in enumerate(targets) if t > 0 and n < 1]
    assert rows[0].held_s == (below[0] - 0.5 if below else math.inf)
    assert rows[0].start_s == 0.5
