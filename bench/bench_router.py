"""Router proxy overhead at a fixed request rate against an instant fake backend, router vs direct side by side.

Starts (loopback only) a fake OpenAI backend subprocess that answers every completion at once and the router
subprocess (`python -m serving.router`, one mixed backend), then sends an open-loop, evenly spaced stream of
non-streaming completions at ``--rate`` req/s to the router and, interleaved, the same stream straight to the
backend. Overhead = router latency minus direct latency, per percentile; the router's own
``pdscale:router_proxy_overhead_seconds`` histogram is read back too. The 1-min load average is recorded:
the machine is shared and the figures are noisy.

Before/after in one run: ``--before DIR`` (or ``--compare NAME=DIR``, repeatable) also starts a router from
another source tree (e.g. ``git archive HEAD serving | tar -x -C DIR``; the whole ``serving`` package, so that
the copy and not the working tree is imported: the bench checks which file each router imports). Every router
and the direct path then get ``--rate`` req/s each, interleaved in one open-loop stream (request i of target k
at ``(i + k/K) / rate``), against the same fake backend; ``--runs N`` repeats with fresh processes.

``--metrics-lines N`` makes the fake backend serve a vLLM-like ``/metrics`` page of about N lines (0: 404, no
page), so the router's least-loaded poll does real parsing work during the run.

Run: .venv/bin/python bench/bench_router.py [--rate 200] [--duration-s 20] [--json OUT]
     .venv/bin/python bench/bench_router.py --before /tmp/w1_before --runs 3 --duration-s 20 --json OUT
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
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from serving.router.app import new_event_loop

ANSWER = json.dumps(
    {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
     "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}}
).encode()  # fmt: skip
PCT = {"p50": 50, "p90": 90, "p99": 99}
REPO = Path(__file__).resolve().parent.parent


def vllm_metrics_page(lines: int) -> bytes:
    """A vLLM-like ``/metrics`` page of about ``lines`` lines: histograms, then the two load gauges."""
    out: list[str] = []
    i = 0
    while len(out) < max(0, lines - 6):
        name = f"vllm:request_latency_{i}_seconds"
        out += [f"# HELP {name} Histogram number {i}.", f"# TYPE {name} histogram"]
        for le in ("0.01", "0.05", "0.1", "0.5", "1.0", "5.0", "10.0", "+Inf"):
            out.append(f'{name}_bucket{{engine="0",le="{le}",model_name="tiny model"}} {i * 3}.0')
        out += [f'{name}_count{{engine="0",model_name="tiny model"}} {i * 3}.0',
                f'{name}_sum{{engine="0",model_name="tiny model"}} {i * 1.5}']  # fmt: skip
        i += 1
    for gauge, value in (("running", 3), ("waiting", 1)):
        name = f"vllm:num_requests_{gauge}"
        out += [f"# HELP {name} Requests {gauge}.", f"# TYPE {name} gauge",
                f'{name}{{engine="0",model_name="tiny model"}} {value}.0']  # fmt: skip
    return ("\n".join(out) + "\n").encode()


def serve_fake(port: int, metrics_lines: int) -> None:
    """The fake backend: answers /v1/completions immediately, /health 200, /metrics when asked to."""
    from aiohttp import web

    page = vllm_metrics_page(metrics_lines)

    async def complete(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/plain")

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/health", health)
    if metrics_lines > 0:
        app.router.add_get("/metrics", metrics)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=new_event_loop())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def source_env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def imported_from(src: Path) -> str:
    """The file ``serving.router.app`` resolves to when run from ``src`` (as the router subprocess is)."""
    code = "import serving.router.app as a; print(a.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=src, env=source_env(src), capture_output=True, text=True, check=True
    )
    path = out.stdout.strip()
    if not Path(path).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"router source {src}: serving.router.app imports from {path}, not from the copy")
    return path


def start_router(port: int, backend_url: str, src: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "serving.router", "--port", str(port), "-b", f"m0=mixed@{backend_url}"]
    return subprocess.Popen(cmd, cwd=src, env=source_env(src), stderr=subprocess.DEVNULL)


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


async def drive(
    targets: dict[str, str], rate: float, duration_s: float
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Open loop: request i of target k (of K) at ``(i + k/K) / rate``; latencies and errors per target."""
    import aiohttp

    body = {"model": "tiny", "prompt": "hello router", "max_tokens": 1}
    lat: dict[str, list[float]] = {k: [] for k in targets}
    errors = dict.fromkeys(targets, 0)
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

        for kind, url in targets.items():  # warm connections
            await asyncio.gather(*(one(kind, url) for _ in range(20)))
        lat = {k: [] for k in targets}
        errors = dict.fromkeys(targets, 0)
        n = int(rate * duration_s)
        start = time.perf_counter()
        tasks = []
        k_all = len(targets)
        for i in range(n):
            for k, (kind, url) in enumerate(targets.items()):
                due = start + (i + k / k_all) / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(kind, url)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    print(
        f"sent {n} requests to each of {list(targets)} in {elapsed:.1f} s; errors {errors}", file=sys.stderr
    )
    return {k: np.array(v) for k, v in lat.items()}, errors


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


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentiles_ms(values: np.ndarray) -> dict[str, float]:
    return {k: round(float(np.percentile(values, v)) * 1e3, 3) for k, v in PCT.items()}


def one_run(sources: dict[str, Path], rate: float, duration_s: float, metrics_lines: int) -> dict[str, Any]:
    """Start the fake backend and one router per source, drive them all with the direct path, stop them."""
    backend_port = free_port()
    backend_url = f"http://127.0.0.1:{backend_port}"
    router_urls = {name: f"http://127.0.0.1:{free_port()}" for name in sources}
    fake = [
        sys.executable,
        __file__,
        "--serve-fake",
        str(backend_port),
        "--metrics-lines",
        str(metrics_lines),
    ]
    procs = [subprocess.Popen(fake)]
    procs += [
        start_router(int(router_urls[name].rsplit(":", 1)[1]), backend_url, src)
        for name, src in sources.items()
    ]
    load_before = os.getloadavg()
    pages: dict[str, str] = {}
    try:
        loop = new_event_loop()  # uvloop when installed, as the router and the fake backend use
        for url in (backend_url, *router_urls.values()):
            loop.run_until_complete(wait_up(url))
        cpu0 = {name: cpu_s(p.pid) for name, p in zip(sources, procs[1:], strict=True)}
        lat, errors = loop.run_until_complete(drive({**router_urls, "direct": backend_url}, rate, duration_s))
        cpu = {name: cpu_s(p.pid) - cpu0[name] for name, p in zip(sources, procs[1:], strict=True)}
        loop.close()
        for name, url in router_urls.items():
            with urllib.request.urlopen(url + "/metrics") as resp:
                pages[name] = resp.read().decode()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    load_after = os.getloadavg()
    out: dict[str, Any] = {
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_avg_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
        "completed": {k: int(v.size) for k, v in lat.items()},
        "errors": errors,
        "direct_ms": percentiles_ms(lat["direct"]),
    }
    for name in sources:
        key = "router" if name == "after" and len(sources) == 1 else name
        out[f"{key}_ms"] = percentiles_ms(lat[name])
        out[f"{key}_overhead_ms"] = {k: round(out[f"{key}_ms"][k] - out["direct_ms"][k], 3) for k in PCT}
        # the router process's whole CPU time over the run (polls and warm-up included) per request served
        out[f"{key}_cpu_ms_per_request"] = round(cpu[name] * 1e3 / max(1, lat[name].size + 20), 3)
        out[f"{key}_histogram_overhead_ms_upper_bound"] = {
            k: histogram_quantile(pages[name], v / 100) * 1e3 for k, v in PCT.items()
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rate", type=float, default=200.0, help="requests/s to each router (and as many direct)"
    )
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=1, help="repeat with fresh processes")
    parser.add_argument("--before", type=Path, default=None, help="also run a router from this source tree")
    parser.add_argument(
        "--compare", action="append", default=[], metavar="NAME=DIR", help="another router's source tree"
    )
    parser.add_argument(
        "--metrics-lines", type=int, default=0, help="fake backend /metrics page size (0: none)"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--serve-fake", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake is not None:
        serve_fake(args.serve_fake, args.metrics_lines)
        return

    sources: dict[str, Path] = {"after": REPO}
    extra = ([f"before={args.before}"] if args.before is not None else []) + args.compare
    for item in extra:
        name, sep, path = item.partition("=")
        if not sep or not name or name in sources or name == "direct":
            raise SystemExit(f"--compare {item!r}: expected a new NAME=DIR (NAME not after/direct)")
        sources[name] = Path(path)
    imports = {name: imported_from(src) for name, src in sources.items()}
    head: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, shared (noisy)",
        "event_loop": type(new_event_loop()).__module__,
        "rate_rps_each": args.rate,
        "duration_s": args.duration_s,
        "metrics_lines": args.metrics_lines,
        "router_sources": imports,
    }
    runs = [one_run(sources, args.rate, args.duration_s, args.metrics_lines) for _ in range(args.runs)]
    if len(sources) == 1 and args.runs == 1:  # the original single-router output
        doc: dict[str, Any] = head | runs[0]
    else:
        doc = head | {"runs": runs}
        if "before" in sources:
            for run in runs:
                run["after_over_before_overhead"] = {
                    k: round(run["after_overhead_ms"][k] / run["before_overhead_ms"][k], 3)
                    if run["before_overhead_ms"][k] > 0
                    else None
                    for k in PCT
                }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
