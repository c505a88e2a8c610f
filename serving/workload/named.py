"""The project's named workloads: the trace and the one-pool fleet (SLOs) of each name that
``bench/bench_policies.py --workloads`` (and every bench script built on it) and ``train-forecaster fit --replay``
accept.

* ``code`` / ``conv``: the bundled Azure 2023 traces, TTFT 1 s / ITL 50 ms;
* ``sine``: a synthetic sinusoid 1 <-> 24 req/s (period ``sine_period_s``), ISL ~8000 / OSL ~1000, TTFT 3 s /
  ITL 35 ms;
* ``mmpp``: a Markov-modulated bursty trace (6x bursts of ~20 s), 1200 s;
* ``ramp``: a linear rise 2 -> 24 req/s over ``ramp_s`` between 300 s flat at each end (the sinusoid's lengths
  and SLOs);
* ``mmpp-diurnal``: 4x bursts of ~30 s riding an 1800-s diurnal wave, 3600 s;
* ``mmpp-holdout``: another seed, 4x bursts of ~45 s every ~300 s, other length distributions, 1800 s;
* ``mooncake``: the bundled Mooncake FAST'25 trace, TTFT 5 s / ITL 50 ms;
* ``file:PATH``: any trace file ``read_trace`` reads, on the default pool (TTFT 1 s, ITL 50 ms).

A generated workload takes ``@SEED`` (``mmpp@3``, ``sine@101``): the same generator parameters, another seed
(unseen traffic of the same kind). Every trace is seeded: a name always gives the same requests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from serving.sim.fleet import FleetSpec, single_pool
from serving.workload.readers import read_trace
from serving.workload.synthetic import LengthDist, SyntheticParams, generate
from serving.workload.trace import PRIORITY_NORMAL, Trace

ROOT = Path(__file__).resolve().parents[2]
AZURE = ROOT / "datasets" / "azure2023"
MOONCAKE = ROOT / "datasets" / "mooncake" / "synthetic_trace.jsonl"
#: The names ``workload`` accepts (besides ``file:PATH``) and those of them that take ``@SEED``.
WORKLOADS = ("code", "conv", "sine", "mmpp", "ramp", "mmpp-diurnal", "mmpp-holdout", "mooncake")
SEEDED = ("sine", "mmpp", "ramp", "mmpp-diurnal", "mmpp-holdout")


def azure_path(kind: str) -> Path:
    """The bundled Azure 2023 ``kind`` (code, conv) trace: under the repository, or a worktree's ../shared."""
    for base in (AZURE, ROOT.parent / "shared" / "datasets" / "azure2023"):
        path = base / f"AzureLLMInferenceTrace_{kind}.dev_before_1850.csv"
        if path.exists():
            return path
    raise FileNotFoundError(f"Azure {kind} trace not found under {AZURE}")


SINE_PROMPT = LengthDist(median_tokens=8000.0, sigma=0.1, max_tokens=16_000)
SINE_OUTPUT = LengthDist(median_tokens=1000.0, sigma=0.1, max_tokens=2000)
RAMP_FLAT_S = 300.0  # the ramp workload's flat stretch before and after the rise
RAMP_RPS = (2.0, 24.0)  # from, to


def ramp_trace(ramp_s: float, seed: int = 13) -> Trace:
    """Poisson arrivals at a rate flat at RAMP_RPS[0] for RAMP_FLAT_S, rising linearly to RAMP_RPS[1] over
    ``ramp_s``, flat again for RAMP_FLAT_S (time rescaling of a unit-rate process through the integrated
    rate); the sinusoid's prompt and output lengths."""
    if not ramp_s > 0:
        raise ValueError(f"--ramp-s must be > 0, got {ramp_s}")
    lo, hi = RAMP_RPS
    grid = np.arange(0.0, 2 * RAMP_FLAT_S + ramp_s + 1.0)
    rate = lo + (hi - lo) * np.clip((grid - RAMP_FLAT_S) / ramp_s, 0.0, 1.0)
    big_lambda = np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2)])
    rng = np.random.default_rng(seed)
    unit = np.cumsum(rng.exponential(1.0, int(big_lambda[-1] * 1.2) + 100))
    unit = unit[unit < big_lambda[-1]]
    t = np.interp(unit, big_lambda, grid)
    t = t - t[0]
    n = len(t)
    return Trace(
        arrival_s=t,
        prompt_tokens=SINE_PROMPT.sample(rng, n),
        output_tokens=SINE_OUTPUT.sample(rng, n),
        priority=np.full(n, PRIORITY_NORMAL, dtype=np.int8),
        model=np.full(n, -1, dtype=np.int16),
        failed=np.zeros(n, dtype=bool),
        source=f"ramp({lo:g}->{hi:g} req/s over {ramp_s:g} s, seed={seed})",
        format="synthetic",
    )


def workload(
    name: str, duration_s: float | None, sine_period_s: float, ramp_s: float = 1200.0, *, prefix: bool = False
) -> tuple[Trace, FleetSpec]:
    """The trace and the fleet (SLOs) of one named workload (the module docstring). ``NAME@SEED`` (a ``SEEDED``
    name): the same generator parameters with another seed (unseen traffic of the same kind).

    ``duration_s`` cuts the bundled traces and the ramp to their first ``duration_s`` s. The generated ones
    (sine, mmpp, mmpp-holdout, mmpp-diurnal) are generated for ``duration_s`` instead of their default length,
    another realisation; with ``prefix`` they are generated for their default length (or ``duration_s`` if
    longer) and cut, so that a shorter run replays the start of the very trace a full run replays (what
    ``--duration-s`` means in bench_policies.py and bench_misses.py). ``prefix`` is off by default for the
    scripts whose recorded digests were taken on the regenerated traces (bench_sim_digest.py)."""

    def span(default: float) -> float:
        """The generator's duration."""
        if not duration_s:
            return default
        return max(duration_s, default) if prefix else duration_s

    def cut(trace: Trace) -> Trace:
        return trace.window(0.0, duration_s) if prefix and duration_s else trace

    if name.startswith("file:"):  # any trace file read_trace reads, on the default pool (TTFT 1 s, ITL 50 ms)
        trace = read_trace(Path(name.removeprefix("file:")))
        if duration_s is not None:
            trace = trace.window(0.0, duration_s)
        return trace, single_pool()
    name, at, seed_text = name.partition("@")
    seed: int | None = None
    if at:
        if name not in SEEDED or not seed_text.isdigit():
            raise ValueError(
                f"workload {name}@{seed_text}: only the generated workloads take a seed "
                f"({', '.join(s + '@SEED' for s in SEEDED)}), SEED a non-negative integer"
            )
        seed = int(seed_text)
    if name == "ramp":
        trace = ramp_trace(ramp_s) if seed is None else ramp_trace(ramp_s, seed)
        if duration_s is not None:
            trace = trace.window(0.0, duration_s)
        return trace, single_pool(slo_ttft_ms=3000.0, slo_itl_ms=35.0)
    if name in ("code", "conv"):
        trace = read_trace(azure_path(name))
        if duration_s is not None:
            trace = trace.window(0.0, duration_s)
        return trace, single_pool()
    if name == "sine":
        params = SyntheticParams(
            duration_s=span(2 * sine_period_s),
            rate_rps=12.5,
            burst_multiplier=1.0,
            diurnal_amplitude=11.5 / 12.5,  # 1 <-> 24 req/s
            diurnal_period_s=sine_period_s,
            diurnal_phase_s=-sine_period_s / 4,  # starts at the trough
            prompt=SINE_PROMPT,
            output=SINE_OUTPUT,
        )
        return cut(generate(params, seed=11 if seed is None else seed)), single_pool(
            slo_ttft_ms=3000.0, slo_itl_ms=35.0
        )
    if name == "mmpp":
        params = SyntheticParams(
            duration_s=span(1200.0),
            rate_rps=4.0,
            burst_multiplier=6.0,
            calm_mean_s=150.0,
            burst_mean_s=20.0,
            prompt=LengthDist(median_tokens=1500.0, sigma=0.8, max_tokens=8000),
            output=LengthDist(median_tokens=200.0, sigma=0.8, max_tokens=2000),
        )
        return cut(generate(params, seed=5 if seed is None else seed)), single_pool()
    if name == "mmpp-diurnal":
        # Bursts riding a diurnal wave (added with the ramp detector to check that bursts on a rise are not
        # read as a steeper ramp; never used to choose a default): 4x bursts of ~30 s on a 1800-s cycle.
        params = SyntheticParams(
            duration_s=span(3600.0),
            rate_rps=6.0,
            burst_multiplier=4.0,
            calm_mean_s=150.0,
            burst_mean_s=30.0,
            diurnal_amplitude=0.7,
            diurnal_period_s=1800.0,
            prompt=LengthDist(median_tokens=1500.0, sigma=0.8, max_tokens=8000),
            output=LengthDist(median_tokens=200.0, sigma=0.8, max_tokens=2000),
        )
        return cut(generate(params, seed=31 if seed is None else seed)), single_pool()
    if name == "mmpp-holdout":
        # Held out: never used to choose a default. Another seed, longer and rarer bursts, a lower ratio.
        params = SyntheticParams(
            duration_s=span(1800.0),
            rate_rps=3.0,
            burst_multiplier=4.0,
            calm_mean_s=300.0,
            burst_mean_s=45.0,
            prompt=LengthDist(median_tokens=1000.0, sigma=1.0, max_tokens=8000),
            output=LengthDist(median_tokens=300.0, sigma=0.7, max_tokens=2000),
        )
        return cut(generate(params, seed=23 if seed is None else seed)), single_pool()
    if name == "mooncake":
        # Held out: the bundled Mooncake FAST'25 trace (Poisson arrivals, ~15k-token prompts). TTFT 1 s is
        # beyond one llama3-8b/a100 prefill of 15k tokens at any load, so the SLO here is TTFT 5 s, ITL 50 ms.
        trace = read_trace(MOONCAKE)
        if duration_s is not None:
            trace = trace.window(0.0, duration_s)
        return trace, single_pool(slo_ttft_ms=5000.0, slo_itl_ms=50.0)
    raise ValueError(f"unknown workload {name!r}: {', '.join(WORKLOADS)}, file:PATH")
