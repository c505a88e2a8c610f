"""Output lengths that change under a running pool (s14k): the usual output length, the length-rise test, and
what the default does with it (``decode_length_rise``: no short-burst cap or cold-start wait for decode;
``output_floor_kv: rise``: a full KV cache floors the length tracker's estimate during a rise)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, ctx, obs

from controller.config import PolicyConfig
from controller.pipeline import Pipeline, PoolCounts
from controller.policy import PoolState, decide, stages
from controller.sources.aggregate import PoolLoad
from tests.controller.test_length_tracker import _Track as Track

H = stages.USUAL_OUTPUT_HALFLIFE_S


def _usual(value: float, seconds: float) -> tuple[float, float, float]:
    """The usual output after ``seconds`` of one reading per second at ``value``."""
    u = stages.usual_output((math.nan, math.nan, 0.0), 0.0, value)
    for t in range(1, int(seconds) + 1):
        u = stages.usual_output(u, float(t), value)
    return u


def test_usual_output_is_the_readings_mean_and_ignores_unknown_readings() -> None:
    u = _usual(200.0, 300.0)
    assert math.isclose(u[1] / u[2], 200.0, rel_tol=1e-9)
    assert math.isclose(u[2], 1.0 - 0.5 ** (300.0 / H), rel_tol=1e-9)
    assert stages.usual_output(u, 301.0, math.nan) == u
    assert stages.usual_output(u, 300.0, 900.0) == u  # no time passed: nothing folded in


@pytest.mark.parametrize(
    ("label", "seconds", "mean", "gen", "rose"),
    [
        ("steady", 600.0, 110.0, 4_000.0, False),  # within headroom of the usual 100
        ("longer outputs", 600.0, 400.0, 4_000.0, True),
        ("too young a usual", 100.0, 400.0, 4_000.0, False),  # weight < USUAL_OUTPUT_MIN_WEIGHT
        ("short outputs' noise", 600.0, 150.0, 100.0, False),  # +50 %, a few hundredths of an instance
        ("unknown generation", 600.0, 400.0, math.nan, False),
        ("unknown length", 600.0, math.nan, 4_000.0, False),
    ],
)
def test_length_rise(label: str, seconds: float, mean: float, gen: float, rose: bool) -> None:
    assert stages.length_rise(mean, _usual(100.0, seconds), 0.3, gen, CAP) is rose, label


@settings(max_examples=100, deadline=None)
@given(
    usual=st.floats(1.0, 5_000.0),
    mean=st.floats(0.0, 20_000.0),
    more=st.floats(0.0, 20_000.0),
    gen=st.floats(0.0, 100_000.0),
)
def test_a_longer_mean_output_never_reads_less_of_a_rise(
    usual: float, mean: float, more: float, gen: float
) -> None:
    u = _usual(usual, 400.0)
    if stages.length_rise(mean, u, 0.3, gen, CAP):
        assert stages.length_rise(mean + more, u, 0.3, gen, CAP)


def _decide_run(cfg: PolicyConfig) -> list[int]:
    """10 req/s; mean output 100 for 900 s, then 1,500 (the length tracker's EWMA climbing over a minute).
    Decode has 2 warm instances, full (running at the modelled batch); the decode targets from 900 s."""
    state = PoolState()
    out: list[int] = []
    for t in range(0, 1000):
        climb = min(max(t - 900, 0) / 60.0, 1.0)
        mean = 100.0 + 1_400.0 * climb
        o = obs(
            now_s=float(t),
            replicas={"prefill": 2, "decode": 2},
            active={"prefill": 2, "decode": 2},
            standby={"prefill": 0, "decode": 0},
            arrival_rps=10.0,
            gen_tps=min(10.0 * mean, 2 * CAP.decode_tps),
            running_seqs=min(10.0 * mean / 31.25, 2 * CAP.decode_seqs),
            mean_output_tokens=mean,
            kv_usage=0.95 if t >= 900 else 0.3,
        )
        plan, state = decide(ctx(o, cfg), state)
        if t >= 900 and plan is not None:
            out.append(plan.decode)
    return out


def test_decide_sizes_decode_past_the_fleet_at_once_on_longer_outputs() -> None:
    """The default reads the rise and starts decode capacity on the tick the target passes the fleet; without
    it the cold-start wait keeps the lowest target of the last 30 s (the fleet's 2) first."""
    on = _decide_run(PolicyConfig())
    off = _decide_run(PolicyConfig(decode_length_rise=False, output_floor_kv="off"))
    first_on = next(i for i, d in enumerate(on) if d > 2)
    first_off = next((i for i, d in enumerate(off) if d > 2), len(off))
    assert first_on < first_off
    assert max(on) >= max(off)


def _rising_track(policy: PolicyConfig, output: float) -> Track:
    """A pool's track for ``Pipeline._decode_capped``: a modelled batch of 100, a tracker reading ``output``
    tokens and the policy's usual output of 100 tokens."""
    return Track(policy, output, PoolState(output_usual=_usual(100.0, 600.0)))


def _load(kv: float) -> PoolLoad:
    nan = math.nan
    return PoolLoad(
        pool="p", now_s=0.0, counts={}, arrival_rps=4.0, prompt_tps=4_000.0, gen_tps=4_000.0, running=20.0,
        waiting=0.0, kv_usage=kv, ttft_p50_s=nan, ttft_p90_s=nan, itl_p50_s=nan, itl_p90_s=nan,
        mean_prompt_tokens=1_000.0, complete=True,
    )  # fmt: skip


COUNTS = PoolCounts(replicas={"decode": 2}, active={"decode": 2}, standby={}, provisioning={})


@pytest.mark.parametrize(
    ("mode", "output", "kv", "capped"),
    [
        ("rise", 800.0, 0.95, True),  # a rise and a full KV cache: the length read is a floor
        ("rise", 110.0, 0.95, False),  # a full KV cache without a rise: the running test alone
        ("rise", 800.0, 0.5, False),
        ("off", 800.0, 0.95, False),
        ("on", 110.0, 0.95, True),
    ],
)
def test_pipeline_floors_the_length_on_a_full_kv_cache_during_a_rise(
    mode: str, output: float, kv: float, capped: bool
) -> None:
    track = _rising_track(PolicyConfig(output_floor_kv=mode), output)
    assert Pipeline._decode_capped(track, _load(kv), COUNTS) is capped  # type: ignore[arg-type]
