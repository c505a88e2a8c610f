"""Shared fixtures. Keep this small: helpers live in ``tests/support``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.support.background import MYPY_RUN, mypy_run
from tests.support.prometheus import PrometheusServer, ScrapeJob

MYPY_TEST = "tests/test_static.py::test_mypy_strict_clean"


def on_ci() -> bool:
    """True when the environment says CI (``CI=true``/``1``), where missing real parts must fail, not skip."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the whole-project mypy run as soon as the tests are known, when its test is among them: minutes
    of one core, while most tests leave the other core idle. The test waits for it and asserts on it."""
    if any(item.nodeid == MYPY_TEST for item in session.items):
        session.config.stash[MYPY_RUN] = mypy_run()


def pytest_sessionfinish(session: pytest.Session) -> None:
    run = session.config.stash.get(MYPY_RUN, None)
    if run is not None:
        run.kill()


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
