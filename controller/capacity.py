"""Per-instance capacity of a pool at its SLOs, from THE capacity model in serving.sim.capacity.

Recomputed only when the pool's measured mean lengths drift by more than ``REFRESH_REL`` (the model's
interpolation is cheap but not free, and capacity does not change tick to tick).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controller.policy.types import PoolCapacity
from serving.sim.capacity import decode_capacity, mixed_node_capacity, prefill_capacity_tps
from serving.sim.fleet import PoolSpec
from serving.sim.hardware import get_profile
from serving.sim.latency import get_latency_model

REFRESH_REL = 0.1
DEFAULT_PROMPT_TOKENS = 1024.0
DEFAULT_OUTPUT_TOKENS = 256.0


def pool_capacity(pool: PoolSpec, mean_prompt_tokens: float, mean_output_tokens: float) -> PoolCapacity:
    """One instance's prefill tokens/s at the TTFT SLO and decode batch/tokens/s at the ITL SLO.

    An SLO the profile cannot meet at all leaves a capacity of one token/s (or one sequence): the policy
    then asks for the maximum replicas and degrades, which is the truthful answer.

    A mixed-node pool (``placement="mixed-node"``) gets the partitioned capacities of one node
    (``serving.sim.capacity.mixed_node_capacity``: prefill at ``prefill_mem_frac`` of the KV memory, decode at
    the rest with its ITL budget cut by the node's interference); the policies then size nodes from both
    needs (``controller.policy.mixed_node``).
    """
    profile, model = get_profile(pool.profile), get_latency_model(pool.profile)
    prompt = max(mean_prompt_tokens, 1.0)
    output = max(mean_output_tokens, 1.0)
    if pool.placement == "mixed-node":
        node = mixed_node_capacity(
            profile, model, pool.slo_ttft_ms, pool.slo_itl_ms, prompt, output,
            prefill_mem_frac=pool.prefill_mem_frac, slowdown=pool.mixed_node_slowdown,
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

    def get(self, mean_prompt_tokens: float, mean_output_tokens: float) -> PoolCapacity:
        prompt = mean_prompt_tokens if math.isfinite(mean_prompt_tokens) else DEFAULT_PROMPT_TOKENS
        output = mean_output_tokens if math.isfinite(mean_output_tokens) else DEFAULT_OUTPUT_TOKENS
        stale = (
            self.capacity is None
            or abs(prompt - self.prompt_tokens) > REFRESH_REL * self.prompt_tokens
            or abs(output - self.output_tokens) > REFRESH_REL * self.output_tokens
        )
        if stale or self.capacity is None:
            self.capacity = pool_capacity(self.pool, prompt, output)
            self.prompt_tokens, self.output_tokens = prompt, output
        return self.capacity
