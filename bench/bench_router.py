"""Router proxy overhead at a fixed request rate against an instant fake backend, router vs direct side by side.

Starts (loopback only) a fake OpenAI backend subprocess that answers every completion at once and the router
subprocess (`python -m serving.router`, one mixed backend), then sends an open-loop, evenly spaced stream of
non-streaming completions at ``--rate`` req/s to the router and, interleaved, the same stream straight to the
backend. Overhead = router latency minus direct latency, per percentile; the router's own
``pdscale:router_proxy_overhead_seconds`` histogram is read back too. The 1-min load average is recorded:
the machine is shared and the figures are noisy.

Run: .venv/bin/python bench/bench_router.py [--rate 200] [--duration-s 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from serving.router.app import new_event_loop

ANSWER = json.dumps(
    {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
     "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}}
).encode()  # fmt: skip


def serve_fake(port: int) -> None:
    """The fake backend: answers /v1/completions immediately, /health 200."""
    from aiohttp import web

    async def complete(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=new_event_loop())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_up(url: str, timeout_s: float = 60.0) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url + "/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url}/health not up within {timeout_s} s")


async def drive(router_url: str, backend_url: str, rate: float, duration_s: float) -> dict[str, np.ndarray]:
    """Open loop: request i at i/rate to the router, and at i/rate + 1/(2 rate) straight to the backend."""
    import aiohttp

    body = {"model": "tiny", "prompt": "hello router", "max_tokens": 1}
    lat: dict[str, list[float]] = {"router": [], "direct": []}
    errors = {"router": 0, "direct": 0}
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:

        async def one(kind: str, url: str) -> None:
            t0 = time.perf_counter()
            try:
                async with s.post(url + "/v1/completions", json=body) as resp:
                    await resp.read()
                    ok = resp.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                lat[kind].append(time.perf_counter() - t0)
            else:
                errors[kind] += 1

        for kind, url in (("router", router_url), ("direct", backend_url)):  # warm connections
            await asyncio.gather(*(one(kind, url) for _ in range(20)))
        lat = {"router": [], "direct": []}
        n = int(rate * duration_s)
        start = time.perf_counter()
        tasks = []
        for i in range(n):
            for kind, url, offset in (("router", router_url, 0.0), ("direct", backend_url, 0.5)):
                due = start + (i + offset) / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(kind, url)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    print(f"sent {n} + {n} requests in {elapsed:.1f} s; errors {errors}", file=sys.stderr)
    return {k: np.array(v) for k, v in lat.items()} | {
        "errors": np.array([errors["router"], errors["direct"]])
    }


def histogram_quantile(page: str, q: float) -> float:
    """Upper bucket bound holding quantile ``q`` of the router's overhead histogram (all routes)."""
    counts: dict[float, float] = {}
    for line in page.splitlines():
        if line.startswith("pdscale:router_proxy_overhead_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            counts[float(le)] = counts.get(float(le), 0.0) + float(line.rsplit(" ", 1)[1])
    bounds = sorted(counts)
    total = counts[bounds[-1]]
    for b in bounds:
        if counts[b] >= q * total:
            return b
    return float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--rate", type=float, default=200.0, help="requests/s to the router (and as many direct)"
    )
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--serve-fake", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake is not None:
        serve_fake(args.serve_fake)
        return

    import urllib.request

    backend_port, router_port = free_port(), free_port()
    backend_url, router_url = f"http://127.0.0.1:{backend_port}", f"http://127.0.0.1:{router_port}"
    procs = [
        subprocess.Popen([sys.executable, __file__, "--serve-fake", str(backend_port)]),
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "serving.router",
                "--port",
                str(router_port),
                "-b",
                f"m0=mixed@{backend_url}",
            ],
            stderr=subprocess.DEVNULL,
        ),
    ]
    load_before = os.getloadavg()
    try:
        loop = new_event_loop()  # uvloop when installed, as the router and the fake backend use
        loop.run_until_complete(wait_up(backend_url))
        loop.run_until_complete(wait_up(router_url))
        lat = loop.run_until_complete(drive(router_url, backend_url, args.rate, args.duration_s))
        loop.close()
        with urllib.request.urlopen(router_url + "/metrics") as resp:
            page = resp.read().decode()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    load_after = os.getloadavg()
    pct = {"p50": 50, "p90": 90, "p99": 99}
    out: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, shared (noisy)",
        "event_loop": type(new_event_loop()).__module__,
        "rate_rps": args.rate,
        "duration_s": args.duration_s,
        "load_avg_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "completed": {"router": int(lat["router"].size), "direct": int(lat["direct"].size)},
        "errors": {"router": int(lat["errors"][0]), "direct": int(lat["errors"][1])},
    }
    for kind in ("router", "direct"):
        out[f"{kind}_ms"] = {k: round(float(np.percentile(lat[kind], v)) * 1e3, 3) for k, v in pct.items()}
    out["overhead_ms"] = {k: round(out["router_ms"][k] - out["direct_ms"][k], 3) for k in pct}
    out["router_histogram_overhead_ms_upper_bound"] = {
        k: histogram_quantile(page, v / 100) * 1e3 for k, v in pct.items()
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
