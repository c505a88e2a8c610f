"""The scaling policy: pure functions from an observation and state to a plan and the next state."""

from controller.policy.decide import PolicyContext, allocate_budget, decide
from controller.policy.types import PoolCapacity, PoolForecast, PoolObservation, PoolState, ScalingPlan

__all__ = [
    "PolicyContext",
    "PoolCapacity",
    "PoolForecast",
    "PoolObservation",
    "PoolState",
    "ScalingPlan",
    "allocate_budget",
    "decide",
]
