"""The arrival calibration's cut eased by the decode fleet's fullness (``PolicyConfig.arrival_calibration_saturated
= 'eased'``): the fullness as a number (``stages.decode_fullness``), the weight and the eased multiplier
(``calibration.ease_weight`` / ``eased_scale``), their invariants against today's switch ('lift'), and the option
through ``decide``."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, NAN, ctx, forecast, obs
from pydantic import ValidationError

from controller.config import PolicyConfig
from controller.policy import PoolForecast, PoolObservation, PoolState, ScalingPlan, decide, stages
from controller.policy.calibration import CalibrationParams, calibrated_forecast, ease_weight, eased_scale
from controller.policy.types import ArrivalCalibration

H = 5.0
BATCH = 4 * CAP.decode_seqs  # the fixtures' 4 active decode instances × 64 sequences


@pytest.mark.parametrize(
    ("label", "kw", "kv", "expected"),
    [
        ("running over the modelled batch", {"running_seqs": 0.5 * BATCH}, False, 0.5),
        ("above the batch reads above 1", {"running_seqs": 1.25 * BATCH}, False, 1.25),
        ("the KV gauge is not read without kv", {"running_seqs": 0.5 * BATCH, "kv_usage": 1.0}, False, 0.5),
        ("kv: the larger of the two", {"running_seqs": 0.5 * BATCH, "kv_usage": 1.0}, True, 1.0),
        ("kv: running still counts", {"running_seqs": 0.95 * BATCH, "kv_usage": 0.2}, True, 0.95),
        ("kv: running unknown, the gauge", {"running_seqs": NAN, "kv_usage": 0.92}, True, 0.92),
        ("running unknown: unknown", {"running_seqs": NAN}, False, NAN),
        ("no active decode: unknown", {"active": {"prefill": 2, "decode": 0}}, True, NAN),
    ],
)
def test_decode_fullness(label: str, kw: dict[str, object], kv: bool, expected: float) -> None:
    got = stages.decode_fullness(obs(**kw), CAP, kv)
    if math.isnan(expected):
        assert math.isnan(got), label
    else:
        assert got == pytest.approx(expected), label


fractions = st.floats(min_value=0.0, max_value=2.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    active=st.integers(1, 64),
    seqs=st.floats(1.0, 512.0),
    frac=fractions,
    kv_usage=st.one_of(st.just(NAN), st.floats(0.0, 1.0)),
    kv=st.booleans(),
)
def test_the_fullness_agrees_with_the_saturated_test(
    active: int, seqs: float, frac: float, kv_usage: float, kv: bool
) -> None:
    """``decode_full`` (the 'lift' switch) is the fullness at 90 % or more, away from rounding at the line."""
    running = frac * active * seqs
    fill = stages.decode_fill(active, running, kv_usage, seqs, kv)
    full = stages.decode_full(active, running, kv_usage, seqs, kv)
    if fill >= stages.DECODE_SATURATED + 1e-9:
        assert full
    elif fill < stages.DECODE_SATURATED - 1e-9:
        assert not full


@pytest.mark.parametrize(
    ("label", "fullness", "start", "full", "expected"),
    [
        ("below the start: no lift", 0.5, 0.9, 1.0, 0.0),
        ("at the start: no lift", 0.9, 0.9, 1.0, 0.0),
        ("halfway", 0.95, 0.9, 1.0, 0.5),
        ("at full: all of it", 1.0, 0.9, 1.0, 1.0),
        ("above full: all of it", 1.7, 0.9, 1.0, 1.0),
        ("a wider ramp", 1.2, 0.9, 1.5, 0.5),
        ("unknown: none", NAN, 0.9, 1.0, 0.0),
    ],
)
def test_ease_weight(label: str, fullness: float, start: float, full: float, expected: float) -> None:
    assert ease_weight(fullness, start, full) == pytest.approx(expected), label


def test_ease_weight_rejects_bad_bounds_and_eased_scale_leaves_raises() -> None:
    for start, full in ((1.0, 1.0), (1.0, 0.9), (-0.1, 1.0), (0.9, math.inf)):
        with pytest.raises(ValueError, match="need 0 <= start < full"):
            ease_weight(0.95, start, full)
    assert eased_scale(0.4, 0.0) == 0.4
    assert eased_scale(0.4, 0.5) == pytest.approx(0.7)
    assert eased_scale(0.4, 1.0) == 1.0
    assert eased_scale(1.6, 1.0) == 1.6  # a raise is not the cut the fullness eases


def tracked(s50: float, s90: float) -> ArrivalCalibration:
    """A calibration past its warm-up whose multipliers are (s50, s90)."""
    return ArrivalCalibration(
        log_scale=(math.log(s50), math.log(s90)), last_s=100.0, compared_s=100.0, covered=(60.0, 95.0)
    )


FC = PoolForecast(
    horizon_s=H, arrivals_p50=80.0 * H, arrivals_p90=100.0 * H, prompt_tokens_p90=1e4 * H,
    gen_tokens_p90=2e3 * H, burst_prob=0.0,
)  # fmt: skip


def applied_p90(cal: ArrivalCalibration, fullness: float, ease: tuple[float, float] | None) -> float:
    scaled, _ = calibrated_forecast(
        FC,
        cal,
        5.0,
        CalibrationParams(max_scale=3.0),
        saturated=fullness >= stages.DECODE_SATURATED,
        fullness=fullness,
        ease=ease,
    )
    assert scaled is not None
    return scaled.arrivals_p90


@settings(max_examples=300, deadline=None)
@given(
    s50=st.floats(0.3, 3.0),
    s90=st.floats(0.3, 3.0),
    f1=fractions,
    f2=fractions,
    start=st.floats(0.0, 1.5),
    width=st.floats(0.01, 0.5),
)
def test_eased_is_monotone_in_fullness_and_lift_at_both_ends(
    s50: float, s90: float, f1: float, f2: float, start: float, width: float
) -> None:
    """The applied p90 never falls as the fleet fills; below both the easing's start and 90 % it is the cut
    'lift' applies, at or above both its end and 90 % it is 'lift''s uncut forecast; in between it lies between
    the cut and the uncut one."""
    cal, ease = tracked(s50, s90), (start, start + width)
    lo, hi = sorted((f1, f2))
    assert applied_p90(cal, lo, ease) <= applied_p90(cal, hi, ease) + 1e-9
    cut, uncut = applied_p90(cal, 0.0, None), applied_p90(cal, 1.0, None)
    for f in (f1, f2):
        eased = applied_p90(cal, f, ease)
        if f < min(start, stages.DECODE_SATURATED):
            assert eased == pytest.approx(cut)
        elif f >= max(start + width, stages.DECODE_SATURATED):
            assert eased == pytest.approx(uncut)
        assert min(cut, uncut) - 1e-9 <= eased <= max(cut, uncut) + 1e-9


def test_the_reason_says_what_was_applied() -> None:
    cal = tracked(0.4, 0.5)
    _, why = calibrated_forecast(FC, cal, 5.0, CalibrationParams(), fullness=0.95, ease=(0.9, 1.0))
    assert why is not None
    assert "p50 × 0.70, p90 × 0.75" in why  # halfway from the tracked 0.40 / 0.50 to 1
    assert "decode 95% full: cut eased 50% toward 1 (tracked p50 × 0.40, p90 × 0.50)" in why
    _, below = calibrated_forecast(FC, cal, 5.0, CalibrationParams(), fullness=0.5, ease=(0.9, 1.0))
    assert below is not None and "p90 × 0.50" in below and "eased" not in below
    assert calibrated_forecast(FC, cal, 5.0, CalibrationParams(), fullness=1.0, ease=(0.9, 1.0)) == (FC, None)


def test_config_defaults_and_bounds() -> None:
    cfg = PolicyConfig()
    assert cfg.arrival_calibration_saturated == "eased"  # since session 14
    assert (cfg.arrival_calibration_ease_from, cfg.arrival_calibration_ease_full) == (0.9, 1.0)
    with pytest.raises(ValidationError, match=r"arrival_calibration_ease_from .* must be below"):
        PolicyConfig(arrival_calibration_ease_from=1.0, arrival_calibration_ease_full=0.95)
    with pytest.raises(ValidationError, match="arrival_calibration_saturated"):
        PolicyConfig.model_validate({"arrival_calibration_saturated": "fade"})


def little_of(plan: ScalingPlan) -> float:
    need = next(r for r in plan.reasons if r.startswith("need:"))
    return float(need.split("Little ")[1].rstrip(")"))


def decode_need(plan: ScalingPlan) -> float:
    need = next(r for r in plan.reasons if r.startswith("need:"))
    return float(need.split("decode ")[1].split(" instances")[0])


def final_plan(cfg: PolicyConfig, running_seqs: float) -> ScalingPlan:
    """300 1-s ticks of a pool whose forecaster reads 100 req/s where 30 arrive (the calibration's cut reaches
    its 0.3 floor), its decode fleet held at ``running_seqs`` of its 256-sequence batch; the last plan."""
    fc = forecast(prompt_tps=3_000.0, gen_tps=600.0, rps=100.0)
    state, plan = PoolState(), None
    for t in range(1, 301):
        o: PoolObservation = obs(
            now_s=float(t), arrival_rps=30.0, forecast=fc, running_seqs=running_seqs, gen_tps=600.0,
            prompt_tps=3_000.0,
        )  # fmt: skip
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
    assert plan is not None
    return plan


def test_through_decide_eased_changes_decodes_need() -> None:
    """At 95 % of the batch 'lift' (session 13) sizes decode on the uncut forecast; 'eased' (0.9 → 1.0, the
    default since session 14, as an explicit 'eased' does) halfway between the cut and the uncut, and says so;
    below 90 % the two agree."""
    eased_cfg = PolicyConfig(arrival_calibration_saturated="eased")
    full = 0.95 * BATCH
    default, lift = (
        final_plan(PolicyConfig(), full),
        final_plan(PolicyConfig(arrival_calibration_saturated="lift"), full),
    )
    eased = final_plan(eased_cfg, full)
    assert default == eased
    per_seq = CAP.decode_tps / CAP.decode_seqs
    uncut, cut = (
        100.0 * 200.0 / per_seq,
        30.0 * 200.0 / per_seq,
    )  # 100 req/s as forecast; × 0.3 = the 30 measured
    assert little_of(lift) == pytest.approx(uncut, abs=1.0)
    assert little_of(eased) == pytest.approx((uncut + cut) / 2, abs=1.0)  # p90 × 0.65
    assert decode_need(eased) < decode_need(lift)
    assert any("decode 95% full: cut eased 50% toward 1" in r for r in eased.reasons)
    assert not any("eased" in r for r in lift.reasons)
    below = 0.6 * BATCH
    lift_cfg = PolicyConfig(arrival_calibration_saturated="lift")
    assert final_plan(eased_cfg, below).reasons == final_plan(lift_cfg, below).reasons
