"""A linear latency model and a small profile, for hand-checked simulations and tests.

``AnalyticLatency.iteration_ms = base_ms + prefill_ms_per_token·prefill_tokens
+ decode_ms_per_seq·decode_batch + decode_ms_per_context_token·decode_context_tokens`` (0 for an empty
iteration). Every term is exact arithmetic, so a test can step virtual time by hand; the Vidur-based
model in :mod:`serving.sim.latency` is what replays use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from serving.sim.instance import LatencyLike, ProfileLike


@dataclass(frozen=True)
class AnalyticLatency:
    base_ms: float = 10.0
    prefill_ms_per_token: float = 0.01
    decode_ms_per_seq: float = 0.0
    decode_ms_per_context_token: float = 0.0

    def iteration_ms(
        self,
        prefill_tokens: int,
        prefill_context_tokens: int,
        decode_batch: int,
        decode_context_tokens: int,
        *,
        prefill_seqs: int = 1,
    ) -> float:
        if prefill_tokens == 0 and decode_batch == 0:
            return 0.0
        return (
            self.base_ms
            + self.prefill_ms_per_token * prefill_tokens
            + self.decode_ms_per_seq * decode_batch
            + self.decode_ms_per_context_token * decode_context_tokens
        )


@dataclass(frozen=True)
class AnalyticProfile:
    """The :class:`~serving.sim.instance.ProfileLike` fields, with small defaults."""

    gpus: int = 1
    kv_bytes_per_token: int = 1000
    kv_capacity_tokens: int = 16384
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    cold_start_s: float = 120.0
    standby_activation_s: float = 5.0
    kv_transfer_gbps: float = 8.0  # 1 GB/s: 1000 bytes per token move in 1 µs per token
    kv_transfer_latency_ms: float = 0.0


def analytic_models(
    profile: AnalyticProfile | None = None, latency: AnalyticLatency | None = None
) -> Callable[[str], tuple[ProfileLike, LatencyLike]]:
    """A ``models`` resolver for :class:`~serving.sim.engine.Simulator` ignoring the profile name."""
    prof: ProfileLike = profile or AnalyticProfile()
    lat: LatencyLike = latency or AnalyticLatency()

    def resolve(name: str) -> tuple[ProfileLike, LatencyLike]:
        return prof, lat

    return resolve
