"""Session 11's opt-in rules (s11u; the pipeline's side of the KV rule: test_length_tracker.py): a KV cache at 90 % counts as a full decode fleet
(``decode_saturated_kv``), and a burst longer than each of the few bursts seen is not capped as a short one
(``short_burst_unseen_below``). Both off by default: the default decisions are session 10's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, NAN, obs
from pydantic import ValidationError

from controller.config import PolicyConfig
from controller.policy import PoolForecast, stages

BLOCK = stages.NEED_BLOCK_S
Runs = tuple[tuple[float, float], ...]


def _cfg(**kw: object) -> PolicyConfig:
    return PolicyConfig(burst_hold="survival", short_burst_cap=True, **kw)


def _quiet_then_high() -> tuple[tuple[float, float, float, int], ...]:
    """20 quiet 5-s blocks from t = 1200 s (need 1), then an open block at need 8."""
    return tuple((1200.0 + i * BLOCK, v, 0.0, 5) for i, v in enumerate([1.0] * 20 + [8.0]))


# Three bursts of 2, 3 and 1 s before the history's blocks: the first is cut by the history's start (a lower
# bound, not counted), so two durations (3 s and 1 s) are seen.
SHORT: Runs = ((0.0, 2.0), (100.0, 103.0), (200.0, 201.0))


def test_a_burst_past_every_one_seen_is_capped_by_default() -> None:
    blocks = _quiet_then_high()
    late = blocks[-1][0] + 4.0  # the open burst has lasted 4 s: longer than both seen
    capped, why = stages.short_burst(SHORT, blocks, late, _cfg())
    assert capped and why is not None and "= 0.00 over 2 bursts" in why


@pytest.mark.parametrize(("below", "capped"), [(0, True), (2, True), (3, False), (100_000, False)])
def test_unseen_below_lifts_the_cap_only_with_fewer_bursts_seen(below: int, capped: bool) -> None:
    blocks = _quiet_then_high()
    late = blocks[-1][0] + 4.0
    assert stages.short_burst(SHORT, blocks, late, _cfg(short_burst_unseen_below=below))[0] is capped


def test_unseen_below_leaves_a_burst_the_durations_cover_alone() -> None:
    # lasted 0.5 s: both seen bursts outlasted it, so the survival estimate has samples and still caps
    blocks = _quiet_then_high()
    early = blocks[-1][0] + 0.5
    assert stages.short_burst(SHORT, blocks, early, _cfg(short_burst_unseen_below=100_000))[0]


@settings(max_examples=80, deadline=None)
@given(
    durations=st.lists(st.floats(0.5, 100.0), min_size=2, max_size=8),
    lasted=st.floats(0.1, 110.0),
    below=st.integers(0, 20),
)
def test_unseen_below_only_ever_lifts_the_cap(durations: list[float], lasted: float, below: int) -> None:
    """For any bursts seen and any duration so far: with the knob the cap holds at most where it held
    without it, and exactly there while some seen burst lasted longer."""
    runs: list[tuple[float, float]] = []
    t = 0.0
    for d in durations:
        runs.append((t, t + d))
        t += d + 50.0
    blocks = tuple((t + 10.0 + i * BLOCK, v, 0.0, 5) for i, v in enumerate([1.0] * 20 + [8.0]))
    now = blocks[-1][0] + min(lasted, BLOCK - 0.01)
    base = stages.short_burst(tuple(runs), blocks, now, _cfg())[0]
    knob = stages.short_burst(tuple(runs), blocks, now, _cfg(short_burst_unseen_below=below))[0]
    assert knob <= base
    # the first run starts before the blocks: cut by the history, not counted
    seen = [b - a for a, b in runs[1:]]
    if any(d > now - blocks[-1][0] for d in seen):
        assert knob == base


@pytest.mark.parametrize(
    ("label", "kv", "active", "opted", "saturated"),
    [
        ("KV full, opted in", 0.95, 4, True, True),
        ("KV full, default", 0.95, 4, False, False),
        ("KV at 90 %", 0.9, 4, True, True),
        ("KV half", 0.5, 4, True, False),
        ("KV unknown", NAN, 4, True, False),
        ("no active decode", 0.95, 0, True, False),
    ],
)
def test_decode_saturated_by_kv(label: str, kv: float, active: int, opted: bool, saturated: bool) -> None:
    # 10 running of 4 × 64: far below the modelled batch, so only the KV gauge can say it is full
    o = obs(running_seqs=10.0, kv_usage=kv, active={"prefill": 2, "decode": active})
    assert stages.decode_saturated(o, CAP, opted) is saturated, label


def test_a_full_kv_cache_cuts_nothing_from_the_forecast_when_opted_in() -> None:
    h = 5.0
    f = PoolForecast(
        horizon_s=h,
        arrivals_p50=16.0 * h,
        arrivals_p90=64.0 * h,
        prompt_tokens_p90=10_000.0 * h,
        gen_tokens_p90=20_000.0 * h,
        burst_prob=0.0,
    )
    full_kv = obs(running_seqs=10.0, kv_usage=0.97, gen_tps=0.0, forecast=f)
    off = stages.capacity_target(full_kv, CAP, 1.0, gen_forecast="min", little_arrivals="p50")
    on = stages.capacity_target(
        full_kv, CAP, 1.0, gen_forecast="min", little_arrivals="p50", saturated_kv=True
    )
    assert off is not None and on is not None
    assert off.decode == pytest.approx(64.0 * 200.0 / CAP.decode_tps)  # min(20,000, 64 × 200) tok/s
    assert on.decode == pytest.approx(20_000.0 / CAP.decode_tps)  # the larger: the token p90


def test_defaults_and_bad_values_name_the_field() -> None:
    cfg = PolicyConfig()
    assert cfg.decode_saturated_kv is False and cfg.short_burst_unseen_below == 0
    with pytest.raises(ValidationError, match="short_burst_unseen_below"):
        PolicyConfig(short_burst_unseen_below=-1)
    with pytest.raises(ValidationError, match="decode_saturated_kv"):
        PolicyConfig(decode_saturated_kv="sometimes")
