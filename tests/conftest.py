"""Shared fixtures. Keep this small: helpers live in ``tests/support``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.support.prometheus import PrometheusServer, ScrapeJob


def on_ci() -> bool:
    """True when the environment says CI (``CI=true``/``1``), where missing real parts must fail, not skip."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    """Path of the ``prometheus`` binary (``promtool`` beside it).

    Skips only when the binary is genuinely absent and we are not on CI; on CI the test command installs
    it (``bash scripts/setup.sh --test``), so its absence there is a failure.
    """
    path = shutil.which("prometheus")
    promtool = shutil.which("promtool")
    if path is not None and promtool is not None:
        return path
    message = (
        "Prometheus is not installed (need `prometheus` and `promtool` on PATH): "
        "apt-get install -y --no-install-recommends prometheus, or bash scripts/setup.sh --test"
    )
    if on_ci():
        pytest.fail(f"CI=true and {message}")
    pytest.skip(message)


@pytest.fixture
def start_prometheus(prometheus_bin: str) -> Iterator[Callable[..., PrometheusServer]]:
    """A factory: ``start_prometheus(jobs, **kwargs)`` starts a ready server; all are stopped at teardown."""
    servers: list[PrometheusServer] = []

    def start(jobs: Sequence[ScrapeJob] = (), **kwargs: object) -> PrometheusServer:
        server = PrometheusServer(prometheus_bin, jobs, **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        return server.__enter__()

    yield start
    for server in servers:
        server.stop()
