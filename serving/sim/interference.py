"""Interference on a PD-mixed node, derived from the latency model's operator timings (issue 8).

A mixed node runs a prefill and a decode vLLM instance side by side on the same GPUs. While the prefill
instance works, the decode instance's steps take longer; this module says how much longer, from the same
Vidur operator timings (``serving.sim.latency``) that time every simulated iteration. **It is a model from
kernel timings, not a measurement on a real mixed node**: no mixed-node timing exists in the profiles.

The model (``busy_slowdown``), for a decode step of batch B with KV lengths summing to C, while the node's
prefill instance runs an iteration of P prompt tokens:

1. *Equal time-slicing.* Two processes on one GPU get alternating, equal slices of its time (the CUDA
   driver's default time-slicing between contexts; MPS shares SMs but the scheduler still interleaves the two
   streams). So for every decode step the prefill stream gets as much GPU time as that step takes alone:
   it advances by ``x`` tokens with ``prefill_ms(x) = decode_step_ms(B, C)``, at most the P tokens its
   iteration holds (a shorter prefill iteration ends inside the round).
2. *Batched efficiency.* Co-running kernels cost what one hybrid (Sarathi-style chunked-prefill) iteration
   holding both costs: ``iteration_ms(x, 0, B, C)``. The token-wise GEMMs of both streams read the weights
   once, as in a batched iteration; each keeps its own attention and per-sequence overhead.

A decode step overlapping a prefill therefore takes ``iteration_ms(x, 0, B, C)`` instead of
``iteration_ms(0, 0, B, C)``: the slowdown. It lies in [1, 2]: 1 when the prefill's share costs nothing on
top of the step (never quite: its attention and overhead remain), 2 when batching saves nothing (pure time
slicing of two equal slices); the result is clamped to that range. It grows with P (more prefill work to
share the GPU with, up to one slice) and with the decode step's attention share (long contexts, big
batches: the part of the step that does not merge with the prefill's GEMMs). For llama3-8b/a100 it runs from
×1.03 (batch 1) through ×1.14 (batch 32, 500-token contexts) and ×1.43 (batch 32, 1,500) to ×1.7–2.0
(batch 64–128, 1,500–4,000): the old constant ×1.3 sits inside that range.

What it leaves out (assumptions, stated): the prefill instance is not slowed in the simulator (by the same
rounds it would be, by the same factor, while the decode instance is busy); contention for HBM bandwidth
beyond what the batched iteration's timings contain; MPS's SM partitioning (which would make the slices
unequal); and any NVLink/PCIe traffic of the KV hand-off, which on a mixed node stays on the GPU.

The published evidence this is calibrated against in spirit, not in numbers: DistServe (Zhong et al., OSDI
2024, Fig. 2) measures that batching one prefill with decode jobs slows the decode step markedly, growing
with the prefill's length; Sarathi-Serve (Agrawal et al., OSDI 2024) bounds that stall by chunking the
prefill, which is the "x tokens per round" above; Splitwise (Patel et al., ISCA 2024) motivates separating
the phases because the mixed iteration's latency is dominated by the prompt phase; Vidur (Agrawal et al.,
MLSys 2024) supplies the operator timings the hybrid iteration is composed from.
"""

from __future__ import annotations

import math
from typing import Protocol

MIN_SLOWDOWN = 1.0
MAX_SLOWDOWN = 2.0  # equal time slices with no batching benefit
# the simulator's cache keys: context per sequence and prefill tokens rounded to these many tokens
CONTEXT_QUANTUM = 64
PREFILL_QUANTUM = 64


class IterationModel(Protocol):
    """What the derivation needs of a latency model (``serving.sim.instance.LatencyLike``)."""

    def iteration_ms(
        self,
        prefill_tokens: int,
        prefill_context_tokens: int,
        decode_batch: int,
        decode_context_tokens: int,
        *,
        prefill_seqs: int = 1,
    ) -> float: ...


def prefill_share_tokens(model: IterationModel, slice_ms: float, prefill_tokens: int) -> int:
    """The most prefill tokens ``x`` whose iteration alone fits in ``slice_ms`` (bisection on whole tokens),
    at most ``prefill_tokens``: what the prefill stream gets done in one equal time slice."""
    if prefill_tokens <= 0 or slice_ms <= 0:
        return 0
    if float(model.iteration_ms(prefill_tokens, 0, 0, 0)) <= slice_ms:
        return prefill_tokens
    lo, hi = 0, prefill_tokens  # iteration_ms(lo) <= slice < iteration_ms(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if float(model.iteration_ms(mid, 0, 0, 0)) <= slice_ms:
            lo = mid
        else:
            hi = mid
    return lo


def busy_slowdown(
    model: IterationModel, decode_batch: int, decode_context_tokens: int, prefill_tokens: int
) -> float:
    """How many times longer a decode step of ``decode_batch`` sequences (KV lengths summing to
    ``decode_context_tokens``) takes while the node's prefill instance runs an iteration of
    ``prefill_tokens`` prompt tokens (see the module docstring), in [1, 2]. No decode batch or no
    prefill work: 1."""
    for name, value in (
        ("decode_batch", decode_batch),
        ("decode_context_tokens", decode_context_tokens),
        ("prefill_tokens", prefill_tokens),
    ):
        if not value >= 0:
            raise ValueError(f"busy_slowdown: {name} must be >= 0, got {value!r}")
    if decode_batch <= 0 or prefill_tokens <= 0:
        return MIN_SLOWDOWN
    alone = float(model.iteration_ms(0, 0, decode_batch, decode_context_tokens))
    if not alone > 0:
        return MIN_SLOWDOWN
    x = max(prefill_share_tokens(model, alone, prefill_tokens), 1)  # the smallest prefill share is one token
    both = float(model.iteration_ms(x, 0, decode_batch, decode_context_tokens))
    return min(max(both / alone, MIN_SLOWDOWN), MAX_SLOWDOWN)


def mean_slowdown(busy: float, prefill_busy_share: float) -> float:
    """The mean step stretch when the prefill instance is busy ``prefill_busy_share`` of the time and a step
    overlapping it is ``busy`` times slower: ``1 + (busy - 1) x share`` (share clamped to [0, 1])."""
    share = min(max(prefill_busy_share, 0.0), 1.0) if math.isfinite(prefill_busy_share) else 1.0
    return 1.0 + (busy - 1.0) * share


class Interference:
    """``busy_slowdown`` for one latency model, cached on quantised inputs (the simulator's hot path asks at
    every decode run that starts while the node's prefill instance is busy)."""

    def __init__(self, model: IterationModel) -> None:
        self.model = model
        self._cache: dict[tuple[int, int, int], float] = {}

    def slowdown(self, decode_batch: int, decode_context_tokens: float, prefill_tokens: float) -> float:
        if decode_batch <= 0 or prefill_tokens <= 0:
            return MIN_SLOWDOWN
        per_seq = decode_context_tokens / decode_batch
        key = (
            int(decode_batch),
            max(1, round(per_seq / CONTEXT_QUANTUM)),
            max(1, round(prefill_tokens / PREFILL_QUANTUM)),
        )
        out = self._cache.get(key)
        if out is None:
            ctx = key[1] * CONTEXT_QUANTUM * key[0]
            out = self._cache[key] = busy_slowdown(self.model, key[0], ctx, key[2] * PREFILL_QUANTUM)
        return out
