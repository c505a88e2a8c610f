"""Routing policies: each picks among the ready candidates it is given, by its own rule."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.sim.router import RouteRequest, least_loaded_in_id_order, make_router, router_names


@dataclass(frozen=True)
class B:
    instance_id: str
    load: int = 0
    marked: bool = False


def req(prompt: int = 100, output: int = 100, stage: str = "prefill") -> RouteRequest:
    return RouteRequest(prompt_tokens=prompt, predicted_output_tokens=output, priority=1, stage=stage)


def test_round_robin_cycles_per_stage() -> None:
    r = make_router("round-robin")
    cands = [B("a"), B("b"), B("c")]
    assert [r.choose(req(), cands) for _ in range(4)] == [0, 1, 2, 0]
    assert r.choose(req(stage="decode"), cands) == 0


@pytest.mark.parametrize(
    ("loads", "ids", "expected"),
    [
        pytest.param([3, 1, 2], ["a", "b", "c"], 1, id="fewest requests"),
        pytest.param([1, 1, 2], ["b", "a", "c"], 1, id="tie to lowest id"),
    ],
)
def test_least_loaded(loads: list[int], ids: list[str], expected: int) -> None:
    cands = [B(i, load) for i, load in zip(ids, loads, strict=True)]
    assert make_router("least-loaded").choose(req(), cands) == expected


@given(st.lists(st.integers(0, 3), min_size=1, max_size=12))
def test_least_loaded_in_id_order_is_least_loaded_on_sorted_candidates(loads: list[int]) -> None:
    """The simulator's shortcut (its ready lists are sorted by id) picks what the router picks."""
    cands = [B(f"pool-decode-{i:03d}", load) for i, load in enumerate(loads)]
    assert least_loaded_in_id_order(cands) == make_router("least-loaded").choose(req(), cands)


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        pytest.param(req(prompt=4096), 2, id="long prompt to the marked (fast) prefill instance"),
        pytest.param(req(prompt=2048), 0, id="2048 is not long: least-loaded unmarked"),
    ],
)
def test_context_aware_prefill(request_: RouteRequest, expected: int) -> None:
    cands = [B("p0", 1), B("p1", 2), B("p2", 5, marked=True)]
    assert make_router("context-aware").choose(request_, cands) == expected


def test_context_aware_sends_longer_than_average_outputs_to_high_memory_decode() -> None:
    r = make_router("context-aware")
    cands = [B("d0", 0), B("d1", 9, marked=True)]
    assert r.choose(req(output=100, stage="decode"), cands) == 0  # first: no average yet
    assert r.choose(req(output=500, stage="decode"), cands) == 1  # 500 > 100
    assert r.choose(req(output=50, stage="decode"), cands) == 0  # 50 < 300


def test_context_aware_falls_back_when_no_marked_instance_is_ready() -> None:
    assert make_router("context-aware").choose(req(prompt=9000), [B("p0", 3), B("p1", 1)]) == 1


def test_unknown_router_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="context-aware"):
        make_router("nope")
    assert {"round-robin", "least-loaded", "context-aware"} <= set(router_names())


@given(
    loads=st.lists(st.integers(0, 50), min_size=1, max_size=8),
    marks=st.lists(st.booleans(), min_size=8, max_size=8),
    prompt=st.integers(1, 10_000),
    name=st.sampled_from(["round-robin", "least-loaded", "context-aware"]),
)
def test_every_policy_returns_a_valid_candidate(
    loads: list[int], marks: list[bool], prompt: int, name: str
) -> None:
    cands = [B(f"i{k}", load, marks[k]) for k, load in enumerate(loads)]
    r = make_router(name)
    for stage in ("prefill", "decode", "mixed"):
        assert 0 <= r.choose(req(prompt=prompt, stage=stage), cands) < len(cands)
