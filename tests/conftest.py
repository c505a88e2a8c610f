"""Shared fixtures. Keep this small: helpers live in ``tests/support``."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from tests.support.background import MYPY_RUN, mypy_run
from tests.support.prometheus import PrometheusServer, ScrapeJob

MYPY_TEST = "tests/test_static.py::test_mypy_strict_clean"


def on_ci() -> bool:
    """True when the environment says CI (``CI=true``/``1``), where missing real parts must fail, not skip."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def in_xdist_worker() -> bool:
    """True inside a pytest-xdist worker (the README's test command runs ``-n 2``)."""
    return "PYTEST_XDIST_WORKER" in os.environ


VLLM_DIR = "tests/vllm/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that starts real vLLM servers lives in ``tests/vllm/`` (checked here), which the xdist
    scheduler below hands to one worker as a whole. In a worker those tests also come first, so that group
    starts at once instead of last, alone, on an idle machine."""
    stray = [i.nodeid for i in items if i.get_closest_marker("vllm") and not i.nodeid.startswith(VLLM_DIR)]
    if stray:
        raise pytest.UsageError(f"tests marked vllm must live in {VLLM_DIR} (tests/conftest.py): {stray[:3]}")
    if in_xdist_worker():
        items.sort(key=lambda i: not i.nodeid.startswith(VLLM_DIR))  # stable: tests/vllm first


if importlib.util.find_spec("xdist") is not None:
    from xdist.scheduler import LoadScopeScheduling

    class _FileScheduling(LoadScopeScheduling):
        """``-n N``'s scheduler here: each test file whole on one worker, so its module fixtures (a
        Prometheus, an API server, a fitted model) are set up once, as in a serial run; and all of
        ``tests/vllm/`` as one unit, so no two real vLLM servers start at once (on 2 cores each would take
        about twice as long, near the start timeouts) while the CPU tests run beside them. Units go out in
        collection order (the vLLM unit first: see ``pytest_collection_modifyitems``). Written as a scheduler
        because xdist's ``--dist loadgroup`` marks do not reach the scheduler under pytest 9.2
        (pytest-dev/pytest-xdist#1386)."""

        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return "vllm" if nodeid.startswith(VLLM_DIR) else nodeid.split("::", 1)[0]

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
        """The file scheduler for ``-n N`` (xdist's default ``--dist load``); any other ``--dist`` as asked."""
        return _FileScheduling(config, log) if config.getvalue("dist") == "load" else None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the whole-project mypy run as soon as the tests are known, when its test is among them: minutes
    of one core, while most tests leave the other core idle. The test waits for it and asserts on it. Not in
    an xdist worker: every worker collects every test, each would start one, and the two workers already keep
    both cores busy (the test then runs mypy itself)."""
    if not in_xdist_worker() and any(item.nodeid == MYPY_TEST for item in session.items):
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
