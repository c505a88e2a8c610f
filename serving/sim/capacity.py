"""THE capacity model: what one instance of a profile sustains within its SLOs, and how many a load needs.

Every sizing in pdscale (the controller's capacity target, static-peak replay, ``pdscale plan``) calls these
functions; nothing else repeats the math. All latencies come from a :class:`~serving.sim.latency.LatencyModel`.

Prefill (one instance of the prefill pool). vLLM packs waiting prompts into an iteration up to
``max_num_batched_tokens``: with mean prompt P, n = ⌊budget/P⌋ prompts share one iteration of
``t_it = iteration_ms(n·P, prefill_seqs=n)`` (a prompt longer than the budget is chunked over several iterations,
n = 1, t_it = the sum of its chunks). Requests are one M/D/1 queue with service D = t_it/n per request: mean wait
W = ρ·D / (2(1−ρ)); its q-quantile uses the usual exponential tail (a request waits with probability ρ, and the
wait of those who do is exponential with mean W/ρ): W_q = (W/ρ)·ln(ρ/(1−q)) when ρ > 1−q, else 0. TTFT_q ≈ W_q
+ t_it + KV transfer (P/D handoff). For each packing n = 1…⌊budget/P⌋ the largest utilisation ρ meeting ``slo_ttft_ms`` is found by bisection,
and the packing with the most tokens/s = ρ·n·P / t_it wins (bigger iterations amortise the fixed cost but leave
less of the SLO to queueing).

Decode (one instance of the decode pool). A decode step of B sequences at mean context C takes
``decode_step_ms(B, C)``; the ITL SLO holds while the step time does. The largest B with step ≤ ``slo_itl_ms``,
bounded by ``max_num_seqs``, the KV cache (⌊kv blocks / ⌈C/block⌉⌋ sequences) and ``max_num_batched_tokens``,
sets generation tokens/s = B / step. A pool needs enough slots for the concurrency ``rate·output·step`` (Little).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from serving.sim.hardware import HardwareProfile
from serving.sim.latency import LatencyModel

DEFAULT_TTFT_QUANTILE = 0.9  # SLOs are stated on P90 TTFT / ITL throughout pdscale


class CapacityError(ValueError):
    """A load or SLO the capacity model cannot size (unknown input, or an SLO no instance can meet)."""


@dataclass(frozen=True)
class PrefillCapacity:
    """What one prefill instance sustains at a TTFT SLO."""

    tokens_per_s: float  # prompt tokens per second at the SLO-meeting utilisation (0 when infeasible)
    requests_per_s: float  # tokens_per_s / mean prompt tokens
    utilisation: float  # ρ of the M/D/1 queue, in [0, 1)
    prompts_per_iteration: int  # n, prompts packed into one iteration (0 when infeasible)
    iteration_ms: float  # t_it, time of that iteration (whole prompt, chunks summed, when n = 1)
    min_ttft_ms: float  # TTFT of a lone request (no queue, no packing) incl. KV transfer
    kv_transfer_ms: float = 0.0  # the P/D handoff of a mean prompt's KV (0 when not counted)


@dataclass(frozen=True)
class DecodeCapacity:
    """What one decode instance sustains at an ITL SLO."""

    max_batch: int  # largest decode batch meeting the SLO within the bounds (0 when infeasible)
    tokens_per_s: float  # generation tokens per second at max_batch
    step_ms: float  # decode step time at max_batch (the single-sequence step when infeasible)
    limited_by: Literal["slo", "max_num_seqs", "kv_cache", "max_num_batched_tokens"]
    kv_max_batch: int  # sequences of mean context the KV cache holds


@dataclass(frozen=True)
class InstancesNeeded:
    """Pool sizes for a load, each rounded up separately."""

    prefill: int
    decode: int
    prefill_capacity: PrefillCapacity
    decode_capacity: DecodeCapacity
    prefill_load_tps: float  # prompt tokens/s to serve, headroom included
    decode_load_tps: float  # generation tokens/s to serve, headroom included
    # Colocated ("mixed") instances for the same load instead: each splits its time between the two phases,
    # so it needs ⌈prefill share + decode share⌉. A lower bound: the ITL cost of prefill chunks landing in
    # decode steps (interference) is not modelled here.
    mixed: int = 0

    def __iter__(self) -> Iterator[int]:
        """Unpacks as ``prefill, decode = instances_needed(...)``."""
        return iter((self.prefill, self.decode))


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not (
            isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value) and value > 0
        ):
            raise CapacityError(f"{name} must be a finite number > 0, got {value!r}")


def whole_prompt_ms(profile: HardwareProfile, model: LatencyModel, prompt_tokens: int) -> float:
    """Prefill time of one prompt alone: chunks of ``max_num_batched_tokens`` on a growing context, summed."""
    budget = profile.max_num_batched_tokens
    starts = np.arange(0, prompt_tokens, budget, dtype=np.float64)
    sizes = np.minimum(budget, prompt_tokens - starts)
    return float(np.sum(model.iteration_ms(sizes, starts, np.zeros_like(sizes), np.zeros_like(sizes))))


def md1_wait_quantile_ms(rho: float, service_ms: float, quantile: float) -> float:
    """q-quantile of the M/D/1 waiting time (exponential-tail approximation, see the module docstring)."""
    if rho >= 1.0:
        return math.inf
    if rho <= 0.0:
        return 0.0
    return float(_wait_quantile_ms(np.array([rho]), np.array([service_ms]), quantile)[0])


def prefill_capacity(
    profile: HardwareProfile,
    model: LatencyModel,
    slo_ttft_ms: float,
    mean_prompt_tokens: float,
    *,
    quantile: float = DEFAULT_TTFT_QUANTILE,
    include_kv_transfer: bool = True,
) -> PrefillCapacity:
    """Prompt throughput of one prefill instance whose ``quantile`` TTFT stays within ``slo_ttft_ms``."""
    _check_positive(slo_ttft_ms=slo_ttft_ms, mean_prompt_tokens=mean_prompt_tokens)
    if not 0.0 < quantile < 1.0:
        raise CapacityError(f"quantile must be in (0, 1), got {quantile!r}")
    prompt = max(1, round(mean_prompt_tokens))
    transfer_ms = profile.kv_transfer_ms(prompt) if include_kv_transfer else 0.0
    budget_ms = slo_ttft_ms - transfer_ms
    alone_ms = whole_prompt_ms(profile, model, prompt)
    infeasible = PrefillCapacity(0.0, 0.0, 0.0, 0, alone_ms, alone_ms + transfer_ms, transfer_ms)
    if alone_ms >= budget_ms:
        return infeasible
    n_max = max(1, min(profile.max_num_batched_tokens // prompt, profile.max_num_seqs))
    ns = np.arange(1, n_max + 1, dtype=np.float64)
    packed = np.asarray(model.iteration_ms(ns * prompt, 0.0, 0.0, 0.0, prefill_seqs=ns), dtype=np.float64)
    if n_max == 1:
        packed = np.array([alone_ms])
    ns = ns[: len(packed)]
    rho = _max_utilisation(packed, packed / ns, budget_ms, quantile)
    tps_by_n = rho * ns * prompt / packed * 1e3
    i = int(np.argmax(tps_by_n))  # the packing that sustains the most tokens within the SLO (first on ties)
    tps = float(tps_by_n[i])
    return PrefillCapacity(
        tps, tps / prompt, float(rho[i]), int(ns[i]), float(packed[i]), alone_ms + transfer_ms, transfer_ms
    )


def _max_utilisation(
    t_it_ms: npt.NDArray[np.float64], service_ms: npt.NDArray[np.float64], budget_ms: float, quantile: float
) -> npt.NDArray[np.float64]:
    """Largest ρ per option with t_it + W_q(ρ) <= budget (0 where t_it alone misses it); bisection, vectorised."""
    lo = np.zeros_like(t_it_ms)
    hi = np.ones_like(t_it_ms)
    feasible = t_it_ms < budget_ms
    for _ in range(60):  # TTFT_q rises with ρ
        mid = 0.5 * (lo + hi)
        ok = t_it_ms + _wait_quantile_ms(mid, service_ms, quantile) <= budget_ms
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return np.where(feasible, lo, 0.0)


def _wait_quantile_ms(
    rho: npt.NDArray[np.float64], service_ms: npt.NDArray[np.float64], quantile: float
) -> npt.NDArray[np.float64]:
    r = np.clip(rho, 1e-300, 1.0 - 1e-15)
    mean_wait = r * service_ms / (2.0 * (1.0 - r))
    tail = mean_wait / r * np.log(np.maximum(r / (1.0 - quantile), 1.0))
    return np.where(r > 1.0 - quantile, tail, 0.0)


def prefill_capacity_tps(
    profile: HardwareProfile,
    model: LatencyModel,
    slo_ttft_ms: float,
    mean_prompt_tokens: float,
    *,
    quantile: float = DEFAULT_TTFT_QUANTILE,
) -> float:
    """Prompt tokens/s one prefill instance sustains at the TTFT SLO (0.0 when the SLO is out of reach)."""
    return prefill_capacity(profile, model, slo_ttft_ms, mean_prompt_tokens, quantile=quantile).tokens_per_s


def decode_capacity(
    profile: HardwareProfile, model: LatencyModel, slo_itl_ms: float, mean_context_tokens: float
) -> DecodeCapacity:
    """Largest decode batch whose step stays within ``slo_itl_ms`` at ``mean_context_tokens``, and its tokens/s."""
    _check_positive(slo_itl_ms=slo_itl_ms, mean_context_tokens=mean_context_tokens)
    blocks_per_seq = math.ceil(mean_context_tokens / profile.block_size)
    kv_batch = profile.kv_capacity_blocks // blocks_per_seq
    bounds = {
        "max_num_seqs": profile.max_num_seqs,
        "kv_cache": kv_batch,
        "max_num_batched_tokens": profile.max_num_batched_tokens,
    }
    bound_name = min(bounds, key=lambda k: bounds[k])
    bound = bounds[bound_name]
    if bound < 1:
        step1 = float(model.decode_step_ms(1, mean_context_tokens))
        return DecodeCapacity(0, 0.0, step1, "kv_cache", kv_batch)
    batches = np.arange(1, bound + 1, dtype=np.float64)
    steps = np.asarray(model.decode_step_ms(batches, mean_context_tokens), dtype=np.float64)
    ok = np.maximum.accumulate(steps) <= slo_itl_ms  # the prefix where every smaller batch also meets the SLO
    b = int(np.count_nonzero(ok))
    if b == 0:
        return DecodeCapacity(0, 0.0, float(steps[0]), "slo", kv_batch)
    limited: Literal["slo", "max_num_seqs", "kv_cache", "max_num_batched_tokens"] = (
        bound_name if b == bound else "slo"  # type: ignore[assignment]
    )
    step = float(steps[b - 1])
    return DecodeCapacity(b, b / step * 1e3, step, limited, kv_batch)


def instances_needed(
    profile: HardwareProfile,
    model: LatencyModel,
    rate_rps: float,
    mean_prompt_tokens: float,
    mean_output_tokens: float,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    *,
    headroom: float = 0.0,
    quantile: float = DEFAULT_TTFT_QUANTILE,
) -> InstancesNeeded:
    """Prefill and decode instances for ``rate_rps`` requests/s, each pool rounded up on its own
    (``.mixed`` gives the colocated alternative).

    ``headroom`` sizes for ``(1 + headroom)`` × the load. Decode runs at mean context prompt + output/2 (the
    average over a request's generation). A rate of 0 needs 0 instances (floors are the policy's business);
    an unknown (NaN) or negative rate, or an SLO no instance can meet, is a :class:`CapacityError`.
    """
    if not (math.isfinite(rate_rps) and rate_rps >= 0):
        raise CapacityError(
            f"rate_rps must be a finite number >= 0 (unknown load is not sized), got {rate_rps!r}"
        )
    if not (math.isfinite(headroom) and headroom >= 0):
        raise CapacityError(f"headroom must be a finite number >= 0, got {headroom!r}")
    _check_positive(mean_prompt_tokens=mean_prompt_tokens, mean_output_tokens=mean_output_tokens)
    pre = prefill_capacity(profile, model, slo_ttft_ms, mean_prompt_tokens, quantile=quantile)
    dec = decode_capacity(profile, model, slo_itl_ms, mean_prompt_tokens + mean_output_tokens / 2.0)
    load = rate_rps * (1.0 + headroom)
    prefill_tps, decode_tps = load * mean_prompt_tokens, load * mean_output_tokens
    if rate_rps > 0 and pre.tokens_per_s <= 0:
        raise CapacityError(
            f"{profile.name}: TTFT SLO {slo_ttft_ms} ms is out of reach for {mean_prompt_tokens:.0f}-token "
            f"prompts (a lone prompt takes {pre.min_ttft_ms:.1f} ms)"
        )
    if rate_rps > 0 and dec.tokens_per_s <= 0:
        raise CapacityError(
            f"{profile.name}: ITL SLO {slo_itl_ms} ms is out of reach at context "
            f"{mean_prompt_tokens + mean_output_tokens / 2:.0f} (one sequence steps in {dec.step_ms:.1f} ms, "
            f"KV holds {dec.kv_max_batch} sequences)"
        )
    if rate_rps == 0:
        return InstancesNeeded(0, 0, pre, dec, prefill_tps, decode_tps, mixed=0)
    pre_share, dec_share = prefill_tps / pre.tokens_per_s, decode_tps / dec.tokens_per_s
    return InstancesNeeded(
        prefill=math.ceil(pre_share - 1e-9),
        decode=math.ceil(dec_share - 1e-9),
        prefill_capacity=pre,
        decode_capacity=dec,
        prefill_load_tps=prefill_tps,
        decode_load_tps=decode_tps,
        mixed=math.ceil(pre_share + dec_share - 1e-9),
    )


def derived_busy_slowdown(
    decode_profile: HardwareProfile,
    model: LatencyModel,
    slo_itl_ms: float,
    mean_context_tokens: float,
    prompts_per_iteration: int,
    mean_prompt_tokens: float,
) -> float:
    """A mixed node's decode step stretch while its prefill instance works, derived at the operating point
    (``serving.sim.interference.busy_slowdown``): a full decode batch at the ITL SLO on ``decode_profile``
    (``mean_context_tokens`` of KV per sequence; batch 1 when none meets the SLO) beside a packed prefill
    iteration of ``prompts_per_iteration`` mean prompts. Shared by :func:`mixed_node_capacity` and the
    planner (``serving.sim.plan.plan_mixed_node``)."""
    from serving.sim.interference import busy_slowdown

    ctx = max(mean_context_tokens, 1.0)
    try:
        batch = max(decode_capacity(decode_profile, model, slo_itl_ms, ctx).max_batch, 1)
    except CapacityError:
        batch = 1
    iteration = max(prompts_per_iteration, 1) * max(round(mean_prompt_tokens), 1)
    return busy_slowdown(model, batch, round(batch * ctx), iteration)


@dataclass(frozen=True)
class MixedNodeCapacity:
    """What one PD-mixed node sustains: its prefill instance (at the node's ``prefill_mem_frac`` of the KV
    memory) and its decode instance (the rest), the decode step stretched by the node's interference."""

    prefill: PrefillCapacity
    decode: DecodeCapacity
    busy_slowdown: float  # decode step stretch while the prefill instance works (given, or derived)
    prefill_busy: float  # the prefill instance's busy share at its capacity (its M/D/1 utilisation)
    effective_slowdown: float  # 1 + (busy_slowdown - 1) x prefill_busy: the decode sizing's ITL divisor


def mixed_node_capacity(
    profile: HardwareProfile,
    model: LatencyModel,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    mean_prompt_tokens: float,
    mean_output_tokens: float,
    *,
    prefill_mem_frac: float,
    slowdown: float | None = None,
    prompt_tps_per_node: float | None = None,
    quantile: float = DEFAULT_TTFT_QUANTILE,
) -> MixedNodeCapacity:
    """One mixed node's capacities, as the simulator runs it (``serving.sim.engine``: the node's KV tokens
    split by ``prefill_mem_frac``).

    Prefill: :func:`prefill_capacity` on the prefill share's KV. Decode: :func:`decode_capacity` on the rest,
    at the ITL SLO divided by the mean step stretch ``1 + (s - 1) x ρ``, where ρ is the prefill instance's busy
    share: ``prompt_tps_per_node`` over what the instance prefills when always busy, when the prompt load per
    node is known (the controller's measured load over its nodes), else the busy share at its capacity load
    (the most it can be busy while meeting the TTFT SLO: right when prefill binds, pessimistic when decode
    binds); ρ is at most 1. ``s`` is ``slowdown`` or, when None, derived
    (``serving.sim.interference.busy_slowdown``) for a full decode batch at the SLO beside a packed prefill
    iteration of mean prompts.
    """
    from serving.sim.interference import mean_slowdown

    if not 0.0 < prefill_mem_frac < 1.0:
        raise CapacityError(f"prefill_mem_frac must lie in (0, 1), got {prefill_mem_frac!r}")
    _check_positive(mean_prompt_tokens=mean_prompt_tokens, mean_output_tokens=mean_output_tokens)
    kv_gib = profile.kv_pool_bytes_per_gpu / float(1 << 30)
    pre_profile = profile.with_overrides(kv_cache_gib=kv_gib * prefill_mem_frac)
    dec_profile = profile.with_overrides(kv_cache_gib=kv_gib * (1.0 - prefill_mem_frac))
    pre = prefill_capacity(pre_profile, model, slo_ttft_ms, mean_prompt_tokens, quantile=quantile)
    ctx = mean_prompt_tokens + mean_output_tokens / 2.0
    if slowdown is None:
        slowdown = derived_busy_slowdown(
            dec_profile, model, slo_itl_ms, ctx, pre.prompts_per_iteration, mean_prompt_tokens
        )
    busy = pre.utilisation
    if prompt_tps_per_node is not None and math.isfinite(prompt_tps_per_node) and pre.utilisation > 0:
        full_tps = pre.tokens_per_s / pre.utilisation  # prompt tokens/s of an always-busy prefill instance
        busy = min(max(prompt_tps_per_node, 0.0) / full_tps, 1.0)
    eff = mean_slowdown(slowdown, busy)
    dec = decode_capacity(dec_profile, model, slo_itl_ms / eff, ctx)
    return MixedNodeCapacity(pre, dec, slowdown, busy, eff)


# Burst lengths the burst floor tries (s): from one instant to half the sizing window.
BURST_SPANS_S: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


def burst_floor(
    arrival_s: npt.NDArray[np.float64],
    prompt_tokens: npt.NDArray[np.int64],
    output_tokens: npt.NDArray[np.int64],
    prefill: PrefillCapacity,
    decode: DecodeCapacity,
    slo_ttft_ms: float,
    *,
    window_s: float,
    quantile: float = DEFAULT_TTFT_QUANTILE,
) -> tuple[int, int]:
    """(prefill, decode) instances a burst shorter than ``window_s`` needs, which a rate averaged over the
    window misses (500 requests on one timestamp are 8 req/s over 60 s).

    Prefill: requests arriving within d seconds bring T prompt tokens; n instances prefilling at their full rate
    R (``prefill.tokens_per_s / utilisation``, at the packing the capacity model chose) clear them d + S after
    the burst starts, S = ``slo_ttft_ms`` minus what a request spends past its queue (the iteration it is
    prefilled in, as work is done in whole iterations; the KV transfer; its first decode step). The sizing
    promises the ``quantile`` TTFT over a window, so up to (1 − quantile) of the prompt tokens of the
    ``window_s`` window the burst opens may wait longer: n ≥ (T − (1 − quantile)·W) / (R·(d + S)), the most
    over every start and every d in ``BURST_SPANS_S`` below ``window_s``; a prompt counts at most R·(d + S)
    tokens (it prefills on one instance: more instances do not clear it sooner). Decode: each request holds a
    decode slot for output × the step time at ``decode.max_batch`` from its arrival; n ≥ quantile × the peak of
    those slots / ``max_batch``. Lengths count as at least one token, as served. (0, 0) for an empty trace or
    an SLO out of reach (the rate sizing says so).
    """
    n = len(arrival_s)
    if n == 0 or prefill.utilisation <= 0 or decode.max_batch < 1:
        return 0, 0
    t = np.asarray(arrival_s, dtype=np.float64)
    prompt = np.maximum(np.asarray(prompt_tokens, dtype=np.float64), 1.0)
    start = np.arange(n)
    full_tps = prefill.tokens_per_s / prefill.utilisation
    past_queue_ms = prefill.iteration_ms + prefill.kv_transfer_ms + decode.step_ms
    slack_s = max((slo_ttft_ms - past_queue_ms) / 1000.0, 0.0)
    need = 0.0
    for span_s in BURST_SPANS_S:
        if span_s >= window_s or span_s + slack_s <= 0:
            continue
        # one prompt runs on one instance: more instances do not clear more of it than one does in the time
        cum = np.concatenate([[0.0], np.cumsum(np.minimum(prompt, full_tps * (span_s + slack_s)))])
        window = cum[np.searchsorted(t, t + window_s, side="right")] - cum[start]
        burst = cum[np.searchsorted(t, t + span_s, side="right")] - cum[start]
        need = max(need, float(np.max(burst - (1.0 - quantile) * window)) / (full_tps * (span_s + slack_s)))
    hold_s = np.maximum(np.asarray(output_tokens, dtype=np.float64), 1.0) * decode.step_ms / 1000.0
    times = np.concatenate([t, t + hold_s])
    steps = np.concatenate([np.ones(n), -np.ones(n)])
    order = np.lexsort((steps, times))  # a slot freed at an instant is free for an arrival at that instant
    peak = float(np.max(np.cumsum(steps[order])))
    return math.ceil(need - 1e-9), math.ceil(quantile * peak / decode.max_batch - 1e-9)
