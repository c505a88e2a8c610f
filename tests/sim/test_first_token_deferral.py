"""Deferred first tokens (``first_token_deferred_fraction`` q): 0 changes nothing; at q = 1 every multi-token
request's client TTFT is its e2e (its mean ITL 0) while one-token requests and the engine's schedule are
untouched; at 0 < q < 1 a deterministic share near q is deferred; the fit counts the deferred probes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from serving.sim.fleet import single_pool
from serving.sim.hardware import ProfileError, get_profile
from serving.sim.latency import LinearLatencyModel, fit_first_token_delivery, get_latency_model
from serving.sim.replay import PolicyOptions, make_policy, replay
from serving.workload.trace import Trace

PROFILE = get_profile("cpu-tiny").with_overrides(max_num_seqs=16)
COEF = {
    "a_ms": 3.0,
    "b_ms_per_prefill_token": 0.04,
    "c_ms_per_decode_seq": 0.1,
    "d_ms_per_decode_context_token": 5e-4,
}


def _report(n: int, q: float, outputs: int = 20) -> Any:
    rng = np.random.default_rng(0)
    trace = Trace.from_arrays(
        arrival_s=np.sort(rng.uniform(0, n / 2.0, n)),
        prompt_tokens=rng.integers(16, 400, n),
        output_tokens=np.where(np.arange(n) % 5 == 0, 1, outputs),
        source="test",
        format="synthetic",
    )
    model = LinearLatencyModel(PROFILE, COEF, "test", first_token_deferred_fraction=q)
    return replay(
        single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
        {"default": trace},
        make_policy("fixed", PolicyOptions(mixed=1)),
        models=lambda _name: (PROFILE, model),
    )


def test_zero_changes_nothing_and_gpu_profiles_have_none() -> None:
    a, b = _report(60, 0.0).to_json(), _report(60, 0.0).to_json()
    a.pop("wall_s")
    b.pop("wall_s")
    assert a == b
    assert get_latency_model("llama3-8b/a100").first_token_deferred_fraction == 0.0


def test_all_deferred_ttft_is_e2e_and_the_schedule_is_unchanged() -> None:
    base, late = _report(60, 0.0), _report(60, 1.0)
    multi = np.arange(60) % 5 != 0
    e2e = np.asarray(late.to_json()["e2e_ms"]["p50"])
    assert e2e == pytest.approx(base.to_json()["e2e_ms"]["p50"])  # the engine did the same work, same time
    ttft0, ttft1 = np.asarray(base.request_ttft_ms), np.asarray(late.request_ttft_ms)
    np.testing.assert_allclose(ttft1[~multi], ttft0[~multi])  # one-token requests: nothing to defer
    assert np.all(ttft1[multi] > ttft0[multi])
    np.testing.assert_allclose(np.asarray(late.request_itl_ms)[multi], 0.0, atol=1e-9)


def test_a_share_near_q_is_deferred() -> None:
    base, late = _report(400, 0.0), _report(400, 0.4)
    multi = np.arange(400) % 5 != 0
    moved = np.asarray(late.request_ttft_ms)[multi] > np.asarray(base.request_ttft_ms)[multi] + 1e-9
    assert abs(moved.mean() - 0.4) < 0.08


def test_bad_fraction_is_named() -> None:
    with pytest.raises(ProfileError, match=r"first_token_deferred_fraction must be in \[0, 1\]"):
        LinearLatencyModel(PROFILE, COEF, "test", first_token_deferred_fraction=1.5)


def test_fit_first_token_delivery() -> None:
    fit = fit_first_token_delivery([1, 1, 32, 32], [64] * 4, [20.0, 20.0, 110.0, 25.0], 3.0)
    assert fit["first_token_deferred_fraction"] == 0.5 and fit["n_rows"] == 2
    with pytest.raises(ValueError, match="one-token and multi-token rows"):
        fit_first_token_delivery([32, 32], [64, 64], [1.0, 2.0], 3.0)
    with pytest.raises(ValueError, match="decode_step_ms must be > 0"):
        fit_first_token_delivery([1], [64], [1.0], 0.0)
    with pytest.raises(ValueError, match="differ in length"):
        fit_first_token_delivery([1], [64, 2], [1.0], 3.0)
