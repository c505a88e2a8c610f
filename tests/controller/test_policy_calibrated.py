"""Stage 1 with a calibrated forecaster: token forecasts taken from arrivals × mean lengths, Little's law on a
chosen arrival quantile, the decode cold-start persistence, and bench_policies' ``--checkpoint`` parsing."""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, NAN, ctx, obs
from pydantic import ValidationError

from controller.config import PolicyConfig
from controller.policy import PoolForecast, PoolState, decide, stages
from controller.policy.types import PoolObservation

H = 5.0


def fc(
    rps: float = 10.0, rps_p50: float | None = None, prompt_tps: float = 10_000.0, gen_tps: float = 2_000.0
) -> PoolForecast:
    return PoolForecast(
        horizon_s=H,
        arrivals_p50=(rps if rps_p50 is None else rps_p50) * H,
        arrivals_p90=rps * H,
        prompt_tokens_p90=prompt_tps * H,
        gen_tokens_p90=gen_tps * H,
        burst_prob=0.0,
    )


@pytest.mark.parametrize(
    ("label", "mode", "channel", "kw", "expected"),
    [
        ("tokens: the token p90 as it is", "tokens", "prompt", {}, 50_000.0),
        ("arrivals: p90 × mean prompt", "arrivals", "prompt", {}, 20 * 1000.0),
        ("arrivals: p90 × mean output", "arrivals", "gen", {}, 20 * 200.0),
        ("max of the two", "max", "prompt", {}, 50_000.0),
        ("min of the two", "min", "prompt", {}, 20_000.0),
        ("min, gen channel", "min", "gen", {}, 4_000.0),
        (
            "arrivals, mean unknown: the token p90",
            "arrivals",
            "prompt",
            {"mean_prompt_tokens": NAN},
            50_000.0,
        ),
        ("min, mean unknown: the token p90", "min", "prompt", {"mean_prompt_tokens": NAN}, 50_000.0),
        ("max, output mean unknown: the token p90", "max", "gen", {"mean_output_tokens": NAN}, 6_000.0),
    ],
)
def test_forecast_token_tps(
    label: str, mode: str, channel: str, kw: dict[str, float], expected: float
) -> None:
    o = obs(forecast=fc(rps=20.0, prompt_tps=50_000.0, gen_tps=6_000.0), **kw)
    assert stages.forecast_token_tps(o, channel, mode) == pytest.approx(expected), label


def test_forecast_token_tps_unknowns_and_errors() -> None:
    assert math.isnan(stages.forecast_token_tps(obs(forecast=None), "prompt", "min"))
    no_arrivals = obs(forecast=replace(fc(), arrivals_p90=NAN))
    assert stages.forecast_token_tps(no_arrivals, "prompt", "arrivals") == pytest.approx(10_000.0)
    with pytest.raises(ValueError, match="channel must be prompt or gen, got 'kv'"):
        stages.forecast_token_tps(obs(forecast=fc()), "kv", "min")
    with pytest.raises(ValueError, match="expected tokens, arrivals, max or min, got 'median'"):
        stages.forecast_token_tps(obs(forecast=fc()), "prompt", "median")


rates = st.floats(min_value=0.0, max_value=1e5, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(rps=rates, prompt=rates, gen=rates, mean_prompt=st.floats(1.0, 3e4), mean_out=st.floats(1.0, 4e3))
def test_min_and_max_bracket_the_two_forecasts(
    rps: float, prompt: float, gen: float, mean_prompt: float, mean_out: float
) -> None:
    o = obs(forecast=fc(rps, prompt_tps=prompt, gen_tps=gen), mean_prompt_tokens=mean_prompt,
            mean_output_tokens=mean_out)  # fmt: skip
    for channel in ("prompt", "gen"):
        tokens = stages.forecast_token_tps(o, channel, "tokens")
        by_arrivals = stages.forecast_token_tps(o, channel, "arrivals")
        lo, hi = stages.forecast_token_tps(o, channel, "min"), stages.forecast_token_tps(o, channel, "max")
        assert lo == min(tokens, by_arrivals) and hi == max(tokens, by_arrivals)


def _spike(**kw: float) -> PoolObservation:
    """A quiet pool (1 req/s of 1,000-token prompts measured) whose token forecast jumps to 40,000 tok/s
    (one long prompt read relative to a low arrival level) while its arrival p90 stays at 2 req/s."""
    base: dict[str, float] = {
        "arrival_rps": 1.0,
        "prompt_tps": 1_000.0,
        "gen_tps": 200.0,
        "running_seqs": 5.0,
    }
    o: PoolObservation = obs(
        forecast=fc(rps=2.0, rps_p50=1.0, prompt_tps=40_000.0, gen_tps=400.0), **{**base, **kw}
    )
    return o


def test_capacity_min_keeps_a_token_spike_out_of_prefill() -> None:
    tokens = stages.capacity_target(_spike(), CAP, 1.0)
    lowest = stages.capacity_target(_spike(), CAP, 1.0, prompt_forecast="min")
    assert tokens is not None and lowest is not None
    assert tokens.prefill == pytest.approx(4.0)  # 40,000 / 10,000
    assert lowest.prefill == pytest.approx(0.2)  # 2 req/s × 1,000 tokens / 10,000


def test_capacity_measured_load_stays_a_floor_under_min() -> None:
    busy = stages.capacity_target(_spike(prompt_tps=30_000.0), CAP, 1.0, prompt_forecast="min")
    assert busy is not None and busy.prefill == pytest.approx(3.0)


def test_capacity_little_on_the_p50() -> None:
    o = obs(running_seqs=0.0, gen_tps=0.0, forecast=fc(rps=64.0, rps_p50=32.0, gen_tps=0.0))
    p90 = stages.capacity_target(o, CAP, 1.0)
    p50 = stages.capacity_target(o, CAP, 1.0, little_arrivals="p50")
    assert p90 is not None and p50 is not None
    per_seq = CAP.decode_tps / CAP.decode_seqs
    assert p90.decode == pytest.approx(64.0 * 200.0 / per_seq / CAP.decode_seqs)
    assert p50.decode == pytest.approx(32.0 * 200.0 / per_seq / CAP.decode_seqs)


def test_defaults() -> None:
    cfg = PolicyConfig()
    assert (cfg.prompt_forecast, cfg.gen_forecast, cfg.little_arrivals) == ("tokens", "tokens", "p90")
    assert cfg.cold_start_persist_decode


def test_config_rejects_unknown_modes_by_name() -> None:
    with pytest.raises(ValidationError, match="prompt_forecast"):
        PolicyConfig(prompt_forecast="median")
    with pytest.raises(ValidationError, match="little_arrivals"):
        PolicyConfig(little_arrivals="p99")


def test_decide_feeds_the_modes_to_stage_one() -> None:
    cfg = PolicyConfig(prompt_forecast="min", headroom=0.0)
    plan, _ = decide(ctx(_spike(), cfg), PoolState())
    plan_tokens, _ = decide(ctx(_spike(), PolicyConfig(prompt_forecast="tokens", headroom=0.0)), PoolState())
    assert plan is not None and plan_tokens is not None
    assert any("need: prefill 0.20" in r for r in plan.reasons)
    assert any("need: prefill 4.00" in r for r in plan_tokens.reasons)


def _decode_spike_run(persist_decode: bool) -> list[int]:
    """Decode targets over a quiet pool watched for a cold start, with one tick whose arrival forecast
    (Little's law) asks for far more decode."""
    cfg = PolicyConfig(cold_start_persist_decode=persist_decode, burst_reserve="off", standby_sizing="flat",
                       standby_decode=0, qps_change_alert_per_min=10.0)  # fmt: skip
    state, out = PoolState(), []
    for t in range(0, 200):
        spike = t == 150
        o = obs(now_s=float(t), arrival_rps=1.0, prompt_tps=1_000.0, gen_tps=200.0, running_seqs=5.0,
                replicas={"prefill": 1, "decode": 1}, active={"prefill": 1, "decode": 1},
                standby={"prefill": 0, "decode": 0},
                forecast=fc(rps=300.0 if spike else 1.0, prompt_tps=1_000.0, gen_tps=200.0))  # fmt: skip
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
        out.append(plan.decode)
    return out


def test_decode_cold_start_waits_for_a_lasting_target_when_asked() -> None:
    assert max(_decode_spike_run(False)[150:]) > 1  # session 4's rule: the one-tick target starts capacity
    assert max(_decode_spike_run(True)[150:]) == 1


BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_policies.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_policies_checkpoint_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_checkpoint_runs(tmp_path: Path) -> None:
    bench = _bench()
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"x")
    b.write_bytes(b"x")
    assert bench.checkpoint_runs([]) == [("", None)]
    assert bench.checkpoint_runs([str(a), f"cand={b}"]) == [("a", a), ("cand", b)]
    with pytest.raises(FileNotFoundError, match="no file at"):
        bench.checkpoint_runs([f"x={tmp_path / 'missing.safetensors'}"])


@pytest.mark.parametrize(
    ("label", "running", "active", "saturated"),
    [
        ("half full", 128.0, 4, False),
        ("at 90 % of 4 × 64", 0.9 * 256, 4, True),
        ("over capacity", 400.0, 4, True),
        ("no active decode", 400.0, 0, False),
        ("running unknown", NAN, 4, False),
    ],
)
def test_decode_saturated(label: str, running: float, active: int, saturated: bool) -> None:
    o = obs(running_seqs=running, active={"prefill": 2, "decode": active})
    assert stages.decode_saturated(o, CAP) is saturated, label


def test_a_saturated_decode_cuts_nothing_from_the_forecast() -> None:
    """A full decode fleet measures a capped generation and output length: the arrival p90 and the larger
    generation forecast size it, whatever the modes say."""
    f = fc(rps=64.0, rps_p50=16.0, gen_tps=20_000.0)
    free = obs(running_seqs=10.0, gen_tps=0.0, forecast=f)
    full = obs(running_seqs=256.0, gen_tps=0.0, forecast=f)
    cut = stages.capacity_target(free, CAP, 1.0, gen_forecast="min", little_arrivals="p50")
    kept = stages.capacity_target(full, CAP, 1.0, gen_forecast="min", little_arrivals="p50")
    assert cut is not None and kept is not None
    assert cut.decode == pytest.approx(64.0 * 200.0 / CAP.decode_tps)  # min(20,000, 64 × 200) tok/s
    assert kept.decode == pytest.approx(20_000.0 / CAP.decode_tps)  # the larger: the token p90
