"""The load generator against a fake OpenAI streaming server (no vLLM), and the validation slice maths."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.pools.loadgen import RequestTimings, replay
from serving.sim.validate import SliceSpec, compare, scale_slice
from serving.workload.trace import Trace

BODIES: web.AppKey[list[dict[str, Any]]] = web.AppKey("bodies", list)
FIRST_TOKEN_S = 0.05
TOKEN_GAP_S = 0.02


async def _fake_completions(request: web.Request) -> web.StreamResponse:
    """Streams ``max_tokens`` one-token chunks like vLLM; answers 500 to prompts that start with id 13."""
    body: dict[str, Any] = await request.json()
    request.app[BODIES].append(body)
    if body["prompt"][0] == 13:
        return web.json_response({"error": "boom"}, status=500)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await asyncio.sleep(FIRST_TOKEN_S)
    for i in range(body["max_tokens"]):
        if i:
            await asyncio.sleep(TOKEN_GAP_S)
        chunk = {"choices": [{"index": 0, "text": f"t{i}", "token_ids": [i]}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    usage = {
        "choices": [],
        "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]},
    }
    await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    await resp.write_eof()
    return resp


async def _replay_against_fake(
    trace: Trace, vocab: np.ndarray, **kwargs: Any
) -> tuple[RequestTimings, list[Any]]:
    app = web.Application()
    app[BODIES] = []
    app.router.add_post("/v1/completions", _fake_completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        timings = await replay(f"http://127.0.0.1:{port}", trace, vocab, **kwargs)
    finally:
        await runner.cleanup()
    return timings, app[BODIES]


def test_replay_times_streams_and_sends_the_right_bodies() -> None:
    trace = Trace.from_arrays(
        arrival_s=np.array([0.0, 0.2, 0.2, 0.6]),
        prompt_tokens=np.array([5, 0, 17, 3]),
        output_tokens=np.array([4, 1, 6, 0]),
    )
    timings, bodies = asyncio.run(_replay_against_fake(trace, np.array([7, 8, 9]), time_scale=2.0))
    assert timings.errors == ("",) * 4
    np.testing.assert_allclose(timings.scheduled_s, [0.0, 0.1, 0.1, 0.3])
    assert np.all(timings.sent_s >= timings.scheduled_s - 1e-3)  # never early
    np.testing.assert_array_equal(timings.prompt_tokens, [5, 1, 17, 3])  # at least one token
    np.testing.assert_array_equal(timings.completion_tokens, [4, 1, 6, 1])
    assert np.all(timings.ttft_s >= FIRST_TOKEN_S * 0.9)
    assert np.isnan(timings.itl_mean_s[1]) and np.isnan(timings.itl_mean_s[3])
    assert timings.itl_mean_s[0] >= TOKEN_GAP_S * 0.9 and timings.itl_mean_s[2] >= TOKEN_GAP_S * 0.9
    by_len = {len(b["prompt"]): b for b in bodies}
    assert set(by_len) == {5, 1, 17, 3}
    assert by_len[17]["max_tokens"] == 6 and by_len[17]["ignore_eos"] is True and by_len[17]["stream"] is True
    assert all(set(b["prompt"]) <= {7, 8, 9} for b in bodies)


def test_replay_records_server_errors_as_unmeasured() -> None:
    trace = Trace.from_arrays(np.array([0.0, 0.0]), np.array([4, 4]), np.array([3, 3]))
    timings, _ = asyncio.run(_replay_against_fake(trace, np.array([13])))
    assert all(e.startswith("HTTP 500") for e in timings.errors)
    assert np.all(np.isnan(timings.ttft_s)) and np.all(np.isnan(timings.itl_mean_s))
    assert timings.summary()["completed"] == 0


def test_replay_rejects_a_non_positive_time_scale() -> None:
    trace = Trace.from_arrays(np.array([0.0]), np.array([4]), np.array([3]))
    with pytest.raises(ValueError, match="time_scale"):
        asyncio.run(replay("http://127.0.0.1:9", trace, np.array([1]), time_scale=0.0))


# --- slice maths ------------------------------------------------------------------------------------------


def _trace(n: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    return Trace.from_arrays(
        arrival_s=np.cumsum(rng.exponential(0.3, n)) + 100.0,
        prompt_tokens=rng.integers(0, 3000, n),
        output_tokens=rng.integers(0, 500, n),
        source="mem",
    )


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=400),
    start=st.integers(min_value=0, max_value=100),
    rate=st.floats(min_value=0.1, max_value=50.0),
)
def test_scale_slice_hits_the_target_rate_and_clips(n: int, start: int, rate: float) -> None:
    trace = _trace(600)
    spec = SliceSpec(n_requests=n, start_index=start, target_rps=rate)
    s = scale_slice(trace, spec)
    assert len(s) == n
    assert s.arrival_s[0] == 0.0
    assert np.all(np.diff(s.arrival_s) >= 0)
    assert (n - 1) / s.arrival_s[-1] == pytest.approx(rate, rel=1e-9)
    assert s.prompt_tokens.min() >= 1 and s.prompt_tokens.max() <= spec.max_prompt_tokens
    assert s.output_tokens.min() >= 1 and s.output_tokens.max() <= spec.max_output_tokens
    # burst shape kept: inter-arrival gaps are proportional to the original ones
    gaps = np.diff(trace.arrival_s[start : start + n])
    np.testing.assert_allclose(
        np.diff(s.arrival_s), gaps * (s.arrival_s[-1] / gaps.sum()), rtol=1e-9, atol=1e-12
    )


def test_scale_slice_past_the_end_is_an_error() -> None:
    with pytest.raises(ValueError, match="leaves none"):
        scale_slice(_trace(10), SliceSpec(start_index=10))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n_requests": 0}, "n_requests"),
        ({"target_rps": math.nan}, "target_rps"),
        ({"target_rps": -1.0}, "target_rps"),
        ({"max_prompt_tokens": 1000, "max_output_tokens": 100}, "exceeds max_model_len"),
    ],
    ids=["no-requests", "nan-rate", "negative-rate", "too-long"],
)
def test_slice_spec_rejects(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SliceSpec(**kwargs)


def test_compare_gives_ratios_and_null_for_unknown() -> None:
    real = {"ttft_ms": {"p50": 100.0, "p90": 400.0}, "itl_ms": {"p50": 20.0, "p90": None}}
    sim = {"ttft_ms": {"p50": 150.0, "p90": 200.0}, "itl_ms": {"p50": 10.0, "p90": 30.0}}
    out = compare(real, sim)
    assert out["ttft_ms.p50"]["sim_over_real"] == pytest.approx(1.5)
    assert out["ttft_ms.p90"]["sim_over_real"] == pytest.approx(0.5)
    assert out["itl_ms.p50"]["sim_over_real"] == pytest.approx(0.5)
    assert out["itl_ms.p90"]["sim_over_real"] is None
