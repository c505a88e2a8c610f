"""Shared checks for the bench/gen_shapes_s*.py traffic-shape generators' tests."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np

from serving.workload.readers import read_trace
from serving.workload.trace import Trace


def assert_written_and_read_back(
    gen: ModuleType,
    out: Path,
    shapes: dict[str, tuple[str, Trace]],
    prefix: str,
    count: int,
    minutes: tuple[float, float] = (25.0, 40.0),
) -> None:
    """``gen.main(["--out", out])`` writes every shape of ``shapes`` as ``{prefix}*.csv`` (``count`` of them), and
    each reads back whole: the same requests, times from 0, and a duration within ``minutes``."""
    assert gen.main(["--out", str(out)]) == 0
    files = sorted(p.stem for p in out.glob(f"{prefix}*.csv"))
    assert files == sorted(shapes) and len(files) == count
    for name, (_, trace) in shapes.items():
        back = read_trace(out / f"{name}.csv")
        assert len(back) == len(trace), name
        assert np.allclose(back.arrival_s, trace.arrival_s - trace.arrival_s[0], atol=1e-3), name
        assert back.prompt_tokens.tolist() == trace.prompt_tokens.tolist(), name
        assert back.output_tokens.tolist() == trace.output_tokens.tolist(), name
        assert minutes[0] * 60 <= back.duration_s <= minutes[1] * 60, (name, back.duration_s)
