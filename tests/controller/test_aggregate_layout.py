"""The aggregator keeps a scrape's layout (id index, each pool's rows) while the fleet is unchanged: a long-lived
aggregator must give, on any sequence of scrapes (instances joining, leaving, moving pool, changing role or state,
counters reset, NaN), exactly the loads of the plain definitions over boolean masks of the two latest scrapes."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.sources.aggregate import LoadAggregator, PoolLoad
from serving.sim import samples as s

IDS = ("a", "b", "c", "d", "e", "f")
POOLS = ("p0", "p1")
ASKED = ["p0", "p1", "nowhere"]  # a pool with no instance in any scrape
ROLE_CHOICES = ("prefill", "decode", "mixed")
STATE_CHOICES = ("active", "draining", "standby", "provisioning")
VALUES = st.one_of(st.floats(0.0, 1e4), st.just(math.nan))


@st.composite
def scrapes(draw: st.DrawFn) -> list[s.InstanceSamples]:
    fleet = draw(st.lists(st.sampled_from(IDS), min_size=0, max_size=6, unique=True))
    attrs = {i: (draw(st.sampled_from(POOLS)), draw(st.sampled_from(ROLE_CHOICES)),
                 draw(st.sampled_from(STATE_CHOICES))) for i in IDS}  # fmt: skip
    out = []
    for k in range(draw(st.integers(2, 8))):
        change = draw(st.sampled_from(("same", "same", "join", "leave", "move", "reorder")))
        if change == "join" and len(fleet) < len(IDS):
            fleet = [*fleet, next(i for i in IDS if i not in fleet)]
        elif change == "leave" and fleet:
            fleet = fleet[1:]
        elif change == "move" and fleet:
            i = fleet[0]
            attrs[i] = (draw(st.sampled_from(POOLS)), draw(st.sampled_from(ROLE_CHOICES)),
                        draw(st.sampled_from(STATE_CHOICES)))  # fmt: skip
        elif change == "reorder":
            fleet = list(reversed(fleet))

        def arr(n: int = len(fleet)) -> np.ndarray:
            return np.array([draw(VALUES) for _ in range(n)], dtype=np.float64)

        counters = (s.PROMPT_TOKENS_TOTAL, s.GENERATION_TOKENS_TOTAL, s.ROUTER_REQUESTS_TOTAL)
        gauges = (s.NUM_REQUESTS_RUNNING, s.NUM_REQUESTS_WAITING, s.KV_CACHE_USAGE_PERC)
        out.append(
            s.InstanceSamples(
                now_s=10.0 + k,
                instance_ids=tuple(fleet),
                pools=tuple(attrs[i][0] for i in fleet),
                roles=tuple(attrs[i][1] for i in fleet),
                nodes=tuple(fleet),
                states=tuple(attrs[i][2] for i in fleet),
                gauges={g: arr() for g in gauges},
                counters={c: arr() for c in counters},
            )
        )
    return out


def _increments(prev: s.InstanceSamples, cur: s.InstanceSamples, metric: str) -> np.ndarray:
    """Per current instance: counter now minus its previous value (0 when new; the value itself on a reset)."""
    where = {iid: i for i, iid in enumerate(prev.instance_ids)}
    before = np.array([prev.counters[metric][where[i]] if i in where else 0.0 for i in cur.instance_ids])
    d = cur.counters[metric] - before
    return np.where(d < 0, cur.counters[metric], d)


def _rate(values: np.ndarray, dt_s: float) -> float:
    return math.nan if np.isnan(values).any() else float(values.sum() / dt_s)


def _reference(prev: s.InstanceSamples, cur: s.InstanceSamples, pool: str) -> dict[str, object]:
    """The loads by their definitions: boolean masks over every instance, one pool at a time."""
    pools, roles, states = (np.array(x, dtype=object) for x in (cur.pools, cur.roles, cur.states))
    in_pool = pools == pool
    serving = in_pool & np.isin(states, ("active", "draining"))
    prompt_role, decode_role = np.isin(roles, ("prefill", "mixed")), np.isin(roles, ("decode", "mixed"))
    dt = cur.now_s - prev.now_s
    arrivals = _increments(prev, cur, s.ROUTER_REQUESTS_TOTAL)[in_pool & prompt_role]
    prompt = _increments(prev, cur, s.PROMPT_TOKENS_TOTAL)[in_pool & prompt_role]
    kv = cur.gauges[s.KV_CACHE_USAGE_PERC][serving & decode_role]
    counts: dict[str, dict[str, int]] = {}
    for (role, state), k in Counter(
        zip(roles[in_pool].tolist(), states[in_pool].tolist(), strict=True)
    ).items():
        counts.setdefault(role, {})[state] = k
    n_arrivals = float(arrivals.sum())
    return {
        "counts": counts,
        "arrival_rps": _rate(arrivals, dt),
        "prompt_tps": _rate(prompt, dt),
        "gen_tps": _rate(_increments(prev, cur, s.GENERATION_TOKENS_TOTAL)[in_pool], dt),
        "running": float(cur.gauges[s.NUM_REQUESTS_RUNNING][serving & decode_role].sum()),
        "waiting": float(cur.gauges[s.NUM_REQUESTS_WAITING][serving & prompt_role].sum()),
        "kv_usage": float(kv.mean()) if len(kv) else math.nan,
        "mean_prompt_tokens": float(prompt.sum()) / n_arrivals if n_arrivals > 0 else math.nan,
    }


def _fields(load: PoolLoad) -> dict[str, object]:
    return {k: getattr(load, k) for k in ("counts", "arrival_rps", "prompt_tps", "gen_tps", "running",
                                          "waiting", "kv_usage", "mean_prompt_tokens")}  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(scrapes())
def test_a_long_lived_aggregator_gives_the_definitions_on_a_changing_fleet(
    seq: list[s.InstanceSamples],
) -> None:
    agg = LoadAggregator()
    agg.update(seq[0], ASKED)
    for prev, cur in itertools.pairwise(seq):
        got = agg.update(cur, ASKED)
        for pool in ASKED:
            # repr: NaN equals NaN, and every float must match to the bit
            assert repr(_fields(got[pool])) == repr(_reference(prev, cur, pool)), pool
