"""Latency model figures: call cost (scalar / vectorised), anchors, overhead-fit residuals, capacity examples.

Run: .venv/bin/python bench/bench_latency.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from serving.sim.capacity import decode_capacity, prefill_capacity
from serving.sim.hardware import get_profile, list_profiles
from serving.sim.latency import build_operator_model, fit_all_overheads, get_latency_model, latency_model_for


def _best_of(fn: Any, repeats: int, number: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    out: dict[str, Any] = {"machine": f"{platform.node()} {platform.machine()}, shared 2-core VM (noisy)"}

    t0 = time.perf_counter()
    build_operator_model(get_profile("llama3-8b/a100").with_overrides(max_num_seqs=255))  # uncached tables
    out["first_build_s"] = time.perf_counter() - t0
    calls: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    n = 100_000
    p, k = rng.integers(0, 4096, n).astype(float), rng.integers(0, 8192, n).astype(float)
    b = rng.integers(0, 256, n).astype(float)
    c = b * rng.integers(16, 4096, n)
    for name in list_profiles():
        m = get_latency_model(name)
        scalar_s = _best_of(lambda m=m: m.iteration_ms(512, 1024, 32, 32 * 1500), 5, 20_000)
        vector_s = _best_of(lambda m=m: m.iteration_ms(p, k, b, c), 3, 5)
        calls[name] = {
            "scalar_us": scalar_s * 1e6,
            "vector_1e5_ms": vector_s * 1e3,
            "vector_ns_per_row": vector_s / n * 1e9,
        }
    out["call_cost"] = calls

    anchors: dict[str, float] = {}
    m8 = get_latency_model("llama3-8b/a100")
    anchors["llama3-8b/a100 prefill 2048 ms"] = m8.prefill_ms(2048)
    anchors["llama3-8b/a100 decode B64 ctx2176 ms"] = m8.decode_step_ms(64, 2176)
    m70 = get_latency_model("llama2-70b/h100")
    anchors["llama2-70b/h100 TP4 prefill 2048 ms (Splitwise 200.7)"] = m70.prefill_ms(2048)
    anchors["llama2-70b/h100 TP4 prefill 8192 ms (Splitwise 953.6)"] = m70.prefill_ms(8192)
    anchors["llama2-70b/h100 TP4 decode B1 ctx576 ms (Splitwise 29.7)"] = m70.decode_step_ms(1, 576)
    m7 = get_latency_model("llama2-7b/h100")
    anchors["llama2-7b/h100 prefill 2048 ms"] = m7.prefill_ms(2048)
    anchors["llama2-7b/h100 decode B64 ctx2176 ms"] = m7.decode_step_ms(64, 2176)
    out["anchors"] = anchors
    out["overhead_fit"] = fit_all_overheads()["fits"]

    capacity: dict[str, Any] = {}
    for name in ("llama3-8b/a100", "llama2-7b/h100", "llama2-70b/h100", "cpu-tiny"):
        prof, model = get_profile(name), latency_model_for(get_profile(name))
        pre = prefill_capacity(prof, model, 1000.0, 2048 if name != "cpu-tiny" else 512)
        dec = decode_capacity(prof, model, 50.0, 2048 if name != "cpu-tiny" else 512)
        capacity[name] = {
            "prefill_tps_at_ttft1000": pre.tokens_per_s,
            "prefill_utilisation": pre.utilisation,
            "decode_max_batch_at_itl50": dec.max_batch,
            "decode_tps_at_itl50": dec.tokens_per_s,
            "decode_limited_by": dec.limited_by,
        }
    out["capacity"] = capacity
    text = json.dumps(out, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
