"""The cpu-tiny per-request overhead: zero changes nothing, a positive one shifts TTFT/e2e only, the fit from
paired client/engine rows recovers it, and ``bench_vllm_cpu.py --validate --real-json`` replays without a server."""

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
    LINEAR_COEFFICIENTS,
    LinearLatencyModel,
    fit_request_overhead,
    get_latency_model,
    load_linear_profile,
)
from serving.sim.replay import PolicyOptions, make_policy, replay
from serving.sim.validate import SliceSpec, check_same_slice, load_real, simulate_slice, spec_of
from serving.workload.trace import Trace

ROOT = Path(__file__).resolve().parents[2]
PROFILE = get_profile("cpu-tiny").with_overrides(max_num_seqs=16)
COEF = {
    "a_ms": 6.0,
    "b_ms_per_prefill_token": 0.025,
    "c_ms_per_decode_seq": 2.2,
    "d_ms_per_decode_context_token": 4e-4,
}


def _bench() -> ModuleType:
    path = ROOT / "bench" / "bench_vllm_cpu.py"
    spec = importlib.util.spec_from_file_location("bench_vllm_cpu_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class _NoOverheadAttr:
    """A latency model without ``request_overhead_ms`` at all (what every model was before the term)."""

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


def _run(trace: Trace, model: Any) -> dict[str, Any]:
    report = replay(
        single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
        {"default": trace},
        make_policy("fixed", PolicyOptions(mixed=1)),
        models=lambda _name: (PROFILE, model),
    )
    doc = report.to_json()
    doc.pop("wall_s")
    return dict(doc)


def _requests(trace: Trace, model: Any) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-request TTFT and ITL (ms) and the e2e p50 (ms)."""
    report = replay(
        single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
        {"default": trace},
        make_policy("fixed", PolicyOptions(mixed=1)),
        models=lambda _name: (PROFILE, model),
    )
    e2e_p50 = float(report.to_json()["e2e_ms"]["p50"])
    return np.asarray(report.request_ttft_ms), np.asarray(report.request_itl_ms), e2e_p50


BUSY = _trace([0.0, 0.01, 0.02, 0.5, 0.52, 0.9], [300, 120, 512, 64, 200, 400], [30, 5, 32, 1, 12, 20])


def test_zero_overhead_is_identical_to_a_model_without_the_term() -> None:
    plain = LinearLatencyModel(PROFILE, COEF, "test")
    assert plain.request_overhead_ms == 0.0
    assert _run(BUSY, plain) == _run(BUSY, _NoOverheadAttr(plain))


def test_gpu_profiles_have_no_request_overhead() -> None:
    assert get_latency_model("llama3-8b/a100").request_overhead_ms == 0.0
    assert get_latency_model("llama2-70b/h100").request_overhead_ms == 0.0


@settings(max_examples=20, deadline=None)
@given(
    overhead_ms=st.floats(0.5, 200.0),
    prompt=st.integers(1, 900),
    output=st.integers(1, 64),
)
def test_an_isolated_request_pays_the_overhead_once_in_ttft_not_in_itl(
    overhead_ms: float, prompt: int, output: int
) -> None:
    trace = _trace([0.0, 30.0], [prompt, prompt], [output, output])  # far apart: no interaction
    base = LinearLatencyModel(PROFILE, COEF, "test")
    shifted = LinearLatencyModel(PROFILE, COEF, "test", request_overhead_ms=overhead_ms)
    ttft0, itl0, e2e0 = _requests(trace, base)
    ttft1, itl1, e2e1 = _requests(trace, shifted)
    np.testing.assert_allclose(ttft1, ttft0 + overhead_ms, rtol=0, atol=1e-6)
    np.testing.assert_allclose(itl1, itl0, rtol=0, atol=1e-9, equal_nan=True)
    assert e2e1 == pytest.approx(e2e0 + overhead_ms, abs=1e-6)
    # an isolated prefill is one step: TTFT = overhead + a + b * prompt, as a client-timed prefill row
    step = COEF["a_ms"] + COEF["b_ms_per_prefill_token"] * prompt
    assert ttft1[0] == pytest.approx(overhead_ms + step, abs=1e-6)


def test_overhead_reaches_the_engine_late_so_queueing_follows() -> None:
    """Two requests 5 ms apart and a 20 ms overhead: both reach the instance 20 ms late, in arrival order."""
    trace = _trace([0.0, 0.005], [512, 512], [1, 1])
    base = LinearLatencyModel(PROFILE, COEF, "test")
    late = LinearLatencyModel(PROFILE, COEF, "test", request_overhead_ms=20.0)
    ttft0, _, _ = _requests(trace, base)
    ttft1, _, _ = _requests(trace, late)
    np.testing.assert_allclose(ttft1, ttft0 + 20.0, atol=1e-6)


def test_shipped_cpu_tiny_json_has_a_fitted_overhead_and_no_provisional_status() -> None:
    data = json.loads(CPU_TINY_JSON.read_text())
    assert "status" not in data
    assert set(data["coefficients"]) == set(LINEAR_COEFFICIENTS)
    assert 0.0 < data["overheads"]["request_overhead_ms"] < 100.0
    model = get_latency_model("cpu-tiny")
    assert isinstance(model, LinearLatencyModel)
    assert model.request_overhead_ms == data["overheads"]["request_overhead_ms"]


@pytest.mark.parametrize(
    ("overheads", "match"),
    [
        ({"request_overhead_ms": -1.0}, "request_overhead_ms must be finite"),
        ({"per_token": 1.0}, "per_token"),
    ],
)
def test_bad_overheads_name_the_file_and_the_field(
    tmp_path: Path, overheads: dict[str, float], match: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"source": "x", "coefficients": COEF, "overheads": overheads}))
    with pytest.raises(ProfileError, match=match) as info:
        load_linear_profile(PROFILE, path)
    if "per_token" in match:
        assert str(path) in str(info.value)


def test_a_json_without_overheads_loads_with_zero(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"source": "x", "coefficients": COEF}))
    assert load_linear_profile(PROFILE, path).request_overhead_ms == 0.0


# ----------------------------------------------------------------------------------------- the fit
@settings(max_examples=25, deadline=None)
@given(
    overhead=st.floats(0.0, 50.0),
    noise=st.lists(st.floats(-0.5, 0.5), min_size=12, max_size=12),
)
def test_fit_request_overhead_recovers_a_constant_difference(overhead: float, noise: list[float]) -> None:
    engine = np.linspace(5.0, 40.0, 12)
    client = engine + overhead + np.asarray(noise)
    config = [f"prefill-{i // 3}" for i in range(12)]
    fit = fit_request_overhead(client, engine, config)
    assert fit["n_pairs"] == 12 and fit["n_configs"] == 4
    assert fit["request_overhead_ms"] == pytest.approx(max(overhead, 0.0), abs=0.5 + 1e-9)


def test_fit_request_overhead_ignores_one_stalled_step_per_config() -> None:
    engine = np.array([10.0, 10.0, 110.0] * 3)  # a stalled step: both timings include the stall
    client = engine + 9.0
    client[2] += 5.0  # the stalled one also delays its client a bit more
    fit = fit_request_overhead(client, engine, ["a", "a", "a", "b", "b", "b", "c", "c", "c"])
    assert fit["request_overhead_ms"] == pytest.approx(9.0)


def test_fit_request_overhead_errors() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        fit_request_overhead([1.0, 2.0], [1.0], ["a", "a"])
    with pytest.raises(ValueError, match="no finite"):
        fit_request_overhead([math.nan], [1.0], ["a"])


def _synthetic_rows(overhead: float) -> dict[str, np.ndarray]:
    """Bench CSV columns as ``read_measurements`` returns them, generated from COEF and ``overhead``."""
    cols: dict[str, list[Any]] = {k: [] for k in ("prefill_tokens", "prefill_context_tokens", "decode_batch")}
    cols |= {"decode_context_tokens": [], "iteration_ms": [], "kind": [], "config": [], "rep": []}

    def add(p: int, b: int, ctx: float, ms: float, kind: str, config: str, rep: int) -> None:
        for key, value in zip(cols, (p, 0, b, ctx, ms, kind, config, rep), strict=True):
            cols[key].append(value)

    a, bp, cs, d = (COEF[k] for k in LINEAR_COEFFICIENTS)
    for rep in range(3):
        for p in (16, 128, 512, 900):
            step_ms = a + bp * p
            add(p, 0, 0.0, overhead + step_ms, "prefill", f"prefill-{p}", rep)
            add(p, 0, 0.0, step_ms, "engine_prefill", f"engine-prefill-{p}", rep)
        for batch in (1, 4, 16):
            for ctx in (64, 512):
                kv = float(batch * ctx)
                add(0, batch, kv, a + cs * batch + d * kv, "decode", f"decode-{batch}x{ctx}", rep)
    out: dict[str, np.ndarray] = {}
    for key, values in cols.items():
        out[key] = np.asarray(values) if key in ("kind", "config") else np.asarray(values, dtype=np.float64)
    return out


def test_refit_recovers_overhead_and_steps_and_the_sim_reproduces_the_prefill_rows(tmp_path: Path) -> None:
    bench = _bench()
    data = _synthetic_rows(overhead=9.0)
    # engine rows were built so that client - engine = overhead exactly
    overhead = bench.request_overhead(data)
    assert overhead["request_overhead_ms"] == pytest.approx(9.0)
    result = bench.fit(data, "client", 0.5, overhead["request_overhead_ms"])
    for key, value in COEF.items():
        assert result["coefficients"][key] == pytest.approx(value, rel=1e-6, abs=1e-9)
    json_path = tmp_path / "cpu_tiny.json"
    json_path.write_text(json.dumps({"model": "kept", "status": "provisional"}))
    bench.write_profile(result, overhead, 42, json_path, tmp_path / "rows.csv")
    doc = json.loads(json_path.read_text())
    assert doc["model"] == "kept" and "status" not in doc
    assert doc["overheads"]["request_overhead_ms"] == pytest.approx(9.0)
    model = load_linear_profile(PROFILE, json_path)
    # the fitted model reproduces every client-timed prefill row as an isolated request's TTFT
    for p in (16, 128, 512, 900):
        ttft, _, _ = _requests(_trace([0.0], [p], [1]), model)
        assert ttft[0] == pytest.approx(9.0 + COEF["a_ms"] + COEF["b_ms_per_prefill_token"] * p, rel=1e-6)


# ----------------------------------------------------------------------------------------- --real-json
def _recorded_run(tmp_path: Path, trace: Trace, spec: SliceSpec) -> Path:
    from serving.sim.validate import scale_slice

    sl = scale_slice(trace, spec)
    real = {
        "slice": {
            "n_requests": spec.n_requests,
            "start_index": spec.start_index,
            "target_rps": spec.target_rps,
            "max_prompt_tokens": spec.max_prompt_tokens,
            "max_output_tokens": spec.max_output_tokens,
            "max_model_len": spec.max_model_len,
            "source": "test",
            "requests": len(sl),
            "prompt_tokens_mean": float(np.mean(sl.prompt_tokens)),
            "output_tokens_mean": float(np.mean(sl.output_tokens)),
        },
        "server": {"max_num_seqs": 8},
        "real": {"ttft_ms": {"p50": 100.0, "p90": 200.0}, "itl_ms": {"p50": 10.0, "p90": 20.0}},
    }
    path = tmp_path / "real.json"
    path.write_text(json.dumps({"real": real, "sim": {}, "compare": {}}))  # a --validate-json document
    return path


def _long_trace() -> Trace:
    rng = np.random.default_rng(3)
    n = 60
    return _trace(
        np.cumsum(rng.exponential(0.7, n)).tolist(),
        rng.integers(10, 1500, n).tolist(),
        rng.integers(1, 80, n).tolist(),
    )


def test_real_json_replays_the_sim_side_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    trace = _long_trace()
    spec = SliceSpec(n_requests=40, start_index=5, target_rps=2.0)
    path = _recorded_run(tmp_path, trace, spec)
    monkeypatch.setattr("serving.workload.readers.read_trace", lambda _p: trace)

    def no_server(*_a: Any, **_k: Any) -> None:
        raise AssertionError("--real-json must not start a server")

    monkeypatch.setattr("serving.sim.validate.validate", no_server)
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps({"source": "x", "coefficients": COEF, "overheads": {"request_overhead_ms": 50.0}})
    )
    doc = bench.validate_against_sim(
        Path("ignored.csv"),
        tmp_path / "work",
        tmp_path / "out.json",
        real_json=path,
        profile_jsons=[CPU_TINY_JSON, other],
    )
    assert set(doc["compare"]) == {str(CPU_TINY_JSON.relative_to(ROOT)), str(other)}
    assert doc["real"]["server"]["max_num_seqs"] == 8
    slow, fast = doc["compare"][str(other)], doc["compare"][str(CPU_TINY_JSON.relative_to(ROOT))]
    assert slow["ttft_ms.p50"]["real"] == 100.0
    assert slow["ttft_ms.p50"]["sim"] > fast["ttft_ms.p50"]["sim"]
    assert json.loads((tmp_path / "out.json").read_text())["compare"] == doc["compare"]
    # the same slice simulated directly gives the same figures
    from serving.sim.validate import scale_slice

    direct = simulate_slice(scale_slice(trace, spec), max_num_seqs=8, latency_json=other)
    assert direct["ttft_ms"] == doc["sim"][str(other)]["ttft_ms"]


def test_real_json_of_another_slice_is_an_error(tmp_path: Path) -> None:
    from serving.sim.validate import scale_slice

    trace = _long_trace()
    path = _recorded_run(tmp_path, trace, SliceSpec(n_requests=40, start_index=5, target_rps=2.0))
    real = load_real(path)
    assert spec_of(real) == SliceSpec(n_requests=40, start_index=5, target_rps=2.0)
    with pytest.raises(ValueError, match=r"slice\.(prompt|output)_tokens_mean"):
        check_same_slice(real, scale_slice(trace, SliceSpec(n_requests=40, start_index=6, target_rps=2.0)))


def test_load_real_names_what_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"slice": {}, "server": {}}))
    with pytest.raises(ValueError, match="'real' missing"):
        load_real(path)
    with pytest.raises(ValueError, match="cannot read"):
        load_real(tmp_path / "absent.json")


# ----------------------------------------------------------------------------------------- what a real run records
def test_real_run_records_steps_server_means_and_requests() -> None:
    from serving.pools.loadgen import RequestTimings
    from serving.sim.validate import SERVER_HISTOGRAMS, _iteration_summary, _request_rows, _window_means_ms

    log = "\n".join(
        [
            "INFO Engine 000: Iteration(0): 1 context requests, 300 context tokens, 0 generation requests, "
            "0 generation tokens, iteration elapsed time: 14.00 ms, CPU KV cache usage: 0.1%",
            "INFO Engine 000: Iteration(1): 0 context requests, 0 context tokens, 1 generation requests, "
            "1 generation tokens, iteration elapsed time: 4.00 ms, CPU KV cache usage: 0.1%",
            "INFO Engine 000: Iteration(2): 1 context requests, 64 context tokens, 1 generation requests, "
            "1 generation tokens, iteration elapsed time: 120.00 ms, CPU KV cache usage: 0.1%",
            "unrelated line",
        ]
    )
    its = _iteration_summary(log)
    assert its["steps"] == 3
    assert its["prefill_or_mixed"]["count"] == 2 and its["prefill_or_mixed"]["p50_ms"] == pytest.approx(67.0)
    assert its["decode_only"] == {"count": 1, "p10_ms": 4.0, "p50_ms": 4.0, "p90_ms": 4.0, "mean_ms": 4.0}
    assert its["rows"]["elapsed_ms"] == [14.0, 4.0, 120.0]

    before = {f"{k}_{s}": 0.0 for k in SERVER_HISTOGRAMS for s in ("sum", "count")}
    after = dict(before) | {"time_to_first_token_sum": 1.5, "time_to_first_token_count": 10.0}
    means = _window_means_ms(before, after)
    assert means["time_to_first_token_mean_ms"] == pytest.approx(150.0)
    assert math.isnan(means["request_queue_time_mean_ms"])  # no request counted: unknown, not 0

    nan = math.nan
    t = RequestTimings(
        scheduled_s=np.array([0.0, 1.0]),
        sent_s=np.array([0.001, 1.002]),
        ttft_s=np.array([0.1, nan]),
        itl_mean_s=np.array([0.01, nan]),
        e2e_s=np.array([0.4, nan]),
        prompt_tokens=np.array([300, 20]),
        output_tokens=np.array([30, 1]),
        completion_tokens=np.array([30, 0]),
        errors=("", "HTTP 500"),
        wall_s=1.5,
    )
    rows = _request_rows(t)
    assert rows["ttft_ms"] == [100.0, None] and rows["sent_ms"] == [1.0, 1002.0]
    json.dumps(rows, allow_nan=False)  # JSON-ready


def test_ttft_by_arrival_state_groups_requests() -> None:
    from serving.sim.validate import ttft_by_arrival_state

    doc = {
        "requests": {
            # request 0 at t=0 (nothing before: idle_long), 1 during 0 (busy), 2 0.3 s after 1 ends (idle_short),
            # 3 five seconds later (idle_long), 4 failed (skipped)
            "sent_ms": [0.0, 100.0, 700.0, 6000.0, 9000.0],
            "e2e_ms": [300.0, 300.0, 200.0, 100.0, None],
            "ttft_ms": [50.0, 80.0, 30.0, 150.0, None],
        }
    }
    out = ttft_by_arrival_state(doc)
    assert out["busy"] == {"n": 1, "p50": 80.0, "p90": 80.0}
    assert out["idle_short"]["n"] == 1 and out["idle_short"]["p50"] == 30.0
    assert out["idle_long"]["n"] == 2 and out["idle_long"]["p50"] == 100.0
    assert ttft_by_arrival_state({"real": {}}) == {}
