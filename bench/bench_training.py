"""Training throughput of the forecaster at the default size, in scored windows per second.

A "window" is one scored position (one forecast with its loss): a batch of B sequences of L steps with a
burn-in of W scores B·(L−W) windows. Measured three ways, in one process, side by side:

- ``data``: building batches only (window cutting, masking, encoding, collation);
- ``step``: forward + backward + clip + AdamW on pre-built batches (the model's cost); also from the
  median step time, which is less sensitive to other processes stealing the CPU for a while;
- ``lightning``: ``Trainer.fit`` end to end (data + step + Lightning's loop), no validation, no logging.

Run: ``nice .venv/bin/python bench/bench_training.py [--steps 8] [--threads 2] [--json out.json]``
The machine is shared: the load average is printed with the figures, and each measurement also in windows per
CPU-second of this process (``time.process_time``, all its threads: with one thread, the rate one core gives
undisturbed by other processes; with N threads, per core-second).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecaster.features import DEFAULT_SCHEMA
from serving.workload.synthetic import SyntheticParams, generate
from training.data import node_series_from_trace
from training.datamodule import ForecastDataModule, WindowConfig, fit_normalizer
from training.fit import LabelConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="optimiser steps timed per measurement")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--batch-size", type=int, default=WindowConfig().batch_size)
    parser.add_argument("--seq-len", type=int, default=WindowConfig().seq_len)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import lightning as L
    import torch

    from forecaster.network import NetConfig
    from training.module import ForecastModule, OptimConfig

    torch.set_num_threads(args.threads)
    labels = LabelConfig()
    trace = generate(SyntheticParams(duration_s=3600, rate_rps=8, burst_multiplier=6), seed=1)
    series = [
        node_series_from_trace(
            "bench", trace, t0_s=0.0, t1_s=3600.0, horizon_s=5, onsets=labels.onsets, lead_s=labels.lead_s
        )
    ]
    cfg = WindowConfig(
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        windows_per_epoch=args.batch_size * args.steps,
    )
    norm = fit_normalizer(series)
    dm = ForecastDataModule(series, [], norm, cfg)
    per_batch = cfg.batch_size * (cfg.seq_len - cfg.burn_in)

    load_before = os.getloadavg()[0]
    t, c = time.perf_counter(), time.process_time()
    batches = list(dm.train_dataloader())
    data_s, data_cpu_s = time.perf_counter() - t, time.process_time() - c

    module = ForecastModule.create(
        NetConfig(n_inputs=DEFAULT_SCHEMA.n_inputs), OptimConfig(burn_in=cfg.burn_in, has_val=False)
    )
    opt = torch.optim.AdamW(module.parameters(), lr=3e-3)

    def step(batch: dict[str, torch.Tensor]) -> None:
        loss = module._losses(batch)["loss"]
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()

    step(batches[0])  # warm-up
    per_step_s, per_step_cpu_s = [], []
    for b in batches:
        t, c = time.perf_counter(), time.process_time()
        step(b)
        per_step_s.append(time.perf_counter() - t)
        per_step_cpu_s.append(time.process_time() - c)
    step_s = float(np.sum(per_step_s))

    module = ForecastModule.create(
        NetConfig(n_inputs=DEFAULT_SCHEMA.n_inputs), OptimConfig(burn_in=cfg.burn_in, has_val=False)
    )
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        gradient_clip_val=1.0,
        deterministic=True,
    )
    t, c = time.perf_counter(), time.process_time()
    trainer.fit(module, datamodule=dm)
    lightning_s, lightning_cpu_s = time.perf_counter() - t, time.process_time() - c

    n = len(batches) * per_batch
    result = {
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "burn_in": cfg.burn_in,
        "hidden": 64,
        "layers": 2,
        "heads": 4,
        "attention_window": 60,
        "steps": len(batches),
        "threads": args.threads,
        "data_windows_per_s": n / data_s,
        "step_windows_per_s": n / step_s,
        "step_windows_per_s_median_step": per_batch / float(np.median(per_step_s)),
        "lightning_windows_per_s": n / lightning_s,
        "data_windows_per_cpu_s": n / data_cpu_s,
        "step_windows_per_cpu_s": n / float(np.sum(per_step_cpu_s)),
        "step_windows_per_cpu_s_median_step": per_batch / float(np.median(per_step_cpu_s)),
        "lightning_windows_per_cpu_s": n / lightning_cpu_s,
        "loadavg_1m_before": load_before,
        "loadavg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    for k, v in result.items():
        print(f"{k:>26}: {v:,.1f}" if isinstance(v, float) else f"{k:>26}: {v}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
