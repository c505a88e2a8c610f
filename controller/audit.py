"""The decision audit log: one JSON line per pool per tick — what was seen, forecast, decided and applied.

Read it back with ``read_audit(path)`` (or ``jq``). NaN (unknown) is written as ``null``, never as 0.
The file is appended to and flushed after every tick, so a killed controller loses at most the tick it was in.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from controller.actuators.base import ApplyResult
from controller.pipeline import PoolCounts, PoolDecision

AUDIT_VERSION = 1


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def decision_record(
    now_s: float,
    decision: PoolDecision,
    counts: PoolCounts,
    *,
    leader: bool,
    applied: ApplyResult | None,
    skipped: str | None,
    error: str | None = None,
    forecaster: str = "",
) -> dict[str, Any]:
    """The audit entry of one pool's tick (JSON-ready)."""
    plan, fc, load = decision.plan, decision.forecast, decision.load
    return {
        "v": AUDIT_VERSION,
        "time_s": now_s,
        "time": datetime.fromtimestamp(now_s, tz=UTC).isoformat(timespec="milliseconds"),
        "pool": decision.pool,
        "leader": leader,
        "current": {
            r: {"replicas": counts.replicas.get(r, 0), "standby": counts.standby.get(r, 0)}
            for r in counts.replicas
        },
        "load": {
            "arrival_rps": _num(load.arrival_rps),
            "prompt_tps": _num(load.prompt_tps),
            "gen_tps": _num(load.gen_tps),
            "running": _num(load.running),
            "waiting": _num(load.waiting),
            "complete": decision.observation.complete,
        },
        "forecaster": forecaster,
        "forecast": None
        if fc is None
        else {
            "horizon_s": fc.horizon_s,
            "arrivals_p50": _num(fc.arrivals_p50),
            "arrivals_p90": _num(fc.arrivals_p90),
            "prompt_tokens_p90": _num(fc.prompt_tokens_p90),
            "gen_tokens_p90": _num(fc.gen_tokens_p90),
            "burst_prob": _num(fc.burst_prob),
        },
        "plan": None
        if plan is None
        else {
            "prefill": plan.prefill,
            "decode": plan.decode,
            "standby_prefill": plan.standby_prefill,
            "standby_decode": plan.standby_decode,
            "buffer_seqs": plan.buffer_seqs,
            "degrade": plan.degrade,
            "silent": plan.silent,
        },
        "reasons": list(decision.reasons),
        "applied": None
        if applied is None
        else {
            "targets": {r: {"active": a, "standby": s} for r, (a, s) in applied.targets.items()},
            "changes": [
                {"role": c.role, "tier": c.tier, "target": c.target, "before": c.before, "after": c.after}
                for c in applied.changes
            ],
            "dry_run": applied.dry_run,
            "notes": list(applied.notes),
        },
        "skipped": skipped,
        "error": error,
    }


class AuditLog:
    """Appends JSON lines to ``path`` (parent folders created); thread-safe; a context manager."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, allow_nan=False, separators=(",", ":"))
        with self._lock:
            if self._file is None:
                raise RuntimeError(f"audit log {self.path} is closed")
            self._file.write(line + "\n")

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_audit(path: Path) -> list[dict[str, Any]]:
    """Every entry of an audit log; a malformed line is an error naming the file and line."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not a JSON line: {exc}") from exc
    return out
