"""The cpu-tiny admission delay keyed on the running streams' age: a request arriving among young streams (few
output tokens so far) pays the young terms, one among old streams does not; the profile JSON carries the terms
with clear errors; the joint fit over both probe designs recovers known terms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.hardware import ProfileError
from serving.sim.latency import (
    LinearLatencyModel,
    fit_admission_by_age,
    get_latency_model,
    load_linear_profile,
)
from tests.support.cpu_tiny import COEF, PROFILE, make_trace, replay_mixed


def _ttft(arrivals: list[float], prompts: list[int], outputs: list[int], model: Any) -> np.ndarray:
    return np.asarray(replay_mixed(make_trace(arrivals, prompts, outputs), model).request_ttft_ms)


def _young(busy: float = 80.0, per: float = 0.0, tokens: float = 64.0) -> LinearLatencyModel:
    return LinearLatencyModel(
        PROFILE,
        COEF,
        "test",
        admission_young_busy_ms=busy,
        admission_ms_per_young_seq=per,
        admission_young_tokens=tokens,
    )


def test_the_delay_function() -> None:
    m = LinearLatencyModel(
        PROFILE,
        COEF,
        "test",
        admission_busy_ms=5.0,
        admission_ms_per_running_seq=1.0,
        admission_young_busy_ms=50.0,
        admission_ms_per_young_seq=2.0,
        admission_young_tokens=64,
    )
    assert m.admission_delay_ms(0, 0) == 0.0
    assert m.admission_delay_ms(3) == 8.0  # no young stream: the count-keyed part only
    assert m.admission_delay_ms(3, 0) == 8.0
    assert m.admission_delay_ms(3, 2) == 8.0 + 50.0 + 4.0
    assert get_latency_model("llama3-8b/a100").admission_delay_ms(4, 4) == 0.0


def test_young_streams_delay_a_new_request_old_ones_do_not() -> None:
    plain = LinearLatencyModel(PROFILE, COEF, "test")
    late = _young(busy=80.0)
    # a stream of 2,000 tokens starts at 0; probes arrive at 0.05 s (it is young: a handful of tokens out) and at
    # 3 s (hundreds of tokens out: old)
    arrivals, prompts, outputs = [0.0, 0.05, 3.0], [64, 128, 128], [2000, 1, 1]
    t0 = _ttft(arrivals, prompts, outputs, plain)
    t1 = _ttft(arrivals, prompts, outputs, late)
    step = COEF["a_ms"] + COEF["c_ms_per_decode_seq"] + 1.0
    assert 80.0 - step <= t1[1] - t0[1] <= 80.0 + step
    assert t1[2] == pytest.approx(t0[2], abs=step)  # among old streams: no young delay
    assert t1[0] == pytest.approx(t0[0])


@settings(max_examples=10, deadline=None)
@given(n_young=st.integers(1, 5), per=st.floats(0.0, 30.0))
def test_the_delay_grows_with_the_young_streams(n_young: int, per: float) -> None:
    plain = LinearLatencyModel(PROFILE, COEF, "test")
    late = _young(busy=40.0, per=per)
    # n_young streams start together; a probe arrives at 0.3 s, when all of them decode and are still young
    # (~20 of their 60 tokens out, fewer than 64)
    arrivals = [0.0] * n_young + [0.3]
    t0 = _ttft(arrivals, [64] * n_young + [128], [60] * n_young + [1], plain)
    t1 = _ttft(arrivals, [64] * n_young + [128], [60] * n_young + [1], late)
    delay = 40.0 + per * n_young
    step = COEF["a_ms"] + (COEF["c_ms_per_decode_seq"] + 0.1) * n_young + 0.025 * 64 * n_young
    # each side waits for the step in progress (up to one step, decode or the streams' own prefill)
    assert delay - 2 * step <= t1[-1] - t0[-1] <= delay + 2 * step


def test_profile_json_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    overheads = {
        "admission_young_busy_ms": 70.0,
        "admission_ms_per_young_seq": 1.5,
        "admission_young_tokens": 64,
    }
    path.write_text(json.dumps({"coefficients": COEF, "source": "t", "overheads": overheads}))
    m = load_linear_profile(PROFILE, path)
    assert (m.admission_young_busy_ms, m.admission_ms_per_young_seq, m.admission_young_tokens) == (
        70.0,
        1.5,
        64.0,
    )
    path.write_text(
        json.dumps({"coefficients": COEF, "source": "t", "overheads": {"admission_young_busy_ms": 70.0}})
    )
    with pytest.raises(ProfileError, match=r"p\.json.*admission_young_tokens must be > 0"):
        load_linear_profile(PROFILE, path)
    path.write_text(
        json.dumps({"coefficients": COEF, "source": "t", "overheads": {"admission_ms_per_young_seq": -1}})
    )
    with pytest.raises(ProfileError, match="admission_ms_per_young_seq must be finite and >= 0"):
        load_linear_profile(PROFILE, path)


def test_without_young_terms_the_age_is_never_asked() -> None:
    m = LinearLatencyModel(PROFILE, COEF, "test", admission_young_tokens=64)
    assert m.admission_young_tokens == 0.0  # no young term: not keyed on age (the simulator skips the count)


@settings(max_examples=20, deadline=None)
@given(
    busy=st.floats(0.0, 50.0),
    per=st.floats(0.0, 5.0),
    young_busy=st.floats(0.0, 100.0),
    per_young=st.floats(0.0, 10.0),
    baseline=st.floats(-5.0, 20.0),
)
def test_fit_admission_by_age_recovers_the_terms(
    busy: float, per: float, young_busy: float, per_young: float, baseline: float
) -> None:
    running, young, ttft, modelled = [], [], [], []
    for design_young in (False, True):
        for b in (0, 1, 2, 4, 8):
            g = b if design_young else 0
            delay = 0.0 if b == 0 else busy + per * b + (young_busy + per_young * g if g else 0.0)
            for _ in range(3):
                running.append(b)
                young.append(g)
                modelled.append(20.0 + b)
                ttft.append(20.0 + b + baseline + delay)
    fit = fit_admission_by_age(running, young, ttft, modelled)
    assert fit["baseline_ms"] == pytest.approx(baseline, abs=1e-6)
    assert fit["max_abs_err_ms"] < 1e-6
    got = [fit[k] for k in ("admission_busy_ms", "admission_ms_per_running_seq")]
    assert got == pytest.approx([busy, per], abs=1e-6)
    got = [fit[k] for k in ("admission_young_busy_ms", "admission_ms_per_young_seq")]
    assert got == pytest.approx([young_busy, per_young], abs=1e-6)


def test_fit_admission_by_age_errors() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        fit_admission_by_age([0, 1], [0], [1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="running = 0"):
        fit_admission_by_age([1, 2], [0, 2], [1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="running > 0"):
        fit_admission_by_age([0, 0], [0, 0], [1.0, 2.0], [1.0, 2.0])
