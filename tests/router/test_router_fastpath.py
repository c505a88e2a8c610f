"""The router's fast paths keep its behaviour: filtered ``/metrics`` parsing, bound metric children, role
sets without snapshots, answers parsed only when something learns from them, the frozen GC at start-up."""

from __future__ import annotations

import asyncio
import gc
import math
from collections.abc import Awaitable
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import serving.router.app as router_app
from serving.router.app import Router
from serving.router.backends import BackendRegistry, BackendSpec, parse_vllm_load
from serving.router.config import router_config_from_dict
from serving.router.metrics import RouterMetrics
from tests.router.router_fakes import FakeBackend, backend_doc, serve_backends, serve_router

pytestmark = pytest.mark.timeout(60)


def run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def full_parse_load(text: str) -> tuple[float, float]:
    """The reference: the whole page through the Prometheus parser (the router's parse before the filter)."""
    totals = {"vllm:num_requests_running": math.nan, "vllm:num_requests_waiting": math.nan}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                prior = totals[sample.name]
                totals[sample.name] = sample.value if math.isnan(prior) else prior + sample.value
    return totals["vllm:num_requests_running"], totals["vllm:num_requests_waiting"]


def histogram(name: str, n: int) -> list[str]:
    out = [f"# HELP {name} A histogram.", f"# TYPE {name} histogram"]
    out += [f'{name}_bucket{{engine="0",le="{le}",model_name="m x"}} {n}.0' for le in ("0.1", "1.0", "+Inf")]
    return [*out, f'{name}_count{{engine="0",model_name="m x"}} {n}.0', f"{name}_sum 1.5"]


def gauge(name: str, values: list[tuple[str, float]]) -> list[str]:
    out = [f"# HELP {name} Gauge {name}.", f"# TYPE {name} gauge"]
    return out + [f'{name}{{engine="{e}",model_name="my {{model}}"}} {v}' for e, v in values]


GAUGE_NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
)
values = st.lists(st.tuples(st.sampled_from("0123"), st.floats(0, 1e4, allow_nan=False)), max_size=3)
blocks = st.one_of(
    st.builds(histogram, st.sampled_from(["vllm:e2e_request_latency_seconds", "vllm:iteration_tokens"]),
              st.integers(0, 99)),
    st.builds(gauge, st.sampled_from(GAUGE_NAMES), values),
    st.just(["vllm:kv_cache_usage_perc 0.5"]),
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.lists(blocks, max_size=8), st.booleans())
def test_filtered_parse_equals_the_full_page_parse(parts: list[list[str]], crlf: bool) -> None:
    # the parser wants each family in one block: keep the first block of each name
    seen: set[str] = set()
    lines: list[str] = []
    for block in parts:
        if block[0] not in seen:
            seen.add(block[0])
            lines += block
    text = ("\r\n" if crlf else "\n").join(lines) + ("\n" if lines else "")
    got, want = parse_vllm_load(text), full_parse_load(text.replace("\r\n", "\n"))
    assert [round(x, 6) if not math.isnan(x) else "nan" for x in got] == [
        round(x, 6) if not math.isnan(x) else "nan" for x in want
    ]


def test_a_large_page_is_parsed_by_its_two_gauges() -> None:
    lines = [line for i in range(150) for line in histogram(f"vllm:h{i}_seconds", i)]
    lines += gauge("vllm:num_requests_running", [("0", 2.0), ("1", 3.0)])
    lines += gauge("vllm:num_requests_waiting_by_reason", [("0", 9.0)])
    lines += gauge("vllm:num_requests_waiting", [("0", 1.0)])
    assert parse_vllm_load("\n".join(lines) + "\n") == (5.0, 1.0)


def test_bound_children_are_the_labelled_series_and_stay_bound() -> None:
    m = RouterMetrics()
    a = m.child(m.client_requests, "normal", "mixed", "completions", "200")
    assert a is m.child(m.client_requests, "normal", "mixed", "completions", "200")
    assert a is not m.child(m.client_requests, "normal", "pd", "completions", "200")
    a.inc(3)
    m.child(m.overhead, "pd").observe(0.0004)
    page = m.page().decode()
    assert (
        'pdscale:router_client_requests_total{endpoint="completions",priority_class="normal",route="mixed",'
        'status="200"} 3.0' in page
    )
    assert 'pdscale:router_proxy_overhead_seconds_count{route="pd"} 1.0' in page


specs = st.lists(
    st.tuples(st.sampled_from(["mixed", "prefill", "decode"]), st.booleans(), st.booleans()), max_size=6
)


@given(specs)
def test_roles_match_the_snapshot_sets(states: list[tuple[str, bool, bool]]) -> None:
    reg = BackendRegistry()
    for i, (role, healthy, draining) in enumerate(states):
        reg.add(BackendSpec(id=f"b{i}", url="http://h:1", role=role))  # type: ignore[arg-type]
        if i % 2:  # keep a request in flight so that a drained one stays listed as draining
            reg.acquire(f"b{i}")
        if not healthy:
            reg.mark_unhealthy(f"b{i}", "test")
        if draining:
            reg.remove(f"b{i}")
    views = [v for v in reg.views() if not v.draining]
    assert reg.roles() == ({v.spec.role for v in views if v.healthy}, {v.spec.role for v in views})


def test_an_answer_is_parsed_only_when_something_learns_from_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    real = router_app.usage_completion_tokens

    def counting(chunk: bytes) -> int | None:
        calls.append(chunk)
        return real(chunk)

    monkeypatch.setattr(router_app, "usage_completion_tokens", counting)

    async def body() -> None:
        async with serve_backends(FakeBackend("m0")) as (m,):
            cfg = router_config_from_dict({"backends": [backend_doc(m)], "poll_interval_s": 0})
            async with serve_router(cfg) as (router, url), aiohttp.ClientSession() as s:
                async with s.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 5}) as resp:
                    assert resp.status == 200 and b"m0:x:5" in await resp.read()
                assert calls == []  # least-loaded, no client id: nothing to learn, no parse
                headers = {"x-pdscale-client": "c1"}
                async with s.post(
                    url + "/v1/completions", json={"prompt": "x", "max_tokens": 5}, headers=headers
                ):
                    pass
                assert len(calls) == 1 and router.predicted_output({}, "c1") == 5.0

    run(body())


def test_context_aware_routes_long_prompts_to_the_long_context_prefill_over_http() -> None:
    async def body() -> None:
        fakes = (
            FakeBackend("p-short", "prefill"),
            FakeBackend("p-long", "prefill"),
            FakeBackend("d0", "decode"),
        )
        async with serve_backends(*fakes) as (short, long_, d):
            doc: dict[str, Any] = {
                "backends": [backend_doc(short), backend_doc(long_, long_context=True), backend_doc(d)],
                "poll_interval_s": 0,
                "policy": "context-aware",
            }
            async with serve_router(router_config_from_dict(doc)) as (_, url), aiohttp.ClientSession() as s:
                for prompt in ("x" * 4 * 3000, "short prompt"):
                    async with s.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}) as r:
                        assert r.status == 200, await r.read()
        assert len(long_.bodies) == 1 and len(long_.bodies[0]["prompt"]) == 12000
        assert [b["prompt"] for b in short.bodies] == ["short prompt"]
        assert len(d.bodies) == 2 and all(b["kv_transfer_params"] for b in d.bodies)

    run(body())


def test_start_up_freezes_what_it_allocated() -> None:
    app = Router(router_config_from_dict({})).build_app()
    gc.unfreeze()
    try:
        run(router_app._freeze_gc(app))
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()


def test_request_ids_are_unique_hex_and_differ_between_routers() -> None:
    a, b = Router(router_config_from_dict({})), Router(router_config_from_dict({}))
    ids = [a._new_request_id() for _ in range(1000)] + [b._new_request_id() for _ in range(1000)]
    assert len(set(ids)) == 2000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_the_bench_fake_metrics_page_is_parsed_alike_and_sized_as_asked() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "bench_router.py"
    spec = importlib.util.spec_from_file_location("bench_router_under_test", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    page = bench.vllm_metrics_page(1000).decode()
    assert 990 <= len(page.splitlines()) <= 1010
    assert parse_vllm_load(page) == full_parse_load(page) == (3.0, 1.0)
    m = RouterMetrics()
    for seconds in (0.0002, 0.0002, 0.0002, 0.004):
        m.child(m.overhead, "mixed").observe(seconds)
    assert bench.histogram_quantile(m.page().decode(), 0.5) == 0.00025
    assert bench.histogram_quantile(m.page().decode(), 0.99) == 0.005
