"""The Poisson rise test (``controller.policy.rise``) against the line detector (``stages.trend_factor``), and
what seeing the sinusoid's first rise earlier could buy at most.

Part 1 (offline, no simulator): per-second Poisson counts fed through the policy's rate history, one call a
second, over ``--seeds`` seeds. Rises (150 s flat, then a sinusoid leaving its trough or a linear ramp): the
median and worst second into the rise at which each detector first reads it (never: counted apart). Not
rises: constant Poisson rates (600 s a seed) and the bundled traces' per-second arrivals: the seconds read.

Part 2 (``--ceiling``): the 600-s sinusoid of bench_policies.py (1 <-> 24 req/s from its trough, starting
fleet 1 prefill + 1 decode, 120-s cold starts) replayed by the oracle (knows every arrival) that asks for
nothing until T s (the fleet stays at 1 + 1) and from T on sizes for the true load, with no headroom or
the predictive policy's 30 %: the most any detector that reads the rise at T can buy.

Part 3 (``--cost``): CPU µs per call of each detector on a 130-s history, flat and rising.

Deterministic (seeded) but for part 3. Run: .venv/bin/python bench/bench_rise.py [--ceiling] [--cost]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_policies import run, workload
from controller.policy import rise, stages
from controller.replay_policies import OraclePolicy
from serving.sim.replay import ReplayView, ScaleCommand

LEAD_S = 120.0
History = tuple[tuple[float, float], ...]
Detector = Callable[[History, float, float], tuple[float, str | None]]
DETECTORS: dict[str, Detector] = {"line": stages.trend_factor, "poisson": rise.rise_factor}
FLAT_S = 150


def fires(counts: np.ndarray, detector: Detector) -> list[int]:
    """The seconds at which ``detector`` reads a rise."""
    history: History = ()
    out = []
    for t, c in enumerate(counts):
        history = stages.update_rate_history(history, float(t), float(c))
        if detector(history, float(t), LEAD_S)[1] is not None:
            out.append(t)
    return out


def rise_rates(name: str, n: int) -> np.ndarray:
    t = np.clip(np.arange(float(n)) - FLAT_S, 0.0, None)
    kind, _, arg = name.partition(" ")
    x = float(arg)
    if kind == "sine":
        return 12.5 - 11.5 * np.cos(2 * np.pi * t / x)
    return 2.0 + 22.0 * np.minimum(t / x, 1.0)


def part1(seeds: int) -> None:
    print(f"Rises ({seeds} seeds): second into the rise first read, median / worst (never: of {seeds})")
    print("| rise | line | poisson |")
    print("|---|---|---|")
    for name in ("sine 300", "sine 600", "sine 1200", "sine 3600", "ramp 600", "ramp 1800"):
        span = float(name.split()[1])
        n = int(FLAT_S + (span / 2 if name.startswith("sine") else span))
        rates = rise_rates(name, n)
        cells = []
        for det in DETECTORS.values():
            seen, never = [], 0
            for seed in range(seeds):
                read = [
                    t - FLAT_S for t in fires(np.random.default_rng(seed).poisson(rates), det) if t > FLAT_S
                ]
                if read:
                    seen.append(read[0])
                else:
                    never += 1
            med = f"{statistics.median(seen):.0f} / {max(seen)}" if seen else "-"
            cells.append(med + (f" (never: {never})" if never else ""))
        print(f"| {name} s | {' | '.join(cells)} |", flush=True)
    print()
    print("Not rises: seconds read")
    print("| traffic | line | poisson |")
    print("|---|---|---|")
    for lam in (1.0, 4.0, 12.0, 24.0):
        streams = [np.random.default_rng(1000 + s).poisson(lam, 600) for s in range(seeds)]
        cells = [f"{sum(len(fires(c, det)) for c in streams)} of {600 * seeds}" for det in DETECTORS.values()]
        print(f"| constant {lam:g} req/s, {seeds} × 600 s | {' | '.join(cells)} |", flush=True)
    for name in ("code", "conv", "mmpp", "mmpp-holdout", "mooncake", "mmpp@3", "mmpp@4", "mmpp-holdout@1",
                 "mmpp-holdout@2", "mmpp-diurnal"):  # fmt: skip
        trace, _ = workload(name, None, 600.0)
        counts = np.bincount(np.floor(trace.arrival_s).astype(np.int64))
        cells = []
        for det in DETECTORS.values():
            read = fires(counts, det)
            cells.append(f"{len(read)} of {len(counts)}" + (f" (first {read[0]} s)" if read else ""))
        print(f"| {name} (per-second arrivals) | {' | '.join(cells)} |", flush=True)


class BlindOracle(OraclePolicy):
    """The oracle that asks for nothing before ``blind_s`` (the starting fleet stays), then knows everything."""

    blind_s: float = 0.0

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]:
        return [] if now_s < self.blind_s else super().on_tick(now_s, view)


def part2() -> None:
    trace, fleet = workload("sine", None, 600.0)
    print("\nThe 600-s sinusoid, oracle blind until T s (SLO attained / GPU-s)")
    print("| T s | headroom 0 | headroom 30 % |")
    print("|---|---|---|")
    for blind in (1.0, 30.0, 45.0, 60.0, 70.0):
        cells = []
        for h in (0.0, 0.3):
            pol = BlindOracle(headroom=h)
            pol.blind_s = blind
            rep = run("sine", trace, fleet, pol)
            cells.append(f"{rep.slo_attainment:.2%} / {rep.gpu_seconds:,.0f}")
        print(f"| {blind:.0f} | {' | '.join(cells)} |", flush=True)


def part3(calls: int = 2000) -> None:
    print("\nCPU µs per call, 130-s history (median of 5 rounds)")
    print("| history | line | poisson |")
    print("|---|---|---|")
    rng = np.random.default_rng(3)
    for label, rates in (
        ("flat 12 req/s", np.full(131, 12.0)),
        ("rising 1 → 24 req/s", np.linspace(1, 24, 131)),
    ):
        history: History = tuple((float(t), float(c)) for t, c in enumerate(rng.poisson(rates)))
        cells = []
        for det in DETECTORS.values():
            rounds = []
            for _ in range(5):
                t0 = time.process_time()
                for _ in range(calls):
                    det(history, 130.0, LEAD_S)
                rounds.append((time.process_time() - t0) / calls * 1e6)
            cells.append(f"{statistics.median(rounds):.0f}")
        print(f"| {label} | {' | '.join(cells)} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--ceiling", action="store_true", help="also replay the blind oracle on the sinusoid")
    ap.add_argument("--cost", action="store_true", help="also time each detector per call")
    args = ap.parse_args()
    part1(args.seeds)
    if args.ceiling:
        part2()
    if args.cost:
        part3()


if __name__ == "__main__":
    main()
