"""The capacity model: queueing math, SLO bounds, monotonicity, pool sizing."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from serving.sim.capacity import (
    CapacityError,
    decode_capacity,
    instances_needed,
    md1_wait_quantile_ms,
    prefill_capacity,
    prefill_capacity_tps,
)
from serving.sim.cli import sim_app
from serving.sim.hardware import get_profile
from serving.sim.latency import LinearLatencyModel, get_latency_model

TINY = get_profile("cpu-tiny")


def linear(a: float = 5.0, b: float = 0.02, c: float = 0.6, d: float = 0.0005) -> LinearLatencyModel:
    return LinearLatencyModel(
        TINY,
        {
            "a_ms": a,
            "b_ms_per_prefill_token": b,
            "c_ms_per_decode_seq": c,
            "d_ms_per_decode_context_token": d,
        },
        "test double",
    )


# ----------------------------------------------------------------------------------------- queueing
def test_md1_wait_quantile_shape() -> None:
    assert md1_wait_quantile_ms(0.05, 10.0, 0.9) == 0.0  # most requests find the server idle
    assert md1_wait_quantile_ms(1.0, 10.0, 0.9) == math.inf
    waits = [md1_wait_quantile_ms(r, 10.0, 0.9) for r in np.linspace(0.11, 0.99, 50)]
    assert all(b > a for a, b in itertools.pairwise(waits))
    # rho = 0.5: mean wait 5 ms; P90 = (5/0.5)·ln(0.5/0.1) = 16.09 ms
    assert md1_wait_quantile_ms(0.5, 10.0, 0.9) == pytest.approx(10 * math.log(5.0))


def test_prefill_capacity_is_the_largest_utilisation_meeting_the_slo() -> None:
    m = linear()
    cap = prefill_capacity(TINY, m, 300.0, 500.0)
    budget = 300.0 - TINY.kv_transfer_ms(500)
    service = cap.iteration_ms / cap.prompts_per_iteration
    assert cap.iteration_ms + md1_wait_quantile_ms(cap.utilisation, service, 0.9) <= budget + 1e-6
    assert cap.iteration_ms + md1_wait_quantile_ms(cap.utilisation + 1e-3, service, 0.9) > budget
    assert cap.tokens_per_s == pytest.approx(
        cap.utilisation * cap.prompts_per_iteration * 500 / cap.iteration_ms * 1e3
    )
    assert prefill_capacity_tps(TINY, m, 300.0, 500.0) == cap.tokens_per_s


def test_prefill_slo_out_of_reach_gives_zero() -> None:
    m = linear()
    cap = prefill_capacity(TINY, m, 5.0, 500.0)  # a lone 500-token prompt takes 15 ms
    assert cap.tokens_per_s == 0.0 and cap.prompts_per_iteration == 0
    assert cap.min_ttft_ms > 5.0


def test_long_prompts_are_chunked_over_iterations() -> None:
    m = linear(a=5.0, b=0.02, c=0.0, d=0.0)
    cap = prefill_capacity(TINY, m, 10_000.0, 5000.0)  # budget 2048: chunks 2048 + 2048 + 904
    assert cap.iteration_ms == pytest.approx(3 * 5.0 + 0.02 * 5000)
    assert cap.prompts_per_iteration == 1


@settings(max_examples=60, deadline=None)
@given(
    slo=st.floats(20.0, 5000.0),
    more=st.floats(1.0, 5000.0),
    prompt=st.integers(1, 4000),
    longer=st.integers(1, 4000),
)
def test_prefill_capacity_monotone(slo: float, more: float, prompt: int, longer: int) -> None:
    m = linear()
    base = prefill_capacity(TINY, m, slo, prompt)
    assert prefill_capacity(TINY, m, slo + more, prompt).tokens_per_s >= base.tokens_per_s - 1e-6
    assert prefill_capacity(TINY, m, slo, prompt + longer).requests_per_s <= base.requests_per_s + 1e-6


@pytest.mark.parametrize("name", ["llama3-8b/a100", "llama2-70b/h100"])
def test_gpu_prefill_capacity_monotone_in_slo_and_prompt(name: str) -> None:
    p, m = get_profile(name), get_latency_model(name)
    by_slo = [prefill_capacity_tps(p, m, slo, 2048) for slo in (300, 500, 1000, 2000, 5000)]
    assert all(b >= a for a, b in itertools.pairwise(by_slo)) and by_slo[0] > 0
    by_prompt = [prefill_capacity(p, m, 2000, n).requests_per_s for n in (256, 512, 1024, 2048, 4096, 8192)]
    assert all(b <= a for a, b in itertools.pairwise(by_prompt))
    peak = 2048 / m.prefill_ms(2048) * 1e3 * 2  # packing at most halves the per-token fixed cost here
    assert by_slo[-1] < peak


# ----------------------------------------------------------------------------------------- decode
def test_decode_batch_is_the_largest_meeting_the_itl_slo() -> None:
    m = linear(a=5.0, c=0.5, d=0.0)
    cap = decode_capacity(TINY, m, 20.0, 100.0)
    assert cap.max_batch == 30 and cap.limited_by == "slo"  # 5 + 0.5·30 = 20 ms
    assert cap.step_ms == pytest.approx(20.0)
    assert cap.tokens_per_s == pytest.approx(30 / 20.0 * 1e3)


@pytest.mark.parametrize(
    ("slo_itl_ms", "context", "limited_by"),
    [
        (1e6, 100.0, "max_num_seqs"),
        (1e6, 900_000.0, "kv_cache"),
        (1.0, 100.0, "slo"),
    ],
    ids=["roomy-slo", "huge-context", "tight-slo"],
)
def test_decode_bounds(slo_itl_ms: float, context: float, limited_by: str) -> None:
    cap = decode_capacity(TINY, linear(), slo_itl_ms, context)
    assert cap.limited_by == limited_by
    assert cap.max_batch <= min(TINY.max_num_seqs, cap.kv_max_batch)
    assert cap.kv_max_batch == TINY.kv_capacity_blocks // math.ceil(context / TINY.block_size)


@pytest.mark.parametrize("name", ["llama3-8b/a100", "llama2-7b/h100", "llama2-70b/h100", "cpu-tiny"])
@settings(max_examples=25, deadline=None)
@given(
    slo=st.floats(10.0, 300.0),
    more=st.floats(0.0, 300.0),
    ctx=st.integers(16, 8000),
    extra=st.integers(0, 8000),
)
def test_decode_capacity_monotone(name: str, slo: float, more: float, ctx: int, extra: int) -> None:
    p, m = get_profile(name), get_latency_model(name)
    base = decode_capacity(p, m, slo, ctx)
    assert decode_capacity(p, m, slo + more, ctx).max_batch >= base.max_batch
    assert decode_capacity(p, m, slo, ctx + extra).max_batch <= base.max_batch
    if base.max_batch:
        assert base.step_ms <= slo


# ----------------------------------------------------------------------------------------- sizing
def test_instances_round_each_pool_up_separately() -> None:
    m = linear()
    one = instances_needed(TINY, m, 1.0, 400, 100, 500.0, 30.0)
    pre_rps = one.prefill_capacity.requests_per_s
    dec_rps = one.decode_capacity.tokens_per_s / 100
    exact = instances_needed(TINY, m, 3 * pre_rps, 400, 100, 500.0, 30.0)
    assert exact.prefill == 3
    assert instances_needed(TINY, m, 3 * pre_rps * 1.001, 400, 100, 500.0, 30.0).prefill == 4
    assert exact.decode == math.ceil(3 * pre_rps / dec_rps - 1e-9)


def test_zero_rate_needs_nothing_and_unknown_rate_is_an_error() -> None:
    m = linear()
    prefill, decode = instances_needed(TINY, m, 0.0, 400, 100, 500.0, 30.0)
    assert (prefill, decode) == (0, 0)
    with pytest.raises(CapacityError, match="rate_rps"):
        instances_needed(TINY, m, float("nan"), 400, 100, 500.0, 30.0)
    with pytest.raises(CapacityError, match="TTFT SLO"):
        instances_needed(TINY, m, 1.0, 400, 100, 1.0, 30.0)
    with pytest.raises(CapacityError, match="ITL SLO"):
        instances_needed(TINY, m, 1.0, 400, 100, 500.0, 1.0)


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(0.0, 500.0),
    more=st.floats(0.0, 500.0),
    headroom=st.floats(0.0, 1.0),
    prompt=st.integers(1, 1000),
    output=st.integers(1, 1000),
)
def test_more_load_or_headroom_never_needs_fewer(
    rate: float, more: float, headroom: float, prompt: int, output: int
) -> None:
    m = linear()
    base = instances_needed(TINY, m, rate, prompt, output, 2000.0, 100.0)
    busier = instances_needed(TINY, m, rate + more, prompt, output, 2000.0, 100.0, headroom=headroom)
    assert busier.prefill >= base.prefill and busier.decode >= base.decode and busier.mixed >= base.mixed
    assert max(base.prefill, base.decode) <= base.mixed <= base.prefill + base.decode
    # ceil(share - 1e-9): a share within 1e-9 instance of a whole number rounds down (float noise).
    slack_p, slack_d = 1e-9 * base.prefill_capacity.tokens_per_s, 1e-9 * base.decode_capacity.tokens_per_s
    assert base.prefill * base.prefill_capacity.tokens_per_s >= base.prefill_load_tps - slack_p - 1e-6
    assert base.decode * base.decode_capacity.tokens_per_s >= base.decode_load_tps - slack_d - 1e-6


def test_cli_capacity_json_matches_the_functions(tmp_path: Path) -> None:
    out = tmp_path / "cap.json"
    args = ["capacity", "--model", "llama3-8b", "--gpu", "a100", "--slo-ttft-ms", "500", "--slo-itl-ms", "40"]
    result = CliRunner().invoke(sim_app, [*args, "--rate-rps", "20", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    p, m = get_profile("llama3-8b/a100"), get_latency_model("llama3-8b/a100")
    prefill, decode = instances_needed(p, m, 20.0, 2048, 256, 500.0, 40.0)
    assert data["instances"]["prefill"] == prefill and data["instances"]["decode"] == decode
    assert data["decode"]["max_batch"] == decode_capacity(p, m, 40.0, 2048 + 128).max_batch
    bad = CliRunner().invoke(sim_app, [*args[:5], "--slo-ttft-ms", "5", "--rate-rps", "20"])
    assert bad.exit_code != 0 and "out of reach" in bad.output
