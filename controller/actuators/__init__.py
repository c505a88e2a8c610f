"""Actuators: where a ``ScalingPlan`` becomes replicas (Kubernetes, dry-run, simulator).

Import the implementations from their modules (``controller.actuators.kubernetes`` loads the kubernetes
client; this package does not).
"""

from controller.actuators.base import (
    Actuator,
    ActuatorError,
    ActuatorUnavailable,
    ApplyResult,
    Change,
    PoolReplicas,
    ReplicaBounds,
    RoleReplicas,
    clamp_targets,
)

__all__ = [
    "Actuator",
    "ActuatorError",
    "ActuatorUnavailable",
    "ApplyResult",
    "Change",
    "PoolReplicas",
    "ReplicaBounds",
    "RoleReplicas",
    "clamp_targets",
]
