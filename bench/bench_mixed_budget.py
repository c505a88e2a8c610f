"""The fleet GPU budget with a mixed-node pool, before and after counting a node's GPUs once (issue 8, W7).

Run: ``git archive <before-commit> | tar -x -C /tmp/before`` (a clean copy of the code before the fix), then
``nice .venv/bin/python bench/bench_mixed_budget.py --before /tmp/before`` (``--traces conv,code``,
``--policies reactive,predictive``, ``--budgets 1.0,1.5``, ``--json OUT``).

For each bundled Azure 2023 trace (first 1000 s), a fleet file like ``examples/fleet-mixed-node.yaml`` (the same
trace on two llama3-8b/a100 pools, TTFT 1 s / ITL 50 ms, 1-16 per role: one ``placement: mixed-node``, one
dedicated) with ``gpu_budget`` at each fraction of the summed peak demand (``serving.sim.fleet_file
.peak_demand_gpus``, a mixed node counted once; at least 3 GPUs, the pools' minimums), and each policy, this
runs ``pdscale replay --fleet FILE --policy P --json OUT`` (shared split, the CLI's defaults: the fleet reserve
on, each pool's static share guaranteed; predictive with the shipped checkpoint) twice: with the ``--before``
tree on ``PYTHONPATH`` and with this checkout. Columns: fleet and per-pool SLO attainment, GPU-seconds, and the
fleet's mean GPUs held (GPU-s / simulated seconds) against the budget. Every figure except wall seconds is
deterministic (virtual clock).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT / "datasets" / "azure2023"
TRACES = {
    "conv": AZURE / "AzureLLMInferenceTrace_conv.dev_before_1850.csv",
    "code": AZURE / "AzureLLMInferenceTrace_code.dev_before_1850.csv",
}
MIN_BUDGET = 3  # the mixed pool's 1 node + the dedicated pool's 1 prefill + 1 decode


def fleet_doc(trace: Path, budget: int) -> dict[str, Any]:
    pool: dict[str, Any] = {
        "profile": "llama3-8b/a100",
        "trace": str(trace),
        "slo_ttft_ms": 1000,
        "slo_itl_ms": 50,
        "prefill": {"min": 1, "max": 16},
        "decode": {"min": 1, "max": 16},
    }
    return {
        "gpu_budget": budget,
        "duration_s": 1000,
        "pools": [{"name": "mixed", "placement": "mixed-node", **pool}, {"name": "dedicated", **pool}],
    }


def peak_gpus(trace: Path) -> int:
    """The summed peak demand of the two pools (the fleet file's loader and the capacity model)."""
    from serving.sim.fleet_file import load_fleet_file, peak_demand_gpus

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.yaml"
        path.write_text(yaml.safe_dump(fleet_doc(trace, 1024)))
        fleet = load_fleet_file(path)
    return sum(peak_demand_gpus(p, fleet.traces[p.name]) for p in fleet.spec.pools)


def run(tree: Path, fleet: Path, policy: str, out: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", "from training.pdscale_cli import main; main()", "replay"]
    cmd += ["--fleet", str(fleet), "--policy", policy, "--json", str(out)]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"pdscale replay --fleet {fleet} --policy {policy} (PYTHONPATH={tree}) exited {done.returncode}:\n"
            f"{done.stderr[-4000:]}"
        )
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def row(doc: dict[str, Any]) -> dict[str, Any]:
    pools = doc["pools"]
    return {
        "slo": doc["slo_attainment"],
        "gpu_s": doc["gpu_seconds"],
        "mean_gpus": doc["gpu_seconds"] / doc["sim_end_s"],
        "mixed_slo": pools["mixed"]["slo_attainment"],
        "mixed_gpu_s": pools["mixed"]["gpu_seconds"],
        "dedicated_slo": pools["dedicated"]["slo_attainment"],
        "dedicated_gpu_s": pools["dedicated"]["gpu_seconds"],
        "dropped": doc["dropped"],
        "unfinished": doc["unfinished"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="a clean copy of the code before the fix")
    ap.add_argument("--traces", default="conv,code")
    ap.add_argument("--policies", default="reactive,predictive")
    ap.add_argument("--budgets", default="1.0,1.5", help="fractions of the summed peak demand")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": ROOT}
    results: list[dict[str, Any]] = []
    print("| trace | budget (peak) | policy | code | fleet SLO | mixed SLO | dedicated SLO | mixed GPU-s |"
          " dedicated GPU-s | mean GPUs held |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for trace in args.traces.split(","):
            peak = peak_gpus(TRACES[trace])
            for frac in (float(f) for f in args.budgets.split(",")):
                budget = max(math.floor(frac * peak + 0.5), MIN_BUDGET)
                fleet = Path(tmp) / f"{trace}-{budget}.yaml"
                fleet.write_text(yaml.safe_dump(fleet_doc(TRACES[trace], budget)))
                for policy in args.policies.split(","):
                    for label, tree in trees.items():
                        t0 = time.monotonic()
                        r = row(run(tree, fleet, policy, Path(tmp) / "out.json"))
                        r |= {"trace": trace, "budget": budget, "peak": peak, "policy": policy, "code": label}
                        r["wall_s"] = time.monotonic() - t0
                        results.append(r)
                        print(
                            f"| {trace} | {budget} ({peak}) | {policy} | {label} | {r['slo']:.4f} |"
                            f" {r['mixed_slo']:.4f} | {r['dedicated_slo']:.4f} | {r['mixed_gpu_s']:,.0f} |"
                            f" {r['dedicated_gpu_s']:,.0f} | {r['mean_gpus']:.2f} of {budget} |",
                            flush=True,
                        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
