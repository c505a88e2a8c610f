"""LocalPoolActuator over a fake pool manager: clamping, idempotence, standby tiers, error kinds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.actuators.base import ActuatorError, ActuatorUnavailable, ReplicaBounds
from controller.actuators.local import LocalPoolActuator
from controller.policy.types import ScalingPlan
from serving.pools.local import InstanceStartError


class FakePool:
    """Counts per role and tier; ``scale`` records calls (``(role, n)``, or ``(role, n, standby)`` when a
    standby target is passed) and can be told to fail."""

    def __init__(
        self, prefill: int = 1, decode: int = 1, name: str = "local", *, standby_supported: bool = True
    ) -> None:
        self.name = name
        self.standby_supported = standby_supported
        self.counts = {"prefill": prefill, "decode": decode, "mixed": 0}
        self.standby = {"prefill": 0, "decode": 0, "mixed": 0}
        self.calls: list[tuple[str, int] | tuple[str, int, int]] = []
        self.fail: BaseException | None = None
        self.unready: dict[str, int] = {}
        self.standby_down: dict[str, int] = {}

    def count(self, role: str) -> int:
        return self.counts[role]

    def ready(self, role: str) -> int:
        return self.counts[role] - self.unready.get(role, 0)

    def standby_count(self, role: str) -> int:
        return self.standby[role]

    def standby_ready(self, role: str) -> int:
        return self.standby[role] - self.standby_down.get(role, 0)

    def scale(self, role: str, n: int, standby: int | None = None) -> object:
        self.calls.append((role, n) if standby is None else (role, n, standby))
        if self.fail is not None:
            raise self.fail
        self.counts[role] = n
        if standby is not None:
            self.standby[role] = standby
        return None


def plan(prefill: int, decode: int, sp: int = 0, sd: int = 0, pool: str = "local") -> ScalingPlan:
    return ScalingPlan(pool=pool, prefill=prefill, decode=decode, standby_prefill=sp, standby_decode=sd)


BOUNDS = ReplicaBounds(min_prefill=1, max_prefill=3, min_decode=1, max_decode=4)


def test_apply_scales_only_roles_that_differ_and_reports_changes() -> None:
    pool = FakePool(prefill=1, decode=1)
    result = LocalPoolActuator(pool).apply(plan(1, 3), BOUNDS)
    assert pool.calls == [("decode", 3, 0)]
    assert [(c.role, c.tier, c.target, c.before, c.after) for c in result.changes] == [
        ("decode", "active", "local", 1, 3)
    ]
    assert result.targets == {"prefill": (1, 0), "decode": (3, 0)}
    assert result.changed


def test_apply_is_idempotent() -> None:
    pool = FakePool(prefill=2, decode=2)
    actuator = LocalPoolActuator(pool)
    actuator.apply(plan(1, 1), BOUNDS)
    second = actuator.apply(plan(1, 1), BOUNDS)
    assert pool.calls == [("prefill", 1, 0), ("decode", 1, 0)]
    assert second.changes == () and not second.changed


def test_standby_targets_are_applied_and_reported_as_the_standby_tier() -> None:
    pool = FakePool(prefill=1, decode=2)
    result = LocalPoolActuator(pool).apply(plan(1, 2, sp=1, sd=2), BOUNDS)
    assert pool.calls == [("prefill", 1, 1), ("decode", 2, 2)]
    assert [(c.role, c.tier, c.before, c.after) for c in result.changes] == [
        ("prefill", "standby", 0, 1),
        ("decode", "standby", 0, 2),
    ]
    assert result.targets == {"prefill": (1, 1), "decode": (2, 2)} and not result.notes
    # only standby differs for decode: still one scale call for the role, with both targets
    changed = LocalPoolActuator(pool).apply(plan(1, 2, sp=1, sd=1), BOUNDS)
    assert pool.calls[-1] == ("decode", 2, 1) and len(pool.calls) == 3
    assert [(c.tier, c.before, c.after) for c in changed.changes] == [("standby", 2, 1)]


def test_plan_is_clamped_and_standby_clamped_to_max_minus_active() -> None:
    pool = FakePool()
    result = LocalPoolActuator(pool).apply(plan(0, 9, sp=1, sd=2), BOUNDS)
    assert pool.calls == [("prefill", 1, 1), ("decode", 4, 0)]
    assert result.targets == {"prefill": (1, 1), "decode": (4, 0)}
    text = " ".join(result.notes)
    assert "clamped to 1" in text and "clamped to 4" in text and "standby 2 clamped to 0" in text


def test_a_pool_without_a_standby_tier_gets_standby_zero_with_a_note() -> None:
    pool = FakePool(standby_supported=False)
    result = LocalPoolActuator(pool).apply(plan(1, 2, sp=1, sd=2), BOUNDS)
    assert pool.calls == [("decode", 2, 0)]
    assert result.targets == {"prefill": (1, 0), "decode": (2, 0)}
    assert [n for n in result.notes if "has no standby tier" in n] == [
        "local/prefill: standby 1 set to 0 (this local pool has no standby tier: mixed-node placement)",
        "local/decode: standby 2 set to 0 (this local pool has no standby tier: mixed-node placement)",
    ]


def test_current_reports_replicas_ready_and_standby() -> None:
    pool = FakePool(prefill=1, decode=3)
    pool.unready = {"decode": 1}
    pool.standby = {"prefill": 0, "decode": 2, "mixed": 0}
    pool.standby_down = {"decode": 1}
    now = LocalPoolActuator(pool).current("local")
    assert (now.role("decode").replicas, now.role("decode").ready) == (3, 2)
    assert (now.role("decode").standby, now.role("decode").standby_ready) == (2, 1)
    assert (now.role("prefill").replicas, now.role("prefill").ready, now.role("prefill").standby) == (1, 1, 0)


def test_other_pool_is_a_permanent_error() -> None:
    actuator = LocalPoolActuator(FakePool(name="local"))
    with pytest.raises(ActuatorError, match="'local' only, asked for 'gpu-a'"):
        actuator.apply(plan(1, 1, pool="gpu-a"), BOUNDS)
    with pytest.raises(ActuatorError, match="gpu-a"):
        actuator.current("gpu-a")


def test_start_failure_is_temporary_and_bad_model_dir_permanent() -> None:
    pool = FakePool()
    pool.fail = InstanceStartError("server exited with code 1")
    with pytest.raises(ActuatorUnavailable, match="local/decode 1 -> 2: server exited") as info:
        LocalPoolActuator(pool, retry_after_s=7.0).apply(plan(1, 2), BOUNDS)
    assert info.value.retry_after_s == 7.0
    pool.fail = FileNotFoundError("out/tiny/config.json: not a model directory")
    with pytest.raises(ActuatorError, match="not a model directory") as perm:
        LocalPoolActuator(pool).apply(plan(1, 2), BOUNDS)
    assert not isinstance(perm.value, ActuatorUnavailable)
    pool.fail = InstanceStartError("standby server exited")
    with pytest.raises(ActuatorUnavailable, match=r"local/decode 1 -> 1, standby 0 -> 1: standby server"):
        LocalPoolActuator(pool).apply(plan(1, 1, sd=1), BOUNDS)


@settings(max_examples=60, deadline=None)
@given(
    start=st.tuples(st.integers(0, 5), st.integers(0, 5)),
    want=st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 3), st.integers(0, 3)),
)
def test_after_apply_counts_are_within_bounds_and_a_second_apply_writes_nothing(
    start: tuple[int, int], want: tuple[int, int, int, int]
) -> None:
    pool = FakePool(*start)
    actuator = LocalPoolActuator(pool)
    actuator.apply(plan(*want), BOUNDS)
    for role in ("prefill", "decode"):
        lo, hi = BOUNDS.of(role)
        assert lo <= pool.count(role) <= hi
        assert 0 <= pool.standby_count(role) <= hi - pool.count(role)
    assert pool.count("prefill") == min(max(want[0], 1), 3)
    assert pool.standby_count("decode") == min(want[3], 4 - pool.count("decode"))
    n_calls = len(pool.calls)
    assert actuator.apply(plan(*want), BOUNDS).changes == ()
    assert len(pool.calls) == n_calls
