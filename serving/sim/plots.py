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
    centers, p50, p99 = ttft_bins(arrivals, report.request_ttft_ms, TTFT_BIN_S)
    ax_ttft.plot(centers, p50, label="TTFT p50")
    ax_ttft.plot(centers, p99, label="TTFT p99")
    ax_ttft.set_yscale("log")
    ax_ttft.set_ylabel("TTFT, ms")
    ax_ttft.set_xlabel("time, s")
    ax_ttft.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ttft_bins(arrival_s: np.ndarray, ttft_ms: np.ndarray, bin_s: float) -> tuple[np.ndarray, ...]:
    """(bin centres, p50, p99) of the finite TTFTs per ``bin_s`` of arrival time; empty bins left out.

    One sort and one split: a day of trace has ~10k bins, and a mask per bin would cost bins × requests.
    """
    ok = np.isfinite(ttft_ms)
    bins = np.floor(arrival_s[ok] / bin_s).astype(np.int64)
    order = np.lexsort((ttft_ms[ok], bins))  # by bin, then by TTFT within the bin
    bins, vals = bins[order], ttft_ms[ok][order]
    keys, starts = np.unique(bins, return_index=True)
    groups = np.split(vals, starts[1:])
    p50 = np.array([np.percentile(g, 50) for g in groups]) if len(keys) else np.zeros(0)
    p99 = np.array([np.percentile(g, 99) for g in groups]) if len(keys) else np.zeros(0)
    return (keys + 0.5) * bin_s, p50, p99
