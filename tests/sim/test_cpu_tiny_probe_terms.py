"""The cpu-tiny admission delay and wake-up terms: zero changes nothing, the admission delay grows TTFT with the
sequences decoding at arrival, the wake-up is paid only after an idle spell, both leave ITL alone, the profile
JSON round-trips with clear errors, and the fits recover known terms from synthetic probe rows."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.sim.fleet import single_pool
from serving.sim.hardware import ProfileError, get_profile
from serving.sim.latency import (
    CPU_TINY_JSON,
    LINEAR_OVERHEADS,
    LinearLatencyModel,
    fit_admission_delay,
    fit_wake_up,
    get_latency_model,
    load_linear_profile,
)
from serving.sim.replay import PolicyOptions, make_policy, replay
from serving.workload.trace import Trace

ROOT = Path(__file__).resolve().parents[2]
PROFILE = get_profile("cpu-tiny").with_overrides(max_num_seqs=16)
COEF = {
    "a_ms": 6.0,
    "b_ms_per_prefill_token": 0.025,
    "c_ms_per_decode_seq": 2.2,
    "d_ms_per_decode_context_token": 4e-4,
}


class _Bare:
    """A latency model with none of the optional terms as attributes (what every model was before them)."""

    def __init__(self, inner: LinearLatencyModel) -> None:
        self.inner = inner

    def iteration_ms(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.iteration_ms(*args, **kwargs)


def _trace(arrivals: list[float], prompts: list[int], outputs: list[int]) -> Trace:
    return Trace.from_arrays(
        arrival_s=np.asarray(arrivals, dtype=np.float64),
        prompt_tokens=np.asarray(prompts),
        output_tokens=np.asarray(outputs),
        source="test",
        format="synthetic",
    )


def _replay(trace: Trace, model: Any) -> Any:
    return replay(
        single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
        {"default": trace},
        make_policy("fixed", PolicyOptions(mixed=1)),
        models=lambda _name: (PROFILE, model),
    )


def _doc(trace: Trace, model: Any) -> dict[str, Any]:
    doc = dict(_replay(trace, model).to_json())
    doc.pop("wall_s")
    return doc


def _ttft_itl(trace: Trace, model: Any) -> tuple[np.ndarray, np.ndarray]:
    report = _replay(trace, model)
    return np.asarray(report.request_ttft_ms), np.asarray(report.request_itl_ms)


BUSY = _trace(
    [0.0, 0.01, 0.02, 0.5, 0.52, 0.9, 2.5, 2.51],
    [300, 120, 512, 64, 200, 400, 32, 256],
    [30, 5, 32, 1, 12, 20, 8, 3],
)


def test_zero_terms_are_identical_to_a_model_without_them() -> None:
    plain = LinearLatencyModel(PROFILE, COEF, "test")
    assert plain.admission_delay_ms(8) == 0.0 and plain.wake_up_ms == 0.0
    assert _doc(BUSY, plain) == _doc(BUSY, _Bare(plain))


def test_gpu_profiles_have_neither_term() -> None:
    for name in ("llama3-8b/a100", "llama2-70b/h100"):
        model = get_latency_model(name)
        assert model.admission_delay_ms(8) == 0.0
        assert model.wake_up_ms == 0.0


@settings(max_examples=15, deadline=None)
@given(running=st.integers(1, 6), busy_ms=st.floats(0.0, 80.0), per_seq_ms=st.floats(0.0, 40.0))
def test_admission_delay_grows_ttft_with_the_sequences_decoding_at_arrival(
    running: int, busy_ms: float, per_seq_ms: float
) -> None:
    # `running` long streams start together; a probe arrives at 0.5 s while they all decode
    trace = _trace([0.0] * running + [0.5], [64] * running + [256], [400] * running + [1])
    base = LinearLatencyModel(PROFILE, COEF, "test")
    late = LinearLatencyModel(
        PROFILE, COEF, "test", admission_busy_ms=busy_ms, admission_ms_per_running_seq=per_seq_ms
    )
    ttft0, _ = _ttft_itl(trace, base)
    ttft1, _ = _ttft_itl(trace, late)
    # the streams arrived at an idle instance: no delay for them
    np.testing.assert_allclose(ttft1[:running], ttft0[:running], atol=1e-9)
    delay = busy_ms + per_seq_ms * running
    step = COEF["a_ms"] + COEF["c_ms_per_decode_seq"] * running + 1.0  # one decode step (+ context), ms
    # the probe reaches the engine `delay` later, then waits for the end of the step in progress
    assert delay - step <= ttft1[-1] - ttft0[-1] <= delay + step


def test_admission_delay_leaves_an_isolated_request_and_itl_alone() -> None:
    trace = _trace([0.0, 0.1, 30.0], [200, 100, 200], [40, 40, 40])
    base = LinearLatencyModel(PROFILE, COEF, "test")
    late = LinearLatencyModel(PROFILE, COEF, "test", admission_busy_ms=50.0)
    ttft0, itl0 = _ttft_itl(trace, base)
    ttft1, itl1 = _ttft_itl(trace, late)
    assert ttft1[0] == pytest.approx(ttft0[0]) and ttft1[2] == pytest.approx(ttft0[2])
    assert ttft1[1] > ttft0[1] + 40.0  # arrived while request 0 decoded
    assert itl1[2] == pytest.approx(
        itl0[2], abs=1e-9
    )  # (request 0's ITL moves: request 1 joins its batch later)


def test_wake_up_is_paid_only_after_an_idle_spell() -> None:
    # 0.0: the instance was just created; 0.4 s: right after the first answer; 5.0 s: after ~4.5 s idle;
    # 5.2 s: arrives while the woken instance works
    trace = _trace([0.0, 0.4, 5.0, 5.2], [256, 256, 256, 256], [20, 20, 20, 20])
    base = LinearLatencyModel(PROFILE, COEF, "test")
    woken = LinearLatencyModel(PROFILE, COEF, "test", wake_up_ms=150.0, idle_after_s=1.0)
    ttft0, itl0 = _ttft_itl(trace, base)
    ttft1, itl1 = _ttft_itl(trace, woken)
    np.testing.assert_allclose(ttft1[[0, 1]], ttft0[[0, 1]], atol=1e-9)
    assert ttft1[2] == pytest.approx(ttft0[2] + 150.0, abs=1e-6)
    assert ttft1[3] < ttft0[3] + 150.0  # no second wake-up: the instance was busy (queued behind, not woken)
    np.testing.assert_allclose(itl1[:2], itl0[:2], atol=1e-9)
    # alone, the woken request decodes as before: the wake-up is no inter-token gap
    alone = _trace([0.0, 5.0], [256, 256], [20, 20])
    np.testing.assert_allclose(_ttft_itl(alone, woken)[1], _ttft_itl(alone, base)[1], atol=1e-9)


def test_idle_after_s_is_the_threshold() -> None:
    trace = _trace([0.0, 1.0], [64, 64], [1, 1])  # the first answer ends ~8 ms after t=0: gap < 1 s
    base = LinearLatencyModel(PROFILE, COEF, "test")
    short = LinearLatencyModel(PROFILE, COEF, "test", wake_up_ms=100.0, idle_after_s=0.5)
    long = LinearLatencyModel(PROFILE, COEF, "test", wake_up_ms=100.0, idle_after_s=2.0)
    ttft0, _ = _ttft_itl(trace, base)
    assert _ttft_itl(trace, short)[0][1] == pytest.approx(ttft0[1] + 100.0)
    assert _ttft_itl(trace, long)[0][1] == pytest.approx(ttft0[1])


# ---------------------------------------------------------------------------------------------- the JSON
def _write(tmp_path: Path, overheads: Any) -> Path:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"source": "test", "coefficients": COEF, "overheads": overheads}))
    return path


def test_profile_json_round_trip(tmp_path: Path) -> None:
    terms = {
        "request_overhead_ms": 9.0,
        "admission_busy_ms": 40.0,
        "admission_ms_per_running_seq": 3.5,
        "wake_up_ms": 120.0,
        "idle_after_s": 1.5,
        "admission_young_busy_ms": 0.0,  # the young terms: tests/sim/test_cpu_tiny_age_terms.py
        "admission_ms_per_young_seq": 0.0,
        "admission_young_tokens": 0.0,
        "decode_stall_fraction": 0.0,  # the stall terms: tests/sim/test_decode_stalls.py
        "decode_stall_ms": 0.0,
        "decode_stall_seed": 0,
        "first_token_deferred_fraction": 0.0,  # tests/sim/test_first_token_deferral.py
        "request_overhead_outside_fraction": 0.25,  # where the server's TTFT starts: tests/sim/test_server_stamp.py
        "admission_outside_fraction": 0.5,
    }
    assert set(terms) == set(LINEAR_OVERHEADS)
    model = load_linear_profile(PROFILE, _write(tmp_path, terms))
    assert {k: getattr(model, k) for k in terms} == terms
    assert model.admission_delay_ms(0) == 0.0
    assert model.admission_delay_ms(4) == pytest.approx(40.0 + 4 * 3.5)
    # absent terms: 0, and the vLLM idle threshold
    bare = load_linear_profile(PROFILE, _write(tmp_path, {}))
    assert bare.admission_delay_ms(8) == 0.0 and bare.wake_up_ms == 0.0 and bare.idle_after_s == 1.0


def test_shipped_cpu_tiny_json_has_the_terms() -> None:
    data = json.loads(CPU_TINY_JSON.read_text())
    model = load_linear_profile(PROFILE)
    for key in ("admission_busy_ms", "admission_ms_per_running_seq", "wake_up_ms", "idle_after_s"):
        assert key in data["overheads"], key
        assert getattr(model, key) == data["overheads"][key]
    assert "--probe" in data["source"] or "probe" in data["source"]


@pytest.mark.parametrize(
    ("overheads", "message"),
    [
        ({"wake_up_ms": -1.0}, "wake_up_ms must be finite and >= 0"),
        ({"admission_busy_ms": math.inf}, "admission_busy_ms must be finite"),
        ({"admission_ms_per_running_seq": "3"}, "overheads.admission_ms_per_running_seq must be a number"),
        ({"idle_after_s": 0.0}, "idle_after_s must be finite and > 0"),
        ({"wake_ms": 1.0}, "unknown overheads ['wake_ms']"),
        ([1, 2], "overheads must be an object"),
    ],
)
def test_bad_terms_are_named(tmp_path: Path, overheads: Any, message: str) -> None:
    path = _write(tmp_path, overheads)
    with pytest.raises(ProfileError) as err:
        load_linear_profile(PROFILE, path)
    assert message in str(err.value) and str(path) in str(err.value)


# ---------------------------------------------------------------------------------------------- the fits
@settings(max_examples=30, deadline=None)
@given(busy=st.floats(0.0, 100.0), per_seq=st.floats(0.0, 20.0), baseline=st.floats(0.0, 20.0))
def test_fit_admission_delay_recovers_the_terms(busy: float, per_seq: float, baseline: float) -> None:
    running = np.repeat([0, 1, 2, 4, 8], 5)
    wait = np.where(running > 0, 3.0 + running, 0.0)
    excess = baseline + wait + np.where(running > 0, busy + per_seq * running, 0.0)
    excess[::5] += 500.0  # one stalled probe per count: medians ignore it
    fit = fit_admission_delay(running, excess, wait)
    assert fit["baseline_ms"] == pytest.approx(baseline, abs=1e-6)
    assert fit["admission_busy_ms"] == pytest.approx(busy, abs=1e-4)
    assert fit["admission_ms_per_running_seq"] == pytest.approx(per_seq, abs=1e-4)


def test_fit_admission_delay_errors() -> None:
    with pytest.raises(ValueError, match="baseline"):
        fit_admission_delay([1, 2], [10.0, 20.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="running > 0"):
        fit_admission_delay([0, 0], [10.0, 20.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="differ in length"):
        fit_admission_delay([0, 1], [10.0], [0.0, 0.0])


def test_fit_wake_up_recovers_the_cost_and_ignores_short_gaps() -> None:
    gaps = np.tile([0.1, 0.5, 1.0, 2.0, 5.0], 8)
    prompts = np.repeat([32, 512], 20)
    ttft = np.where(prompts == 32, 20.0, 40.0) + np.where(gaps >= 1.0, 180.0, 0.0)
    fit = fit_wake_up(gaps, ttft, prompts, 1.0)
    assert fit["wake_up_ms"] == pytest.approx(180.0)
    assert fit["per_prompt_ms"] == {32: pytest.approx(180.0), 512: pytest.approx(180.0)}
    with pytest.raises(ValueError, match="below and at or above 10"):
        fit_wake_up(gaps, ttft, prompts, 10.0)
    with pytest.raises(ValueError, match="idle_after_s must be > 0"):
        fit_wake_up(gaps, ttft, prompts, 0.0)


# ---------------------------------------------------------------------------------------------- bench
def _bench() -> ModuleType:
    path = ROOT / "bench" / "bench_vllm_cpu.py"
    spec = importlib.util.spec_from_file_location("bench_vllm_cpu_probe_terms", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_refit_writes_the_probe_terms(tmp_path: Path) -> None:
    bench = _bench()
    probes = []
    a, b, c, d = COEF.values()
    for rep in range(3):
        for running in (0, 1, 2, 4, 8):
            for n in (32, 256):
                # what the simulator gives the probe without the term (see probe_fits), plus a known excess
                decode = running * (c + d * bench.BACKGROUND_CONTEXT_AT_PROBE)
                modelled = 9.0 + ((a + decode) / 2 if running else 0.0) + a + b * n + decode
                ttft = modelled + (30.0 + 2.0 * running if running else 0.0) + 1.5
                engine = 10.0 + 0.02 * n
                probes.append(bench.ProbeRow("admit", n, running, math.nan, ttft, engine, running, rep))
        for gap in (0.1, 0.5, 1.0, 2.0, 5.0):
            for n in (32, 512):
                ttft = 20.0 + 0.03 * n + (150.0 if gap >= 1.0 else 0.0)
                probes.append(bench.ProbeRow("idle", n, 0, gap, ttft, math.nan, -1, rep))
    csv_path = tmp_path / "probes.csv"
    bench.write_probe_csv(probes, csv_path, "test", "0.1", "synthetic")
    data = bench.read_probes(csv_path)
    admission, wake = bench.probe_fits(data, COEF, 9.0)
    assert admission["baseline_ms"] == pytest.approx(1.5)
    assert admission["admission_busy_ms"] == pytest.approx(30.0, abs=1e-3)
    assert admission["admission_ms_per_running_seq"] == pytest.approx(2.0, abs=1e-4)
    assert wake["wake_up_ms"] == pytest.approx(150.0)
    json_path = tmp_path / "cpu_tiny.json"
    json_path.write_text(json.dumps({"source": "x", "coefficients": COEF}))
    result = {
        "coefficients": COEF,
        "n_samples": 4,
        "rel_err_p50": 0.1,
        "rel_err_p90": 0.2,
        "rel_err_max": 0.3,
    }
    overhead = {
        "request_overhead_ms": 9.0,
        "n_configs": 2,
        "n_pairs": 4,
        "diff_p10_ms": 8.0,
        "diff_p90_ms": 10.0,
    }
    bench.write_profile(result, overhead, 10, json_path, tmp_path / "m.csv", (admission, wake, 75), csv_path)
    model = load_linear_profile(PROFILE, json_path)
    assert model.wake_up_ms == pytest.approx(150.0) and model.idle_after_s == 1.0
    assert model.admission_delay_ms(4) == pytest.approx(38.0, abs=1e-3)
    assert "fit_admission_delay" in model.source and "fit_wake_up" in model.source


def test_read_probes_names_the_bad_line(tmp_path: Path) -> None:
    bench = _bench()
    path = tmp_path / "p.csv"
    path.write_text(
        "# c\n" + ",".join(bench.PROBE_COLUMNS) + "\nadmit,32,1,nan,10,5,1,0\nbogus,32,1,nan,10,5,1,0\n"
    )
    with pytest.raises(ValueError, match=r"p\.csv:4: kind 'bogus'"):
        bench.read_probes(path)
    path.write_text(",".join(bench.PROBE_COLUMNS) + "\nadmit,32,1,nan,10\n")
    with pytest.raises(ValueError, match=r"p\.csv:2: 5 fields"):
        bench.read_probes(path)


# ---------------------------------------------------------------------------------------------- in transit
def _sim(trace: Trace, model: Any, mixed: int) -> Any:
    from serving.sim.engine import Simulator

    fleet = single_pool(profile="cpu-tiny", mixed=mixed, max_per_role=4)
    return Simulator(fleet, {"default": trace}, models=lambda _name: (PROFILE, model))


def test_a_request_in_admission_transit_survives_its_instance_failing() -> None:
    late = LinearLatencyModel(PROFILE, COEF, "test", admission_busy_ms=200.0)
    # one long stream on each instance, then a request that must wait 200 ms to be admitted
    sim = _sim(_trace([0.0, 0.0, 0.5], [64, 64, 128], [400, 400, 5]), late, mixed=2)
    sim.run_until(0.55)
    where = [i for i in sim.instances if i.load == 2]  # its stream + the request on its way in
    assert len(where) == 1
    sim.fail_instance(where[0].instance_id)
    sim.run_to_completion(limit_s=60.0)
    assert sim.unfinished() == 0
    assert all(i.load == 0 for i in sim.instances if i.state != "failed")


def test_a_request_in_admission_transit_keeps_the_draining_instance() -> None:
    late = LinearLatencyModel(PROFILE, COEF, "test", admission_busy_ms=200.0)
    sim = _sim(_trace([0.0, 0.5], [64, 128], [400, 5]), late, mixed=1)
    sim.run_until(0.55)
    sim.set_target("default", "mixed", 0)  # drain: finishes what it holds, the request in transit too
    sim.run_to_completion(limit_s=60.0)
    assert sim.unfinished() == 0
