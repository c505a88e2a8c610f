"""The latency model: anchors against published measurements, consistency, derived profiles, cpu-tiny fit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from serving.sim.cli import sim_app
from serving.sim.hardware import ProfileError, get_profile, list_profiles
from serving.sim.latency import (
    CPU_TINY_JSON,
    LINEAR_COEFFICIENTS,
    OVERHEAD_JSON,
    LinearLatencyModel,
    Overhead,
    build_operator_model,
    fit_all_overheads,
    fit_linear_profile,
    get_latency_model,
    h100_speedup,
    latency_model_for,
    splitwise_medians,
)

GPU_PROFILES = [n for n in list_profiles() if n != "cpu-tiny"]


# ----------------------------------------------------------------------------------------- anchors
def test_llama3_8b_a100_prefill_2048_in_published_range() -> None:
    assert 150.0 <= get_latency_model("llama3-8b/a100").prefill_ms(2048) <= 190.0


def test_llama3_8b_a100_decode_batch64_ctx2176_near_24ms() -> None:
    m = get_latency_model("llama3-8b/a100")
    parts = m.breakdown_ms(0, 0, 64, 64 * 2176)
    kernel = parts["total"] - parts["overhead"]
    assert kernel == pytest.approx(24.0, rel=0.10)  # Vidur kernel-only cross-check: 24.1 ms
    assert parts["total"] == pytest.approx(24.0, rel=0.15)  # with the fitted per-iteration overhead


def _h100_tp4_relative_errors() -> tuple[np.ndarray, np.ndarray]:
    df = splitwise_medians()
    sub = df[(df["hardware"] == "h100-80gb") & (df["tensor_parallel"] == 4)]
    m = get_latency_model("llama2-70b/h100")
    assert m.profile.gpus == 4
    prompt = sub["prompt_size"].to_numpy(float)
    batch = sub["batch_size"].to_numpy(float)
    out = sub["token_size"].to_numpy(float)
    p = m.iteration_ms(prompt * batch, 0, 0, 0, prefill_seqs=batch) / sub["prompt_time"].to_numpy() - 1
    t = m.iteration_ms(0, 0, batch, batch * (prompt + out / 2)) / sub["token_time"].to_numpy() - 1
    return np.abs(p), np.abs(t)


def test_llama2_70b_h100_tp4_near_splitwise_medians() -> None:
    prompt_err, token_err = _h100_tp4_relative_errors()
    assert len(prompt_err) == 19
    # Stated tolerance (profiles/README.md): prefill p50 <= 15 %, p90 <= 20 %; decode p50 <= 5 %, max <= 10 %.
    assert np.median(prompt_err) <= 0.15 and np.percentile(prompt_err, 90) <= 0.20
    assert np.median(token_err) <= 0.05 and token_err.max() <= 0.10
    m = get_latency_model("llama2-70b/h100")
    assert m.prefill_ms(2048) == pytest.approx(200.7, rel=0.10)
    assert m.decode_step_ms(1, 512 + 64) == pytest.approx(29.7, rel=0.05)


def test_shipped_overhead_fit_matches_a_refit() -> None:
    shipped = json.loads(OVERHEAD_JSON.read_text())
    refit = fit_all_overheads()
    for gpu, by_tp in refit["fits"].items():
        for tp, fit in by_tp.items():
            for key in ("c0_ms", "per_seq_ms", "per_prefill_token_ms"):
                assert shipped["fits"][gpu][tp][key] == pytest.approx(fit[key], abs=1e-6), (gpu, tp, key)


def test_kernel_only_model_is_close_to_splitwise_a100_prefill() -> None:
    # Vidur's cross-check: A100 Llama-2-70B prefill 2048 = 389 / 252 ms at TP4 / TP8 (kernel only).
    for tp, expected in ((4, 389.0), (8, 252.0)):
        profile = get_profile("llama2-70b/a100").with_overrides(gpus=tp)
        m = build_operator_model(profile, overhead=Overhead(0.0, 0.0))
        assert m.prefill_ms(2048) == pytest.approx(expected, rel=0.05)


# ----------------------------------------------------------------------------------------- consistency
inputs = st.tuples(
    st.integers(0, 40_000),  # prefill tokens
    st.integers(0, 40_000),  # prefill context
    st.integers(0, 600),  # decode batch
    st.integers(0, 20_000),  # mean decode context
    st.integers(1, 16),  # prefill seqs
)


@pytest.mark.parametrize("name", list_profiles())
@settings(max_examples=40, deadline=None)
@given(case=st.lists(inputs, min_size=1, max_size=20))
def test_scalar_and_vector_calls_agree_and_parts_sum(name: str, case: list[tuple[int, ...]]) -> None:
    m = get_latency_model(name)
    arr = np.array(case, dtype=float)
    p, k, b, c, n = arr.T
    vec = m.iteration_ms(p, k, b, b * c, prefill_seqs=n)
    parts = m.breakdown_ms(p, k, b, b * c, prefill_seqs=n)
    assert isinstance(vec, np.ndarray) and vec.shape == (len(case),)
    for i, (pi, ki, bi, ci, ni) in enumerate(case):
        scalar = m.iteration_ms(pi, ki, bi, bi * ci, prefill_seqs=ni)
        assert isinstance(scalar, float)
        assert scalar == pytest.approx(vec[i], rel=1e-9, abs=1e-12)
        assert (scalar == 0.0) == (pi + bi == 0)
    total = parts["mlp"] + parts["attention"] + parts["all_reduce"] + parts["overhead"]
    np.testing.assert_allclose(total, vec, rtol=1e-12)


@pytest.mark.parametrize("name", list_profiles())
@settings(max_examples=40, deadline=None)
@given(base=inputs, field=st.integers(0, 3), more=st.integers(1, 5000))
def test_more_work_never_takes_less_time(name: str, base: tuple[int, ...], field: int, more: int) -> None:
    m = get_latency_model(name)
    p, k, b, c, n = base
    bigger = [p, k, b, c]
    bigger[field] += more
    before = m.iteration_ms(p, k, b, b * c, prefill_seqs=n)
    after = m.iteration_ms(bigger[0], bigger[1], bigger[2], bigger[2] * bigger[3], prefill_seqs=n)
    assert after >= before - 1e-9


@pytest.mark.parametrize("name", GPU_PROFILES)
@settings(max_examples=30, deadline=None)
@given(case=st.lists(inputs, min_size=2, max_size=30))
def test_scalar_calls_do_not_depend_on_call_order(name: str, case: list[tuple[int, ...]]) -> None:
    """Scalar calls memoise table lookups: two fresh models asked the same calls in opposite orders must give
    the same floats (a memo keyed on the wrong quantity would hand one call another's value)."""
    profile = get_profile(name)
    forward, backward = build_operator_model(profile), build_operator_model(profile)
    calls = []
    for p, k, b, c, n in case:  # each with calls of the same batch tokens split otherwise between the phases
        calls += [(p, k, b, b * c, n), (p + b, k, 0, 0, n), (0, 0, p + b, (p + b) * c, 1)]
    ahead = [forward.iteration_ms(p, k, b, c, prefill_seqs=n) for p, k, b, c, n in calls]
    behind = [backward.iteration_ms(p, k, b, c, prefill_seqs=n) for p, k, b, c, n in reversed(calls)]
    assert ahead == behind[::-1]


def test_empty_negative_and_nan_inputs() -> None:
    m = get_latency_model("llama3-8b/a100")
    assert m.iteration_ms(0, 500, 0, 0) == 0.0
    assert math.isnan(m.iteration_ms(float("nan"), 0, 1, 10))
    with pytest.raises(ValueError, match="decode_batch=-1"):
        m.iteration_ms(0, 0, -1, 10)
    with pytest.raises(ValueError, match="element 1"):
        m.iteration_ms(np.array([1, -5]), 0, 0, 0)


def test_all_reduce_only_with_tensor_parallelism() -> None:
    tp1 = get_latency_model("llama3-8b/a100").breakdown_ms(512, 0, 8, 8000)
    assert tp1["all_reduce"] == 0.0
    tp4 = latency_model_for(get_profile("llama3-8b/a100").with_overrides(gpus=4)).breakdown_ms(
        512, 0, 8, 8000
    )
    assert tp4["all_reduce"] > 0.0
    assert tp4["mlp"] < tp1["mlp"] / 2  # GEMMs split four ways


def test_chunk_on_context_costs_like_its_causal_work() -> None:
    m = build_operator_model(get_profile("llama3-8b/a100"), overhead=Overhead(0.0, 0.0))
    # 1024 new tokens on 1536 cached: c·k + c²/2 = 2048²/2 pairs, the work of a fresh 2048-token chunk.
    fresh = m.breakdown_ms(2048, 0, 0, 0)["attention"]
    chunked = m.breakdown_ms(1024, 1536, 0, 0)["attention"]
    assert chunked == pytest.approx(fresh, rel=1e-9)
    # Splitting the same tokens over more sequences does less causal work.
    assert (
        m.breakdown_ms(4096, 0, 0, 0, prefill_seqs=4)["attention"]
        < m.breakdown_ms(4096, 0, 0, 0)["attention"]
    )


# ----------------------------------------------------------------------------------------- derived attention
def test_h100_bandwidth_ratio_is_the_hbm_ratio() -> None:
    _, ratio, r_bw = h100_speedup()
    assert 1.5 < r_bw < 1.8  # H100-SXM 3.35 TB/s over A100-80GB 2.04 TB/s = 1.64
    assert ratio.max() > 3.0  # large GEMMs: ~3.3x


def _decode_attention_per_kv_token(name: str) -> float:
    m = get_latency_model(name)
    lo = m.breakdown_ms(0, 0, 32, 32 * 1000)["attention"]
    hi = m.breakdown_ms(0, 0, 32, 32 * 3000)["attention"]
    return float(hi - lo) / (32 * 2000)


def test_decode_attention_scales_with_kv_heads_and_gpu_bandwidth() -> None:
    _, _, r_bw = h100_speedup()
    llama3 = _decode_attention_per_kv_token("llama3-8b/a100")  # 8 KV heads
    llama2_a100 = _decode_attention_per_kv_token("llama2-7b/a100")  # 32 KV heads
    llama2_h100 = _decode_attention_per_kv_token("llama2-7b/h100")
    llama70_h100 = _decode_attention_per_kv_token("llama2-70b/h100")  # 8 KV heads over TP4, 80 layers
    assert llama2_a100 == pytest.approx(4 * llama3, rel=1e-9)
    assert llama2_h100 == pytest.approx(llama2_a100 / r_bw, rel=1e-9)
    assert llama70_h100 == pytest.approx(llama3 * (2 / 8) * (80 / 32) / r_bw, rel=1e-9)


def test_h100_prefill_faster_than_a100_for_the_same_model() -> None:
    a100 = get_latency_model("llama2-7b/a100").breakdown_ms(4096, 0, 0, 0)
    h100 = get_latency_model("llama2-7b/h100").breakdown_ms(4096, 0, 0, 0)
    assert 2.5 < a100["attention"] / h100["attention"] < 3.5
    assert 2.5 < a100["mlp"] / h100["mlp"] < 3.5


# ----------------------------------------------------------------------------------------- cpu-tiny
def test_cpu_tiny_json_is_provisional_and_complete() -> None:
    data = json.loads(CPU_TINY_JSON.read_text())
    assert set(data["coefficients"]) == set(LINEAR_COEFFICIENTS)
    m = get_latency_model("cpu-tiny")
    assert isinstance(m, LinearLatencyModel)
    assert m.source == data["source"]
    c = data["coefficients"]
    expected = c["a_ms"] + 10 * c["b_ms_per_prefill_token"] + 3 * c["c_ms_per_decode_seq"]
    expected += 300 * c["d_ms_per_decode_context_token"]
    assert m.iteration_ms(10, 0, 3, 300) == pytest.approx(expected)


@settings(max_examples=30, deadline=None)
@given(coef=st.tuples(st.floats(0.5, 20), st.floats(0.0, 0.1), st.floats(0.0, 2.0), st.floats(0.0, 0.01)))
def test_fit_linear_profile_recovers_known_coefficients(coef: tuple[float, float, float, float]) -> None:
    rng = np.random.default_rng(0)
    prefill = np.concatenate([rng.integers(16, 900, 30), np.zeros(30)])
    batch = np.concatenate([np.zeros(30), rng.integers(1, 17, 30)])
    context = batch * rng.integers(16, 900, 60)
    a, b, c, d = coef
    ms = a + b * prefill + c * batch + d * context
    fit = fit_linear_profile(
        {
            "prefill_tokens": prefill,
            "decode_batch": batch,
            "decode_context_tokens": context,
            "iteration_ms": ms,
        }
    )
    got = fit["coefficients"]
    assert got["a_ms"] == pytest.approx(a, rel=1e-6, abs=1e-9)
    assert got["b_ms_per_prefill_token"] == pytest.approx(b, rel=1e-6, abs=1e-9)
    assert got["c_ms_per_decode_seq"] == pytest.approx(c, rel=1e-6, abs=1e-9)
    assert got["d_ms_per_decode_context_token"] == pytest.approx(d, rel=1e-6, abs=1e-9)
    assert fit["rel_err_max"] < 1e-6 and fit["n_samples"] == 60


def test_fit_linear_profile_names_a_missing_column() -> None:
    with pytest.raises(ValueError, match="iteration_ms"):
        fit_linear_profile({"prefill_tokens": [1], "decode_batch": [0], "decode_context_tokens": [0]})


# ----------------------------------------------------------------------------------------- CLI
def test_cli_latency_json_matches_the_model(tmp_path: object) -> None:
    from pathlib import Path

    out = Path(str(tmp_path)) / "it.json"
    result = CliRunner().invoke(
        sim_app,
        ["latency", "--model", "llama3-8b", "--gpu", "a100", "--decode-batch", "64", "--context", "2176",
         "--json", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["iteration_ms"] == pytest.approx(get_latency_model("llama3-8b/a100").decode_step_ms(64, 2176))
    assert set(data["breakdown_ms"]) == {"mlp", "attention", "all_reduce", "overhead"}


def test_cli_unknown_model_lists_profiles() -> None:
    result = CliRunner().invoke(
        sim_app, ["latency", "--model", "gpt9", "--gpu", "a100", "--prefill-tokens", "8"]
    )
    assert result.exit_code != 0
    assert "llama3-8b/a100" in result.output


def test_unknown_profile_name_lists_known_ones() -> None:
    with pytest.raises(ProfileError, match="known profiles: cpu-tiny"):
        get_latency_model("llama3-8b/h200")
