"""Time for the daemon loop: a ``Clock`` protocol with a wall and a virtual implementation.

The loop, leader election and telemetry read time only through a ``Clock`` (never ``time`` directly), so
tests step time by hand and a replay can run faster than real time. ``time()`` is Unix seconds (for
timestamps, Prometheus queries and Lease renew times); ``monotonic()`` is for intervals and deadlines.
``sleep`` on the virtual clock advances it instantly.
"""

from __future__ import annotations

import math
import threading
import time as _time
from typing import Protocol


class Clock(Protocol):
    """What the controller asks of time."""

    def time(self) -> float:
        """Unix seconds (wall time)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals, deadlines)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (no-op when <= 0)."""
        ...


class WallClock:
    """The process's clocks (``time.time``, ``time.monotonic``, ``time.sleep``)."""

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            _time.sleep(seconds)


class VirtualClock:
    """Hand-stepped time: ``sleep`` and ``advance`` move it forward at once. Thread-safe.

    ``start_s`` is the Unix time it starts at; ``monotonic()`` counts from 0 at creation.
    """

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        if not math.isfinite(start_s):
            raise ValueError(f"VirtualClock.start_s must be finite, got {start_s!r}")
        self._start_s = start_s
        self._elapsed_s = 0.0
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._start_s + self._elapsed_s

    def monotonic(self) -> float:
        with self._lock:
            return self._elapsed_s

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0, finite)."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"VirtualClock.advance: seconds must be finite and >= 0, got {seconds!r}")
        with self._lock:
            self._elapsed_s += seconds
