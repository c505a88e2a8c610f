"""The ramp detector alone, before against after, and the most any causal policy can get on the sinusoid.

Part 1 (offline, no simulator): per-second Poisson arrival counts fed through the policy's rate history, one
``trend_factor`` call per second, for the detector before this change (4 consecutive rising 30-s blocks, the
median rise 2 standard errors above the blocks' noise; copied here as ``blocks_trend``) and after it
(``controller.policy.stages.trend_factor``). Rises (sinusoids from the trough, linear ramps after 150 s flat):
the second of the rise at which the ramp is first seen, and the projected factor against the true rate ratio
``rate(t + lead) / rate(t)`` there. Not ramps (constant Poisson rates, steps, and the per-second arrivals of
the bundled bursty traces): the seconds at which a trend is read, and Σ(factor − 1) over them (the excess
the projection asks for, in "current loads × seconds").

Part 2 (``--ceiling``): the 1<->24 req/s sinusoid of bench_policies.py replayed by the oracle (knows every
arrival, same 120-s cold starts) when its t = 0 answer is *not* its starting fleet: it starts, like every
other policy, at the fleet's initial 1 prefill + 1 decode. No causal policy can beat it; it bounds what seeing
a ramp early can buy on that workload.

Deterministic (seeded); only the wall seconds depend on the machine.

Run: .venv/bin/python bench/bench_trend.py [--ceiling] [--sine-periods 300,600,1200,3600]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_policies import run, workload
from controller.policy import stages
from controller.replay_policies import OraclePolicy
from serving.sim.replay import ReplayView, ScaleCommand

LEAD_S = 120.0
History = tuple[tuple[float, float], ...]
Detector = Callable[[History, float, float], tuple[float, str | None]]

OLD_BLOCK_S, OLD_BLOCKS, OLD_MIN_Z = 30.0, 4, 2.0


def blocks_trend(history: History, now_s: float, lead_s: float) -> tuple[float, str | None]:
    """The detector before this change (commit 56b1225, ``stages.trend_factor``), verbatim in substance."""
    if lead_s <= 0:
        return 1.0, None
    means: list[float] = []
    variances: list[float] = []
    for k in range(OLD_BLOCKS - 1, -1, -1):
        hi = now_s - k * OLD_BLOCK_S
        xs = [r for t, r in history if hi - OLD_BLOCK_S < t <= hi]
        if len(xs) < 3:
            return 1.0, None
        means.append(sum(xs) / len(xs))
        m = means[-1]
        variances.append(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))
    rises = sorted(b - a for a, b in itertools.pairwise(means))
    noise = math.sqrt(2.0 * max(variances))
    median_rise = rises[len(rises) // 2]
    if rises[0] <= 0 or median_rise <= OLD_MIN_Z * noise or means[-1] <= 0:
        return 1.0, None
    projected = means[-1] + median_rise / OLD_BLOCK_S * (OLD_BLOCK_S / 2 + lead_s)
    return min(projected / means[-1], stages.MAX_TREND_FACTOR), "trend"


def detect(counts: np.ndarray, detector: Detector, window_s: float) -> list[tuple[int, float]]:
    """(second, factor) of every second at which ``detector`` reads a trend."""
    history: History = ()
    out = []
    for t, c in enumerate(counts):
        history = stages.update_rate_history(history, float(t), float(c), window_s)
        factor, why = detector(history, float(t), LEAD_S)
        if why is not None:
            out.append((t, factor))
    return out


DETECTORS: dict[str, tuple[Detector, float]] = {
    "before (4 rising 30-s blocks)": (blocks_trend, OLD_BLOCKS * OLD_BLOCK_S),
    "after (least squares 30/60/120 s)": (stages.trend_factor, stages.RATE_HISTORY_S),
}


def sine_rate(t: float, period_s: float) -> float:
    return 12.5 - 11.5 * math.cos(2 * math.pi * t / period_s)


def ramp_rate(t: float, ramp_s: float) -> float:
    return 2.0 + 22.0 * min(max(t - 150.0, 0.0) / ramp_s, 1.0)


def rises(periods: list[float]) -> list[tuple[str, Callable[[float], float], int, int]]:
    """(name, rate(t), seconds, the second the rise starts)."""
    out: list[tuple[str, Callable[[float], float], int, int]] = []
    for p in periods:
        out.append(
            (f"sine 1<->24, period {p:.0f} s", functools.partial(sine_rate, period_s=p), int(p / 2), 0)
        )
    for dur in (600.0, 1800.0):
        out.append(
            (f"ramp 2->24 over {dur:.0f} s", functools.partial(ramp_rate, ramp_s=dur), int(150 + dur), 150)
        )
    return out


def not_ramps() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    out = [(f"constant {lam:g} req/s, 1 h", rng.poisson(lam, 3600)) for lam in (1.0, 4.0, 12.0, 24.0)]
    t = np.arange(1200)
    for lo, hi in ((4.0, 24.0), (4.0, 8.0)):
        out.append((f"step {lo:g} -> {hi:g} req/s at 600 s", rng.poisson(np.where(t < 600, lo, hi))))
    for name in ("mmpp", "mmpp-holdout", "code", "conv", "mooncake"):
        trace, _ = workload(name, None, 600.0)
        out.append((f"{name} (per-second arrivals)", np.bincount(np.floor(trace.arrival_s).astype(np.int64))))
    return out


def part1(periods: list[float]) -> None:
    print(
        "Rises: the second of the rise a trend is first read, its factor, and the true rate(t+lead)/rate(t)"
    )
    print(
        "| rise | detector | first seen (s into the rise) | factor then | true ratio | seconds read / of the rise |"
    )
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(11)
    for name, rate, n, start in rises(periods):
        rates = np.asarray([rate(float(t)) for t in range(n)])
        counts = rng.poisson(rates)
        for label, (det, window) in DETECTORS.items():
            fires = [(t, f) for t, f in detect(counts, det, window) if t >= start]
            if not fires:
                print(f"| {name} | {label} | never | - | - | 0 / {n - start} |")
                continue
            t0, f0 = fires[0]
            truth = rate(t0 + LEAD_S) / max(rate(float(t0)), 1e-9)
            print(
                f"| {name} | {label} | {t0 - start} | {f0:.2f} | {truth:.2f} | {len(fires)} / {n - start} |"
            )
    print()
    print("Not ramps: seconds a trend is read (episodes: runs apart by > 5 s), and Σ(factor − 1) over them")
    print("| traffic | detector | seconds read | episodes | Σ(factor − 1) |")
    print("|---|---|---|---|---|")
    for name, counts in not_ramps():
        for label, (det, window) in DETECTORS.items():
            fires = detect(counts, det, window)
            episodes = sum(1 for k, (t, _) in enumerate(fires) if k == 0 or t - fires[k - 1][0] > 5)
            excess = sum(f - 1.0 for _, f in fires)
            print(f"| {name} | {label} | {len(fires)} / {len(counts)} | {episodes} | {excess:.1f} |")


class ColdOracle(OraclePolicy):
    """The oracle without a warm starting fleet: its t = 0 answer is dropped, so it starts at the fleet's
    initial counts and everything it asks for pays a cold start, as for every causal policy."""

    def on_tick(self, now_s: float, view: ReplayView) -> list[ScaleCommand]:
        return [] if now_s <= 0.0 else super().on_tick(now_s, view)


def part2(periods: list[float]) -> None:
    print(
        "\nThe ceiling on the sinusoid (1<->24 req/s, ISL 8000 / OSL 1000, TTFT 3 s / ITL 35 ms, 2 periods)"
    )
    print("| period s | policy | SLO attained | GPU-s |")
    print("|---|---|---|---|")
    for p in periods:
        trace, fleet = workload("sine", None, p)
        for label, pol in (
            ("oracle (t = 0 answer warm)", OraclePolicy()),
            ("oracle, cold t = 0", ColdOracle()),
        ):
            rep = run("sine", trace, fleet, pol)
            print(f"| {p:.0f} | {label} | {rep.slo_attainment:.2%} | {rep.gpu_seconds:,.0f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sine-periods", default="300,600,1200,3600")
    ap.add_argument(
        "--ceiling", action="store_true", help="also replay the cold-start oracle on the sinusoid"
    )
    args = ap.parse_args()
    periods = [float(x) for x in args.sine_periods.split(",") if x]
    part1(periods)
    if args.ceiling:
        part2(periods)


if __name__ == "__main__":
    main()
