"""The HPA-like reactive baseline behaves like the HPA's documented defaults."""

from __future__ import annotations

from policy_fixtures import CAP, NAN, obs

from controller.policy.reactive import ReactiveConfig, ReactiveState, decide_reactive


def _step(now: float, prompt: float, active: int, state: ReactiveState) -> tuple[int, ReactiveState]:
    o = obs(
        now_s=now, prompt_tps=prompt, replicas={"prefill": active, "decode": 1}, running_seqs=0.0, gen_tps=1.0
    )
    plan, state = decide_reactive(o, CAP, ReactiveConfig(), 1000.0, state)
    assert plan is not None
    return plan.prefill, state


def test_scale_up_limited_to_double_or_plus_four_per_15_s() -> None:
    n, st = _step(0.0, 700_000.0, 2, ReactiveState())  # need 70 → desired 100, capped at max 64 later
    assert n == 6  # max(2 × 2, 2 + 4)
    n2, st = _step(10.0, 700_000.0, n, st)
    assert n2 == n  # within the 15 s period
    n3, _ = _step(15.0, 700_000.0, n, st)
    assert n3 == 12


def test_scale_down_stabilised_for_300_s() -> None:
    st = ReactiveState()
    n, st = _step(0.0, 70_000.0, 10, st)  # need 7 → desired 10 = current
    assert n == 10
    for t in (60.0, 200.0, 299.0):
        n, st = _step(t, 7_000.0, 10, st)
        assert n == 10, t
    n, st = _step(301.0, 7_000.0, 10, st)
    assert n == 1  # the t=0 recommendation (10) left the window; need 0.7 at 70 % → 1


def test_tolerance_band_holds() -> None:
    n, _ = _step(0.0, 58_800.0, 8, ReactiveState())  # desired 8.4 = 5 % over current: within 10 %
    assert n == 8
    n, _ = _step(0.0, 64_400.0, 8, ReactiveState())  # 15 % over: scales
    assert n == 10


def test_unknown_measurement_no_opinion() -> None:
    plan, _ = decide_reactive(obs(prompt_tps=NAN), CAP, ReactiveConfig(), 1000.0, ReactiveState())
    assert plan is None
