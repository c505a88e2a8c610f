"""The columnar trace: every request of a workload as a handful of numpy arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np

PRIORITY_VIP = 0
PRIORITY_NORMAL = 1
PRIORITY_BATCH = 2
PRIORITY_NAMES = {"vip": PRIORITY_VIP, "normal": PRIORITY_NORMAL, "batch": PRIORITY_BATCH}


@dataclass(frozen=True)
class Request:
    """One request, as the router and tests see it (traces keep requests columnar instead)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    priority: int = PRIORITY_NORMAL
    model: str | None = None
    failed: bool = False


@dataclass(frozen=True, eq=False)
class Trace:
    """A workload as parallel arrays, one entry per request, in arrival order.

    ``arrival_s`` is measured from the first arrival of the file (which is 0.0); ``start_time`` is the
    wall-clock time of that first arrival when the format carries one. ``line``: each row's line in the file
    it was read from (1-based, a CSV header is line 1), so that messages about a request can name it; None for
    a trace built in memory.
    """

    arrival_s: np.ndarray  # float64, non-decreasing
    prompt_tokens: np.ndarray  # int64 >= 0
    output_tokens: np.ndarray  # int64 >= 0
    priority: np.ndarray  # int8, PRIORITY_*
    model: np.ndarray  # int16 codes into model_names, -1 = not given
    failed: np.ndarray  # bool
    model_names: tuple[str, ...] = ()
    start_time: datetime | None = None
    source: str = ""
    format: str = ""
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    line: np.ndarray | None = None  # int32/int64, the row's line in its file; None = not read from a file

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "output_tokens", "priority", "model", "failed"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Trace.{name} has {len(getattr(self, name))} rows, arrival_s has {n}")
        if self.line is not None and len(self.line) != n:
            raise ValueError(f"Trace.line has {len(self.line)} rows, arrival_s has {n}")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        """Last arrival minus first arrival (0.0 for fewer than two requests)."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    def take(self, index: np.ndarray | slice) -> Trace:
        """A new trace holding the selected rows (times are not re-based)."""
        return Trace(
            arrival_s=self.arrival_s[index],
            prompt_tokens=self.prompt_tokens[index],
            output_tokens=self.output_tokens[index],
            priority=self.priority[index],
            model=self.model[index],
            failed=self.failed[index],
            model_names=self.model_names,
            start_time=self.start_time,
            source=self.source,
            format=self.format,
            extra={k: v[index] for k, v in self.extra.items()},
            line=None if self.line is None else self.line[index],
        )

    def where(self, i: int) -> str:
        """Row ``i`` for a message: ``FILE:LINE`` when the trace was read from a file, else ``SOURCE request i``
        (``i`` in arrival order)."""
        if self.line is not None:
            return f"{self.source or 'trace'}:{int(self.line[i])}"
        return f"{self.source or 'trace'} request {i} (arrival order)"

    def window(self, t0_s: float, t1_s: float) -> Trace:
        """Requests arriving in [t0_s, t1_s)."""
        lo, hi = np.searchsorted(self.arrival_s, [t0_s, t1_s], side="left")
        return self.take(slice(int(lo), int(hi)))

    @staticmethod
    def from_arrays(
        arrival_s: np.ndarray,
        prompt_tokens: np.ndarray,
        output_tokens: np.ndarray,
        *,
        priority: np.ndarray | None = None,
        source: str = "",
        format: str = "",
    ) -> Trace:
        """Build a trace from the three essential columns; other columns take their defaults."""
        n = len(arrival_s)
        return Trace(
            arrival_s=np.asarray(arrival_s, dtype=np.float64),
            prompt_tokens=np.asarray(prompt_tokens, dtype=np.int64),
            output_tokens=np.asarray(output_tokens, dtype=np.int64),
            priority=(
                np.full(n, PRIORITY_NORMAL, dtype=np.int8)
                if priority is None
                else np.asarray(priority, dtype=np.int8)
            ),
            model=np.full(n, -1, dtype=np.int16),
            failed=np.zeros(n, dtype=bool),
            source=source,
            format=format,
        )


def concat_traces(traces: Sequence[Trace]) -> Trace:
    """One trace holding the rows of ``traces`` in order (chunks of one file, typically).

    Metadata (start_time, source, format) comes from the first trace; ``model_names`` from the last,
    since readers only ever append names, so earlier codes stay valid. All must carry the same ``extra``
    columns; ``line`` is kept when every trace has it.
    """
    if not traces:
        raise ValueError("concat_traces needs at least one trace")
    first, last = traces[0], traces[-1]
    keys = set(first.extra)
    for t in traces:
        if set(t.extra) != keys:
            raise ValueError(f"concat_traces: extra columns differ: {sorted(keys)} vs {sorted(t.extra)}")
    if len(traces) == 1:
        return replace(first, model_names=last.model_names)
    return Trace(
        arrival_s=np.concatenate([t.arrival_s for t in traces]),
        prompt_tokens=np.concatenate([t.prompt_tokens for t in traces]),
        output_tokens=np.concatenate([t.output_tokens for t in traces]),
        priority=np.concatenate([t.priority for t in traces]),
        model=np.concatenate([t.model for t in traces]),
        failed=np.concatenate([t.failed for t in traces]),
        model_names=last.model_names,
        start_time=first.start_time,
        source=first.source,
        format=first.format,
        extra={k: np.concatenate([t.extra[k] for t in traces]) for k in sorted(keys)},
        line=(
            None
            if any(t.line is None for t in traces)
            else np.concatenate([t.line for t in traces if t.line is not None])
        ),
    )
