"""QoS: the request's priority class and the strict-priority wait for a backend slot.

``x-pdscale-priority: vip|normal|batch`` maps to P0, P1, P2 (``serving.workload.trace.PRIORITY_*``); no
header is ``normal``. When no backend of a stage can take a request (all at their in-flight cap,
unhealthy, draining or on full nodes) the request waits in that stage's queue; every freed slot wakes
the queue head, lowest priority number first, FIFO within a class. A request also waits behind an
already-queued one of the same stage (no overtaking).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from serving.workload.trace import PRIORITY_NAMES, PRIORITY_NORMAL

PRIORITY_HEADER = "x-pdscale-priority"
CLIENT_HEADER = "x-pdscale-client"
CLASS_NAMES: dict[int, str] = {v: k for k, v in PRIORITY_NAMES.items()}


class QosError(ValueError):
    """A bad QoS header (the message names it); the router answers 400."""


class QueueFull(RuntimeError):
    """The stage's queue is at its limit; the router answers 503."""


class QueueTimeout(RuntimeError):
    """No backend slot within the queue timeout; the router answers 503."""


def parse_priority(value: str | None) -> int:
    """The priority number for a header value (None or empty: normal)."""
    if value is None or not value.strip():
        return PRIORITY_NORMAL
    key = value.strip().lower()
    if key not in PRIORITY_NAMES:
        raise QosError(f"{PRIORITY_HEADER}: {value!r} is not one of {', '.join(PRIORITY_NAMES)}")
    return PRIORITY_NAMES[key]


Pick = Callable[[], "str | None"]  # choose a backend and count it in flight, or None


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    future: asyncio.Future[str] = field(compare=False)
    pick: Pick = field(compare=False)
    gone: bool = field(default=False, compare=False)


class AdmissionQueues:
    """One strict-priority queue per stage. Use from one event loop only."""

    def __init__(self, max_queue: int = 10_000) -> None:
        self.max_queue = max_queue
        self._heaps: dict[str, list[_Waiter]] = {}
        self._seq = itertools.count()

    async def admit(
        self,
        stage: str,
        priority: int,
        pick: Pick,
        timeout_s: float,
        abandon: Callable[[str], None],
        on_wait: Callable[[], None] | None = None,
    ) -> str:
        """A backend id (already counted in flight) for a request of ``priority`` at ``stage``.

        ``abandon(id)`` gives a slot back when the waiting task is cancelled just after it was handed one.
        ``on_wait()`` is called once when no slot is free at once (before the request queues or is refused
        for a full queue): the router counts such a request as it arrives, not when it is dispatched.
        """
        heap = self._heaps.setdefault(stage, [])
        if not any(not w.gone for w in heap):
            heap.clear()
            chosen = pick()
            if chosen is not None:
                return chosen
        if on_wait is not None:
            on_wait()
        if self.waiting(stage) >= self.max_queue:
            raise QueueFull(f"{stage} queue holds {self.max_queue} requests (router max_queue)")
        waiter = _Waiter(priority, next(self._seq), asyncio.get_running_loop().create_future(), pick)
        heapq.heappush(heap, waiter)
        try:
            await asyncio.wait({waiter.future}, timeout=timeout_s)
        except BaseException:  # cancelled (client went away): leave the queue, give back a handed slot
            waiter.gone = True
            if waiter.future.done():
                abandon(waiter.future.result())
            raise
        if waiter.future.done():
            return waiter.future.result()
        waiter.gone = True  # left lazily in the heap; wake() skips it
        raise QueueTimeout(f"no {stage} backend slot within {timeout_s:g} s (router queue_timeout_s)")

    def wake(self) -> None:
        """Hand freed slots to queue heads, best priority first, until a head cannot be placed."""
        for heap in self._heaps.values():
            while heap:
                head = heap[0]
                if head.gone or head.future.done():
                    heapq.heappop(heap)
                    continue
                chosen = head.pick()
                if chosen is None:
                    break
                heapq.heappop(heap)
                head.future.set_result(chosen)

    def waiting(self, stage: str) -> int:
        return sum(1 for w in self._heaps.get(stage, ()) if not w.gone and not w.future.done())

    def lengths(self) -> dict[tuple[str, int], int]:
        """Requests waiting per (stage, priority)."""
        out: dict[tuple[str, int], int] = {}
        for stage, heap in self._heaps.items():
            for w in heap:
                if not w.gone and not w.future.done():
                    out[stage, w.priority] = out.get((stage, w.priority), 0) + 1
        return out
