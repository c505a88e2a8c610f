"""Hand-built ``InstanceSamples`` whose values are a known function of time, for exporter and source tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from serving.sim import samples as s

# Three instances: one prefill and one decode serving, one prefill still provisioning (its endpoint is down).
INSTANCE_IDS = ("default-prefill-0", "default-decode-0", "default-prefill-1")
ROLES = ("prefill", "decode", "prefill")
STATES = ("active", "active", "provisioning")
TTFT_S = 0.2  # every request's TTFT falls in vLLM's (0.1, 0.25] bucket


def synthetic_samples(
    now_s: float,
    *,
    prompt_tps: float = 1000.0,
    requests_rps: float = 10.0,
    running: Sequence[float] = (3.0, 5.0, float("nan")),
    states: Sequence[str] = STATES,
) -> s.InstanceSamples:
    """A scrape at ``now_s``: counters grow at ``prompt_tps`` tokens/s and ``requests_rps`` requests/s.

    Each serving instance's counters are ``rate * now_s`` (instance k at ``k + 1`` times the rate), and every
    request lands in the TTFT bucket holding ``TTFT_S``, so ``rate()`` and ``histogram_quantile`` have exact
    expected values.
    """
    n = len(INSTANCE_IDS)
    scale = np.arange(1, n + 1, dtype=np.float64)
    requests = np.floor(requests_rps * now_s * scale)
    bounds = s.TTFT_BUCKETS_S
    first_at_or_above = int(np.searchsorted(bounds, TTFT_S))
    counts = np.zeros((n, len(bounds) + 1), dtype=np.int64)
    counts[:, first_at_or_above:] = requests.astype(np.int64)[:, None]
    return s.InstanceSamples(
        now_s=now_s,
        instance_ids=INSTANCE_IDS,
        pools=("default",) * n,
        roles=ROLES,
        nodes=tuple(f"node-{i}" for i in range(n)),
        states=tuple(states),
        gauges={
            s.NUM_REQUESTS_RUNNING: np.asarray(running, dtype=np.float64),
            s.KV_CACHE_USAGE_PERC: np.full(n, 0.25),
        },
        counters={
            s.PROMPT_TOKENS_TOTAL: prompt_tps * now_s * scale,
            s.REQUEST_SUCCESS_TOTAL: requests,
        },
        histograms={
            s.TIME_TO_FIRST_TOKEN_SECONDS: s.Histogram(
                bounds_s=bounds, counts=counts, sums=requests * TTFT_S
            ),
        },
    )
