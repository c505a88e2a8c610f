"""The simulator's share of one ``pdscale replay`` (a policy in the loop): CPU seconds inside
``Simulator.run_until`` (arrivals, events, the engine) against the whole process (imports, the trace, the policy,
the forecaster, the per-tick scrapes and the report).

Runs the CLI in this process with ``Simulator.run_until`` wrapped to add up its ``time.process_time``; prints one
JSON line. The tree measured is the one on ``PYTHONPATH`` (this script adds none), so one copy of the script
measures two trees: ``PYTHONPATH=TREE .venv/bin/python bench/bench_replay_share.py``.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_replay_share.py
     [--trace datasets/azure2023/AzureLLMInferenceTrace_code.dev_before_1850.csv] [--policy predictive]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / "datasets" / "azure2023" / "AzureLLMInferenceTrace_code.dev_before_1850.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--policy", default="predictive")
    args = ap.parse_args()
    cpu0 = time.process_time()
    from serving.sim.engine import Simulator
    from training.pdscale_cli import main as cli

    inner = Simulator.run_until
    spent = [0.0]

    def timed(self: Simulator, t_s: float) -> None:
        c0 = time.process_time()
        inner(self, t_s)
        spent[0] += time.process_time() - c0

    Simulator.run_until = timed  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "replay.json"
        sys.argv = [
            "pdscale",
            "replay",
            "--trace",
            str(args.trace),
            "--policy",
            args.policy,
            "--json",
            str(out),
        ]
        try:
            cli()
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        doc: dict[str, Any] = json.loads(out.read_text())
    total = time.process_time() - cpu0
    print(
        json.dumps(
            {
                "process_cpu_s": round(total, 2),
                "run_until_cpu_s": round(spent[0], 2),
                "share": round(spent[0] / total, 3),
                "slo_attainment": doc["slo_attainment"],
                "gpu_seconds": doc["gpu_seconds"],
                "loadavg_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
