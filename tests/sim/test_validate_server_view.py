"""`sim validate` carries both views, client-side and server-side (vLLM's histograms), and still reads every
recording made before the server view existed. No real server: recorded runs and a local /metrics stub."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from serving.sim.cli import sim_app
from serving.sim.server_view import BucketCounts, histograms_to_json
from serving.sim.validate import (
    load_real,
    scale_slice,
    settled_scrape,
    simulate_slice,
    spec_of,
    validate_against_sim,
)
from serving.workload.readers import read_trace
from serving.workload.trace import Trace

ROOT = Path(__file__).resolve().parents[2]
TRACES = {
    "code": ROOT / "datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv",
    "conv": ROOT / "datasets/azure2023/AzureLLMInferenceTrace_conv.dev_before_1850.csv",
}
RECORDED = ROOT / "serving/sim/profiles/validation"
RECORDINGS = sorted(RECORDED.glob("*.json"))
FIGURES = {"ttft_ms.p50", "ttft_ms.p90", "itl_ms.p50", "itl_ms.p90"}


def _trace_of(path: Path) -> Path:
    return TRACES[path.name.split("_")[0]]


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.stem for p in RECORDINGS])
def test_every_recording_still_loads_and_compares_both_views(path: Path, tmp_path: Path) -> None:
    doc = validate_against_sim(read_trace(_trace_of(path)), work_dir=tmp_path, real_json=path)
    # the shipped profile first; a --calibrate recording (session 8) also has its own fitted profile, and one with
    # outside rows (session 9) four variants of it with the client-side term
    cal = load_real(path).get("calibration")
    expected = 1 + (cal is not None) + (4 if cal is not None and "outside" in cal else 0)
    assert len(doc["compare"]) == len(doc["compare_server"]) == expected
    client, server = next(iter(doc["compare"].values())), next(iter(doc["compare_server"].values()))
    assert set(client) == FIGURES and all(row["real"] > 0 and row["sim"] > 0 for row in client.values())
    assert set(server) >= FIGURES and all(server[f]["sim"] > 0 for f in FIGURES)
    real = doc["real"]
    if not doc["server_view_recorded"]:  # before session 6: the window means are all the server side there is
        assert all(server[f]["real"] is None and server[f]["sim_over_real"] is None for f in FIGURES)
        mean = real["server_metrics"].get("time_to_first_token_mean_ms")  # absent in the oldest recording
        assert server["ttft_ms.mean"]["real"] == (None if mean is None else pytest.approx(mean))
    else:  # a recording with histograms: its window mean is the histogram's sum / count
        ttft = BucketCounts.from_json(real["server_histograms"]["ttft_ms"])
        assert ttft.count == real["real"]["completed"]
        assert server["ttft_ms.mean"]["real"] == pytest.approx(
            real["server_metrics"]["time_to_first_token_mean_ms"], rel=1e-9
        )


def _slice_of(path: Path) -> tuple[dict[str, Any], Trace]:
    real = load_real(path)
    return real, scale_slice(read_trace(_trace_of(path)), spec_of(real))


def test_the_simulators_histograms_count_every_request_and_token() -> None:
    _, trace_slice = _slice_of(RECORDED / "conv_rows0-119_1rps_s5.json")
    doc = simulate_slice(trace_slice)
    hists = {k: BucketCounts.from_json(v) for k, v in doc["server_histograms"].items()}
    outputs = np.asarray(trace_slice.output_tokens)
    assert hists["ttft_ms"].count == hists["e2e_ms"].count == doc["completed"] == len(outputs)
    assert hists["itl_ms"].count == int(np.sum(outputs - 1))  # one gap per token after the first
    # the simulator's exported TTFT is the client's (request overhead included), as its per-request figures
    assert 1e3 * hists["ttft_ms"].sum_s / hists["ttft_ms"].count == pytest.approx(
        float(np.mean(doc["request_ttft_ms"])), rel=1e-4
    )


def test_reading_the_final_scrape_changes_nothing_in_the_report() -> None:
    from serving.sim.fleet import single_pool
    from serving.sim.hardware import get_profile
    from serving.sim.latency import CPU_TINY_JSON, load_linear_profile
    from serving.sim.replay import PolicyOptions, make_policy, replay

    _, trace_slice = _slice_of(RECORDED / "code_rows0-119_1rps_s5.json")
    profile = get_profile("cpu-tiny").with_overrides(max_num_seqs=16)
    model = load_linear_profile(profile, CPU_TINY_JSON)
    plain = replay(
        single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
        {"default": trace_slice},
        make_policy("fixed", PolicyOptions(mixed=1)),
        models=lambda _name: (profile, model),
    ).to_json()
    mine = simulate_slice(trace_slice)
    for doc in (plain, mine):
        doc.pop("wall_s")
    mine.pop("server_histograms")
    mine.pop("request_ttft_ms")
    assert mine == plain


def _with_histograms(path: Path, out: Path, hists: dict[str, BucketCounts | None]) -> Path:
    doc = json.loads(path.read_text())
    doc["real"]["server_histograms"] = histograms_to_json(hists)
    out.write_text(json.dumps(doc))
    return out


def test_cli_prints_and_writes_both_views_of_a_recording_with_histograms(tmp_path: Path) -> None:
    ttft_bounds = (0.02, 0.04, 0.06, 0.08, 0.1)
    hists: dict[str, BucketCounts | None] = {
        "ttft_ms": BucketCounts(ttft_bounds, (10, 60, 100, 110, 118, 120), 120 * 0.045),
        "itl_ms": BucketCounts((0.01, 0.025), (3000, 3400, 3420), 3420 * 0.004),
        "e2e_ms": None,
    }
    recording = _with_histograms(RECORDED / "code_rows0-119_1rps_s5.json", tmp_path / "rec.json", hists)
    out = tmp_path / "v.json"
    res = CliRunner().invoke(
        sim_app, ["validate", str(TRACES["code"]), "--real-json", str(recording), "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "server side" in res.output and "before session 6" not in res.output
    doc = json.loads(out.read_text())
    assert doc["server_view_recorded"] is True
    (client,) = doc["compare"].values()
    (server,) = doc["compare_server"].values()
    assert set(client) == FIGURES  # the client-side comparison is unchanged
    # rank 60 of 120 is the top of (20, 40] ms; rank 108 lies in (60, 80]: 100 below, 10 inside
    assert server["ttft_ms.p50"]["real"] == pytest.approx(40.0)
    assert server["ttft_ms.p90"]["real"] == pytest.approx(60.0 + 20.0 * 8 / 10)
    assert server["ttft_ms.p90"]["real_bucket_ms"] == pytest.approx([60.0, 80.0])
    # the recording's ITL buckets are not vLLM's: no quantile ratio, the exact mean still compared
    assert server["itl_ms.p50"]["bounds_match"] is False and server["itl_ms.p50"]["sim_over_real"] is None
    assert server["itl_ms.mean"]["real"] == pytest.approx(4.0)
    assert server["itl_ms.mean"]["sim_over_real"] == pytest.approx(server["itl_ms.mean"]["sim"] / 4.0)
    # no e2e histogram in this recording: its window mean stands in
    assert server["e2e_ms.mean"]["real"] == pytest.approx(
        doc["real"]["server_metrics"]["e2e_request_latency_mean_ms"]
    )


def test_cli_says_when_a_recording_has_no_histograms() -> None:
    res = CliRunner().invoke(
        sim_app,
        ["validate", str(TRACES["code"]), "--real-json", str(RECORDED / "code_rows0-119_1rps_quiet.json")],
    )
    assert res.exit_code == 0, res.output
    assert "server side" in res.output and "before session 6" in res.output


class _Metrics(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_url() -> Iterator[str]:
    _Metrics.body = (
        b"# TYPE vllm:e2e_request_latency_seconds histogram\n"
        b'vllm:e2e_request_latency_seconds_bucket{le="1.0"} 5\n'
        b'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 5\n'
        b"vllm:e2e_request_latency_seconds_count 5\n"
        b"vllm:e2e_request_latency_seconds_sum 1.5\n"
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


def test_settled_scrape_waits_for_the_finished_count(metrics_url: str) -> None:
    snap, settled = settled_scrape(metrics_url, 5)
    assert settled and snap.total("vllm:e2e_request_latency_seconds_count") == 5
    snap, settled = settled_scrape(metrics_url, 6, timeout_s=0.3, poll_s=0.1)
    assert not settled and snap.total("vllm:e2e_request_latency_seconds_count") == 5


def test_deferred_first_tokens_move_the_clients_ttft_not_the_servers_histogram(tmp_path: Path) -> None:
    """vLLM records a first token when its API process takes it from the engine, before streaming it: a first
    token the client gets late is late for the client only."""
    from serving.sim.latency import CPU_TINY_JSON

    _, trace_slice = _slice_of(RECORDED / "conv_rows0-119_1rps_s5.json")
    doc = json.loads(CPU_TINY_JSON.read_text())
    docs = {}
    for q in (0.0, 1.0):
        doc["overheads"]["first_token_deferred_fraction"] = q
        path = tmp_path / f"q{q}.json"
        path.write_text(json.dumps(doc))
        docs[q] = simulate_slice(trace_slice, latency_json=path)
    multi = np.asarray(trace_slice.output_tokens) > 1
    early, late = (np.asarray(docs[q]["request_ttft_ms"]) for q in (0.0, 1.0))
    assert np.all(late[multi] > early[multi]) and np.array_equal(late[~multi], early[~multi])
    assert docs[1.0]["server_histograms"] == docs[0.0]["server_histograms"]
