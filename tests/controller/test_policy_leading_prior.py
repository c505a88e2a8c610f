"""A history that starts in a burst (``PolicyConfig.burst_reserve_leading`` 'prior', ``stages.leading_prior``): the
burst reserve counts the leading burst's rise from the median, as the blocks of one cold start before it would
have seen it, while those blocks are more than 1 - burst_quantile of the history."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, ctx, obs
from pydantic import ValidationError
from typer.testing import CliRunner

from controller.config import PolicyConfig
from controller.policy import PoolState, decide, stages
from controller.policy.types import PoolObservation, evolve
from training.pdscale_cli import app

BLOCK = stages.NEED_BLOCK_S
Blocks = tuple[tuple[float, float, float, int], ...]
LEAD = 120.0  # PolicyConfig's provision_lead_s: 24 blocks


def _blocks(prefill: list[float], decode: float = 1.0) -> Blocks:
    return tuple((i * BLOCK, p, decode, 5) for i, p in enumerate(prefill))


def test_prior_is_the_default() -> None:
    assert PolicyConfig().burst_reserve_leading == "prior"


def test_a_history_that_starts_in_a_burst_gets_its_rise_from_the_median() -> None:
    blocks = _blocks([6.0, 6.0, *[1.0] * 20])  # 22 blocks: 24 / 46 > 0.1
    rise, peak = stages.leading_prior(blocks, ((0.0, 10.0),), LEAD, 0.9, 0.3)
    assert peak == (6.0, 1.0)
    assert rise == pytest.approx((6.0 - 1.3 * 1.0, 0.0))  # decode is flat: no rise beyond its headroom


@pytest.mark.parametrize(
    ("label", "runs", "n_quiet"),
    [
        ("no burst seen", (), 20),
        ("the first burst starts after the history's start", ((10.0, 20.0),), 20),
        # 24 virtual blocks of 24 + 216 + 2 are 0.099 of them: no longer more than 1 - q
        ("the history has outgrown the prior", ((0.0, 10.0),), 216),
    ],
)
def test_no_prior(label: str, runs: tuple[tuple[float, float], ...], n_quiet: int) -> None:
    blocks = _blocks([6.0, 6.0, *[1.0] * n_quiet])
    rise, peak = stages.leading_prior(blocks, runs, LEAD, 0.9, 0.3)
    assert all(math.isnan(x) for x in (*rise, *peak)), label


def test_the_prior_lasts_as_long_as_its_blocks_are_above_the_quantile() -> None:
    runs = ((0.0, 10.0),)
    # m / (n + m) > 1 - q  <=>  n < m q / (1 - q): with m = 24, q = 0.9, n < 216 blocks (q = 0.5: n < 24)
    for n, counts in ((215, True), (216, False)):
        rise, _ = stages.leading_prior(_blocks([6.0, 6.0, *[1.0] * (n - 2)]), runs, LEAD, 0.9, 0.3)
        assert math.isfinite(rise[0]) == counts, n
    rise, _ = stages.leading_prior(_blocks([6.0, 6.0, *[1.0] * 30]), runs, LEAD, 0.5, 0.3)
    assert math.isnan(rise[0])


def _stage(cfg: PolicyConfig, state: PoolState, now_s: float, rps: float) -> tuple[int, int]:
    o = _load(now_s, rps)
    prefill, decode, _, _, _ = stages.burst_reserve_stage(1, 1, o, CAP, cfg, state)
    return prefill, decode


def _load(t: float, rps: float) -> PoolObservation:
    o: PoolObservation = obs(now_s=t, arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=rps * 100.0,
                             running_seqs=rps * 2.0, standby={"prefill": 0, "decode": 0})  # fmt: skip
    return o


@settings(max_examples=60, deadline=None)
@given(
    needs=st.lists(st.floats(0.0, 20.0, allow_nan=False), min_size=3, max_size=80),
    lead_blocks=st.integers(0, 5),
    rps=st.floats(0.0, 60.0, allow_nan=False),
)
def test_the_prior_only_raises_the_reserve_and_only_after_a_leading_burst(
    needs: list[float], lead_blocks: int, rps: float
) -> None:
    """For any remembered history, 'prior' keeps at least what 'none' keeps, per role, and exactly the same
    when the history does not start in a burst (no run at its first block)."""
    blocks = _blocks(needs)
    runs = ((0.0, (lead_blocks + 1) * BLOCK),) if lead_blocks else ((BLOCK, 2 * BLOCK),)
    state = evolve(PoolState(), need_blocks=blocks, burst_runs=runs)
    now = len(needs) * BLOCK - 1.0  # inside the last block: no block opens, the runs stay as given
    base = _stage(PolicyConfig(burst_reserve_leading="none"), state, now, rps)
    prior = _stage(PolicyConfig(burst_reserve_leading="prior"), state, now, rps)
    assert prior[0] >= base[0] and prior[1] >= base[1]
    if not lead_blocks:
        assert prior == base


def _replay(cfg: PolicyConfig, rate: Any, seconds: int) -> list[int]:
    """The planned prefill a second at a time, the fleet following the plan at once."""
    state, replicas, prefill = PoolState(), {"prefill": 1, "decode": 1}, []
    for t in range(seconds):
        o = _load(float(t), rate(t))
        o = obs(**{**o.__dict__, "replicas": dict(replicas), "active": dict(replicas)})
        plan, state = decide(ctx(o, cfg), state)
        assert plan is not None
        replicas = {"prefill": plan.prefill, "decode": plan.decode}
        prefill.append(plan.prefill)
    return prefill


def test_decide_keeps_the_leading_bursts_capacity_past_the_burst_hold() -> None:
    """First seen in a burst (40 req/s for 15 s, then 2 req/s): the burst hold keeps its capacity for
    burst_hold_max_s (300 s) after it; with 'prior' the reserve keeps it after that too, for the next burst."""
    base = PolicyConfig(standby_decode=0, burst_reserve_leading="none")

    def rate(t: int) -> float:
        return 40.0 if t < 15 else 2.0

    none = _replay(base, rate, 420)
    prior = _replay(base.model_copy(update={"burst_reserve_leading": "prior"}), rate, 420)
    quiet = none[-1]
    assert max(none[:15]) > quiet  # the burst asked for more than the quiet load needs
    assert none[400] == quiet  # released after the hold
    assert prior[400] > quiet  # still kept for a burst like it
    assert prior[:300] == none[:300]  # the same while the burst hold keeps it anyway


def test_bad_values_are_refused_naming_the_field(tmp_path: Any) -> None:
    with pytest.raises(ValidationError, match="burst_reserve_leading"):
        PolicyConfig(burst_reserve_leading="yes")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("pools:\n  - name: chat\n    policy: {burst_reserve_leading: always}\n")
    result = CliRunner().invoke(app, ["config", "check", str(cfg)])
    assert result.exit_code == 2
    assert "pools.0.policy.burst_reserve_leading" in result.output


def test_a_leading_run_that_lasted_a_cold_start_is_a_level_not_a_burst() -> None:
    blocks = _blocks([6.0] * 24 + [1.0] * 20)
    assert math.isnan(stages.leading_prior(blocks, ((0.0, LEAD),), LEAD, 0.9, 0.3)[0][0])
    assert math.isfinite(stages.leading_prior(blocks, ((0.0, LEAD - BLOCK),), LEAD, 0.9, 0.3)[0][0])


def test_the_historys_first_block_alone_is_no_burst() -> None:
    """A run of the first block only (the pool's first seconds of counters) has no prior; a longer run's peak
    is read from its later blocks."""
    blocks = _blocks([46.0, 20.0, 20.0, *[10.0] * 30])
    assert math.isnan(stages.leading_prior(blocks, ((0.0, BLOCK),), LEAD, 0.9, 0.3)[1][0])
    assert stages.leading_prior(blocks, ((0.0, 3 * BLOCK),), LEAD, 0.9, 0.3)[1][0] == 20.0


def test_a_burst_seen_since_drops_the_prior() -> None:
    blocks = _blocks([6.0, 6.0, *[1.0] * 20, 6.0, *[1.0] * 5])
    assert math.isfinite(stages.leading_prior(blocks, ((0.0, 10.0),), LEAD, 0.9, 0.3)[0][0])
    assert math.isnan(stages.leading_prior(blocks, ((0.0, 10.0), (110.0, 115.0)), LEAD, 0.9, 0.3)[0][0])
