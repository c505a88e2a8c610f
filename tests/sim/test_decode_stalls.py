"""Seeded decode stalls (``decode_stall_fraction`` p, ``decode_stall_ms`` S): zero changes nothing, every
decode step of a run costs S more at p = 1, a fraction near p at 0 < p < 1, the same seed gives the same
replay, runs cut by arrivals stay consistent, the ITL histogram moves by exactly the stalls, and the fit
recovers p and S from step times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.engine import Simulator
from serving.sim.fleet import single_pool
from serving.sim.hardware import ProfileError
from serving.sim.latency import LinearLatencyModel, fit_decode_stalls, get_latency_model, load_linear_profile
from tests.support.cpu_tiny import PROFILE, make_trace, replay_mixed, report_doc

COEF = {
    "a_ms": 3.0,
    "b_ms_per_prefill_token": 0.03,
    "c_ms_per_decode_seq": 0.1,
    "d_ms_per_decode_context_token": 2e-4,
}


_trace = make_trace


def _model(p: float = 0.0, s: float = 0.0, seed: int = 0) -> LinearLatencyModel:
    return LinearLatencyModel(
        PROFILE, COEF, "test", decode_stall_fraction=p, decode_stall_ms=s, decode_stall_seed=seed
    )


_report = replay_mixed
_doc = report_doc


MIX = _trace(
    [0.0, 0.01, 0.02, 0.3, 0.31, 0.6, 1.5, 1.51],
    [300, 120, 512, 64, 200, 400, 32, 256],
    [300, 5, 32, 1, 120, 20, 8, 3],
)


def test_zero_stall_is_identical_and_gpu_profiles_have_none() -> None:
    assert _doc(MIX, _model()) == _doc(MIX, _model(0.0, 50.0)) == _doc(MIX, _model(0.3, 0.0))
    assert get_latency_model("llama3-8b/a100").decode_stall_ms == 0.0


def test_every_step_stalled_adds_s_to_every_inter_token_gap() -> None:
    trace = _trace([0.0], [100], [200])
    base = _report(trace, _model())
    late = _report(trace, _model(1.0, 7.0))
    assert late.request_ttft_ms[0] == pytest.approx(base.request_ttft_ms[0])  # the prefill is not stalled
    assert late.request_itl_ms[0] == pytest.approx(base.request_itl_ms[0] + 7.0)


@settings(max_examples=10, deadline=None)
@given(p=st.floats(0.05, 0.9), seed=st.integers(0, 1000))
def test_a_fraction_near_p_of_the_steps_stall(p: float, seed: int) -> None:
    trace = _trace([0.0], [100], [3001])
    base = _report(trace, _model())
    late = _report(trace, _model(p, 10.0, seed))
    stalled = (late.request_itl_ms[0] - base.request_itl_ms[0]) * 3000 / 10.0
    assert stalled == pytest.approx(round(stalled), abs=1e-6)  # a whole number of stalls
    assert abs(stalled / 3000 - p) < 4 * np.sqrt(p * (1 - p) / 3000) + 1e-9
    again = _report(trace, _model(p, 10.0, seed))
    assert again.request_itl_ms[0] == late.request_itl_ms[0]  # seeded: the same replay


def test_another_seed_moves_the_stalls() -> None:
    trace = _trace([0.0], [100], [400])
    a = _report(trace, _model(0.1, 10.0, 1)).request_itl_ms[0]
    b = _report(trace, _model(0.1, 10.0, 2)).request_itl_ms[0]
    assert a != b


@settings(max_examples=15, deadline=None)
@given(
    arrivals=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=12),
    p=st.floats(0.0, 1.0),
    data=st.data(),
)
def test_runs_cut_by_arrivals_stay_consistent(arrivals: list[float], p: float, data: Any) -> None:
    n = len(arrivals)
    prompts = data.draw(st.lists(st.integers(1, 500), min_size=n, max_size=n))
    outputs = data.draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    trace = _trace(sorted(arrivals), prompts, outputs)
    sim = Simulator(
        single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
        {"default": trace},
        models=lambda _name: (PROFILE, _model(p, 20.0)),
    )
    plain = Simulator(
        single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
        {"default": trace},
        models=lambda _name: (PROFILE, _model()),
    )
    for s in (sim, plain):
        t = 0.0
        while not s.idle:  # stepped, so that exports read runs mid-way
            t += 0.05
            s.run_until(t)
            inst = s.instances[0]
            assert inst.generation_tokens(t) <= sum(outputs)
        assert s.unfinished() == 0
    a, b = sim.instances[0], plain.instances[0]
    assert a.generation_tokens_total == b.generation_tokens_total == sum(outputs)
    assert sum(a.itl.counts) == sum(b.itl.counts)  # stalls move samples, never add or drop them
    assert a.itl.sum >= b.itl.sum - 1e-9
    assert all(c >= 0 for c in a.itl.counts)


def test_the_itl_histogram_moves_by_exactly_the_stalls() -> None:
    trace = _trace([0.0], [100], [500])
    sims = []
    for model in (_model(), _model(0.2, 40.0, 3)):

        def models(_name: str, m: LinearLatencyModel = model) -> tuple[Any, Any]:
            return PROFILE, m

        sim = Simulator(
            single_pool(profile="cpu-tiny", mixed=1, max_per_role=1), {"default": trace}, models=models
        )
        sim.run_to_completion()
        sims.append(sim)
    base, late = (s.instances[0] for s in sims)
    stalls = late._stalls_before(late.step)  # every decode step of the instance so far
    e2e_extra = (sims[1].req.t_done_s[0] - sims[0].req.t_done_s[0]) * 1000.0
    assert e2e_extra == pytest.approx(40.0 * stalls)
    assert (late.itl.sum - base.itl.sum) * 1000.0 == pytest.approx(40.0 * stalls)


def test_profile_json_terms_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "p.json"

    def write(overheads: dict[str, Any]) -> Path:
        path.write_text(json.dumps({"coefficients": COEF, "source": "t", "overheads": overheads}))
        return path

    m = load_linear_profile(
        PROFILE, write({"decode_stall_fraction": 0.05, "decode_stall_ms": 90.0, "decode_stall_seed": 4})
    )
    assert (m.decode_stall_fraction, m.decode_stall_ms, m.decode_stall_seed) == (0.05, 90.0, 4)
    with pytest.raises(ProfileError, match=r"p\.json.*decode_stall_fraction must be in \[0, 1\]"):
        load_linear_profile(PROFILE, write({"decode_stall_fraction": 1.5}))
    with pytest.raises(ProfileError, match="decode_stall_seed must be an integer"):
        load_linear_profile(PROFILE, write({"decode_stall_seed": 1.5}))
    with pytest.raises(ProfileError, match="decode_stall_ms must be finite and >= 0"):
        load_linear_profile(PROFILE, write({"decode_stall_ms": -1}))


def test_fit_decode_stalls() -> None:
    fit = fit_decode_stalls([3, 3, 3, 53], ["b1"] * 4)
    assert fit["decode_stall_fraction"] == 0.25 and fit["decode_stall_ms"] == 50.0
    # per configuration: a 10 ms step is normal where the median is 9 ms, stalled where it is 3 ms
    fit = fit_decode_stalls([3, 3, 10, 9, 9, 10], ["a", "a", "a", "b", "b", "b"], threshold=2.0)
    assert fit["n_stalled"] == 1 and fit["decode_stall_ms"] == 7.0
    assert fit_decode_stalls([3, 3], ["a", "a"])["decode_stall_ms"] == 0.0
    with pytest.raises(ValueError, match="differ in length"):
        fit_decode_stalls([1.0], ["a", "b"])
    with pytest.raises(ValueError, match="threshold must be > 1"):
        fit_decode_stalls([1.0], ["a"], threshold=1.0)
