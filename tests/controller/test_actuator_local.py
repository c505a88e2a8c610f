"""LocalPoolActuator over a fake pool manager: clamping, idempotence, no standby, error kinds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.actuators.base import ActuatorError, ActuatorUnavailable, ReplicaBounds
from controller.actuators.local import LocalPoolActuator
from controller.policy.types import ScalingPlan
from serving.pools.local import InstanceStartError


class FakePool:
    """Counts per role; ``scale`` records calls and can be told to fail."""

    def __init__(self, prefill: int = 1, decode: int = 1, name: str = "local") -> None:
        self.name = name
        self.counts = {"prefill": prefill, "decode": decode, "mixed": 0}
        self.calls: list[tuple[str, int]] = []
        self.fail: BaseException | None = None
        self.unready: dict[str, int] = {}

    def count(self, role: str) -> int:
        return self.counts[role]

    def ready(self, role: str) -> int:
        return self.counts[role] - self.unready.get(role, 0)

    def scale(self, role: str, n: int) -> object:
        self.calls.append((role, n))
        if self.fail is not None:
            raise self.fail
        self.counts[role] = n
        return None


def plan(prefill: int, decode: int, sp: int = 0, sd: int = 0, pool: str = "local") -> ScalingPlan:
    return ScalingPlan(pool=pool, prefill=prefill, decode=decode, standby_prefill=sp, standby_decode=sd)


BOUNDS = ReplicaBounds(min_prefill=1, max_prefill=3, min_decode=1, max_decode=4)


def test_apply_scales_only_roles_that_differ_and_reports_changes() -> None:
    pool = FakePool(prefill=1, decode=1)
    result = LocalPoolActuator(pool).apply(plan(1, 3), BOUNDS)
    assert pool.calls == [("decode", 3)]
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
    assert pool.calls == [("prefill", 1), ("decode", 1)]
    assert second.changes == () and not second.changed


def test_plan_is_clamped_and_standby_dropped_with_notes() -> None:
    pool = FakePool()
    result = LocalPoolActuator(pool).apply(plan(0, 9, sp=1, sd=2), BOUNDS)
    assert pool.calls == [("decode", 4)]
    assert result.targets == {"prefill": (1, 0), "decode": (4, 0)}
    text = " ".join(result.notes)
    assert "clamped to 1" in text and "clamped to 4" in text and "no standby" in text


def test_current_reports_replicas_and_ready() -> None:
    pool = FakePool(prefill=1, decode=3)
    pool.unready = {"decode": 1}
    now = LocalPoolActuator(pool).current("local")
    assert (now.role("decode").replicas, now.role("decode").ready) == (3, 2)
    assert (now.role("prefill").replicas, now.role("prefill").ready) == (1, 1)


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
    assert pool.count("prefill") == min(max(want[0], 1), 3)
    n_calls = len(pool.calls)
    assert actuator.apply(plan(*want), BOUNDS).changes == ()
    assert len(pool.calls) == n_calls
