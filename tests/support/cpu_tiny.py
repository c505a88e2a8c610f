"""Shared fixtures of the cpu-tiny latency-term tests: the profile, a linear model's coefficients, a trace from
lists, and a replay on one mixed instance with a given latency model (admission, stall and overhead terms)."""

from __future__ import annotations

from typing import Any

import numpy as np

from serving.sim.fleet import single_pool
from serving.sim.hardware import get_profile
from serving.sim.replay import PolicyOptions, make_policy, replay
from serving.sim.router import GatewayPolicy
from serving.workload.trace import Trace

PROFILE = get_profile("cpu-tiny").with_overrides(max_num_seqs=16)
COEF = {
    "a_ms": 6.0,
    "b_ms_per_prefill_token": 0.025,
    "c_ms_per_decode_seq": 2.2,
    "d_ms_per_decode_context_token": 4e-4,
}


def make_trace(arrivals: list[float], prompts: list[int], outputs: list[int]) -> Trace:
    return Trace.from_arrays(
        arrival_s=np.asarray(arrivals, dtype=np.float64),
        prompt_tokens=np.asarray(prompts),
        output_tokens=np.asarray(outputs),
        source="test",
        format="synthetic",
    )


def replay_mixed(trace: Trace, model: Any, gateway: GatewayPolicy | None = None) -> Any:
    """``trace`` on one cpu-tiny mixed instance (fixed policy) whose latency model is ``model``."""
    return replay(
        single_pool(profile="cpu-tiny", mixed=1, max_per_role=1),
        {"default": trace},
        make_policy("fixed", PolicyOptions(mixed=1)),
        models=lambda _name: (PROFILE, model),
        gateway=gateway,
    )


def report_doc(trace: Trace, model: Any) -> dict[str, Any]:
    """``replay_mixed``'s JSON without its wall time (deterministic, comparable with ``==``)."""
    doc = dict(replay_mixed(trace, model).to_json())
    doc.pop("wall_s")
    return doc
