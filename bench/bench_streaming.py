"""Streaming forecaster tick cost vs re-running the window, and training throughput of the network.

Usage::

    .venv/bin/python bench/bench_streaming.py                      # 1,000 and 10,000 nodes, 1 thread
    .venv/bin/python bench/bench_streaming.py --nodes 1000 --ticks 200 --json out/bench_streaming.json
    .venv/bin/python bench/bench_streaming.py --no-train           # skip the training-throughput figure
    .venv/bin/python bench/bench_streaming.py --level-halflife-s 60 --no-train   # a level-relative (v3) model
    .venv/bin/python bench/bench_streaming.py --no-train --combination   # also the online combination
    .venv/bin/python bench/bench_streaming.py --no-train --numpy   # also the torch-free step the controller runs
    .venv/bin/python bench/bench_streaming.py --numpy-only --nodes 8 1000 10000   # only that, shipped checkpoint

A tick is ``LearnedForecaster.step``: encode raw channels, one LSTM step + attention over the ring per node,
decode to totals — batched across all nodes. The naive way re-runs the network's full forward over the last
``window`` encoded inputs of every node and keeps the last position. Both run side by side in one process,
interleaved, on default hyper-parameters (hidden 64, 2 layers, 4 heads, window 60). Reported: median and
10th percentile of wall time per tick, the median CPU time of the (single) computing thread (closest to the
uncontended cost on a shared machine), and the ratio of wall medians. ``--level-halflife-s H`` benchmarks a
level-relative model (feature schema v3, ``level_of="arrivals"``, as ``train-forecaster fit
--level-halflife-s H --level-of arrivals`` makes): each tick also updates the per-node levels.
``--combination`` also steps a second copy of the network inside the online forecast combination
(``forecaster.combination.CombinedForecaster``) on the same inputs, right after the raw one: the
"combined" line is the whole tick (network + combination), beside the raw network's. ``--numpy`` also steps
the same weights through ``forecaster.inference.NumpyLearnedForecaster`` (float32, what the controller runs,
no torch) on the same inputs, right after the torch one: the "numpy" line. ``--numpy-only`` times just that
step, on the weights, normaliser and schema of ``--checkpoint`` (the shipped default checkpoint unless given),
the whole tick the controller pays (encoding, network, decoding): CPU median and p99 per tick. It uses only
the forecaster's public API, so the same file times another tree with ``PYTHONPATH=TREE``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from forecaster.combination import CombinedForecaster
from forecaster.features import (
    DEFAULT_SCHEMA,
    LEVEL_SCHEMA_VERSION,
    FeatureSchema,
    LevelState,
    Normalizer,
    encode_step,
    encode_step_masked,
    level_offsets,
)
from forecaster.inference import NumpyLearnedForecaster, NumpyNet
from forecaster.network import LstmAttentionNet, burst_bce, pinball_loss
from forecaster.streaming import LearnedForecaster
from forecaster.types import CHANNELS

T0_S = 1.7e9
DEFAULT_CHECKPOINT = (
    Path(__file__).resolve().parents[1] / "forecaster" / "checkpoints" / "default.safetensors"
)


def _stats(wall_s: list[float], cpu_s: list[float]) -> dict[str, float]:
    a, c = np.asarray(wall_s) * 1e3, np.asarray(cpu_s) * 1e3
    return {
        "median_ms": float(np.median(a)),
        "p10_ms": float(np.percentile(a, 10)),
        "cpu_median_ms": float(np.median(c)),
        "cpu_p99_ms": float(np.percentile(c, 99)),
        "n": float(len(a)),
    }


def bench_ticks(
    n: int,
    ticks: int,
    naive_every: int,
    seed: int = 0,
    schema: FeatureSchema = DEFAULT_SCHEMA,
    combination: bool = False,
    numpy_engine: bool = False,
) -> dict[str, Any]:
    torch.manual_seed(seed)
    net = LstmAttentionNet(schema.n_inputs)
    nz = Normalizer.identity(schema)
    f = LearnedForecaster(net, schema, nz, 5.0, "bench")
    f.reset([f"node-{i}" for i in range(n)])
    # the same network inside the online combination, stepped on the same inputs right after the raw one
    cf = CombinedForecaster(LearnedForecaster(net, schema, nz, 5.0, "bench")) if combination else None
    if cf is not None:
        cf.reset([f"node-{i}" for i in range(n)])
    comb: list[float] = []
    comb_cpu: list[float] = []
    weights = {k: v.numpy() for k, v in net.state_dict().items()}
    nf = (
        NumpyLearnedForecaster(NumpyNet(weights, net.config), schema, nz, 5.0, "bench")
        if numpy_engine
        else None
    )
    if nf is not None:
        nf.reset([f"node-{i}" for i in range(n)])
    np_wall: list[float] = []
    np_cpu: list[float] = []
    rng = np.random.default_rng(seed)
    w = net.window
    history = np.zeros((n, w, schema.n_inputs), dtype=np.float32)
    levels = LevelState(n, schema) if schema.level_relative else None
    stream: list[float] = []
    naive: list[float] = []
    stream_cpu: list[float] = []
    naive_cpu: list[float] = []
    for t in range(w + 5 + ticks):
        x = rng.gamma(2.0, 5.0, size=(n, len(CHANNELS)))
        mask = rng.random(x.shape) > 0.05
        t0, c0 = time.perf_counter(), time.thread_time()
        f.step(x, mask, T0_S + t)
        dt, dc = time.perf_counter() - t0, time.thread_time() - c0
        if nf is not None:
            t1, c1 = time.perf_counter(), time.thread_time()
            nf.step(x, mask, T0_S + t)
            if t >= w + 5:
                np_wall.append(time.perf_counter() - t1)
                np_cpu.append(time.thread_time() - c1)
        if cf is not None:
            t1, c1 = time.perf_counter(), time.thread_time()
            cf.step(x, mask, T0_S + t)
            if t >= w + 5:
                comb.append(time.perf_counter() - t1)
                comb_cpu.append(time.thread_time() - c1)
        history = np.roll(history, -1, axis=1)
        lv = levels.update(x, mask) if levels is not None else None
        history[:, -1] = encode_step(x, mask, nz, T0_S + t, schema, levels=lv)
        if t < w + 5:
            continue  # warm-up: fill the ring and the history
        stream.append(dt)
        stream_cpu.append(dc)
        if (t - w - 5) % naive_every == 0:
            t0, c0 = time.perf_counter(), time.thread_time()
            with torch.inference_mode():
                out = net(torch.from_numpy(history))
                _ = out.quantiles[:, -1].numpy(), torch.sigmoid(out.burst_logit[:, -1]).numpy()
            naive.append(time.perf_counter() - t0)
            naive_cpu.append(time.thread_time() - c0)
    s, nv = _stats(stream, stream_cpu), _stats(naive, naive_cpu)
    out = {
        "nodes": n,
        "stream": s,
        "naive_window_rerun": nv,
        "ratio_median": nv["median_ms"] / s["median_ms"],
    }
    if cf is not None:
        out["combined"] = _stats(comb, comb_cpu)
    if nf is not None:
        out["numpy"] = _stats(np_wall, np_cpu)
    return out


def bench_numpy_ticks(n: int, ticks: int, checkpoint: Path, seed: int = 0) -> dict[str, Any]:
    """``NumpyLearnedForecaster.step`` alone (what the controller runs) on ``checkpoint``, ``n`` nodes: the
    same random raw channels as :func:`bench_ticks` (5 % masked), after ``window + 5`` warm-up ticks."""
    f = NumpyLearnedForecaster.load(checkpoint)
    f.reset([f"node-{i}" for i in range(n)])
    rng = np.random.default_rng(seed)
    warm = f.net_config.window + 5
    wall: list[float] = []
    cpu: list[float] = []
    for t in range(warm + ticks):
        x = rng.gamma(2.0, 5.0, size=(n, len(CHANNELS)))
        mask = rng.random(x.shape) > 0.05
        t0, c0 = time.perf_counter(), time.thread_time()
        f.step(x, mask, T0_S + t)
        if t >= warm:
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
    return {"nodes": n, "checkpoint": str(checkpoint), "numpy": _stats(wall, cpu)}


def bench_numpy_against(n: int, ticks: int, checkpoint: Path, other: Path, seed: int = 0) -> dict[str, Any]:
    """This tree's ``NumpyLearnedForecaster`` and another tree's (its ``forecaster/inference.py`` loaded from
    ``other``, the rest of ``forecaster`` shared), stepped alternately tick by tick on the same inputs: on a
    loaded machine both see the same contention, so their ratio is steadier than two separate runs'."""
    spec = importlib.util.spec_from_file_location("other_inference", other / "forecaster" / "inference.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against {other}: no forecaster/inference.py there")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # a dataclass there resolves its annotations through its module
    spec.loader.exec_module(mod)
    engines = {
        "this": NumpyLearnedForecaster.load(checkpoint),
        "other": mod.NumpyLearnedForecaster.load(checkpoint),
    }
    for f in engines.values():
        f.reset([f"node-{i}" for i in range(n)])
    rng = np.random.default_rng(seed)
    warm = engines["this"].net_config.window + 5
    wall: dict[str, list[float]] = {k: [] for k in engines}
    cpu: dict[str, list[float]] = {k: [] for k in engines}
    for t in range(warm + ticks):
        x = rng.gamma(2.0, 5.0, size=(n, len(CHANNELS)))
        mask = rng.random(x.shape) > 0.05
        for name, f in engines.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            f.step(x, mask, T0_S + t)
            if t >= warm:
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.thread_time() - c0)
    return {"nodes": n, "other": str(other), **{k: _stats(wall[k], cpu[k]) for k in engines}}


def bench_encode(n: int, reps: int, schema: FeatureSchema, seed: int = 0) -> dict[str, Any]:
    """The per-tick encoding of ``LearnedForecaster.step``, one pass (this tree) against two (until session 5).

    Two passes = ``encode_step`` plus a second ``level_offsets`` and ``normalize_inputs`` for the observed mask,
    which is what ``step`` did before it took the mask from the encoding. Interleaved, same inputs.
    """
    nz = Normalizer.identity(schema)
    rng = np.random.default_rng(seed)
    x = rng.gamma(2.0, 5.0, size=(n, len(CHANNELS)))
    mask = rng.random(x.shape) > 0.05
    lv = LevelState(n, schema).update(x, mask) if schema.level_relative else None
    one: list[float] = []
    two: list[float] = []
    one_cpu: list[float] = []
    two_cpu: list[float] = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        x_off = level_offsets(lv, schema, 5.0)[0] if lv is not None else None
        encode_step_masked(x, mask, nz, T0_S, schema, levels=lv, x_offsets=x_off)
        one.append(time.perf_counter() - t0)
        one_cpu.append(time.thread_time() - c0)
        t0, c0 = time.perf_counter(), time.thread_time()
        x_off = level_offsets(lv, schema, 5.0)[0] if lv is not None else None
        encode_step(x, mask, nz, T0_S, schema, levels=lv)
        nz.normalize_inputs(x, mask, x_off)
        two.append(time.perf_counter() - t0)
        two_cpu.append(time.thread_time() - c0)
    return {"nodes": n, "one_pass": _stats(one, one_cpu), "two_passes": _stats(two, two_cpu)}


def bench_training(batch: int, seq: int, steps: int, threads: int) -> dict[str, Any]:
    """Forward + backward + Adam over ``batch`` sequences of ``seq`` steps; every position is one window."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    net = LstmAttentionNet(DEFAULT_SCHEMA.n_inputs)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(batch, seq, DEFAULT_SCHEMA.n_inputs)
    y = torch.randn(batch, seq, 3)
    b = (torch.rand(batch, seq) > 0.9).float()
    times: list[float] = []
    cpu: list[float] = []
    for i in range(steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        out = net(x)
        loss = pinball_loss(out.quantiles, y, (0.5, 0.9)) + burst_bce(out.burst_logit, b)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if i:  # the first step pays one-off allocation costs
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    med = float(np.median(times))
    cpu_med = float(np.median(cpu))
    return {
        "batch": batch,
        "seq": seq,
        "threads": threads,
        "step_median_s": med,
        "windows_per_s": batch * seq / med,
        "step_cpu_median_s": cpu_med,  # the process's CPU time, all threads
        "windows_per_cpu_s": batch * seq / cpu_med,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--ticks", type=int, default=100, help="measured streaming ticks per node count")
    p.add_argument("--naive-every", type=int, default=10, help="run the naive window re-run every k ticks")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the tick benchmark")
    p.add_argument("--no-train", action="store_true", help="skip the training-throughput measurement")
    p.add_argument(
        "--combination",
        action="store_true",
        help="also step the same network inside the online forecast combination (forecaster/combination.py)",
    )
    p.add_argument(
        "--numpy",
        action="store_true",
        help="also step the same weights without torch (forecaster/inference.py, what the controller runs)",
    )
    p.add_argument(
        "--numpy-only",
        action="store_true",
        help="time only the torch-free step on --checkpoint (no torch, no naive re-run, encoding or training)",
    )
    p.add_argument(
        "--against",
        type=Path,
        default=None,
        help="with --numpy-only: also step another tree's numpy forecaster, alternating tick by tick",
    )
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT, help="the model --numpy-only steps")
    p.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    p.add_argument(
        "--level-halflife-s",
        type=float,
        default=0.0,
        help="benchmark a level-relative model (schema v3, levels of arrivals) with this half-life; 0 = v1",
    )
    a = p.parse_args()
    schema = DEFAULT_SCHEMA
    if a.level_halflife_s > 0:
        schema = dataclasses.replace(
            DEFAULT_SCHEMA,
            version=LEVEL_SCHEMA_VERSION,
            level_halflife_s=a.level_halflife_s,
            level_of="arrivals",
        )
    if a.numpy_only:
        numpy_only(a.nodes, a.ticks, a.checkpoint, a.json, a.against)
        return
    torch.set_num_threads(a.threads)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
        "loadavg_before": os.getloadavg(),
        "threads": a.threads,
        "schema_version": schema.version,
        "level_halflife_s": schema.level_halflife_s,
        "ticks": [],
    }
    for n in a.nodes:
        r = bench_ticks(
            n,
            a.ticks if n <= 2000 else max(a.ticks // 4, 10),
            a.naive_every,
            schema=schema,
            combination=a.combination,
            numpy_engine=a.numpy,
        )
        results["ticks"].append(r)
        s, nv = r["stream"], r["naive_window_rerun"]
        print(
            f"{n:>6} nodes: stream wall median {s['median_ms']:7.2f} ms (p10 {s['p10_ms']:7.2f}, "
            f"cpu {s['cpu_median_ms']:7.2f}) | naive 60-step re-run wall median {nv['median_ms']:8.1f} ms "
            f"(p10 {nv['p10_ms']:8.1f}, cpu {nv['cpu_median_ms']:8.1f}) | ratio {r['ratio_median']:.0f}x"
        )
        if "numpy" in r:
            nn = r["numpy"]
            print(
                f"{n:>6} nodes: numpy (no torch) wall median {nn['median_ms']:7.2f} ms (p10 {nn['p10_ms']:7.2f}, "
                f"cpu {nn['cpu_median_ms']:7.2f}, cpu p99 {nn['cpu_p99_ms']:7.2f}) | torch cpu {s['cpu_median_ms']:7.2f} | numpy / torch cpu "
                f"{nn['cpu_median_ms'] / s['cpu_median_ms']:.2f}"
            )
        if "combined" in r:
            cb = r["combined"]
            print(
                f"{n:>6} nodes: combined (network + combination) wall median {cb['median_ms']:7.2f} ms "
                f"(p10 {cb['p10_ms']:7.2f}, cpu {cb['cpu_median_ms']:7.2f}) | raw network cpu "
                f"{s['cpu_median_ms']:7.2f} | combination adds {cb['cpu_median_ms'] - s['cpu_median_ms']:.2f} ms cpu"
            )
    results["encode"] = []
    for n in a.nodes:
        e = bench_encode(n, 200 if n <= 2000 else 50, schema)
        results["encode"].append(e)
        o, t = e["one_pass"], e["two_passes"]
        print(
            f"{n:>6} nodes: encoding per tick, one pass {o['median_ms']:.3f} ms (cpu {o['cpu_median_ms']:.3f}) | "
            f"two passes (before) {t['median_ms']:.3f} ms (cpu {t['cpu_median_ms']:.3f})"
        )
    if not a.no_train:
        results["training"] = []
        for threads in (1, 2):  # on a shared, oversubscribed machine 2 threads can be far slower than 1
            tr = bench_training(batch=32, seq=256, steps=5, threads=threads)
            results["training"].append(tr)
            print(
                f"training: batch {tr['batch']} x {tr['seq']} steps, {tr['threads']} thread(s): "
                f"{tr['step_median_s']:.3f} s/step = {tr['windows_per_s']:,.0f} windows/s; CPU "
                f"{tr['step_cpu_median_s']:.3f} s/step = {tr['windows_per_cpu_s']:,.0f} windows per CPU-s"
            )
    results["loadavg_after"] = os.getloadavg()
    print(f"load average before {results['loadavg_before']}, after {results['loadavg_after']}")
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(results, indent=2))


def numpy_only(
    nodes: list[int], ticks: int, checkpoint: Path, json_path: Path | None, against: Path | None
) -> None:
    results: dict[str, Any] = {"loadavg_before": os.getloadavg(), "ticks": []}
    for n in nodes:
        k = ticks if n <= 2000 else max(ticks // 4, 10)
        if against is None:
            r = bench_numpy_ticks(n, k, checkpoint)
            lines = {"numpy tick": r["numpy"]}
        else:
            r = bench_numpy_against(n, k, checkpoint, against)
            lines = {"numpy tick, this tree": r["this"], f"numpy tick, {against}": r["other"]}
        results["ticks"].append(r)
        for label, s in lines.items():
            print(
                f"{n:>6} nodes: {label}: cpu median {s['cpu_median_ms']:8.2f} ms, p99 {s['cpu_p99_ms']:8.2f} | "
                f"wall median {s['median_ms']:8.2f} (p10 {s['p10_ms']:8.2f}) | {int(s['n'])} ticks, {checkpoint.name}"
            )
        if against is not None:
            print(
                f"{n:>6} nodes: cpu medians, other / this: {r['other']['cpu_median_ms'] / r['this']['cpu_median_ms']:.2f}"
            )
    results["loadavg_after"] = os.getloadavg()
    print(f"load average before {results['loadavg_before']}, after {results['loadavg_after']}")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
