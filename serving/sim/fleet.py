"""What the simulator runs: a fleet (GPU budget) of pools, each a set of prefill/decode/mixed instances.

A pool is either *disaggregated* (prefill and decode instances, KV moved between them) or *colocated*
(``mixed`` instances that prefill and decode in one vLLM server). Counts are per role; the simulator's
actuator (``Simulator.set_target``) clamps every target to ``[min, max]`` of its role.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

ROLES: tuple[str, ...] = ("prefill", "decode", "mixed")
PLACEMENTS: tuple[str, ...] = ("dedicated", "mixed-node")


@dataclass(frozen=True)
class RoleCounts:
    """Initial active/standby counts and the actuator's bounds for one role of one pool."""

    initial: int = 0
    standby: int = 0  # warm standby instances wanted at start (loaded, out of rotation)
    min: int = 0
    max: int = 64

    def errors(self, where: str) -> list[str]:
        out = []
        if self.min < 0 or self.initial < 0 or self.standby < 0:
            out.append(
                f"{where}: counts must be >= 0 (initial={self.initial}, standby={self.standby}, min={self.min})"
            )
        if self.max < self.min:
            out.append(f"{where}.max={self.max} is below {where}.min={self.min}")
        if not self.min <= self.initial <= self.max:
            out.append(f"{where}.initial={self.initial} is outside [min={self.min}, max={self.max}]")
        return out


@dataclass(frozen=True)
class PoolSpec:
    """One model on one hardware profile, with its SLOs, router policy and per-role counts.

    ``long_context_prefill`` / ``high_memory_decode``: how many prefill (decode) instances the
    context-aware router treats as fast/long-context (high-memory); the lowest-numbered ones get the mark.
    """

    name: str = "default"
    profile: str = "llama3-8b/a100"
    slo_ttft_ms: float = 1000.0
    slo_itl_ms: float = 50.0
    router: str = "least-loaded"
    placement: str = "dedicated"
    prefill_mem_frac: float = (
        0.4  # mixed-node placement: share of the node's KV memory for the prefill instance
    )
    # mixed-node placement: decode steps run this many times slower while the node's prefill instance is busy
    # (shared compute). None (the default): derived per step from the latency model's operator timings
    # (serving/sim/interference.py: the decode batch, its context and the prefill iteration in progress) — a
    # model from kernel timings, not a measurement on a real mixed node; a number overrides it.
    mixed_node_slowdown: float | None = None
    prefill: RoleCounts = field(default_factory=lambda: RoleCounts(initial=1, min=0))
    decode: RoleCounts = field(default_factory=lambda: RoleCounts(initial=1, min=0))
    mixed: RoleCounts = field(default_factory=lambda: RoleCounts(initial=0, max=0))
    long_context_prefill: int = 0
    high_memory_decode: int = 0

    def role(self, role: str) -> RoleCounts:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}: expected one of {ROLES}")
        counts: RoleCounts = getattr(self, role)
        return counts

    @property
    def disaggregated(self) -> bool:
        """True when requests prefill on ``prefill`` instances and decode on ``decode`` instances."""
        return self.prefill.max > 0 or self.decode.max > 0

    @property
    def roles(self) -> tuple[str, ...]:
        return ("prefill", "decode") if self.disaggregated else ("mixed",)

    def errors(self) -> list[str]:
        where = f"pools[{self.name}]"
        out: list[str] = []
        if not self.name:
            out.append(f"{where}.name must not be empty")
        if self.slo_ttft_ms <= 0 or self.slo_itl_ms <= 0:
            out.append(f"{where}: SLOs must be > 0 ms (ttft={self.slo_ttft_ms}, itl={self.slo_itl_ms})")
        if self.placement not in PLACEMENTS:
            out.append(f"{where}.placement={self.placement!r}: expected one of {PLACEMENTS}")
        if not 0.0 < self.prefill_mem_frac < 1.0:
            out.append(f"{where}.prefill_mem_frac={self.prefill_mem_frac} must lie in (0, 1)")
        if self.mixed_node_slowdown is not None and not self.mixed_node_slowdown >= 1.0:
            out.append(f"{where}.mixed_node_slowdown={self.mixed_node_slowdown} must be >= 1")
        if self.placement == "mixed-node" and not self.disaggregated:
            out.append(
                f"{where}: placement='mixed-node' hosts a prefill and a decode instance per node; "
                "it needs a disaggregated pool (prefill and decode roles)"
            )
        for role in ROLES:
            out.extend(self.role(role).errors(f"{where}.{role}"))
        if self.disaggregated and self.mixed.max > 0:
            out.append(
                f"{where}: a pool is either disaggregated (prefill+decode) or colocated (mixed), not both"
            )
        if not self.disaggregated and self.mixed.max == 0:
            out.append(f"{where}: no role can hold an instance (prefill, decode and mixed max are all 0)")
        if self.disaggregated and (self.prefill.max == 0 or self.decode.max == 0):
            out.append(f"{where}: a disaggregated pool needs prefill.max > 0 and decode.max > 0")
        return out


@dataclass(frozen=True)
class FleetSpec:
    """Pools sharing one GPU budget (GPUs of every instance that holds one: provisioning to draining)."""

    pools: tuple[PoolSpec, ...] = (PoolSpec(),)
    gpu_budget: int = 1024

    def __post_init__(self) -> None:
        errors = self.errors()
        if errors:
            raise ValueError("invalid FleetSpec:\n  " + "\n  ".join(errors))

    def errors(self) -> list[str]:
        out: list[str] = []
        if self.gpu_budget <= 0:
            out.append(f"gpu_budget={self.gpu_budget} must be > 0")
        if not self.pools:
            out.append("pools: a fleet needs at least one pool")
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            out.append(f"pools: names must be unique, got {names}")
        for pool in self.pools:
            out.extend(pool.errors())
        return out

    def pool(self, name: str) -> PoolSpec:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool named {name!r} in fleet (pools: {[p.name for p in self.pools]})")


def single_pool(
    *,
    profile: str = "llama3-8b/a100",
    prefill: int = 1,
    decode: int = 1,
    mixed: int = 0,
    slo_ttft_ms: float = 1000.0,
    slo_itl_ms: float = 50.0,
    router: str = "least-loaded",
    max_per_role: int = 64,
    gpu_budget: int = 1024,
) -> FleetSpec:
    """A fleet with one pool named ``default``: disaggregated if ``mixed == 0``, else colocated."""
    none = RoleCounts(initial=0, max=0)
    if mixed > 0:
        p_counts, d_counts = none, none
        m_counts = RoleCounts(initial=mixed, max=max(max_per_role, mixed))
    else:
        p_counts = RoleCounts(initial=prefill, max=max(max_per_role, prefill))
        d_counts = RoleCounts(initial=decode, max=max(max_per_role, decode))
        m_counts = none
    pool = PoolSpec(
        profile=profile,
        slo_ttft_ms=slo_ttft_ms,
        slo_itl_ms=slo_itl_ms,
        router=router,
        prefill=p_counts,
        decode=d_counts,
        mixed=m_counts,
    )
    return FleetSpec(pools=(pool,), gpu_budget=gpu_budget)


def _fields(cls: type, data: object, where: str) -> dict[str, Any]:
    """``data`` as keyword arguments for dataclass ``cls``; an unknown key is an error naming it."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; known: {sorted(known)}")
    return {str(k): v for k, v in data.items()}


def fleet_from_dict(data: object, source: str = "config") -> FleetSpec:
    """A FleetSpec from a parsed YAML/JSON document; unknown or invalid fields are errors naming them.

    Example document::

        gpu_budget: 64
        pools:
          - name: chat
            profile: llama3-8b/a100
            slo_ttft_ms: 1000
            slo_itl_ms: 50
            router: context-aware
            prefill: {initial: 2, min: 1, max: 16}
            decode: {initial: 2, min: 1, max: 16}
    """
    top = _fields(FleetSpec, data, source)
    raw_pools = top.get("pools", [{}])
    if not isinstance(raw_pools, list):
        raise ValueError(f"{source}: pools must be a list of pool mappings")
    pools = []
    for i, raw in enumerate(raw_pools):
        where = f"{source}: pools[{i}]"
        fields = _fields(PoolSpec, raw, where)
        for role in ROLES:
            if role in fields:
                fields[role] = RoleCounts(**_fields(RoleCounts, fields[role], f"{where}.{role}"))
        try:
            pools.append(PoolSpec(**fields))
        except TypeError as exc:
            raise ValueError(f"{where}: {exc}") from None
    try:
        return FleetSpec(pools=tuple(pools), gpu_budget=int(top.get("gpu_budget", 1024)))
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def load_fleet(path: str) -> FleetSpec:
    """Read a fleet config from a YAML or JSON file (see :func:`fleet_from_dict`)."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        return fleet_from_dict(yaml.safe_load(fh), source=path)
