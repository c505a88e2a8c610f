"""``PolicyConfig.reserve_output_hold_s`` (s14u): the burst reserve's need blocks read decode's mean output as
the most it was over the last S seconds, so a burst whose output estimate dips (generation follows arrivals by
a sequence lifetime) is remembered at its true decode need. Opt-in (0 by default: the reserve as in session
13). The dipped-burst case fails with ``held_output`` left out of ``stages.burst_reserve_stage``."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_fixtures import CAP, obs
from pydantic import ValidationError

from controller.config import PolicyConfig
from controller.policy import PoolState, stages
from controller.policy.types import PoolObservation

TRUE_OUTPUT = 250.0  # tokens; CAP: decode 2,000 tok/s and 64 sequences = 31.25 tok/s a sequence


def _load(t: float, rps: float, est_output: float) -> PoolObservation:
    """``rps`` arrivals/s of 1,000-token prompts whose generation is what ``rps`` × the true output would give,
    read by the pool as ``est_output`` tokens a request (the length tracker's estimate; NaN = not known yet)."""
    gen = rps * (est_output if math.isfinite(est_output) else TRUE_OUTPUT)
    o: PoolObservation = obs(now_s=t, arrival_rps=rps, prompt_tps=rps * 1000.0, gen_tps=gen,
                             mean_prompt_tokens=1000.0, mean_output_tokens=est_output, running_seqs=math.nan,
                             standby={"prefill": 0, "decode": 0})  # fmt: skip
    return o


def _burst_ticks() -> list[tuple[float, float, float]]:
    """5 min at 2 req/s (estimate 250), a 40-s burst at 12 req/s whose estimate dips to 140 (arrivals jumped,
    the generation has not followed yet), then 2 min at 2 req/s again (estimate 250)."""
    ticks = [(float(t), 2.0, TRUE_OUTPUT) for t in range(300)]
    ticks += [(float(t), 12.0, 140.0) for t in range(300, 340)]
    ticks += [(float(t), 2.0, TRUE_OUTPUT) for t in range(340, 460)]
    return ticks


OFF = PolicyConfig(reserve_output_hold_s=0.0)  # session 15's default: this tick's estimate


def _decode_targets(ticks: list[tuple[float, float, float]], cfg: PolicyConfig) -> list[int]:
    """The reserve stage's decode target per tick, from a stage-2 target of 1 + 1."""
    state, out = PoolState(), []
    for t, rps, est in ticks:
        _, d, _, state, _ = stages.burst_reserve_stage(1, 1, _load(t, rps, est), CAP, cfg, state)
        out.append(d)
    return out


def test_the_value_is_validated_and_named() -> None:
    assert PolicyConfig().reserve_output_hold_s == 60.0  # the default since session 16
    assert PolicyConfig(reserve_output_hold_s=60).reserve_output_hold_s == 60.0
    for bad in (-1.0, 3601.0):
        with pytest.raises(ValidationError, match="reserve_output_hold_s"):
            PolicyConfig(reserve_output_hold_s=bad)


@pytest.mark.parametrize(
    ("history", "now", "hold_s", "want", "kept"),
    [
        pytest.param((), (10.0, 200.0), 60.0, 200.0, 1, id="first-tick"),
        pytest.param(((0.0, 300.0), (5.0, 250.0)), (10.0, 200.0), 60.0, 300.0, 3, id="most-in-window"),
        pytest.param(
            ((0.0, 300.0), (50.0, 250.0)), (70.0, 200.0), 60.0, 250.0, 2, id="older-than-hold-dropped"
        ),
        pytest.param(((0.0, 300.0),), (10.0, math.nan), 60.0, math.nan, 1, id="unknown-stays-unknown"),
        pytest.param(((0.0, 100.0),), (10.0, 200.0), 60.0, 200.0, 2, id="a-rise-is-read-at-once"),
    ],
)
def test_held_output_table(
    history: tuple[tuple[float, float], ...], now: tuple[float, float], hold_s: float, want: float, kept: int
) -> None:
    o = _load(now[0], 2.0, now[1])
    got, state = stages.held_output(o, PoolState(output_recent=history), hold_s)
    assert (math.isnan(want) and math.isnan(got.mean_output_tokens)) or got.mean_output_tokens == want
    assert len(state.output_recent) == kept
    assert got.arrival_rps == o.arrival_rps and got.gen_tps == o.gen_tps  # only the output length changes


def test_zero_passes_the_observation_and_state_through() -> None:
    o, s = _load(10.0, 2.0, 200.0), PoolState(output_recent=((0.0, 300.0),))
    got, state = stages.held_output(o, s, 0.0)
    assert got is o and state is s


def test_a_dipped_burst_is_remembered_at_its_true_decode_need() -> None:
    """The burst's decode need is 12 × 250 / 2,000 = 1.5 instances; read with the dipped 140 it is 0.84. After
    the burst 0 (session 15's default) keeps 1 decode, the hold keeps 2 (the true peak, without headroom, rounded up)."""
    ticks = _burst_ticks()
    base = _decode_targets(ticks, OFF)
    held = _decode_targets(ticks, PolicyConfig(reserve_output_hold_s=60.0))
    assert held == _decode_targets(ticks, PolicyConfig())  # 60 s is the default
    assert max(base[350:]) == 1
    assert min(held[350:]) == 2


def test_zero_leaves_the_new_state_unwritten() -> None:
    """With 0 the stage never writes ``output_recent``: the state is the session-13 state."""
    state = PoolState()
    for t, rps, est in _burst_ticks():
        _, _, _, state, _ = stages.burst_reserve_stage(1, 1, _load(t, rps, est), CAP, OFF, state)
    assert state.output_recent == ()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 30.0), st.floats(1.0, 2000.0) | st.just(math.nan)), min_size=1, max_size=80
    ),
    st.sampled_from([5.0, 30.0, 120.0]),
)
def test_the_hold_raises_only_decode_need_blocks(seq: list[tuple[float, float]], hold_s: float) -> None:
    """For any sequence of 5-s ticks the need blocks the reserve learns from are the default's blocks, with each
    block's decode need at least the default's and its prefill need equal (the held output enters decode's
    Little's-law need only; the reserve built on them is not monotone in them, a rise being measured above
    each block's need)."""
    base, hold = PoolState(), PoolState()
    cfg = PolicyConfig(reserve_output_hold_s=hold_s)
    for i, (rps, est) in enumerate(seq):
        o = _load(5.0 * i, rps, est)
        *_, base, _ = stages.burst_reserve_stage(1, 1, o, CAP, OFF, base)
        *_, hold, _ = stages.burst_reserve_stage(1, 1, o, CAP, cfg, hold)
    assert [b[0] for b in hold.need_blocks] == [b[0] for b in base.need_blocks]
    for b, h in zip(base.need_blocks, hold.need_blocks, strict=True):
        assert h[1] == b[1] or (math.isnan(h[1]) and math.isnan(b[1]))
        assert h[2] >= b[2] - 1e-12 or (math.isnan(h[2]) and math.isnan(b[2]))
