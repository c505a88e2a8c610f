"""run_realtime: the real Simulator's virtual clock advanced by an injected wall clock, published to the exporter."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.sim import samples as s
from serving.sim.engine import Simulator
from serving.sim.exporter import SimMetricsExporter, run_realtime
from serving.sim.fleet import single_pool
from serving.workload.trace import Trace


class StepClock:
    """Wall time that moves only when slept; ``lag`` models a late wake-up (sleeping longer than asked)."""

    def __init__(self, lag: float = 1.0) -> None:
        self.t = 100.0
        self.lag = lag

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds * self.lag


def small_sim(duration_s: float = 20.0, rps: float = 5.0) -> Simulator:
    n = int(duration_s * rps)
    trace = Trace.from_arrays(
        np.linspace(0.0, duration_s, n, endpoint=False), np.full(n, 200), np.full(n, 20), source="test"
    )
    return Simulator(single_pool(prefill=1, decode=1), {"default": trace})


def prompt_tokens_on_page(exporter: SimMetricsExporter) -> float:
    total = 0.0
    for family in text_string_to_metric_families(exporter.render().decode()):
        total += sum(x.value for x in family.samples if x.name == s.PROMPT_TOKENS_TOTAL)
    return total


def test_virtual_time_follows_wall_time_times_speed() -> None:
    sim = small_sim()
    ticks: list[float] = []
    with SimMetricsExporter() as exporter:
        end_s = run_realtime(
            sim, exporter, until_s=20.0, speed=10.0, step_s=0.5, clock=StepClock(), on_tick=ticks.append
        )
        assert end_s == 20.0
        assert ticks == [5.0, 10.0, 15.0, 20.0]
        assert exporter.now_s == 20.0
        published = prompt_tokens_on_page(exporter)
    assert published == pytest.approx(float(sim.observe().counters[s.PROMPT_TOKENS_TOTAL].sum()))
    assert 0 < published <= 100 * 200


def test_late_wake_ups_catch_up_and_never_pass_until() -> None:
    ticks: list[float] = []
    with SimMetricsExporter() as exporter:
        run_realtime(
            small_sim(),
            exporter,
            until_s=12.0,
            speed=2.0,
            step_s=1.0,
            clock=StepClock(lag=1.5),
            on_tick=ticks.append,
        )
    assert ticks == [3.0, 6.0, 9.0, 12.0]


def test_stop_event_ends_the_run_early() -> None:
    stop = threading.Event()
    ticks: list[float] = []

    def tick(now_s: float) -> None:
        ticks.append(now_s)
        if now_s >= 4.0:
            stop.set()

    with SimMetricsExporter() as exporter:
        end_s = run_realtime(
            small_sim(),
            exporter,
            until_s=20.0,
            speed=4.0,
            step_s=0.5,
            clock=StepClock(),
            stop=stop,
            on_tick=tick,
        )
    assert (end_s, ticks) == (4.0, [2.0, 4.0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"speed": 0.0}, "speed must be"), ({"step_s": 0.0}, "step_s must be"), ({"until_s": -1.0}, "before")],
    ids=["zero-speed", "zero-step", "until-in-the-past"],
)
def test_rejects_bad_arguments(kwargs: dict[str, float], message: str) -> None:
    args = {"until_s": 5.0, "speed": 1.0, "step_s": 0.1, **kwargs}
    with SimMetricsExporter() as exporter, pytest.raises(ValueError, match=message):
        run_realtime(
            small_sim(),
            exporter,
            until_s=args["until_s"],
            speed=args["speed"],
            step_s=args["step_s"],
            clock=StepClock(),
        )
