"""Does training on a replayed trace help, and under which replay policy? Small ``train-forecaster fit`` runs,
arm by arm and seed by seed, each scored by ``train-forecaster evaluate T`` on the trace's last 30 % (the part
every fit holds out; arrivals as the trace has them, ``gen_tps`` counted at arrival):

* ``trace``: ``fit --trace T --copies 4``;
* ``trace+replay:POLICY``: the same plus ``--replay T --replay-policy POLICY`` (``reactive``, ``dynamo-like``,
  ``predictive``, ``predictive-holt``; or ``--replay SPEC`` for another trace or a named workload);
* ``trace+copy``: ``--copies 5`` instead: one more augmented copy of T, as many training series as a replay arm
  (a control for "more series").

Prints per seed and the mean over seeds, for the learned and combined rows, arrivals MAE / pinball p90 / p90
coverage and the token MAEs, and each arm's ratio to the first arm. Small fits (a minute or two each), so this
says whether the path works and which way it points, not what a full fit gains.

Run: OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_replay_fit.py [--trace FILE] [--seeds 0,1,2]
    [--epochs 5] [--arms trace,trace+replay:reactive,trace+replay:predictive,trace+copy] [--replay SPEC]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.replay_frames import REPLAY_POLICIES  # noqa: E402

DEFAULT_TRACE = ROOT / "datasets" / "azure2023" / "AzureLLMInferenceTrace_code.dev_before_1850.csv"
ROWS = ("learned", "combined")
METRICS = ("mae", "pinball_p90", "coverage_p90", "prompt_mae", "gen_mae")


def _cli(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "training.cli", *args], env=env, capture_output=True, text=True
    )
    if run.returncode != 0:
        raise SystemExit(
            f"train-forecaster {' '.join(args[:1])} failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}"
        )


def _scores(path: Path) -> dict[str, dict[str, float]]:
    models = json.loads(path.read_text())["models"]
    out = {}
    for row in ROWS:
        m = models[row]
        out[row] = {
            "mae": m["mae"],
            "pinball_p90": m["pinball_p90"],
            "coverage_p90": m["coverage_p90"],
            "prompt_mae": m["prompt_tokens"]["mae"],
            "gen_mae": m["gen_tokens"]["mae"],
        }
    return out


def arm_args(arm: str, trace: str, replay: str) -> list[str]:
    """The fit options of one arm (``trace``, ``trace+copy``, ``trace+replay:POLICY``)."""
    if arm == "trace":
        return ["--copies", "4"]
    if arm == "trace+copy":
        return ["--copies", "5"]
    kind, _, policy = arm.partition(":")
    if kind == "trace+replay" and policy in REPLAY_POLICIES:
        return ["--copies", "4", "--replay", replay, "--replay-policy", policy]
    raise SystemExit(
        f"--arms: unknown arm {arm!r}; known: trace, trace+copy, "
        + ", ".join(f"trace+replay:{p}" for p in REPLAY_POLICIES)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trained on and scored on (last 30 %%)")
    ap.add_argument("--replay", default=None, help="what the replay arms replay (default: --trace)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--windows-per-epoch", type=int, default=256)
    ap.add_argument("--arms", default="trace,trace+replay:reactive,trace+replay:predictive,trace+copy")
    args = ap.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    t = str(args.trace)
    replay = args.replay or t
    for arm in arms:
        arm_args(arm, t, replay)  # unknown arms fail before any fit
    seeds = [int(s) for s in args.seeds.split(",") if s]
    results: dict[str, list[dict[str, dict[str, float]]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="bench_replay_fit_") as tmp:
        for seed in seeds:
            common = [
                "--epochs", str(args.epochs), "--windows-per-epoch", str(args.windows_per_epoch),
                "--seq-len", "128", "--burn-in", "16", "--batch-size", "8", "--hidden", "16", "--layers", "1",
                "--heads", "2", "--window", "16", "--synthetic", "0", "--accelerator", "cpu",
                "--threads", "1", "--quiet", "--seed", str(seed),
            ]  # fmt: skip
            for arm in arms:
                out = Path(tmp) / f"{arm.replace(':', '-')}-{seed}"
                t0 = time.perf_counter()
                _cli("fit", "--trace", t, *arm_args(arm, t, replay), *common, "--out", str(out))
                ev = out / "eval.json"
                _cli("evaluate", t, "--checkpoint", str(out / "forecaster.safetensors"), "--no-arima",
                     "--json", str(ev))  # fmt: skip
                results[arm].append(_scores(ev))
                s = results[arm][-1]
                print(f"seed {seed} {arm:26s} ({time.perf_counter() - t0:5.0f} s) " + "  ".join(
                    f"{row}: mae {s[row]['mae']:.3f} pinball90 {s[row]['pinball_p90']:.3f} "
                    f"cov90 {s[row]['coverage_p90']:.3f} prompt_mae {s[row]['prompt_mae']:.0f} "
                    f"gen_mae {s[row]['gen_mae']:.1f}" for row in ROWS), flush=True)  # fmt: skip
    print(f"\nmean over seeds {seeds} (trace {t}, replay {replay}, scored: the trace's last 30 %)")
    print(f"{'row':9s} {'metric':13s} " + " ".join(f"{a:>26s}" for a in arms) + "  (ratio to the first)")
    for row in ROWS:
        for metric in METRICS:
            means = [sum(r[row][metric] for r in results[a]) / len(seeds) for a in arms]
            ratios = " ".join(f"{m / means[0] if means[0] else float('nan'):7.3f}" for m in means[1:])
            print(f"{row:9s} {metric:13s} " + " ".join(f"{m:26.3f}" for m in means) + f"  {ratios}")


if __name__ == "__main__":
    main()
