"""A request routed again after its instance fails is offered load once: the router counters (requests,
prompt tokens, predicted output tokens on the entry role) and ``vllm:prompt_tokens_total`` count it once."""

from __future__ import annotations

import numpy as np
import pytest

from serving.sim.analytic import AnalyticLatency, AnalyticProfile, analytic_models
from serving.sim.engine import Simulator
from serving.sim.fleet import single_pool
from serving.sim.router import GatewayPolicy
from serving.sim.samples import PROMPT_TOKENS_TOTAL, ROUTER_PROMPT_TOKENS_TOTAL, ROUTER_REQUESTS_TOTAL
from serving.workload.trace import Trace

LAT = AnalyticLatency(base_ms=10.0, prefill_ms_per_token=0.01)
PROMPTS = [1000, 2000, 3000, 4000]


class DelayedLatency(AnalyticLatency):
    """Every arrival reaches its instance's queue 50 ms after it was routed there."""

    def admission_delay_ms(self, running: int) -> float:
        return 50.0


def _sim(roles: dict[str, int], *, gateway: GatewayPolicy | None = None, delayed: bool = False) -> Simulator:
    lat = DelayedLatency(base_ms=10.0, prefill_ms_per_token=0.01) if delayed else LAT
    tr = Trace.from_arrays(np.zeros(len(PROMPTS)), np.array(PROMPTS), np.full(len(PROMPTS), 50))
    return Simulator(
        single_pool(
            prefill=roles.get("prefill", 0), decode=roles.get("decode", 0), mixed=roles.get("mixed", 0)
        ),
        {"default": tr},
        models=analytic_models(AnalyticProfile(), lat),
        gateway=gateway,
    )


def _entry_counters(sim: Simulator, entry: str) -> tuple[float, float]:
    """The router counters summed over the entry role, as a scrape shows them (a failed instance stays)."""
    s = sim.observe()
    assert "failed" in s.states
    on_entry = np.array([r == entry for r in s.roles])
    return (
        float(s.counters[ROUTER_REQUESTS_TOTAL][on_entry].sum()),
        float(s.counters[ROUTER_PROMPT_TOKENS_TOTAL][on_entry].sum()),
    )


@pytest.mark.parametrize(
    ("roles", "entry"),
    [({"prefill": 2, "decode": 1}, "prefill"), ({"mixed": 2}, "mixed")],
    ids=["pd", "mixed"],
)
@pytest.mark.parametrize("gateway", [None, GatewayPolicy(max_waiting=1)], ids=["router", "gateway"])
def test_requests_rerouted_after_a_crash_are_counted_once(
    roles: dict[str, int], entry: str, gateway: GatewayPolicy | None
) -> None:
    sim = _sim(roles, gateway=gateway)
    sim.run_until(0.005)  # every request routed, the first prefills running
    victim = max((i for i in sim.instances if i.role == entry), key=lambda i: i.load)
    assert victim.load > 0
    requeued = sim.fail_instance(victim.instance_id)
    assert requeued
    sim.run_until(30.0)
    assert sim.req.completions.tolist() == [1] * len(PROMPTS)
    assert _entry_counters(sim, entry) == (len(PROMPTS), sum(PROMPTS))
    # prompt tokens processed: each request's prefill is counted once, where it completed
    processed = sum(i.prompt_tokens_total for i in sim.instances)
    assert processed == sum(PROMPTS)
    assert float(sim.observe().counters[PROMPT_TOKENS_TOTAL].sum()) <= sum(PROMPTS)


def test_a_request_whose_instance_fails_during_its_admission_delay_is_counted_once() -> None:
    sim = _sim({"prefill": 2, "decode": 1}, delayed=True)
    sim.run_until(0.01)  # routed, still on their way in
    victim = next(i for i in sim.instances if i.role == "prefill" and i.load > 0)
    sim.fail_instance(victim.instance_id)
    sim.run_until(30.0)
    assert sim.req.completions.tolist() == [1] * len(PROMPTS)
    assert _entry_counters(sim, "prefill") == (len(PROMPTS), sum(PROMPTS))


def test_a_request_rerouted_to_the_router_queue_is_counted_once_when_dispatched() -> None:
    # the only prefill instance fails: its requests wait at the router until a new one is active
    sim = _sim({"prefill": 1, "decode": 1})
    sim.run_until(0.005)
    sim.fail_instance("default-prefill-0")
    sim.set_target("default", "prefill", 1)
    sim.run_until(400.0)
    assert sim.req.completions.tolist() == [1] * len(PROMPTS)
    assert _entry_counters(sim, "prefill") == (len(PROMPTS), sum(PROMPTS))
