"""Replay figures: offered load, capacity by role, and TTFT over time (matplotlib, imported lazily)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from serving.sim.report import ReplayReport

TTFT_BIN_S = 10.0


def plot_replay(report: ReplayReport, path: Path | str) -> None:
    """Three stacked panels sharing the time axis; TTFT is binned by arrival time (p50 and p99 per 10 s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_load, ax_cap, ax_ttft) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    arrivals = report.arrival_s
    n_s = int(np.ceil(max(report.sim_end_s, float(arrivals.max()) if len(arrivals) else 0.0))) + 1
    per_s = np.bincount(np.floor(arrivals).astype(np.int64), minlength=n_s)
    ax_load.plot(np.arange(n_s), per_s, lw=0.6, color="tab:gray")
    ax_load.set_ylabel("arrivals / s")
    ax_load.set_title(f"replay — policy {report.policy}, profile {report.profile}")
    if report.timeline is not None:
        for role, series in report.timeline.active.items():
            if series.max() > 0:
                ax_cap.step(report.timeline.t_s, series, where="post", label=f"{role} active")
        ax_cap.step(
            report.timeline.t_s, report.timeline.holding_gpu, where="post", ls="--", label="holding GPUs"
        )
        ax_cap.legend(loc="upper right", fontsize="small")
    ax_cap.set_ylabel("instances")
    bins = np.floor(arrivals / TTFT_BIN_S).astype(np.int64)
    ttft = report.request_ttft_ms
    centers, p50, p99 = [], [], []
    for b in np.unique(bins):
        vals = ttft[(bins == b) & np.isfinite(ttft)]
        if len(vals):
            centers.append((b + 0.5) * TTFT_BIN_S)
            p50.append(float(np.percentile(vals, 50)))
            p99.append(float(np.percentile(vals, 99)))
    ax_ttft.plot(centers, p50, label="TTFT p50")
    ax_ttft.plot(centers, p99, label="TTFT p99")
    ax_ttft.set_yscale("log")
    ax_ttft.set_ylabel("TTFT, ms")
    ax_ttft.set_xlabel("time, s")
    ax_ttft.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
