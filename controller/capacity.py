"""Per-instance capacity of a pool at its SLOs, from THE capacity model in serving.sim.capacity.

Recomputed only when the pool's measured mean lengths drift by more than ``REFRESH_REL`` (the model's
interpolation is cheap but not free, and capacity does not change tick to tick).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controller.policy.types import PoolCapacity, PoolObservation
from serving.sim.capacity import decode_capacity, mixed_node_capacity, prefill_capacity_tps
from serving.sim.fleet import PoolSpec
from serving.sim.hardware import get_profile
from serving.sim.latency import ScaledLatencyModel, get_latency_model

REFRESH_REL = 0.1
DEFAULT_PROMPT_TOKENS = 1024.0
DEFAULT_OUTPUT_TOKENS = 256.0


def pool_capacity(
    pool: PoolSpec,
    mean_prompt_tokens: float,
    mean_output_tokens: float,
    prompt_tps_per_node: float | None = None,
    latency_scale: float = 1.0,
) -> PoolCapacity:
    """One instance's prefill tokens/s at the TTFT SLO and decode batch/tokens/s at the ITL SLO.

    An SLO the profile cannot meet at all leaves a capacity of one token/s (or one sequence): the policy
    then asks for the maximum replicas and degrades, which is the truthful answer.

    A mixed-node pool (``placement="mixed-node"``) gets the partitioned capacities of one node
    (``serving.sim.capacity.mixed_node_capacity``: prefill at ``prefill_mem_frac`` of the KV memory, decode at
    the rest with its ITL budget cut by the node's interference); the policies then size nodes from both
    needs (``controller.policy.mixed_node``). ``prompt_tps_per_node``: the measured prompt load over the pool's
    nodes, which sets how busy a node's prefill instance is (None: busy as at its capacity load).
    ``latency_scale``: the engine measured this many times slower than its profile (``controller.latency_correction``);
    the capacities are those of the profile's latency model scaled by it (not applied to mixed-node pools).
    """
    profile, model = get_profile(pool.profile), get_latency_model(pool.profile)
    if latency_scale != 1.0 and pool.placement != "mixed-node":
        model = ScaledLatencyModel(model, latency_scale)  # type: ignore[assignment]
    prompt = max(mean_prompt_tokens, 1.0)
    output = max(mean_output_tokens, 1.0)
    if pool.placement == "mixed-node":
        node = mixed_node_capacity(
            profile, model, pool.slo_ttft_ms, pool.slo_itl_ms, prompt, output,
            prefill_mem_frac=pool.prefill_mem_frac, slowdown=pool.mixed_node_slowdown,
            prompt_tps_per_node=prompt_tps_per_node,
        )  # fmt: skip
        return PoolCapacity(
            prefill_tps=max(node.prefill.tokens_per_s, 1.0),
            decode_seqs=float(max(node.decode.max_batch, 1)),
            decode_tps=max(node.decode.tokens_per_s, 1.0),
            gpus_per_instance=profile.gpus,
        )
    prefill_tps = prefill_capacity_tps(profile, model, pool.slo_ttft_ms, prompt)
    dec = decode_capacity(profile, model, pool.slo_itl_ms, prompt + output / 2)
    return PoolCapacity(
        prefill_tps=max(prefill_tps, 1.0),
        decode_seqs=float(max(dec.max_batch, 1)),
        decode_tps=max(dec.tokens_per_s, 1.0),
        gpus_per_instance=profile.gpus,
    )


@dataclass
class CapacityCache:
    """The last computed capacity of one pool and the lengths it was computed for."""

    pool: PoolSpec
    prompt_tokens: float = math.nan
    output_tokens: float = math.nan
    capacity: PoolCapacity | None = None
    load_bucket: int | None = None  # mixed-node: the prompt load per node it was computed for (log buckets)
    latency_scale: float = 1.0  # the latency correction it was computed for

    def get(
        self,
        mean_prompt_tokens: float,
        mean_output_tokens: float,
        prompt_tps_per_node: float | None = None,
        latency_scale: float = 1.0,
    ) -> PoolCapacity:
        """``prompt_tps_per_node`` matters to mixed-node pools only (see ``pool_capacity``); it is bucketed
        in steps of ``REFRESH_REL``, as the lengths are. ``latency_scale`` (the latency correction's factor)
        is used as given: it moves in steps already (``controller.latency_correction``)."""
        prompt = mean_prompt_tokens if math.isfinite(mean_prompt_tokens) else DEFAULT_PROMPT_TOKENS
        output = mean_output_tokens if math.isfinite(mean_output_tokens) else DEFAULT_OUTPUT_TOKENS
        bucket = None
        load = None
        if (
            self.pool.placement == "mixed-node"
            and prompt_tps_per_node is not None
            and math.isfinite(prompt_tps_per_node)
        ):
            bucket = round(math.log1p(max(prompt_tps_per_node, 0.0)) / math.log1p(REFRESH_REL))
            load = math.expm1(bucket * math.log1p(REFRESH_REL))
        stale = (
            self.capacity is None
            or abs(prompt - self.prompt_tokens) > REFRESH_REL * self.prompt_tokens
            or abs(output - self.output_tokens) > REFRESH_REL * self.output_tokens
            or bucket != self.load_bucket
            or latency_scale != self.latency_scale
        )
        if stale or self.capacity is None:
            self.capacity = pool_capacity(self.pool, prompt, output, load, latency_scale)
            self.prompt_tokens, self.output_tokens, self.load_bucket = prompt, output, bucket
            self.latency_scale = latency_scale
        return self.capacity


def prompt_load_per_node(obs: PoolObservation) -> float | None:
    """The measured prompt tokens/s over the pool's active prefill instances (one per mixed node); None when
    unknown (NaN load, no active instance)."""
    nodes = obs.active.get("prefill", 0)
    if nodes <= 0 or not math.isfinite(obs.prompt_tps):
        return None
    return obs.prompt_tps / nodes
