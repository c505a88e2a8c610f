"""The shared per-tick core: unknown data, vanishing and returning instances, the GPU budget, recovery."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from controller.config import PolicyConfig
from controller.pipeline import Pipeline, PoolCounts, PoolSetup, TickResult, recovered_state
from forecaster.baselines import Holt
from forecaster.types import ForecastBatch
from serving.sim.fleet import PoolSpec
from tests.controller.test_daemon import ScriptedSource

POLICY = PolicyConfig(standby_decode=0, max_prefill=16, max_decode=16, scale_down_delay_s=0.0)


def counts(prefill: int = 1, decode: int = 1) -> PoolCounts:
    r = {"prefill": prefill, "decode": decode}
    return PoolCounts(r, r, {"prefill": 0, "decode": 0}, {"prefill": 0, "decode": 0})


def run(
    pipe: Pipeline, source: ScriptedSource, ticks: int, t0: float = 1000.0, c: PoolCounts | None = None
) -> list[TickResult]:
    out = []
    for k in range(ticks):
        now = t0 + k
        out.append(pipe.tick(source.scrape(now), {p: c or counts() for p in source.pools}, now))
    return out


def pipeline(pools: Sequence[str] = ("a",), **kwargs: object) -> Pipeline:
    setups = [PoolSetup(PoolSpec(name=p), POLICY) for p in pools]
    return Pipeline(setups, Holt(trailing_s=6), **kwargs)  # type: ignore[arg-type]


def test_first_tick_has_no_rates_and_no_opinion_then_a_plan() -> None:
    results = run(pipeline(), ScriptedSource(), 3)
    assert results[0].decisions["a"].plan is None
    assert "no opinion" in results[0].decisions["a"].reasons[-1]
    assert results[2].decisions["a"].plan is not None


def test_a_vanished_instance_blocks_scale_down_for_that_tick() -> None:
    source = ScriptedSource(prompt_tps=100.0, gen_tps=10.0, running=1.0)
    pipe = pipeline()
    run(pipe, source, 3, c=counts(4, 4))
    source.hidden = {"a-decode-0"}
    (result,) = run(pipe, source, 1, t0=1003.0, c=counts(4, 4))
    d = result.decisions["a"]
    assert d.vanished == ("a-decode-0",)
    assert not d.observation.complete
    assert d.plan is not None and d.plan.decode == 4 and d.plan.prefill == 4
    assert any("no scale-down on incomplete data" in r for r in d.reasons)


def test_a_returning_instance_is_not_read_as_a_burst() -> None:
    def replay(guard: bool) -> tuple[TickResult, TickResult]:
        source = ScriptedSource(prompt_tps=5_000.0)
        pipe = pipeline(guard_vanished=guard)
        run(pipe, source, 5)
        source.hidden = {"a-prefill-0"}
        run(pipe, source, 20, t0=1005.0)  # its counter grows meanwhile: 100k tokens while unseen
        source.hidden = set()
        back, _, good = run(pipe, source, 3, t0=1025.0)
        return back, good

    unguarded, _ = replay(False)
    assert unguarded.decisions["a"].load.prompt_tps > 100_000  # the whole counter read as one second
    back, good = replay(True)
    assert math.isnan(back.decisions["a"].load.prompt_tps), "its jump is unknown, not a burst"
    assert any("back in the scrape" in r for r in back.decisions["a"].reasons)
    plan = back.decisions["a"].plan
    assert plan is None or plan.prefill <= 2
    assert good.decisions["a"].load.prompt_tps == pytest.approx(5_000.0)


def test_the_gpu_budget_caps_the_fleet_and_says_so() -> None:
    source = ScriptedSource(pools=("a", "b"), prompt_tps=200_000.0, gen_tps=20_000.0)
    results = run(pipeline(("a", "b"), gpu_budget=10), source, 3)
    plans = next(r for r in results if r.plans()).plans()  # the first decision: no ramp-up limit yet
    assert len(plans) == 2
    used = sum(p.prefill + p.decode + p.standby_prefill + p.standby_decode for p in plans)
    assert used <= 10
    assert any("budget 10 GPUs" in r for p in plans for r in p.reasons)


class _Broken(Holt):
    def step(self, x: np.ndarray, mask: np.ndarray, now_s: float = math.nan) -> ForecastBatch:
        raise ValueError("bad input for the network")


def test_a_failing_forecaster_falls_back_to_measured_load() -> None:
    setups = [PoolSetup(PoolSpec(name="a"), POLICY)]
    pipe = Pipeline(setups, _Broken(trailing_s=6))
    result = run(pipe, ScriptedSource(), 3)[-1]
    assert result.forecast_error is not None and "bad input" in result.forecast_error
    plan = result.decisions["a"].plan
    assert plan is not None and any("forecast skipped" in r for r in plan.reasons)


def test_recovered_state_holds_the_current_scale_within_the_delay() -> None:
    policy = POLICY.model_copy(update={"scale_down_delay_s": 60.0})
    pipe = Pipeline([PoolSetup(PoolSpec(name="a"), policy)], Holt(trailing_s=6))
    c = counts(8, 8)
    pipe.recover({"a": c}, 1000.0)
    low = ScriptedSource(prompt_tps=100.0, gen_tps=10.0, running=1.0)
    results = run(pipe, low, 50, c=c)
    assert all(r.decisions["a"].plan is None or r.decisions["a"].plan.prefill == 8 for r in results)
    state = recovered_state(c, 5.0)
    assert state.roles["decode"].recent_targets == ((5.0, 8),)


def test_counts_must_cover_every_pool() -> None:
    pipe = pipeline(("a", "b"))
    with pytest.raises(ValueError, match=r"no replica counts for pools \['b'\]"):
        pipe.tick(ScriptedSource(pools=("a", "b")).scrape(1.0), {"a": counts()}, 1.0)
