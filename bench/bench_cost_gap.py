"""Where the predictive policy's GPU-seconds exceed the SLO-matched oracle's: by time, role, state and stage.

For each workload of ``bench/bench_policies.py`` (same traces, fleets and policies), three replays: predictive
(``--params`` overrides, ``--forecaster`` as there), ``oracle@slo`` (the oracle at the least headroom meeting
``--slo-target``, bisected as bench_policies.py does, or at the headroom ``--oracle-h ROW=H`` names, one replay)
and static-peak. Each is wrapped in a probe that samples, every tick, the simulator's instances holding GPUs by
role and lifecycle state (serving a request, active with none, provisioning, standby, ...), split at
``--split-s`` (default 600 s: the cold start every causal policy pays, and the steady state after it).
Predictive's plans are read back into stages (``bench_policies.decompose``) on each side of the split.

Printed per row: GPU-s before / after the split for each policy; predictive − oracle@slo per role and state;
predictive's stages after the split; and two ratios a policy cannot beat from this start:

* ``cold-start bound`` = (predictive's GPU-s before the split + oracle@slo's after) / oracle@slo's total: the
  ratio predictive would have if it matched the oracle exactly once warm (the first minutes are a blind start,
  s9q's ceiling subsection);
* ``oracle@slo / static-peak``: the ``≤ 0.70 × static-peak`` goal is out of reach for any policy at the SLO
  where this is above 0.70 (the oracle sizes every second for the future; a causal policy spends more).

The figures are deterministic (seeded traces, virtual clock).

Run: .venv/bin/python bench/bench_cost_gap.py --workloads code,conv,mmpp --forecaster default
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from bench.bench_policies import (
    STAGES,
    ChurnProbe,
    _parse_params,
    decompose,
    make,
    oracle_at_slo,
    row_trace,
    run,
)
from controller.policy import ScalingPlan
from controller.replay_policies import OraclePolicy, PredictivePolicy, oracle_needs
from serving.sim.engine import HOLDS_GPU
from serving.sim.hardware import get_profile
from serving.sim.replay import PolicyOptions, ReplayPolicy, make_policy

WINDOWS = ("early", "late")
ROLES = ("prefill", "decode")


class SplitProbe(ChurnProbe):
    """ChurnProbe that also keeps its per-tick GPU-seconds by (window, role, state), the window being "early"
    for ticks before ``split_s`` and "late" from it on."""

    def __init__(self, inner: ReplayPolicy, split_s: float) -> None:
        super().__init__(inner)
        self.split_s = split_s
        self.split: dict[tuple[str, str, str], float] = {}

    def _tally(self, now_s: float) -> None:
        if self.sim is not None and math.isfinite(self._last_s):
            dt = now_s - self._last_s
            window = window_of(self._last_s, self.split_s)
            for i in self.sim.instances:
                if i.state in HOLDS_GPU:
                    state = "active idle" if i.state == "active" and i.empty else i.state
                    key = (window, i.role, state)
                    self.split[key] = self.split.get(key, 0.0) + i.gpus * dt
        super()._tally(now_s)


def window_of(t_s: float, split_s: float) -> str:
    """'early' before the split, 'late' from it on."""
    return "early" if t_s < split_s else "late"


def split_decisions(
    decisions: Iterable[tuple[float, ScalingPlan]], split_s: float
) -> dict[str, list[tuple[float, ScalingPlan]]]:
    """The plans on each side of the split, in order (each tick is in exactly one window)."""
    out: dict[str, list[tuple[float, ScalingPlan]]] = {w: [] for w in WINDOWS}
    for t, plan in decisions:
        out[window_of(t, split_s)].append((t, plan))
    return out


def totals(
    split: Mapping[tuple[str, str, str], float], window: str | None = None, role: str | None = None
) -> float:
    """GPU-seconds of a SplitProbe tally, summed over the keys that match ``window`` and ``role`` (None: all)."""
    return sum(v for (w, r, _), v in split.items() if window in (None, w) and role in (None, r))


def cold_start_bound(pred: Mapping[str, float], ref: Mapping[str, float]) -> float:
    """(predictive early + reference late) / reference total: the ratio to the reference predictive would reach
    if it matched the reference exactly once the first window is over. NaN when the reference spent nothing."""
    ref_total = ref["early"] + ref["late"]
    return (pred["early"] + ref["late"]) / ref_total if ref_total > 0 else math.nan


def seen_peak_estimate(need: np.ndarray, lead_s: int) -> tuple[float, float, float]:
    """(the oracle's instance-seconds, those of the oracle plus a reserve of the largest need seen, the
    oracle's seconds at the floor of 1 instance with nothing needed) for one role's per-second need: the oracle holds, at t, the most any second of [t, t + lead] needs (at least 1);
    the estimate also keeps the largest need of [0, t - lead] (a burst seen, ordered then, ready a cold start
    later). What a policy that cannot tell when the next burst comes holds to serve every burst the size of
    the largest seen: an estimate of the causal floor on bursty traffic, not a bound (a policy may miss
    part of a burst, and periodic bursts can be timed)."""
    n = len(need)
    if n == 0:
        return 0.0, 0.0, 0.0
    padded = np.concatenate([need, np.full(lead_s + 1, -np.inf)])
    ahead = sliding_window_view(padded, lead_s + 1)[:n].max(axis=1)
    held = np.maximum(ahead, 1.0)
    seen = np.concatenate([np.zeros(min(lead_s, n)), np.maximum.accumulate(need)[: max(n - lead_s, 0)]])
    return float(held.sum()), float(np.maximum(held, seen).sum()), float((ahead <= 0).sum())


def parse_oracle_h(text: str) -> dict[str, float]:
    """``ROW=H,ROW=H`` -> {ROW: H}; an H outside the oracle's [0, 10] is refused by OraclePolicy itself."""
    out: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        row, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--oracle-h: expected ROW=H, got {item!r}")
        out[row.strip()] = float(value)
    return out


def replay_probed(
    name: str, wl: str, args: argparse.Namespace, policy: ReplayPolicy
) -> tuple[Any, SplitProbe]:
    trace, fleet = row_trace(wl, args)
    probe = SplitProbe(policy, args.split_s)
    return run(name, trace, fleet, probe), probe


def row(wl: str, args: argparse.Namespace, params: dict[str, Any], oracle_h: dict[str, float]) -> None:
    trace, fleet = row_trace(wl, args)
    gpus = get_profile(fleet.pools[0].profile).gpus
    pred_policy = make("predictive", args.forecaster, params)
    assert isinstance(pred_policy, PredictivePolicy)
    pred_rep, pred = replay_probed("predictive", wl, args, pred_policy)
    if wl in oracle_h:
        h: float | None = oracle_h[wl]
        orc_rep, orc = replay_probed("oracle@slo", wl, args, OraclePolicy(headroom=oracle_h[wl]))
    else:
        h, _ = oracle_at_slo(trace, fleet, args.slo_target)
        orc_rep, orc = replay_probed(
            "oracle@slo", wl, args, OraclePolicy(headroom=h if h is not None else 3.0)
        )
    stat_rep, stat = replay_probed("static-peak", wl, args, make_policy("static-peak", PolicyOptions()))
    by_window = {
        name: {w: totals(p.split, w) for w in WINDOWS}
        for name, p in (("pred", pred), ("orc", orc), ("stat", stat))
    }
    h_text = f"h={h:.4f}" if h is not None else "unreachable, h=3"
    print(f"\n#### {wl} (oracle@slo {h_text}; split at {args.split_s:.0f} s)")
    print("| policy | SLO | GPU-s | before split | after split |")
    print("|---|---|---|---|---|")
    for name, rep, key in (
        ("predictive", pred_rep, "pred"),
        ("oracle@slo", orc_rep, "orc"),
        ("static-peak", stat_rep, "stat"),
    ):
        e, late = by_window[key]["early"], by_window[key]["late"]
        print(f"| {name} | {rep.slo_attainment:.2%} | {rep.gpu_seconds:,.0f} | {e:,.0f} | {late:,.0f} |")
    states = sorted({s for (_, _, s) in pred.split} | {s for (_, _, s) in orc.split})
    print("\npredictive − oracle@slo, GPU-s, before / after the split")
    print("| role | " + " | ".join(states) + " | all |")
    print("|---|" + "---|" * (len(states) + 1))
    for r in ROLES:
        cells = []
        for s in [*states, None]:
            diff = [
                sum(v for (w2, r2, s2), v in pred.split.items() if w2 == w and r2 == r and s in (None, s2))
                - sum(v for (w2, r2, s2), v in orc.split.items() if w2 == w and r2 == r and s in (None, s2))
                for w in WINDOWS
            ]
            cells.append(f"{diff[0]:+,.0f} / {diff[1]:+,.0f}")
        print(f"| {r} | " + " | ".join(cells) + " |")
    halves = split_decisions(pred_policy.decisions, args.split_s)
    parts = {w: decompose(halves[w], gpus)["added"] for w in WINDOWS}
    print("\npredictive's stages (GPU-s added, prefill / decode), before / after the split")
    print("| stage | before | after |")
    print("|---|---|---|")
    for st in STAGES:
        cells = [f"{parts[w][st, 'prefill']:,.0f} / {parts[w][st, 'decode']:,.0f}" for w in WINDOWS]
        print(f"| {st} | {cells[0]} | {cells[1]} |")
    orc_total = orc_rep.gpu_seconds
    late_ratio = (
        by_window["pred"]["late"] / by_window["orc"]["late"] if by_window["orc"]["late"] else math.nan
    )
    lead = int(get_profile(fleet.pools[0].profile).cold_start_s)
    needs = oracle_needs(fleet.pools[0], trace, 5.0)
    sums = [seen_peak_estimate(n, lead) for n in needs]
    seen_gpu_s = sum(e for _, e, _ in sums) * gpus
    floor_gpu_s = sum(f for _, _, f in sums) * gpus
    min_fleet_gpu_s = 2 * gpus * len(needs[0])  # one prefill and one decode from t = 0 to the last decode
    print(
        f"oracle (h=0) + a reserve of the largest need seen (capacity model): {seen_gpu_s:,.0f} GPU-s,"
        f" {seen_gpu_s / orc_total:.2f} x oracle@slo; / the oracle's own sizing: prefill"
        f" {sums[0][1] / sums[0][0]:.2f}, decode {sums[1][1] / sums[1][0]:.2f}; the 1 + 1 floor with nothing"
        f" needed: {floor_gpu_s:,.0f} GPU-s ({floor_gpu_s / orc_total:.0%} of oracle@slo); 1 + 1 held all run:"
        f" {min_fleet_gpu_s:,.0f} GPU-s ({min_fleet_gpu_s / orc_total:.0%})"
    )
    print(
        f"\n{wl}: / oracle@slo {pred_rep.gpu_seconds / orc_total:.2f} (after the split {late_ratio:.2f});"
        f" cold-start bound {cold_start_bound(by_window['pred'], by_window['orc']):.2f};"
        f" / static-peak {pred_rep.gpu_seconds / stat_rep.gpu_seconds:.2f};"
        f" oracle@slo / static-peak {orc_total / stat_rep.gpu_seconds:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="code,conv,mmpp,mmpp-holdout,sine,mooncake")
    ap.add_argument("--forecaster", choices=("holt", "default"), default="default")
    ap.add_argument("--params", default="", help="PolicyConfig overrides for predictive: k=v,k=v")
    ap.add_argument("--split-s", type=float, default=600.0, help="the time that splits early from late, s")
    ap.add_argument("--slo-target", type=float, default=0.99, help="the SLO attainment oracle@slo must reach")
    ap.add_argument(
        "--oracle-h",
        default="",
        help="ROW=H,...: oracle@slo's headroom for these rows, one replay instead of the bisection",
    )
    ap.add_argument("--duration-s", type=float, default=None)
    ap.add_argument("--sine-period-s", type=float, default=600.0)
    ap.add_argument("--ramp-s", type=float, default=1200.0)
    args = ap.parse_args()
    try:
        oracle_h = parse_oracle_h(args.oracle_h)
    except ValueError as exc:
        ap.error(str(exc))
    params = _parse_params(args.params)
    for wl in args.workloads.split(","):
        row(wl, args, params, oracle_h)


if __name__ == "__main__":
    main()
